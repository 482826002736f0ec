package local

import (
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// claimPort reserves a port with a file created O_EXCL under .ports, which
// is atomic between concurrent creates in this and any other provider
// process sharing the state dir, so two proxies never get the same port.
// With a port range, ports another program already listens on are skipped.
func (b *Backend) claimPort(s backend.Spec) (int32, error) {
	candidates := []int32{s.Port}
	if pr := b.cfg.PortRange; pr != nil {
		candidates = candidates[:0]
		for p := pr.From; p <= pr.To; p++ {
			candidates = append(candidates, p)
		}
	}
	host := string(s.Local.BindAddress)
	for _, p := range candidates {
		f, err := os.OpenFile(b.portFile(p), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			if !errors.Is(err, os.ErrExist) {
				return 0, errors.Wrap(err, "cannot claim port")
			}
			if owner, _ := os.ReadFile(b.portFile(p)); string(owner) == s.Name {
				return p, nil
			}
			continue
		}
		_, _ = f.WriteString(s.Name)
		_ = f.Close()
		if b.cfg.PortRange != nil && !bindable(host, p) {
			// Someone outside this provider holds it; keep our claim file
			// out of the way and try the next.
			_ = os.Remove(b.portFile(p))
			continue
		}
		return p, nil
	}
	if b.cfg.PortRange != nil {
		return 0, backend.Errorf(backend.ClassQuota, "no free port in %d-%d: widen spec.local.portRange of the ProviderConfig", b.cfg.PortRange.From, b.cfg.PortRange.To)
	}
	owner, _ := os.ReadFile(b.portFile(s.Port))
	return 0, backend.Errorf(backend.ClassPermanent, "port %d is taken by local proxy %s: choose another spec.forProvider.port or give the ProviderConfig a portRange", s.Port, owner)
}

func (b *Backend) portFile(p int32) string {
	return filepath.Join(b.cfg.StateDir, dirPorts, strconv.Itoa(int(p)))
}

func (b *Backend) releasePort(p int32, name string) {
	if owner, err := os.ReadFile(b.portFile(p)); err == nil && string(owner) == name {
		_ = os.Remove(b.portFile(p))
	}
}

func bindable(host string, p int32) bool {
	l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(int(p))))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}
