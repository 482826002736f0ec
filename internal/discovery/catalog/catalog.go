// Package catalog is egress-discovery's read model: the fleets and proxies
// of the cached watch of Proxy objects (members, with health, zone, egress
// IP and maxLeases, remembered per fleet until one of its Proxies
// changes), each fleet's lease and gateway policy read from its ProxyFleet
// or claim, the proxies' credentials from their auth Secrets, and what a
// fleet's XR says of its size, in catalog.go; version.go is the version
// that any change of the cached Proxies and Leases bumps. It writes
// nothing.
package catalog

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
)

// Member is a Proxy as the catalogue sees it.
type Member struct {
	Namespace, Fleet, Name, Zone string
	Host                         string
	Port                         int32
	EgressIP                     string
	LatencyMs                    int64
	Healthy                      bool
	MaxLeases                    int
	AuthSecret                   *v1alpha1.AuthSecretReference
	// DrainSince is when the fleet began to replace the proxy (zero when
	// it does not): it takes no new leases.
	DrainSince time.Time
	// CredentialGrace is how long the proxy accepts its previous
	// credentials after they change: remembered credentials are used for
	// at most half of it, so that none handed out has lapsed.
	CredentialGrace time.Duration
	// CredentialsOutdated: the proxy accepts only the auth Secret's
	// previous credentials, which discovery no longer has, until its
	// fleet replaces it; it is handed to no new crawler.
	CredentialsOutdated bool
	// Booting: it has not yet been Ready (being created, or awaiting its
	// first probe).
	Booting bool
	// Reach is where the gateway may dial it, as its kind justifies; an
	// External proxy's private networks are the gateway's to add.
	Reach reach.Rule
	// PlatformVM: a VM of the platform's cloud account (reach.PlatformVM).
	PlatformVM bool
	// Pool is the ProxyPool composing it, in a pooled fleet.
	Pool string
	// BeyondDiversityLimit: its network holds as many of the fleet's
	// proxies as spec.diversity allows already (the fleet labels it): it
	// is handed out last, as one sharing its egress IP is.
	BeyondDiversityLimit bool
	// Problem says why it is not Ready or not healthy: its last probe's
	// error, else its Ready condition's message or reason.
	Problem string
	// Network is the network a target groups its egress IP in (NetworkOf),
	// worked out once per version of the Proxy.
	Network string
	// IP is EgressIP in the form bans are remembered by (lease.CanonicalIP),
	// parsed once per version of the Proxy.
	IP string
}

// NetworkOf is the network a target groups a proxy's egress IP in: its
// IPv4 /24 or IPv6 /64; an IP not known (or not parsed) is a network of
// its own, named after the IP or the proxy.
func NetworkOf(egressIP, proxy string) string {
	network, _ := parseEgress(egressIP, proxy)
	return network
}

// parseEgress is NetworkOf and the canonical form of egressIP (as
// lease.CanonicalIP: IPv4-mapped as IPv4, no zone; "" when not an
// address), from one parse.
func parseEgress(egressIP, proxy string) (network, canonical string) {
	if egressIP == "" {
		return "proxy:" + proxy, ""
	}
	ip, err := netip.ParseAddr(egressIP)
	if err != nil {
		return "ip:" + egressIP, ""
	}
	return egressip.PrefixOf(ip).String(), ip.Unmap().WithZone("").String()
}

// CanonicalIP is m.IP, worked out if it was not.
func (m *Member) CanonicalIP() string {
	if m.IP != "" || m.EgressIP == "" {
		return m.IP
	}
	_, ip := parseEgress(m.EgressIP, m.Name)
	return ip
}

// NetworkKey is m.Network, worked out if it was not.
func (m *Member) NetworkKey() string {
	if m.Network != "" {
		return m.Network
	}
	return NetworkOf(m.EgressIP, m.Name)
}

// Serving says whether the proxy may be handed to new crawlers: healthy,
// not being replaced, and taking the credentials discovery hands out.
func (m Member) Serving() bool {
	return m.Healthy && m.DrainSince.IsZero() && !m.CredentialsOutdated
}

// Endpoint is host:port.
func (m Member) Endpoint() string { return net.JoinHostPort(m.Host, strconv.Itoa(int(m.Port))) }

// Config is what New builds a Catalog from.
type Config struct {
	// Cache is the manager's cached reader (Proxies, fleets).
	Cache client.Reader
	// Direct reads Secrets (and fleets, when Fleets is nil) without a cache.
	Direct client.Reader
	// Fleets, when set, is a cached watch of ProxyFleet XRs (unstructured;
	// Crossplane may not be installed), so that fleets without proxies yet
	// are listed and lease TTLs are read without an API call.
	Fleets client.Reader
	// Now is the clock of the lease TTLs remembered; nil means time.Now.
	Now func() time.Time
}

