package main

import "syscall"

// sysProcAttr starts the command in its own process group, and has the
// kernel kill it when egressctl dies, even by SIGKILL or the OOM killer,
// as it would otherwise go on using the proxy on a lease nobody renews and
// nobody releases. The kernel sends the signal to the command alone, not
// to what it started. It also sends it when the thread that started the
// command ends, which the Go runtime only does for a goroutine that ends
// locked to its thread; egressctl locks none.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
