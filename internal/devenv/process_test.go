package devenv

import "testing"

func TestWhy(t *testing.T) {
	cases := map[string]struct {
		reason string
		out    string
		want   string
	}{
		"ErrorLine": {
			reason: "The line naming the error is what the progress shows, not the log noise after it.",
			out:    "{\"level\":\"info\"}\ncrossplane: error: cannot initialize core: no matches for kind \"Lock\"\n{\"level\":\"debug\",\"msg\":\"x\"}\n",
			want:   "crossplane: error: cannot initialize core: no matches for kind \"Lock\"",
		},
		"NoErrorLine": {
			reason: "Without one, the last line.",
			out:    "first\nlast\n",
			want:   "last",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := why([]byte(tc.out)); got != tc.want {
				t.Errorf("%s\ngot %q, want %q", tc.reason, got, tc.want)
			}
		})
	}
}