// Catalog reads fleets and proxies from the cached watch of Proxy objects:
// fleet -> proxies with health, latency, zone, egress IP and maxLeases.
// Build it with New.
type Catalog struct {
	Config

	// creds remembers proxy credentials briefly, so that granting a lease
	// does not read a Secret every time. It is a convenience, not a record:
	// a rotated password is picked up within credentialsTTL.
	mu    sync.Mutex
	creds map[string]cachedCreds
	ttls  map[string]cachedPolicy

	// members remembers each fleet's members as of its version, which
	// every cache event of one of its Proxies bumps, so that an
	// acquisition does not list, convert and sort a fleet of 10 000 at
	// every try, nor does a change in another fleet make it. Without an
	// informer to watch (Cache is a plain reader) nothing is kept.
	watchOnce sync.Once
	events    *proxyEvents
	members   map[string]*Members
	// all remembers the members of every fleet as All groups them, as of
	// allVersion of every Proxy: the summary publisher asks each second,
	// and a fleet at rest is not listed, converted and sorted again.
	all        map[string][]Member
	allVersion uint64
}

// New builds a Catalog, its zero settings taking their defaults.
func New(cfg Config) *Catalog {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Catalog{Config: cfg}
}

// maxRemembered bounds the fleets whose members are remembered.
const maxRemembered = 1024

// Members are a fleet's members as of a version of its Proxies, with
// what every acquisition asks of all of them worked out once. Shared:
// read it, never change it.
type Members struct {
	Version uint64
	// Items are sorted by name.
	Items []Member
	// PerIP counts the members by known egress IP (SharedIPs).
	PerIP map[string]int
	// Own and Shared index the members leaving from an egress IP of their
	// own (or none known) and those sharing one or beyond the fleet's
	// diversity caps (Crowded), which are handed out last; Zones counts
	// them by zone.
	Own, Shared []int32
	Zones       map[string]int
	// Serving counts the members that serve, Awake those that serve or
	// are not booting (the healthy fraction admission counts).
	Serving, Awake int
}

// NewMembers are ms (sorted by name) as of version, with what every
// acquisition asks of them worked out.
func NewMembers(version uint64, ms []Member) *Members {
	f := &Members{Version: version, Items: ms, PerIP: SharedIPs(ms), Zones: map[string]int{}}
	f.Serving, f.Awake = CountServing(ms)
	for i := range ms {
		m := &ms[i]
		f.Zones[m.Zone]++
		if f.Crowded(m) {
			f.Shared = append(f.Shared, int32(i))
		} else {
			f.Own = append(f.Own, int32(i))
		}
	}
	return f
}

// Crowded says whether m is handed out last: it shares its egress IP with
// another member, or its network holds as many of the fleet's proxies as
// spec.diversity allows already.
func (f *Members) Crowded(m *Member) bool {
	return f.PerIP[m.EgressIP] > 1 || m.BeyondDiversityLimit
}

// CountServing counts the members that serve, and those that serve or are
// not booting.
func CountServing(ms []Member) (serving, awake int) {
	for i := range ms {
		m := &ms[i]
		if m.Serving() {
			serving++
		}
		if !m.Booting || m.Serving() {
			awake++
		}
	}
	return serving, awake
}

// MemberNamed is the member of ms (sorted by name) named name, or nil.
func MemberNamed(ms []Member, name string) *Member {
	i := sort.Search(len(ms), func(i int) bool { return ms[i].Name >= name })
	if i < len(ms) && ms[i].Name == name {
		return &ms[i]
	}
	return nil
}

// proxyEvents counts the cache's Proxy events by fleet (namespace and
// fleet label).
type proxyEvents struct {
	// unknown counts the events whose Proxy the handler could not read:
	// every fleet's version includes it.
	unknown atomic.Uint64
	byFleet sync.Map // namespace/fleet label -> *atomic.Uint64
	// all counts every event, of any fleet's Proxy.
	all atomic.Uint64
}

func (e *proxyEvents) bump(obj any) {
	e.all.Add(1)
	if d, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	p, ok := obj.(*v1alpha1.Proxy)
	if !ok {
		e.unknown.Add(1)
		return
	}
	key := p.Namespace + "/" + p.Labels[fleetv1alpha1.LabelFleet]
	v, ok := e.byFleet.Load(key)
	if !ok {
		v, _ = e.byFleet.LoadOrStore(key, &atomic.Uint64{})
	}
	v.(*atomic.Uint64).Add(1) //nolint:forcetypeassert // Only counters are stored.
}

// version of the fleet whose key (namespace/fleet label) is given: it
// moves at each event of one of its Proxies, and of any Proxy unread.
// Asking about a fleet stores nothing.
func (e *proxyEvents) version(key string) uint64 {
	v := e.unknown.Load()
	if c, ok := e.byFleet.Load(key); ok {
		v += c.(*atomic.Uint64).Load() //nolint:forcetypeassert // Only counters are stored.
	}
	return v
}

