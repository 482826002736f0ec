package allocator

import (
	"context"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// FleetName says whether a fleet could have this namespace and name.
func FleetName(namespace, name string) bool {
	return len(validation.IsDNS1123Label(namespace)) == 0 && len(validation.IsDNS1123Subdomain(name)) == 0
}

// AuthorizeFleet checks a fleet named in a path and authorises its use.
// Names no fleet can have cost no access review, nor a cache entry.
func (s *Allocator) AuthorizeFleet(ctx context.Context, id *auth.Identity, namespace, name string) error {
	if !FleetName(namespace, name) {
		return problem.ErrFleetNotFound
	}
	return s.Auth.Authorize(ctx, id, namespace, name)
}

// Fleet checks and authorises a fleet named in a path, and returns its
// proxies.
func (s *Allocator) Fleet(ctx context.Context, id *auth.Identity, namespace, name string) ([]catalog.Member, error) {
	if err := s.AuthorizeFleet(ctx, id, namespace, name); err != nil {
		return nil, err
	}
	return s.Members(ctx, namespace, name)
}

// Members returns a fleet's proxies; a fleet without any is not found.
func (s *Allocator) Members(ctx context.Context, namespace, name string) ([]catalog.Member, error) {
	ms, err := s.Catalog.Fleet(ctx, namespace, name)
	if err != nil {
		return nil, err
	}
	if len(ms) == 0 {
		return nil, problem.ErrFleetNotFound
	}
	return ms, nil
}

// CountHealthy counts the healthy proxies of ms.
func CountHealthy(ms []catalog.Member) int {
	n := 0
	for _, m := range ms {
		if m.Healthy {
			n++
		}
	}
	return n
}

// Healthy filters a fleet's proxies: healthy, not draining (being
// replaced), accepting the auth Secret's credentials, in the zone, not
// excluded, not banned for the domain, nor leaving from an egress IP
// banned for it through another proxy. It returns the fleet's bans too.
func (s *Allocator) Healthy(ctx context.Context, ms []catalog.Member, zone string, exclude map[string]bool, domain string) ([]catalog.Member, map[string][]string, error) {
	var bans map[string][]string
	if len(ms) > 0 {
		var err error
		if bans, err = s.Leases.Bans(ctx, ms[0].Namespace, ms[0].Fleet); err != nil {
			return nil, nil, err
		}
	}
	admit, err := s.Admits(ctx, ms, zone, exclude, domain)
	if err != nil {
		return nil, nil, err
	}
	out := make([]catalog.Member, 0, len(ms))
	for i := range ms {
		if admit(&ms[i]) {
			out = append(out, ms[i])
		}
	}
	return out, bans, nil
}

// Admits says which of a fleet's proxies (ms, sorted by name) healthy
// keeps, one at a time: an acquisition in a large fleet asks it of a
// sample. It reads the bans for the domain only, none without one.
func (s *Allocator) Admits(ctx context.Context, ms []catalog.Member, zone string, exclude map[string]bool, domain string) (func(*catalog.Member) bool, error) {
	var banned, bannedIPs map[string]bool
	if len(ms) > 0 && domain != "" {
		var err error
		if banned, bannedIPs, err = s.bannedFor(ctx, ms, domain); err != nil {
			return nil, err
		}
	}
	return func(m *catalog.Member) bool {
		if !m.Serving() || (zone != "" && m.Zone != zone) || exclude[m.Name] {
			return false
		}
		return !banned[m.Name] && (m.EgressIP == "" || len(bannedIPs) == 0 || !bannedIPs[m.EgressIP] && !bannedIPs[m.CanonicalIP()])
	}, nil
}

// bannedFor reads what is banned for domain in the fleet of ms: the
// proxies banned for it, and the egress IPs, since a target that banned a
// proxy banned its IP (every proxy leaving from that IP is banned for the
// domain too), and may have banned the address before this proxy had it
// (its history says until when).
func (s *Allocator) bannedFor(ctx context.Context, ms []catalog.Member, domain string) (banned, bannedIPs map[string]bool, err error) {
	ns, fleet := ms[0].Namespace, ms[0].Fleet
	if banned, err = s.Leases.BannedFor(ctx, ns, fleet, domain); err != nil {
		return nil, nil, err
	}
	bannedIPs = map[string]bool{}
	for name := range banned {
		// A banned proxy not among ms (the gateway asks of one proxy) is
		// read from the cache.
		ip := ""
		if m := catalog.MemberNamed(ms, name); m != nil {
			ip = m.EgressIP
		} else if s.Catalog != nil && s.Catalog.Cache != nil {
			p := &v1alpha1.Proxy{}
			if err := s.Catalog.Cache.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, p); err == nil && fleetv1alpha1.FleetName(p) == fleet {
				ip = catalog.ToMember(p).EgressIP
			}
		}
		if ip != "" {
			bannedIPs[ip] = true
		}
	}
	a, err := s.addressesOf(ctx, ns, fleet)
	if err != nil {
		return nil, nil, err
	}
	for ip := range a.banned[strings.ToLower(domain)] {
		bannedIPs[ip] = true
	}
	return banned, bannedIPs, nil
}
