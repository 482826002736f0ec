//go:build !linux

package main

import "syscall"

// sysProcAttr starts the command in its own process group. Only Linux can
// kill it when egressctl dies.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