// Policy is how a fleet's leases are granted, from its spec.leases.
type Policy struct {
	// DefaultTTL and MaxTTL bound a lease's TTL.
	DefaultTTL, MaxTTL time.Duration
	// Replicas is the fleet's spec.replicas: the share of healthy proxies
	// is counted against it, so that proxies gone altogether count as
	// unhealthy ones.
	Replicas int
	// MinHealthyFraction and MaxWait are spec.leases.admission's.
	MinHealthyFraction float64
	MaxWait            time.Duration
	// Autoscaled: spec.autoscaling sizes the fleet, and spec.replicas
	// (Replicas is then 0) is ignored.
	Autoscaled bool
	// Zones are spec.zones: an acquisition for another zone is no demand
	// a new proxy could meet.
	Zones []string
	// Quotas are spec.leases.quotas; nil sets no bound.
	Quotas *fleetv1alpha1.Quotas
	// MaxBanCooldown is the longest ban a report may ask for.
	MaxBanCooldown time.Duration
	// Rotation is spec.gateway.rotation: how the gateway chooses the
	// proxy of a connection without a session (apiv1.Rotate*).
	Rotation string
	// Pacing is spec.gateway.pacing, in order.
	Pacing []PacingRule
	// BanStatusCodes is spec.gateway.banStatusCodes: DefaultBanStatusCodes
	// unless the fleet lists its own (an empty list: none).
	BanStatusCodes []int
	// Recycling is spec.recycling; nil without it.
	Recycling *egressip.RecyclePolicy
}

// DefaultBanStatusCodes are the origin's answers the gateway counts as a
// ban when a fleet names none: 403 Forbidden, 429 Too Many Requests.
var DefaultBanStatusCodes = []int{403, 429}

// defaultPolicy is the policy of a fleet without a ProxyFleet or claim.
func defaultPolicy() *Policy {
	return policyOf(&fleetv1alpha1.ProxyFleetSpec{})
}

func policyOf(s *fleetv1alpha1.ProxyFleetSpec) *Policy {
	p := &Policy{MaxBanCooldown: s.Leases.BanCooldown()}
	p.DefaultTTL, p.MaxTTL = s.Leases.TTLs()
	if s.Replicas != nil {
		p.Replicas = int(*s.Replicas)
	}
	if s.Autoscaling != nil {
		p.Replicas, p.Autoscaled = 0, true
	}
	p.Zones = s.Zones
	p.Rotation = apiv1.RotateLeastRecentlyUsed
	p.BanStatusCodes = DefaultBanStatusCodes
	p.Recycling = egressip.PolicyOf(s.Recycling)
	if s.Gateway != nil && s.Gateway.BanStatusCodes != nil {
		p.BanStatusCodes = make([]int, 0, len(s.Gateway.BanStatusCodes))
		for _, c := range s.Gateway.BanStatusCodes {
			p.BanStatusCodes = append(p.BanStatusCodes, int(c))
		}
	}
	if s.Gateway != nil {
		if r, ok := apiv1.RotationStrategy(s.Gateway.Rotation); ok {
			p.Rotation = r
		}
		for i, r := range s.Gateway.Pacing {
			if r.Interval.Duration <= 0 || len(r.Domains) == 0 {
				continue
			}
			p.Pacing = append(p.Pacing, PacingRule{Index: i, Domains: r.Domains, Interval: r.Interval.Duration, Burst: max(int(r.Burst), 1)})
		}
	}
	if s.Leases == nil {
		return p
	}
	if a := s.Leases.Admission; a != nil {
		if a.MinHealthyFraction != nil {
			p.MinHealthyFraction = min(max(*a.MinHealthyFraction, 0), 1)
		}
		if a.MaxWait != nil {
			p.MaxWait = min(max(a.MaxWait.Duration, 0), MaxWait)
		}
	}
	p.Quotas = s.Leases.Quotas
	return p
}

// Serves says whether a new proxy of the fleet could be in zone ("" for
// any): only then is a refusal demand.
func (p *Policy) Serves(zone string) bool {
	return zone == "" || len(p.Zones) == 0 || slices.Contains(p.Zones, zone)
}

// MaxWait bounds any acquisition's wait, within the request timeout.
const MaxWait = 20 * time.Second

type cachedPolicy struct {
	p  *Policy
	at time.Time
}

// credentialsTTL bounds how long remembered credentials and lease TTL
// settings are used before they are read again; credentials are
// remembered for at least minCredentialsTTL, even for a proxy with no grace
// period, so that no fleet has every hand-out read its Secret.
const (
	credentialsTTL = 30 * time.Second
	// staleTTLs is how long lease TTLs read last stand in when they
	// cannot be read again.
	staleTTLs         = 5 * time.Minute
	minCredentialsTTL = 2 * time.Second
)

type cachedCreds struct {
	user *url.Userinfo
	at   time.Time
}

