package allocator

import (
	"context"
	"fmt"
	"hash/fnv"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/publicsuffix"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/lease"
)

// DefaultCooldown is a ban's cooldown when the report names none.
const DefaultCooldown = 30 * time.Minute

// recentBanTime is how long a ban this replica recorded is counted
// besides its cache: longer than the cache takes to show it.
const recentBanTime = 10 * time.Second

type recentBan struct {
	ban lease.Ban
	at  time.Time
}

// recentBans returns the bans this replica recorded in the fleet in the
// last recentBanTime that listed does not hold yet, forgetting older ones.
func (s *Allocator) recentBans(key string, listed []lease.Ban) []lease.Ban {
	s.banMu.Lock()
	defer s.banMu.Unlock()
	var out []lease.Ban
	kept := s.bansMade[key][:0]
	for _, r := range s.bansMade[key] {
		if s.Now().Sub(r.at) >= recentBanTime {
			continue
		}
		kept = append(kept, r)
		if !slices.ContainsFunc(listed, func(b lease.Ban) bool { return b.Proxy == r.ban.Proxy && strings.EqualFold(b.Domain, r.ban.Domain) }) {
			out = append(out, r.ban)
		}
	}
	if len(kept) == 0 {
		delete(s.bansMade, key)
	} else {
		s.bansMade[key] = kept
	}
	return out
}

// banLocks is how many locks serialise bans, each for the fleets whose
// key hashes to it.
const banLocks = 64

