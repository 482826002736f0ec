package testbed

import (
	"fmt"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
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
// ports until each listens again (or a few minutes pass): a child crashed
// on purpose gets its ports back when it starts again, however many
// clients reconnect meanwhile, each from a new local port in the same
// range. Where the sysctl is not writable (not root) it does nothing.
func holdPorts(ports []int) {
	if len(ports) == 0 || !changeReserved(ports, true) {
		return
	}
	go func() {
		for deadline := time.Now().Add(3 * time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if slices.IndexFunc(ports, func(p int) bool { return !listening(p) }) < 0 {
				break
			}
		}
		changeReserved(ports, false)
	}()
}

func listening(port int) bool {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return false
	}
	_ = c.Close()
	return true
}

// changeReserved adds ports to the reserved set, or takes them out;
// false when it cannot.
func changeReserved(ports []int, add bool) bool {
	reserving.Lock()
	defer reserving.Unlock()
	b, err := os.ReadFile(reservedPorts)
	if err != nil {
		return false
	}
	var kept []string
	for _, r := range strings.Split(strings.TrimSpace(string(b)), ",") {
		if r == "" {
			continue
		}
		if p, err := strconv.Atoi(r); err == nil && slices.Contains(ports, p) {
			continue
		}
		kept = append(kept, r)
	}
	if add {
		for _, p := range ports {
			kept = append(kept, strconv.Itoa(p))
		}
	}
	return os.WriteFile(reservedPorts, []byte(strings.Join(kept, ",")+"\n"), 0o644) == nil //nolint:gosec // A sysctl.
}