// ToMember is a Proxy as the catalogue sees it.
func ToMember(p *v1alpha1.Proxy) Member {
	ap := p.Status.AtProvider
	m := Member{
		Namespace: p.Namespace, Fleet: fleetv1alpha1.FleetName(p), Name: p.Name, Zone: p.Labels[fleetv1alpha1.LabelZone],
		Host: ap.Host, Port: ap.Port, EgressIP: ap.EgressIP, LatencyMs: ap.LatencyMilliseconds,
		Healthy:    ap.Healthy && p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue && ap.Host != "",
		MaxLeases:  int(p.Spec.ForProvider.MaxLeases),
		AuthSecret: p.Spec.ForProvider.AuthSecretRef,

		CredentialsOutdated: ap.CredentialsOutdated,
		CredentialGrace:     p.Spec.ForProvider.GracePeriod(),
		Reach:               reach.For(p, nil),
		PlatformVM:          reach.PlatformVM(p),
	}
	if m.MaxLeases < 1 {
		m.MaxLeases = 1
	}
	switch ready := p.GetCondition(xpv2.TypeReady); {
	case ready.Status == corev1.ConditionTrue:
	case ready.Reason == "", ready.Reason == xpv2.ReasonCreating, ready.Reason == v1alpha1.ReasonAwaitingProbe:
		m.Booting = true
	}
	m.DrainSince = DrainSince(p)
	m.Pool = p.Labels[fleetv1alpha1.LabelPool]
	m.BeyondDiversityLimit = p.Labels[fleetv1alpha1.LabelBeyondDiversityLimit] == "true"
	m.Network, m.IP = parseEgress(m.EgressIP, m.Name)
	if !m.Healthy {
		ready := p.GetCondition(xpv2.TypeReady)
		switch {
		case ap.LastProbeError != "":
			m.Problem = ap.LastProbeError
		case ready.Message != "":
			m.Problem = ready.Message
		default:
			m.Problem = string(ready.Reason)
		}
	}
	return m
}

// DrainSince reads when the fleet began to replace a proxy
// (fleetv1alpha1.LabelDrainingSince); zero when it does not.
func DrainSince(p *v1alpha1.Proxy) time.Time {
	v, err := strconv.ParseInt(p.Labels[fleetv1alpha1.LabelDrainingSince], 10, 64)
	if err != nil || v <= 0 {
		return time.Time{}
	}
	return time.Unix(v, 0).UTC()
}

// All returns every proxy that belongs to a fleet, by fleet (namespace/name),
// each fleet's sorted by name, and every fleet without proxies too. The
// slices are shared: read them, never change them. Until a Proxy changes
// in the cache, the proxies are not listed again.
func (c *Catalog) All(ctx context.Context) (map[string][]Member, error) {
	c.watchOnce.Do(c.watchProxies)
	byFleet, err := c.allMembers(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string][]Member, len(byFleet))
	for key, ms := range byFleet {
		out[key] = ms
	}
	if c.Fleets != nil {
		xrs := &unstructured.UnstructuredList{}
		xrs.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyFleetKind + "List"))
		// Read-only: names only, no deep copy of every fleet per call.
		if err := c.Fleets.List(ctx, xrs, client.UnsafeDisableDeepCopy); err == nil {
			for _, xr := range xrs.Items {
				if key := xr.GetNamespace() + "/" + xr.GetName(); out[key] == nil {
					out[key] = nil
				}
			}
		}
	}
	return out, nil
}

// allMembers are the members of every fleet's proxies, by fleet, as of
// the last Proxy event (remembered), or listed now when no informer is
// watched.
func (c *Catalog) allMembers(ctx context.Context) (map[string][]Member, error) {
	var v uint64
	if c.events != nil {
		// The version is read before the list: a Proxy changed meanwhile
		// bumps it past what is remembered, and the next call lists again.
		v = c.events.all.Load()
		c.mu.Lock()
		all, ok := c.all, c.all != nil && c.allVersion == v
		c.mu.Unlock()
		if ok {
			return all, nil
		}
	}
	l := &v1alpha1.ProxyList{}
	if err := c.Cache.List(ctx, l, client.UnsafeDisableDeepCopy, client.HasLabels{fleetv1alpha1.LabelFleet}); err != nil {
		return nil, errors.Wrap(err, "cannot list proxies")
	}
	all := map[string][]Member{}
	for i := range l.Items {
		m := ToMember(&l.Items[i])
		all[m.Namespace+"/"+m.Fleet] = append(all[m.Namespace+"/"+m.Fleet], m)
	}
	for key, ms := range all {
		sort.Slice(ms, func(i, j int) bool { return ms[i].Name < ms[j].Name })
		// Shared: a caller's append must make a copy, not write into
		// spare room another caller's slice sees.
		all[key] = slices.Clip(ms)
	}
	if c.events != nil {
		c.mu.Lock()
		c.all, c.allVersion = all, v
		c.mu.Unlock()
	}
	return all, nil
}

// Fleet returns a fleet's proxies, healthy or not, sorted by name. The
// slice is shared: read it, never change it.
func (c *Catalog) Fleet(ctx context.Context, namespace, fleet string) ([]Member, error) {
	f, err := c.Members(ctx, namespace, fleet)
	if err != nil {
		return nil, err
	}
	return f.Items, nil
}

