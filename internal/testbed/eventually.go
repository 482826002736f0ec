package testbed

import (
	"testing"
	"time"
)

// pollInterval is how often Eventually asks again.
const pollInterval = 100 * time.Millisecond

// Eventually asks cond every 100ms until it reports done, and fails t when
// timeout passes first, naming what it waited for and the state cond last
// described. cond is asked at least once, and once more at the deadline.
//
// A test that checks something did not happen waits here first for a
// positive event that would have come before it, never on a sleep.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (done bool, state string)) {
	t.Helper()
	EventuallyEvery(t, timeout, pollInterval, what, cond)
}

// EventuallyEvery is Eventually asking every interval: for a cond costly
// enough (listing thousands of objects) that asking ten times a second
// would be the load being measured.
func EventuallyEvery(t testing.TB, timeout, every time.Duration, what string, cond func() (done bool, state string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		done, state := cond()
		if done {
			return
		}
		if !time.Now().Before(deadline) {
			t.Fatalf("waited %s for %s; last seen: %s", timeout, what, state)
		}
		time.Sleep(min(every, time.Until(deadline)))
	}
}
