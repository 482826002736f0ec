package gateway

import (
	"crypto/tls"
	"net"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// quietFor is how long c's socket has neither sent nor received data, as
// its kernel says; false when it cannot tell.
func quietFor(c net.Conn) (time.Duration, bool) {
	for {
		switch x := c.(type) {
		case *tls.Conn:
			c = x.NetConn()
			continue
		case *bufferedConn:
			c = x.Conn
			continue
		}
		break
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0, false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	var ierr error
	if err := raw.Control(func(fd uintptr) { info, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil || ierr != nil {
		return 0, false
	}
	return time.Duration(min(info.Last_data_recv, info.Last_data_sent)) * time.Millisecond, true
}