// Members returns a fleet's proxies as Fleet does, with their counts.
func (c *Catalog) Members(ctx context.Context, namespace, fleet string) (*Members, error) {
	c.watchOnce.Do(c.watchProxies)
	if c.events == nil {
		ms, err := c.listFleet(ctx, namespace, fleet)
		if err != nil {
			return nil, err
		}
		return NewMembers(0, ms), nil
	}
	key := namespace + "/" + ownership.LabelValue(fleet)
	// The version is read before the list: a Proxy changed meanwhile
	// bumps it past what is remembered, and the next call lists again.
	v := c.events.version(key)
	c.mu.Lock()
	m, ok := c.members[key+"/"+fleet]
	c.mu.Unlock()
	if ok && m.Version == v {
		return m, nil
	}
	ms, err := c.listFleet(ctx, namespace, fleet)
	if err != nil {
		return nil, err
	}
	f := NewMembers(v, ms)
	if len(ms) == 0 {
		// A fleet without proxies is not remembered: any name may be
		// asked for.
		return f, nil
	}
	c.mu.Lock()
	if c.members == nil || len(c.members) >= maxRemembered {
		// Fleets come and go: a full memory starts over.
		c.members = map[string]*Members{}
	}
	c.members[key+"/"+fleet] = f
	c.mu.Unlock()
	return f, nil
}

// watchProxies counts the cache's Proxy events by fleet into events, if
// the cache is an informer's.
func (c *Catalog) watchProxies() {
	inf, ok := c.Cache.(cache.Informers)
	if !ok {
		return
	}
	// Not waiting for the informer to sync: a handler added later is
	// given every Proxy the informer holds, and a caller (a scrape, the
	// status page) must not wait past its own deadline for the sync.
	i, err := inf.GetInformer(context.Background(), &v1alpha1.Proxy{}, cache.BlockUntilSynced(false))
	if err != nil {
		return
	}
	e := &proxyEvents{}
	// An update bumps the fleets of both sides: a relabelled Proxy leaves
	// one and joins another.
	if _, err := i.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc: e.bump, DeleteFunc: e.bump, UpdateFunc: func(o, n any) { e.bump(o); e.bump(n) },
	}); err != nil {
		return
	}
	c.events = e
}

