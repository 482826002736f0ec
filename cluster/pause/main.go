// Command pause is the sandbox ("pause") image of `make cluster`: the first
// process of every pod, which only holds the pod's namespaces open until
// the kubelet stops it. containerd's sandbox_image names it, so the node
// needs no image from the internet.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	// As PID 1 the process also inherits orphans; reap them so that
	// none stays a zombie.
	reap := make(chan os.Signal, 1)
	signal.Notify(reap, syscall.SIGCHLD)
	for {
		select {
		case <-sig:
			os.Exit(0)
		case <-reap:
			for {
				var ws syscall.WaitStatus
				if pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil); pid <= 0 || err != nil {
					break
				}
			}
		}
	}
}
