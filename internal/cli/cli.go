// Package cli is the one command-line convention of the product's binaries:
// a kong CLI struct whose every flag states its help and its default, and on
// the daemons an environment variable, and --help shows all three. A bad
// value in a flag or an environment variable stops the binary with an error
// that names it.
package cli

import (
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/alecthomas/kong"
)

// New returns the parser of grammar, a kong CLI struct, for the binary name.
// opts come after the convention's own, so that a test can redirect output.
func New(name, description string, grammar any, opts ...kong.Option) (*kong.Kong, error) {
	return kong.New(grammar, append([]kong.Option{
		kong.Name(name),
		kong.Description(description),
		kong.ValueFormatter(formatValue),
		kong.PostBuild(typePlaceholders),
	}, opts...)...)
}

// Parse parses the process's arguments into grammar. It exits after printing
// help, or after printing what was wrong with a flag or an environment
// variable. opts are New's: kong.Vars, say, for defaults a package keeps.
func Parse(name, description string, grammar any, opts ...kong.Option) *kong.Context {
	k, err := New(name, description, grammar, opts...)
	if err != nil {
		// Every binary's tests build its grammar, so this is never reached
		// in a release.
		panic(err)
	}
	ctx, code := ParseArgs(k, os.Args[1:])
	if ctx == nil {
		os.Exit(code)
	}
	return ctx
}

// ParseArgs parses args with k without exiting, for a binary that returns
// its exit code and for tests. When the binary must not go on, because it
// printed help or an error, ctx is nil and code is what to exit with.
func ParseArgs(k *kong.Kong, args []string) (ctx *kong.Context, code int) {
	exited := -1
	exit := k.Exit
	defer func() { k.Exit = exit }()
	// --help exits from inside Parse; recording the code lets parsing
	// finish and its later errors, such as a missing required flag, be
	// ignored.
	k.Exit = func(code int) {
		if exited < 0 {
			exited = code
		}
	}
	ctx, err := k.Parse(args)
	if exited < 0 && err != nil {
		k.FatalIfErrorf(err)
	}
	if exited >= 0 {
		return nil, exited
	}
	return ctx, 0
}

// Duration writes d as a flag's default reads best in --help: 1m, not
// 1m0s; for kong.Vars that pass a package's default to a flag.
func Duration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// formatValue ends a flag's help with where else it can be set and what it
// is when unset: "How often to sweep ($SWEEP_INTERVAL; default 30s)."
func formatValue(v *kong.Value) string {
	if v.Flag == nil {
		return v.Help
	}
	var notes []string
	for _, env := range v.Tag.Envs {
		notes = append(notes, "$"+env)
	}
	switch {
	case v.Required:
		notes = append(notes, "required")
	case v.HasDefault:
		notes = append(notes, "default "+Default(v))
	}
	if len(notes) == 0 {
		return v.Help
	}
	return strings.TrimSuffix(v.Help, ".") + " (" + strings.Join(notes, "; ") + ")."
}

// Default is how help shows v's default: quoted when v is a string or the
// default is empty, so that an empty default is visible.
func Default(v *kong.Value) string {
	if v.Target.Kind() == reflect.String || v.Default == "" {
		return strconv.Quote(v.Default)
	}
	return v.Default
}

// typePlaceholders names a flag's value by its type, "--poll=DURATION",
// where kong would show the default, which formatValue already shows.
func typePlaceholders(k *kong.Kong) error {
	return kong.Visit(k.Model, func(n kong.Visitable, next kong.Next) error {
		if f, ok := n.(*kong.Flag); ok && f.PlaceHolder == "" && f.Target.Type().Name() != "" {
			f.PlaceHolder = strings.ToUpper(f.Target.Type().Name())
		}
		return next(nil)
	})
}