// listFleet lists a fleet's proxies from the cache.
func (c *Catalog) listFleet(ctx context.Context, namespace, fleet string) ([]Member, error) {
	l := &v1alpha1.ProxyList{}
	// Read-only use of the cache: members copy what they keep (the auth
	// Secret reference is only read), so no deep copy of every Proxy per
	// acquisition.
	if err := c.Cache.List(ctx, l, client.InNamespace(namespace), client.UnsafeDisableDeepCopy, client.MatchingLabels{fleetv1alpha1.LabelFleet: ownership.LabelValue(fleet)}); err != nil {
		return nil, errors.Wrap(err, "cannot list proxies")
	}
	out := make([]Member, 0, len(l.Items))
	for i := range l.Items {
		// A long name's label is a hash prefix: the exact name decides.
		if m := ToMember(&l.Items[i]); m.Fleet == fleet {
			out = append(out, m)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// TTLs returns a fleet's defaultTTL and maxTTL: see Policy.
func (c *Catalog) TTLs(ctx context.Context, namespace, fleet string) (time.Duration, time.Duration, error) {
	p, err := c.Policy(ctx, namespace, fleet)
	if err != nil {
		return 0, 0, err
	}
	return p.DefaultTTL, p.MaxTTL, nil
}

// Policy returns how a fleet's leases are granted, from its ProxyFleet (or
// ProxyFleetClaim), or the defaults when it has neither. It fails closed:
// a fleet that cannot be read (the API server failing) or whose spec does
// not parse is an error, never the defaults, which could be longer TTLs,
// or fewer bounds, than the fleet sets, unless its policy was read less
// than staleTTLs ago; and an error is not remembered.
func (c *Catalog) Policy(ctx context.Context, namespace, fleet string) (*Policy, error) {
	key := namespace + "/" + fleet
	now := c.Now()
	c.mu.Lock()
	t, ok := c.ttls[key]
	c.mu.Unlock()
	if ok && now.Sub(t.at) < credentialsTTL {
		return t.p, nil
	}
	p, err := c.readPolicy(ctx, namespace, fleet)
	if err != nil {
		// What was read last, for a while, rather than fail every
		// request while the API server is briefly away.
		if ok && now.Sub(t.at) < staleTTLs {
			return t.p, nil
		}
		return nil, err
	}
	c.mu.Lock()
	if c.ttls == nil || len(c.ttls) >= maxPolicies {
		c.ttls = map[string]cachedPolicy{}
	}
	c.ttls[key] = cachedPolicy{p: p, at: now}
	c.mu.Unlock()
	return p, nil
}

// maxPolicies bounds the policies remembered; callers reach only fleets
// that have proxies, but the bound costs nothing.
const maxPolicies = 4096

// readPolicy reads the lease policy of a fleet from its ProxyFleet, else
// from its ProxyFleetClaim; the defaults when it has neither (or their
// kinds are not installed).
func (c *Catalog) readPolicy(ctx context.Context, namespace, fleet string) (*Policy, error) {
	for _, kind := range []string{fleetv1alpha1.ProxyFleetKind, fleetv1alpha1.ProxyFleetClaimKind} {
		u := &unstructured.Unstructured{}
		u.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(kind))
		r := c.Direct
		if c.Fleets != nil && kind == fleetv1alpha1.ProxyFleetKind {
			r = c.Fleets
		}
		err := r.Get(ctx, types.NamespacedName{Namespace: namespace, Name: fleet}, u)
		switch {
		case kerrors.IsNotFound(err), meta.IsNoMatchError(err):
			continue
		case err != nil:
			return nil, errors.Wrapf(err, "cannot read the lease policy of fleet %s/%s", namespace, fleet)
		}
		spec, _, _ := unstructured.NestedMap(u.Object, "spec")
		s, err := fleetv1alpha1.SpecFrom(spec)
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read the lease policy of %s %s/%s", kind, namespace, fleet)
		}
		return policyOf(s), nil
	}
	return defaultPolicy(), nil
}

// ProxyURL is the proxy's URL with its credentials, read from its auth
// Secret. Credentials remembered from an earlier read are used for up to
// credentialsTTL, or half the proxy's credential grace period (but at least
// minCredentialsTTL) if that is shorter: after a password change a crawler may be handed the previous
// password for that long, and the proxy accepts it at least twice as long.
func (c *Catalog) ProxyURL(ctx context.Context, m Member) (string, error) {
	u := &url.URL{Scheme: "http", Host: m.Endpoint()}
	ref := m.AuthSecret
	if ref == nil {
		return u.String(), nil
	}
	uk, pk := ref.Keys()
	key := m.Namespace + "/" + ref.Name + "/" + uk + "/" + pk
	c.mu.Lock()
	cc, ok := c.creds[key]
	c.mu.Unlock()
	if !ok || time.Since(cc.at) > min(credentialsTTL, max(m.CredentialGrace/2, minCredentialsTTL)) {
		s := &corev1.Secret{}
		err := c.Direct.Get(ctx, types.NamespacedName{Namespace: m.Namespace, Name: ref.Name}, s)
		if kerrors.IsNotFound(err) {
			return "", &SecretError{Proxy: m.Name, Reason: fmt.Sprintf("its auth Secret %s/%s does not exist", m.Namespace, ref.Name)}
		}
		if err != nil {
			return "", errors.Wrapf(err, "cannot read the credentials of proxy %s", m.Name)
		}
		// Never hand out a Secret its owner did not mark for proxies:
		// the fleet's author merely named it.
		if err := v1alpha1.UsableSecret(s); err != nil {
			return "", &SecretError{Proxy: m.Name, Reason: err.Error()}
		}
		cc = cachedCreds{user: url.UserPassword(string(s.Data[uk]), string(s.Data[pk])), at: time.Now()}
		c.mu.Lock()
		if c.creds == nil {
			c.creds = map[string]cachedCreds{}
		}
		c.creds[key] = cc
		c.mu.Unlock()
	}
	u.User = cc.user
	return u.String(), nil
}

// A SecretError says a proxy's credentials cannot be handed out for a
// reason its fleet's owner must put right (not the API server failing).
type SecretError struct{ Proxy, Reason string }

func (e *SecretError) Error() string {
	return fmt.Sprintf("cannot hand out the credentials of proxy %s: %s", e.Proxy, e.Reason)
}

// ProxyExists says, for the lease sweeper, whether a Proxy may still exist:
// only one the cache knows to be gone does not. An error reading it (the
// cache not synced, say) is no proof, and sweeping on it would delete the
// leases of live proxies, so that their slots are granted twice. What
// it read is remembered, for one sweep (one goroutine): a proxy's ten
// leases read it once.
func ProxyExists(ctx context.Context, cache client.Reader) func(namespace, name string) bool {
	read := map[types.NamespacedName]bool{}
	return func(namespace, name string) bool {
		key := types.NamespacedName{Namespace: namespace, Name: name}
		exists, ok := read[key]
		if !ok {
			exists = !kerrors.IsNotFound(cache.Get(ctx, key, &v1alpha1.Proxy{}))
			read[key] = exists
		}
		return exists
	}
}

// ProxyOwner returns the owner reference that makes a proxy's leases and
// bans go with the Proxy, read from the cache; nil when the Proxy is not
// there.
func ProxyOwner(cache client.Reader) func(ctx context.Context, namespace, proxy string) *metav1.OwnerReference {
	return func(ctx context.Context, namespace, proxy string) *metav1.OwnerReference {
		p := &v1alpha1.Proxy{}
		if err := cache.Get(ctx, types.NamespacedName{Namespace: namespace, Name: proxy}, p); err != nil || p.UID == "" {
			return nil
		}
		return &metav1.OwnerReference{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.ProxyKind, Name: p.Name, UID: p.UID}
	}
}

// ProxyController names the fleet a proxy belongs to, for the fleet's
// records that outlive the proxy (lease.Store.FleetOwnerOf): its
// controller (the fleet's XR), or in a pooled fleet, whose Proxies a
// ProxyPool controls, the ProxyFleet itself as fleets (a reader of
// ProxyFleets) shows it, since a pool may go while its fleet stays. A
// plain reference, which blocks no deletion and needs no permission on
// the owner; nil when not known.
func ProxyController(cache, fleets client.Reader) func(ctx context.Context, namespace, proxy string) *metav1.OwnerReference {
	return func(ctx context.Context, namespace, proxy string) *metav1.OwnerReference {
		p := &v1alpha1.Proxy{}
		if err := cache.Get(ctx, types.NamespacedName{Namespace: namespace, Name: proxy}, p); err != nil {
			return nil
		}
		c := metav1.GetControllerOf(p)
		if c == nil {
			return nil
		}
		if c.Kind != fleetv1alpha1.ProxyPoolKind {
			return &metav1.OwnerReference{APIVersion: c.APIVersion, Kind: c.Kind, Name: c.Name, UID: c.UID}
		}
		if fleets == nil {
			return nil
		}
		f := &unstructured.Unstructured{}
		f.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyFleetKind))
		if err := fleets.Get(ctx, types.NamespacedName{Namespace: namespace, Name: fleetv1alpha1.FleetName(p)}, f); err != nil || f.GetUID() == "" {
			return nil
		}
		return &metav1.OwnerReference{APIVersion: f.GetAPIVersion(), Kind: f.GetKind(), Name: f.GetName(), UID: f.GetUID()}
	}
}

