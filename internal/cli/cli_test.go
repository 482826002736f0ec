package cli_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/cli/clitest"
)

type sample struct {
	Poll  time.Duration `help:"How often to look." default:"1m" env:"CLI_TEST_POLL"`
	Debug bool          `help:"Log more." default:"false" env:"CLI_TEST_DEBUG"`
	Name  string        `help:"Who; empty means nobody." default:"" env:"CLI_TEST_NAME"`
	Fleet string        `help:"The fleet." required:""`
}

func TestParse(t *testing.T) {
	cases := map[string]struct {
		reason   string
		env      map[string]string
		args     []string
		wantCode int
		want     string
	}{
		"Help": {
			reason:   "Help shows each flag's type, environment variable and default, and exits 0 though a required flag is missing.",
			args:     []string{"--help"},
			wantCode: 0,
			want: `Usage: sample --fleet=STRING [flags]

A sample.

Flags:
  -h, --help             Show context-sensitive help.
      --poll=DURATION    How often to look ($CLI_TEST_POLL; default 1m).
      --debug            Log more ($CLI_TEST_DEBUG; default false).
      --name=STRING      Who; empty means nobody ($CLI_TEST_NAME; default "").
      --fleet=STRING     The fleet (required).
`,
		},
		"BadEnv": {
			reason:   "A bad value in a variable is an error naming the variable.",
			env:      map[string]string{"CLI_TEST_POLL": "often"},
			args:     []string{"--fleet=f"},
			wantCode: 1,
			want:     `sample: error: --poll: expected duration but got "often": time: invalid duration "often" (from envar CLI_TEST_POLL="often")` + "\n",
		},
		"BadFlag": {
			reason:   "A bad flag is a usage error.",
			args:     []string{"--fleet=f", "--poll=often"},
			wantCode: 80,
			want:     `sample: error: --poll: expected duration but got "often": time: invalid duration "often"` + "\n",
		},
		"Run": {
			reason:   "Good flags leave the binary to run.",
			args:     []string{"--fleet=f"},
			wantCode: -1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			k, err := cli.New("sample", "A sample.", &sample{})
			if err != nil {
				t.Fatal(err)
			}
			clitest.Unsetenv(t, k)
			for name, value := range tc.env {
				t.Setenv(name, value)
			}
			printed, code := clitest.Run(t, k, tc.args...)
			if code != tc.wantCode {
				t.Errorf("%s\nexit code: want %d, got %d", tc.reason, tc.wantCode, code)
			}
			if diff := cmp.Diff(tc.want, printed); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

// TestDuration: a package's duration is written as --help shows flags'
// defaults, without zero units.
func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Minute: "1m", 5 * time.Minute: "5m", 90 * time.Second: "1m30s", 10 * time.Second: "10s", time.Hour: "1h", 2*time.Hour + 30*time.Minute: "2h30m", 1500 * time.Millisecond: "1.5s"} {
		if got := cli.Duration(d); got != want {
			t.Errorf("Duration(%s) = %q, want %q", d, got, want)
		}
	}
}
