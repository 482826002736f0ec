package local

import (
	"net"
	"os"
	"path/filepath"
	"strconv"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
)

// What a create is refused with when it finds no port: the range's bounds,
// or the port and the local proxy holding it.
const (
	errFmtNoFreePort = "no free port in %d-%d: widen spec.local.portRange of the ProviderConfig"
	errFmtPortTaken  = "port %d is taken by local proxy %s: choose another spec.forProvider.port or give the ProviderConfig a portRange"
)

// claimPort reserves a port with a file created O_EXCL under .ports, which
// is atomic between concurrent creates in this and any other provider
// process sharing the state dir, so two proxies never get the same port.
// With a port range, ports another program already listens on are skipped.
//
// It reports whether the claim is fresh: only a fresh claim is released
// when the create fails, never one another create of the instance (in
// another provider process sharing the state dir) made and uses. Claims
// are made under the lock of the ports folder, which the sweep of
// leftovers holds while it judges them.
func (b *Backend) claimPort(s backend.Spec, staging string) (int32, bool, error) {
	candidates := []int32{s.Port}
	pr := b.PortRange()
	if pr != nil {
		candidates = candidates[:0]
		for p := pr.From; p <= pr.To; p++ {
			candidates = append(candidates, p)
		}
	}
	host := string(s.Local.BindAddress)
	// A claim appears whole or not at all: it is written beside the
	// staging folder's files and hard-linked into place, which fails when
	// the port is claimed. A claim created empty and written after would be
	// left empty, and its port lost for good, by a provider killed between
	// the two (found by the provider-kill fault test).
	tmp := filepath.Join(staging, ".port-claim")
	if err := os.WriteFile(tmp, []byte(s.Name), 0o644); err != nil { //nolint:gosec // Read by the provider only; no secret.
		return 0, false, errors.Wrap(err, "cannot write port claim")
	}
	unlock, err := lockDir(filepath.Join(b.cfg.StateDir, dirPorts))
	if err != nil {
		return 0, false, err
	}
	defer unlock()
	defer os.Remove(tmp) //nolint:errcheck // The claim, if any, is linked.
	for _, p := range candidates {
		if err := os.Link(tmp, b.portFile(p)); err != nil {
			if !errors.Is(err, os.ErrExist) {
				return 0, false, errors.Wrap(err, "cannot claim port")
			}
			if owner, _ := os.ReadFile(b.portFile(p)); string(owner) == s.Name {
				return p, false, nil
			}
			continue
		}
		if pr != nil && !bindable(host, p) {
			// Someone outside this provider holds it; keep our claim file
			// out of the way and try the next.
			_ = os.Remove(b.portFile(p))
			continue
		}
		return p, true, nil
	}
	if pr != nil {
		return 0, false, backend.Errorf(backend.ClassQuota, errFmtNoFreePort, pr.From, pr.To)
	}
	owner, _ := os.ReadFile(b.portFile(s.Port))
	return 0, false, backend.Errorf(backend.ClassPermanent, errFmtPortTaken, s.Port, owner)
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