// ProxyServing says whether a proxy may still be handed out with a slot,
// as the cache shows it now (healthy, not draining, taking the credentials
// discovery hands out, still the fleet's, and the slot below its
// maxLeases): the lease store asks it once a take is in flight
// (lease.Store.Serving).
func ProxyServing(cache client.Reader) func(ctx context.Context, namespace, fleet, proxy string, slot int) bool {
	return func(ctx context.Context, namespace, fleet, proxy string, slot int) bool {
		p := &v1alpha1.Proxy{}
		if err := cache.Get(ctx, types.NamespacedName{Namespace: namespace, Name: proxy}, p); err != nil {
			return false
		}
		m := ToMember(p)
		return m.Serving() && m.Fleet == fleet && slot < m.MaxLeases
	}
}

// CacheOptions make discovery's cache hold only the Leases it made, found
// by their kind label, so that the cluster's other Leases (node heartbeats
// every 10s per node, leader elections) neither cost it memory nor churn
// its snapshots; and hold no object's managedFields, which discovery never
// reads (about half of a cached Proxy: at 10 000 proxies and as many
// leases, memory, and the garbage collector's work at every acquisition).
// An update of a cached object sends none, and the API server keeps its
// own.
func CacheOptions() cache.Options {
	sel := labels.NewSelector()
	if r, err := labels.NewRequirement(fleetv1alpha1.LabelLeaseKind, selection.Exists, nil); err == nil {
		sel = sel.Add(*r)
	}
	return cache.Options{
		ByObject:         map[client.Object]cache.ByObject{&coordv1.Lease{}: {Label: sel}},
		DefaultTransform: cache.TransformStripManagedFields(),
	}
}

// FleetSizing is what a fleet's XR status says of its size: how many
// proxies it aims at and, for an autoscaled fleet, why, and the demand it
// was sized by, summed over every discovery replica.
type FleetSizing struct {
	Desired                int
	Autoscaled             bool
	Reason                 string
	Held, Waiting, Refused int64
	Capacity               int64
	// MaxUnavailable is spec.rotation.maxUnavailable: the fleet is
	// degraded below Desired - MaxUnavailable healthy proxies.
	MaxUnavailable int
	// RolloutStalled is the XR's RolloutStalled condition.
	RolloutStalled bool
	// Recycling is what the fleet's status says of its recycles; nil
	// without spec.recycling.
	Recycling *FleetRecycling
}

// FleetRecycling is a fleet's recycling as its XR says it.
type FleetRecycling struct {
	// MaxPerHour is spec.recycling.maxPerHour (its default where unset).
	MaxPerHour int
	// Recycles are when status.egress.recycles started each, and the kind
	// of its reason (egressip.ReasonKind).
	Recycles []RecycleMark
	// SeenAgain and Burned are status.egress's, Waiting its
	// recycleWaiting (why the burned wait) and AtBound its
	// recyclesAtBound.
	SeenAgain, Burned int
	Waiting           string
	AtBound           bool
}

// RecycleMark is one recycle of status.egress.recycles.
type RecycleMark struct {
	At   time.Time
	Kind string
}

