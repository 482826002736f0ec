package clitest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"
	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli"
)

// recorder collects what a check reports instead of failing the test, so
// that a test can show the check fails on a broken binary.
type recorder struct {
	testing.TB
	errors []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

type good struct {
	Poll time.Duration `help:"How often to look, in a help text long enough to be wrapped over more than one line of the help." default:"1m" env:"CLITEST_POLL"`
	Name string        `help:"Who." default:"" env:"CLITEST_NAME"`
	Sub  struct {
		Zone string `help:"Where." default:"" env:"CLITEST_ZONE"`
	} `cmd:"" help:"A subcommand."`
}

// newGood builds good's parser, as a binary's test builds its own.
func newGood(t testing.TB, g *good) *kong.Kong { return New(t, "sample", "A sample.", g) }

type noDefault struct {
	Poll time.Duration `help:"How often." env:"CLITEST_POLL"`
}

type noEnv struct {
	Poll time.Duration `help:"How often." default:"1m"`
}

func TestChecks(t *testing.T) {
	plain := kong.ValueFormatter(func(v *kong.Value) string { return v.Help })
	cases := map[string]struct {
		reason  string
		grammar any
		opts    []kong.Option
		check   func(t testing.TB, k *kong.Kong)
		want    []string
	}{
		"HelpFollowsConvention": {
			reason:  "A binary that follows the convention passes CheckHelp, with its subcommands and wrapped help.",
			grammar: &good{},
			check:   CheckHelp,
		},
		"HelpWithoutEnvOrDefault": {
			reason:  "CheckHelp fails when help does not show a flag's variable and default.",
			grammar: &good{},
			opts:    []kong.Option{plain},
			check:   CheckHelp,
			want: []string{
				"the entry of --poll does not show \"default 1m\"", "the entry of --poll does not show \"$CLITEST_POLL\"",
				"the entry of --name does not show \"default \\\"\\\"\"", "the entry of --name does not show \"$CLITEST_NAME\"",
				"the entry of --zone does not show \"default \\\"\\\"\"", "the entry of --zone does not show \"$CLITEST_ZONE\"",
			},
		},
		"HelpWithoutDefaultTag": {
			reason:  "CheckHelp fails when a flag states no default.",
			grammar: &noDefault{},
			check:   CheckHelp,
			want:    []string{"--poll: states no default", "the entry of --poll does not show \"default \\\"\\\"\""},
		},
		"FlagWithoutEnv": {
			reason:  "CheckEnvs fails on a flag without a variable.",
			grammar: &noEnv{},
			check:   CheckEnvs,
			want:    []string{"--poll: has no environment variable"},
		},
		"BadEnvNamed": {
			reason:  "CheckBadEnv passes when a bad value is an error naming its variable.",
			grammar: &good{},
			check:   func(t testing.TB, k *kong.Kong) { CheckBadEnv(t, k, "CLITEST_POLL", "often", "sub") },
		},
		"BadEnvAccepted": {
			reason:  "CheckBadEnv fails when the value is taken.",
			grammar: &good{},
			check:   func(t testing.TB, k *kong.Kong) { CheckBadEnv(t, k, "CLITEST_NAME", "anyone", "sub") },
			want:    []string{"want a non-zero exit code, got -1", "the error does not name the variable"},
		},
		"CasesParsed": {
			grammar: &good{},
			reason:  "CheckCases passes when each case parses into its settings.",
			check: func(t testing.TB, _ *kong.Kong) {
				CheckCases(t, newGood, map[string]Case[good]{
					"Defaults": {Args: []string{"sub"}, Want: With(good{Poll: time.Minute}, func(g *good) {})},
					"Env":      {Env: map[string]string{"CLITEST_NAME": "ann"}, Args: []string{"sub", "--zone=a"}, Want: With(good{Poll: time.Minute}, func(g *good) { g.Name, g.Sub.Zone = "ann", "a" })},
				})
			},
		},
		"CasesDiffer": {
			grammar: &good{},
			reason:  "CheckCases fails, naming the case, where the settings differ from its Want.",
			check: func(t testing.TB, _ *kong.Kong) {
				CheckCases(t, newGood, map[string]Case[good]{"FlagIgnored": {Args: []string{"sub", "--name=bob"}, Want: good{Poll: time.Minute}}})
			},
			want: []string{"FlagIgnored: "},
		},
		"BadEnvsAccepted": {
			grammar: &good{},
			reason:  "CheckBadEnvs checks every case: the one value taken fails.",
			check: func(t testing.TB, _ *kong.Kong) {
				CheckBadEnvs(t, newGood, map[string]BadEnv{"Refused": {Env: "CLITEST_POLL", Value: "often"}, "Taken": {Env: "CLITEST_NAME", Value: "anyone"}})
			},
			want: []string{`CLITEST_NAME="anyone": the error does not name the variable`},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			k, err := cli.New("sample", "A sample.", tc.grammar, tc.opts...)
			if err != nil {
				t.Fatal(err)
			}
			r := &recorder{TB: t}
			tc.check(r, k)
			if diff := cmp.Diff(len(tc.want), len(r.errors)); diff != "" {
				t.Errorf("%s\nnumber of reports: -want, +got:\n%s\n%s", tc.reason, diff, strings.Join(r.errors, "\n"))
			}
			for _, w := range tc.want {
				if !strings.Contains(strings.Join(r.errors, "\n"), w) {
					t.Errorf("%s\nwant a report containing %q, got:\n%s", tc.reason, w, strings.Join(r.errors, "\n"))
				}
			}
		})
	}
}
