package testbed

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// standIn is a test that records its failures instead of failing. Only the
// methods below may be called; the others reach the nil testing.TB.
type standIn struct {
	testing.TB
	msgs []string
}

func (s *standIn) Helper()                   {}
func (s *standIn) Log(...any)                {}
func (s *standIn) Logf(string, ...any)       {}
func (s *standIn) Error(args ...any)         { s.msgs = append(s.msgs, fmt.Sprint(args...)) }
func (s *standIn) Errorf(f string, a ...any) { s.msgs = append(s.msgs, fmt.Sprintf(f, a...)) }
func (s *standIn) Fatal(args ...any)         { s.Error(args...); runtime.Goexit() }
func (s *standIn) Fatalf(f string, a ...any) { s.Errorf(f, a...); runtime.Goexit() }

// Failure runs check against a stand-in test and returns what check failed
// it with, or "" when it passed: it shows a checker failing on a
// deliberately broken input. check may call Helper, Log, Logf, Error,
// Errorf, Fatal and Fatalf.
func Failure(check func(t testing.TB)) string {
	s := &standIn{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		check(s)
	}()
	<-done
	return strings.Join(s.msgs, "\n")
}
