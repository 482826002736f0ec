package testbed

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// reservedPorts is the kernel's set of ports it never hands out as a
// connection's local port (ip_local_reserved_ports).
const reservedPorts = "/proc/sys/net/ipv4/ip_local_reserved_ports"

// reserving serialises changes to reservedPorts.
var reserving sync.Mutex

// listeningPorts are the TCP ports pid listens on, from its sockets'
// inodes and /proc/net/tcp{,6}.
func listeningPorts(pid int) []int {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(l, "socket:["); err == nil && ok {
			inodes[strings.TrimSuffix(inode, "]")] = true
		}
	}
	var ports []int
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			// sl local_address rem_address st ... uid timeout inode
			if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] {
				continue
			}
			_, hex, _ := strings.Cut(f[1], ":")
			if p, err := strconv.ParseInt(hex, 16, 32); err == nil && !slices.Contains(ports, int(p)) {
				ports = append(ports, int(p))
			}
		}
	}
	return ports
}

// holdPorts keeps the kernel from handing ports out as connections' local
// ports until each listens again (or three minutes pass, when it is let go
// all the same): a child crashed on purpose gets its ports back when it
// starts again, however many clients reconnect meanwhile, each from a new
// local port in the same range. Where the sysctl is not writable (not
// root) it does nothing.
func holdPorts(ports []int) {
	if len(ports) == 0 || !changeReserved(ports, true) {
		return
	}
	go func() {
		left := slices.Clone(ports)
		for deadline := time.Now().Add(3 * time.Minute); len(left) > 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			var back []int
			left = slices.DeleteFunc(left, func(p int) bool {
				if listening(p) {
					back = append(back, p)
					return true
				}
				return false
			})
			if len(back) > 0 {
				changeReserved(back, false)
			}
		}
		changeReserved(left, false)
	}()
}

func listening(port int) bool {
	for _, host := range []string{"127.0.0.1", "::1"} {
		if c, err := net.DialTimeout("tcp", net.JoinHostPort(host, strconv.Itoa(port)), time.Second); err == nil {
			_ = c.Close()
			return true
		}
	}
	return false
}

// changeReserved adds ports to the reserved set, or takes them out, keeping
// every other entry (the kernel prints the set as ranges, a-b); false when
// it cannot. A lock file serialises it between test processes, which share
// the sysctl.
func changeReserved(ports []int, add bool) bool {
	if len(ports) == 0 {
		return true
	}
	reserving.Lock()
	defer reserving.Unlock()
	lock, err := os.OpenFile(filepath.Join(os.TempDir(), "egress-testbed-reserved-ports.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return false
	}
	defer lock.Close() //nolint:errcheck // A lock file.
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return false
	}
	b, err := os.ReadFile(reservedPorts)
	if err != nil {
		return false
	}
	set := map[int]bool{}
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(r), "-")
		l, err := strconv.Atoi(lo)
		if err != nil {
			continue
		}
		h := l
		if isRange {
			if h, err = strconv.Atoi(hi); err != nil {
				continue
			}
		}
		for p := l; p <= h && p <= 65535; p++ {
			set[p] = true
		}
	}
	for _, p := range ports {
		set[p] = add
	}
	var on []int
	for p, ok := range set {
		if ok {
			on = append(on, p)
		}
	}
	slices.Sort(on)
	var out []string
	for i := 0; i < len(on); {
		j := i
		for j+1 < len(on) && on[j+1] == on[j]+1 {
			j++
		}
		if j > i {
			out = append(out, fmt.Sprintf("%d-%d", on[i], on[j]))
		} else {
			out = append(out, strconv.Itoa(on[i]))
		}
		i = j + 1
	}
	return os.WriteFile(reservedPorts, []byte(strings.Join(out, ",")+"\n"), 0o644) == nil //nolint:gosec // A sysctl.
}