// Sizing reads a fleet's sizing from the cached ProxyFleet XR; nil when
// fleets are not watched, the fleet has no XR, or the function has not yet
// said what it aims at.
func (c *Catalog) Sizing(ctx context.Context, namespace, fleet string) *FleetSizing {
	if c.Fleets == nil {
		return nil
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(fleetv1alpha1.SchemeGroupVersion.WithKind(fleetv1alpha1.ProxyFleetKind))
	if err := c.Fleets.Get(ctx, types.NamespacedName{Namespace: namespace, Name: fleet}, u); err != nil {
		return nil
	}
	desired, ok, err := unstructured.NestedFieldNoCopy(u.Object, "status", "desiredReplicas")
	if !ok || err != nil {
		return nil
	}
	sz := &FleetSizing{}
	switch n := desired.(type) {
	case int64:
		sz.Desired = int(n)
	case float64:
		sz.Desired = int(n)
	default:
		return nil
	}
	_, sz.Autoscaled, _ = unstructured.NestedMap(u.Object, "spec", "autoscaling")
	sz.Reason, _, _ = unstructured.NestedString(u.Object, "status", "autoscaling", "reason")
	for k, to := range map[string]*int64{"held": &sz.Held, "waiting": &sz.Waiting, "refused": &sz.Refused, "capacity": &sz.Capacity} {
		*to, _, _ = unstructured.NestedInt64(u.Object, "status", "autoscaling", k)
	}
	if n, ok, _ := unstructured.NestedInt64(u.Object, "spec", "rotation", "maxUnavailable"); ok && n > 0 {
		sz.MaxUnavailable = int(n)
	}
	conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conds {
		if m, ok := c.(map[string]any); ok && m["type"] == "RolloutStalled" {
			sz.RolloutStalled = m["status"] == "True"
		}
	}
	sz.Recycling = recyclingOf(u)
	return sz
}

// recyclingOf reads a fleet XR's spec.recycling and status.egress; nil
// for a fleet that recycles nothing (neither spec.recycling nor
// spec.diversity.replaceBeyondLimit).
func recyclingOf(u *unstructured.Unstructured) *FleetRecycling {
	spec, ok, _ := unstructured.NestedMap(u.Object, "spec", "recycling")
	if replace, _, _ := unstructured.NestedBool(u.Object, "spec", "diversity", "replaceBeyondLimit"); !ok && !replace {
		return nil
	}
	r := &FleetRecycling{MaxPerHour: egressip.PolicyOf(&fleetv1alpha1.Recycling{}).MaxPerHour}
	if n, ok, _ := unstructured.NestedInt64(spec, "maxPerHour"); ok && n > 0 {
		r.MaxPerHour = int(n)
	}
	if n, ok, _ := unstructured.NestedInt64(u.Object, "status", "egress", "seenAgain"); ok {
		r.SeenAgain = int(n)
	}
	if n, ok, _ := unstructured.NestedInt64(u.Object, "status", "egress", "burned"); ok {
		r.Burned = int(n)
	}
	r.Waiting, _, _ = unstructured.NestedString(u.Object, "status", "egress", "recycleWaiting")
	r.AtBound, _, _ = unstructured.NestedBool(u.Object, "status", "egress", "recyclesAtBound")
	list, _, _ := unstructured.NestedSlice(u.Object, "status", "egress", "recycles")
	for _, v := range list {
		m, _ := v.(map[string]any)
		ts, _ := m["time"].(string)
		at, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			continue
		}
		reason, _ := m["reason"].(string)
		r.Recycles = append(r.Recycles, RecycleMark{At: at, Kind: egressip.ReasonKind(reason)})
	}
	return r
}

// SharedIPs counts a fleet's proxies by known egress IP, those that serve
// and those that do not (a target bans the IP, whichever proxy used it).
func SharedIPs(ms []Member) map[string]int {
	n := map[string]int{}
	for _, m := range ms {
		if m.EgressIP != "" {
			n[m.EgressIP]++
		}
	}
	return n
}

// PacingRule is one rule of a fleet's pacing.
type PacingRule struct {
	// Index is the rule's place in spec.gateway.pacing, which keys its
	// buckets.
	Index    int
	Domains  []string
	Interval time.Duration
	Burst    int
}

// Covers says whether the rule paces domain: a name it lists, or one
// under a "*." pattern's suffix.
func (r *PacingRule) Covers(domain string) bool {
	for _, d := range r.Domains {
		if suffix, ok := strings.CutPrefix(d, "*."); ok {
			if strings.HasSuffix(domain, "."+suffix) {
				return true
			}
		} else if d == domain {
			return true
		}
	}
	return false
}

// PacingFor is the first of the policy's rules that covers domain, or nil.
func (p *Policy) PacingFor(domain string) *PacingRule {
	if p == nil || domain == "" {
		return nil
	}
	domain = strings.TrimSuffix(strings.ToLower(domain), ".")
	for i := range p.Pacing {
		if p.Pacing[i].Covers(domain) {
			return &p.Pacing[i]
		}
	}
	return nil
}
