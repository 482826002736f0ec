// Package netns runs code inside a named network namespace (one `ip netns
// add` made), for the test hosts the tests and make cluster build.
package netns

import (
	"net"
	"os"
	"runtime"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"golang.org/x/sys/unix"
)

// Do runs f on an OS thread that has joined namespace ns. Sockets f opens
// stay in ns after the thread leaves it.
func Do(ns string, f func() error) error {
	runtime.LockOSThread()
	orig, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return errors.Wrap(err, "cannot open this thread's network namespace")
	}
	defer orig.Close() //nolint:errcheck // read-only
	target, err := os.Open("/var/run/netns/" + ns)
	if err != nil {
		runtime.UnlockOSThread()
		return errors.Wrapf(err, "cannot open network namespace %s", ns)
	}
	defer target.Close() //nolint:errcheck // read-only
	if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
		runtime.UnlockOSThread()
		return errors.Wrapf(err, "cannot enter network namespace %s", ns)
	}
	ferr := f()
	if err := unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET); err != nil {
		// The thread is stuck in ns: keep it locked, so that it exits with
		// this goroutine instead of running others there.
		return errors.Wrap(err, "cannot leave the network namespace")
	}
	runtime.UnlockOSThread()
	return ferr
}

// Listen listens on a TCP address inside namespace ns.
func Listen(ns, addr string) (net.Listener, error) {
	var ln net.Listener
	err := Do(ns, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}