// lockBans takes the lock of the fleet ns/fleet's bans, or gives up when
// ctx ends first (a caller that hung up leaves the queue behind a slow
// write); the function returned unlocks it.
func (s *Allocator) lockBans(ctx context.Context, ns, fleet string) (func(), error) {
	h := fnv.New32a()
	_, _ = h.Write([]byte(ns + "/" + fleet))
	lock := s.banRecord[h.Sum32()%banLocks]
	select {
	case lock <- struct{}{}:
		return func() { <-lock }, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Ban checks a new ban, reported by id, against the bounds and records
// it, one at a time per fleet on a replica, so that reports racing on it
// cannot pass a bound together.
func (s *Allocator) Ban(ctx context.Context, ns, fleet, proxy, domain string, cooldown time.Duration, id *auth.Identity) error {
	return s.ban(ctx, ns, fleet, proxy, domain, cooldown, id, 0)
}

// BanFromAnswer is Ban for an origin's answer with status to a request of
// id's through the gateway. Such bans are bounded apart from reported
// ones: they count neither against id's bound nor the fleet's, but
// against one of their own, a quarter of the fleet's (an origin chooses
// the host names its answers ban, and must not use up what the crawlers'
// own reports may record). And an origin's answers ban at most half of
// the fleet's serving proxies for a domain, counting every proxy that
// leaves from a banned one's egress IP: one that refuses everyone (a
// login wall) cannot cost the fleet the domain.
func (s *Allocator) BanFromAnswer(ctx context.Context, ns, fleet, proxy, domain string, cooldown time.Duration, id *auth.Identity, status int) error {
	return s.ban(ctx, ns, fleet, proxy, domain, cooldown, id, status)
}

// ban is Ban (status 0) and BanFromAnswer.
func (s *Allocator) ban(ctx context.Context, ns, fleet, proxy, domain string, cooldown time.Duration, id *auth.Identity, status int) error {
	unlock, err := s.lockBans(ctx, ns, fleet)
	if err != nil {
		return err
	}
	defer unlock()
	bans, err := s.Leases.ActiveBans(ctx, ns, fleet)
	if err != nil {
		return err
	}
	// With the bans this replica recorded lately, which its cache may not
	// show yet: reports racing on one replica count each other.
	bans = append(bans, s.recentBans(ns+"/"+fleet, bans)...)
	extends, err := s.banAllowed(bans, ns, fleet, proxy, domain, id, status != 0)
	if err != nil {
		return err
	}
	if status != 0 && !extends {
		if err := s.keepsHalf(ctx, bans, ns, fleet, proxy, domain); err != nil {
			return err
		}
	}
	if status != 0 {
		err = s.Leases.BanFromAnswer(ctx, ns, fleet, proxy, domain, cooldown, id.User, status, s.Replica)
	} else {
		err = s.Leases.Ban(ctx, ns, fleet, proxy, domain, cooldown, id.User)
	}
	if err != nil {
		return err
	}
	// The target banned the proxy's address: its history keeps the ban
	// past the proxy, for whichever proxy leaves from it next.
	record := s.Leases.RecordIPBan
	if status != 0 {
		record = s.Leases.RecordAnswerIPBan
	}
	if err := record(ctx, ns, fleet, proxy, s.EgressIPOf(ctx, ns, fleet, proxy), domain, cooldown); err != nil {
		return err
	}
	s.addresses.forget(ns + "/" + fleet)
	s.banMu.Lock()
	defer s.banMu.Unlock()
	key := ns + "/" + fleet
	// An extended ban is one ban, not another, and stays whose it was (as
	// the store keeps it): only its time moves on.
	i := slices.IndexFunc(s.bansMade[key], func(r recentBan) bool {
		return r.ban.Proxy == proxy && strings.EqualFold(r.ban.Domain, domain)
	})
	switch {
	case i >= 0:
		s.bansMade[key][i].at = s.Now()
	case !extends:
		s.bansMade[key] = append(s.bansMade[key], recentBan{ban: lease.Ban{Proxy: proxy, Domain: domain, Identity: id.User, FromAnswer: status != 0, Replica: s.Replica}, at: s.Now()})
	}
	return nil
}

// addressOf is the address a target sees m at: its egress IP, canonical;
// the proxy itself while its IP is not known (a fleet whose health check
// echoes no address never learns it, and counting every such proxy as one
// address would leave its answers no ban at all).
func addressOf(m *catalog.Member) string {
	if ip := lease.CanonicalIP(m.EgressIP); ip != "" {
		return ip
	}
	return "proxy:" + m.Name
}

// keepsHalf refuses a ban from an origin's answer that would leave fewer
// than half of the fleet's serving proxies serving domain: the proxy, and
// every serving proxy leaving from its egress IP (the target banned the
// address), go out with it. What is out already is read as an acquisition
// reads it (bans of proxies and of their IPs, and IP histories), and
// bans, the fleet's live bans with this replica's recent ones.
//
// Replicas check from their own caches, and two racing on one fleet could
// each pass the rule on a view without the other's bans: so each replica
// also keeps the answer bans it recorded itself (by the replica mark on
// their Leases, and its recent ones) within its share of the half, one
// replica's of the fleet's replicas (Replicas). Their answer bans together
// stay within half however they race; with other bans out already (a
// crawler's reports, which are not bound so), racing replicas may pass
// the half by what they write at the same moment. A fleet of fewer
// serving proxies than twice its replicas gets no answer bans (its
// crawlers report bans through the API).
func (s *Allocator) keepsHalf(ctx context.Context, bans []lease.Ban, ns, fleet, proxy, domain string) error {
	ms, err := s.Catalog.Fleet(ctx, ns, fleet)
	if err != nil {
		return err
	}
	admits, err := s.Admits(ctx, ms, "", nil, domain)
	if err != nil {
		return err
	}
	self := catalog.MemberNamed(ms, proxy)
	if self == nil {
		// Not (yet, or any more) the fleet's as the catalogue shows it: its
		// address cannot be counted, and a ban of its name would pass to
		// whichever proxy takes the name next.
		return banLimit(fmt.Sprintf("proxy %s is not among fleet %s/%s's proxies as this replica sees them: an origin's answer bans only a proxy it can count", proxy, ns, fleet))
	}
	// The addresses banned for domain (this replica's recent bans, which
	// its cache may not show yet, among them), and those its answer bans
	// hold.
	banned, mine := map[string]bool{}, map[string]bool{}
	for _, b := range bans {
		m := catalog.MemberNamed(ms, b.Proxy)
		if m == nil || !strings.EqualFold(b.Domain, domain) {
			continue
		}
		banned[addressOf(m)] = true
		if b.FromAnswer && b.Replica == s.Replica {
			mine[addressOf(m)] = true
		}
	}
	target := addressOf(self)
	serving, out, newly, own := 0, 0, 0, 0
	for i := range ms {
		m := &ms[i]
		if !m.Serving() {
			continue
		}
		serving++
		a := addressOf(m)
		if mine[a] {
			own++
		}
		switch {
		case !admits(m) || banned[a]:
			out++
		case a == target:
			newly++
		}
	}
	replicas := s.replicasOf(ctx, ns, fleet)
	if newly == 0 || (2*(out+newly) <= serving && 2*replicas*(own+newly) <= serving) {
		return nil
	}
	return banLimit(fmt.Sprintf("an origin's answers ban at most half of fleet %s/%s's %d serving proxies for %s, each of its %d replicas its share: %d are out for it already (%d by this replica's answers), and this ban would take %d more (its egress IP's)", ns, fleet, serving, domain, replicas, out, own, newly))
}

// EgressIPOf is a proxy's egress IP as the catalogue shows it; "" when it
// is not known (nor the proxy the fleet's).
func (s *Allocator) EgressIPOf(ctx context.Context, ns, fleet, proxy string) string {
	ms, err := s.Catalog.Fleet(ctx, ns, fleet)
	if err != nil {
		return ""
	}
	if m := catalog.MemberNamed(ms, proxy); m != nil {
		return m.EgressIP
	}
	return ""
}

// RecentBans is how far back a ban in an egress IP's history makes the
// IP one handed out after clean ones.
const RecentBans = 24 * time.Hour

// addressMemory is how long a fleet's indexed IP histories are used before
// they are read again: an acquisition costs one lookup, not a parse of
// every history. A ban this replica records drops the fleet's index: the
// next acquisition reads it again, as far as the cache shows it then.
const addressMemory = time.Second

// addresses is a fleet's egress IP histories, indexed: the IPs with a ban
// within RecentBans, and those banned now, by domain.
type addresses struct {
	at      time.Time
	tainted map[string]bool
	banned  map[string]map[string]bool
}

// maxAddressBooks bounds the fleets whose indexed histories are kept.
const maxAddressBooks = 1024

// addressBook holds the fleets' indexed histories; a full book starts over.
type addressBook struct {
	mu sync.Mutex
	m  map[string]*addresses
}

// forget drops a fleet's index: a ban was recorded.
func (b *addressBook) forget(key string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, key)
}

// addressesOf is the fleet's indexed IP histories, read at most every
// addressMemory.
func (s *Allocator) addressesOf(ctx context.Context, ns, fleet string) (*addresses, error) {
	key, now := ns+"/"+fleet, s.Now()
	s.addresses.mu.Lock()
	a, ok := s.addresses.m[key]
	s.addresses.mu.Unlock()
	if ok && now.Sub(a.at) < addressMemory && !now.Before(a.at) {
		return a, nil
	}
	hist, err := s.Leases.IPHistories(ctx, ns, fleet)
	if err != nil {
		return nil, err
	}
	a = &addresses{at: now, tainted: map[string]bool{}, banned: map[string]map[string]bool{}}
	since := now.Add(-RecentBans).Unix()
	for ip, h := range hist {
		for _, b := range h {
			if b.At >= since {
				a.tainted[ip] = true
			}
			if b.Until > now.Unix() {
				if a.banned[b.Domain] == nil {
					a.banned[b.Domain] = map[string]bool{}
				}
				a.banned[b.Domain][ip] = true
			}
		}
	}
	s.addresses.mu.Lock()
	if s.addresses.m == nil || len(s.addresses.m) >= maxAddressBooks {
		s.addresses.m = map[string]*addresses{}
	}
	s.addresses.m[key] = a
	s.addresses.mu.Unlock()
	return a, nil
}

// LiftIPBan ends the live ban of domain in the history of proxy's egress IP
// (an "ok" report on it): the address serves the domain again at once.
func (s *Allocator) LiftIPBan(ctx context.Context, ns, fleet, proxy, domain string) error {
	if err := s.Leases.LiftIPBan(ctx, ns, fleet, s.EgressIPOf(ctx, ns, fleet, proxy), domain); err != nil {
		return err
	}
	s.addresses.forget(ns + "/" + fleet)
	return nil
}

// Tainted are the egress IPs (lease.CanonicalIP) of the fleet with a ban
// in their history within RecentBans: handed out after clean ones. Read
// it, never change it.
func (s *Allocator) Tainted(ctx context.Context, ns, fleet string) (map[string]bool, error) {
	a, err := s.addressesOf(ctx, ns, fleet)
	if err != nil {
		return nil, err
	}
	return a.tainted, nil
}

// banLimit is the refusal of a ban over a bound.
func banLimit(msg string) *problem.Error {
	return &problem.Error{Code: problem.StatusTooManyRequests, Reason: apiv1.ReasonBanLimit, Msg: msg}
}

// MaxAnswerHostsPerSite is how many hosts of one registrable domain an
// origin's answers may hold live bans for in a fleet.
const MaxAnswerHostsPerSite = 8

// registrableDomain is the part of domain one party registers
// (publicsuffix: a.b.example.co.uk is example.co.uk), by which an origin's
// answers are bounded: a host with wildcard DNS names as many hosts as it
// likes. An address or a name with no known suffix is itself.
func registrableDomain(domain string) string {
	d := strings.ToLower(strings.TrimSuffix(domain, "."))
	if r, err := publicsuffix.EffectiveTLDPlusOne(d); err == nil {
		return r
	}
	return d
}

// banAllowed checks a new ban against the bounds, and says whether it
// extends one that is live already (always allowed). A reported ban
// counts against the fleet's bound and the identity's; one from an
// origin's answer (answer) against a quarter of the fleet's, of such bans
// alone, and for at most MaxAnswerHostsPerSite hosts of one registrable
// domain: a site with wildcard DNS names as many hosts as it likes, and
// each may ban half the fleet. Replicas count from their caches, so the
// bounds hold up to what they grant at the same moment. bans are the
// fleet's live bans with this replica's recent ones.
func (s *Allocator) banAllowed(bans []lease.Ban, ns, fleet, proxy, domain string, id *auth.Identity, answer bool) (bool, error) {
	reported, answered, mine := 0, 0, 0
	registrable, hosts := registrableDomain(domain), map[string]bool{}
	for _, b := range bans {
		if b.Proxy == proxy && strings.EqualFold(b.Domain, domain) {
			return true, nil
		}
		switch {
		case b.FromAnswer:
			answered++
			if registrableDomain(b.Domain) == registrable {
				hosts[strings.ToLower(b.Domain)] = true
			}
		case b.Identity == id.User:
			mine++
			reported++
		default:
			reported++
		}
	}
	switch {
	case answer && s.MaxBansPerFleet > 0 && answered >= max(1, s.MaxBansPerFleet/4):
		return false, banLimit(fmt.Sprintf("fleet %s/%s has %d live bans from origins' answers, their bound (a quarter of --max-bans-per-fleet)", ns, fleet, answered))
	case answer && !hosts[strings.ToLower(domain)] && len(hosts) >= MaxAnswerHostsPerSite:
		return false, banLimit(fmt.Sprintf("fleet %s/%s has live bans from the answers of %d hosts of %s, their bound: a site's answers ban proxies for at most %d of its hosts (report more through the API)", ns, fleet, len(hosts), registrable, MaxAnswerHostsPerSite))
	case answer:
		return false, nil
	case s.MaxBansPerFleet > 0 && reported >= s.MaxBansPerFleet:
		return false, banLimit(fmt.Sprintf("fleet %s/%s has %d live bans, its bound (--max-bans-per-fleet): lift some with an \"ok\" report, or wait for their cooldowns", ns, fleet, reported))
	case s.MaxBansPerIdentity > 0 && mine >= s.MaxBansPerIdentity:
		return false, banLimit(fmt.Sprintf("%s has %d live bans in fleet %s/%s, its bound (--max-bans-per-identity)", id.User, mine, ns, fleet))
	}
	return false, nil
}
