// Package clitest checks that a binary keeps the cli convention. Each
// check reads the flags from the binary's kong model, so that a flag added
// later is checked too.
package clitest

import (
	"bytes"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/alecthomas/kong"
	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli"
)

// Setting is one flag as a user can set it.
type Setting struct {
	// Command is the subcommand the flag belongs to, such as "lease"; empty
	// for the binary's own flags.
	Command string
	Flag    string
	Env     string
	// Default as --help shows it; "required" for a required flag.
	Default string
}

// New builds a binary's parser for a test, with the options the binary
// parses with, failing the test when the grammar does not build.
func New(t testing.TB, name, description string, grammar any, opts ...kong.Option) *kong.Kong {
	t.Helper()
	k, err := cli.New(name, description, grammar, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// CheckSettings fails t unless k's flags are exactly want, in order, and
// --help shows each with its variable and default.
func CheckSettings(t testing.TB, k *kong.Kong, want []Setting) {
	t.Helper()
	if diff := cmp.Diff(want, Settings(k)); diff != "" {
		t.Errorf("settings: -want, +got:\n%s", diff)
	}
	CheckHelp(t, k)
}

// Settings lists every flag of k but --help, command by command.
func Settings(k *kong.Kong) []Setting {
	var out []Setting
	eachCommand(k.Model.Node, func(n *kong.Node) {
		for _, f := range flags(k, n) {
			out = append(out, setting(n, f))
		}
	})
	return out
}

// flags are n's own flags but --help.
func flags(k *kong.Kong, n *kong.Node) []*kong.Flag {
	var out []*kong.Flag
	for _, f := range n.Flags {
		// Hidden flags are for tests only: no help, no entry in the docs.
		if f != k.Model.HelpFlag && !f.Hidden {
			out = append(out, f)
		}
	}
	return out
}

func setting(n *kong.Node, f *kong.Flag) Setting {
	s := Setting{Command: strings.TrimSpace(n.Path()), Flag: f.Name, Env: strings.Join(f.Envs, ","), Default: cli.Default(f.Value)}
	if n.Type == kong.ApplicationNode {
		s.Command = ""
	}
	if f.Required {
		s.Default = "required"
	}
	return s
}

func eachCommand(n *kong.Node, fn func(*kong.Node)) {
	fn(n)
	for _, c := range n.Children {
		if c.Type == kong.CommandNode {
			eachCommand(c, fn)
		}
	}
}

// Run parses args with k as the binary would, and returns what it printed
// and the code it exits with; code is -1 when the binary would go on to
// run.
func Run(t testing.TB, k *kong.Kong, args ...string) (printed string, code int) {
	t.Helper()
	var out bytes.Buffer
	k.Stdout, k.Stderr = &out, &out
	ctx, code := cli.ParseArgs(k, args)
	if ctx != nil {
		code = -1
	}
	return out.String(), code
}

// Parse parses args with k, with env set and every other variable k reads
// unset, and fails t unless the binary would go on to run.
func Parse(t testing.TB, k *kong.Kong, env map[string]string, args ...string) {
	t.Helper()
	Unsetenv(t, k)
	for name, value := range env {
		t.Setenv(name, value)
	}
	if printed, code := Run(t, k, args...); code != -1 {
		t.Fatalf("%q: want the binary to run, got exit code %d:\n%s", args, code, printed)
	}
}

// CheckDefaults parses no arguments with none of k's variables set, and
// fails t unless got, read after the parse, is want: the flags whose
// defaults a package keeps default to what it keeps.
func CheckDefaults(t testing.TB, k *kong.Kong, got func() []any, want ...any) {
	t.Helper()
	Unsetenv(t, k)
	if _, err := k.Parse(nil); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got()); diff != "" {
		t.Errorf("the flags' defaults are the packages': -want, +got:\n%s", diff)
	}
}

// Unsetenv clears every environment variable k reads, for the rest of the
// test, so that the test's own environment cannot change what it sees.
func Unsetenv(t testing.TB, k *kong.Kong) {
	t.Helper()
	for _, s := range Settings(k) {
		for _, env := range strings.Split(s.Env, ",") {
			if env == "" {
				continue
			}
			t.Setenv(env, "") // Restores the variable after the test.
			if err := os.Unsetenv(env); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// CheckHelp fails t unless the --help of every command of k shows each of
// the command's flags with its environment variable and its default, and
// unless every flag states a default or is required.
func CheckHelp(t testing.TB, k *kong.Kong) {
	t.Helper()
	Unsetenv(t, k)
	eachCommand(k.Model.Node, func(n *kong.Node) {
		var args []string
		if n.Type == kong.CommandNode {
			args = strings.Fields(n.Path())
		}
		printed, code := Run(t, k, append(args, "--help")...)
		if code != 0 {
			t.Errorf("%q: want exit code 0, got %d:\n%s", strings.Join(append(args, "--help"), " "), code, printed)
		}
		for _, f := range flags(k, n) {
			s := setting(n, f)
			if !f.Required && !f.HasDefault {
				t.Errorf("%s --%s: states no default; give it a default tag", s.Command, s.Flag)
			}
			entry := helpEntry(printed, f.Name)
			want := []string{"default " + s.Default}
			if f.Required {
				want = []string{"required"}
			}
			for _, env := range f.Envs {
				want = append(want, "$"+env)
			}
			for _, w := range want {
				if !strings.Contains(entry, w) {
					t.Errorf("%s --help: the entry of --%s does not show %q:\n%s", s.Command, s.Flag, w, entry)
				}
			}
		}
	})
}

// CheckEnvs fails t unless every flag of k can also be set from the
// environment, as each daemon's flags can.
func CheckEnvs(t testing.TB, k *kong.Kong) {
	t.Helper()
	for _, s := range Settings(k) {
		if s.Env == "" {
			t.Errorf("%s --%s: has no environment variable; give it an env tag", s.Command, s.Flag)
		}
	}
}

// CheckBadEnv fails t unless parsing args with env set to a value its flag
// cannot take fails, naming env, with a non-zero exit code.
func CheckBadEnv(t testing.TB, k *kong.Kong, env, value string, args ...string) {
	t.Helper()
	Unsetenv(t, k)
	t.Setenv(env, value)
	printed, code := Run(t, k, args...)
	if code <= 0 {
		t.Errorf("%s=%q: want a non-zero exit code, got %d", env, value, code)
	}
	if !strings.Contains(printed, env) {
		t.Errorf("%s=%q: the error does not name the variable:\n%s", env, value, printed)
	}
}

// helpEntry is the text help shows for the flag name, its wrapped lines
// joined.
func helpEntry(help, name string) string {
	var entry []string
	in := false
	for line := range strings.SplitSeq(help, "\n") {
		field := strings.Fields(line)
		switch {
		case len(field) == 0:
			in = false
		case isFlag(field, name):
			in = true
		case strings.HasPrefix(field[0], "-"):
			in = false
		}
		if in {
			entry = append(entry, field...)
		}
	}
	return strings.Join(entry, " ")
}

// isFlag tells whether a help line starts the entry of --name, with or
// without a short form ("-h, --help") and a placeholder ("--poll=DURATION").
func isFlag(field []string, name string) bool {
	for _, f := range field[:min(2, len(field))] {
		f, _, _ = strings.Cut(f, "=")
		if f == "--"+name || f == "--[no-]"+name {
			return true
		}
	}
	return false
}

// Case is one way a user sets a binary's flags (its environment and its
// arguments), and the settings the binary must parse them into.
type Case[T any] struct {
	Reason string
	Env    map[string]string
	Args   []string
	Want   T
}

// CheckCases parses each case into a fresh T, with the parser newParser
// builds for it, and fails t where the settings differ from the case's
// Want (compared with opts), naming the case.
func CheckCases[T any](t testing.TB, newParser func(testing.TB, *T) *kong.Kong, cases map[string]Case[T], opts ...cmp.Option) {
	t.Helper()
	each(t, cases, func(t testing.TB, name string, tc Case[T]) {
		var got T
		Parse(t, newParser(t, &got), tc.Env, tc.Args...)
		if diff := cmp.Diff(tc.Want, got, opts...); diff != "" {
			t.Errorf("%s: %s\n-want, +got:\n%s", name, tc.Reason, diff)
		}
	})
}

// BadEnv is an environment variable set to a value the binary must
// refuse.
type BadEnv struct{ Env, Value string }

// CheckBadEnvs checks each case as CheckBadEnv does, each on a fresh
// parser.
func CheckBadEnvs[T any](t testing.TB, newParser func(testing.TB, *T) *kong.Kong, cases map[string]BadEnv) {
	t.Helper()
	each(t, cases, func(t testing.TB, _ string, tc BadEnv) {
		var c T
		CheckBadEnv(t, newParser(t, &c), tc.Env, tc.Value)
	})
}

// each runs check on each case, in name order: in a subtest of its own
// where t is a test (so that what one case sets in the environment is gone
// for the next), one after the other on t otherwise (a recorder).
func each[C any](t testing.TB, cases map[string]C, check func(t testing.TB, name string, tc C)) {
	t.Helper()
	for _, name := range slices.Sorted(maps.Keys(cases)) {
		if tt, ok := t.(*testing.T); ok {
			tt.Run(name, func(t *testing.T) { check(t, name, cases[name]) })
			continue
		}
		check(t, name, cases[name])
	}
}

// With is base as f changes it.
func With[T any](base T, f func(*T)) T {
	f(&base)
	return base
}
