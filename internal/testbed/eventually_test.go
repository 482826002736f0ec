package testbed

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// run calls Eventually as a test would and returns its failure message, or
// "" when it returned.
func run(timeout time.Duration, what string, cond func() (bool, string)) string {
	return Failure(func(t testing.TB) { Eventually(t, timeout, what, cond) })
}

func TestEventually(t *testing.T) {
	t.Run("ReturnsOnceDone", func(t *testing.T) {
		asked := 0
		msg := run(10*time.Second, "the third call", func() (bool, string) {
			asked++
			return asked == 3, fmt.Sprintf("call %d", asked)
		})
		if msg != "" || asked != 3 {
			t.Errorf("want a return on the third call, got %d calls and failure %q", asked, msg)
		}
	})
	t.Run("FailsNamingWhatAndLastState", func(t *testing.T) {
		asked := 0
		msg := run(250*time.Millisecond, "the impossible", func() (bool, string) {
			asked++
			return false, fmt.Sprintf("state %d", asked)
		})
		for _, want := range []string{"250ms", "the impossible", fmt.Sprintf("last seen: state %d", asked)} {
			if !strings.Contains(msg, want) {
				t.Errorf("the failure must say %q, got %q", want, msg)
			}
		}
		if asked < 2 {
			t.Errorf("want cond asked again before the deadline, asked %d times", asked)
		}
	})
	t.Run("AsksOnceEvenWithNoTime", func(t *testing.T) {
		if msg := run(0, "anything", func() (bool, string) { return true, "" }); msg != "" {
			t.Errorf("a condition that already holds passes with no time left, got %q", msg)
		}
	})
}
