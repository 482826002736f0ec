package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Ban memory per egress IP: a target bans an address, not a proxy. Each
// ban reported on a proxy whose egress IP is known is also written to the
// history of that IP in its fleet: one Lease object per (fleet, IP), kind
// ipbans, owned by the fleet (the proxy's controller), which outlives the
// proxy. A proxy that comes up with an address banned for a domain
// inherits the ban until its cooldown ends, and an address with bans in
// its recent history is handed out after clean ones. The history keeps
// the last MaxIPHistory bans of the last IPHistoryRetention; an object
// with no ban for that long lapses and is swept.

const (
	// IPHistoryRetention is how long a ban stays in its IP's history.
	IPHistoryRetention = 7 * 24 * time.Hour
	// MaxIPHistory bounds the bans one IP's history keeps (the newest).
	MaxIPHistory = 64
	// AnnotationEgressIP holds an ipbans object's IP.
	AnnotationEgressIP = fleetv1alpha1.Group + "/egress-ip"
	// AnnotationBanHistory holds an ipbans object's bans (JSON, oldest
	// first).
	AnnotationBanHistory = fleetv1alpha1.Group + "/ban-history"
)

// IPBan is one ban in an IP's history: the domain, when it was reported
// and when its cooldown ends.
type IPBan struct {
	Domain string `json:"d"`
	At     int64  `json:"at"`
	Until  int64  `json:"until"`
	// Answer marks a ban taken from an origin's answer (the gateway's
	// banStatusCodes) rather than reported: a full history lets such bans
	// go before reported ones.
	Answer bool `json:"a,omitempty"`
}

// CanonicalIP is the form an egress IP is remembered by: an IPv4-mapped
// address as its IPv4 address, without zone; "" for no valid address.
func CanonicalIP(ip string) string {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return ""
	}
	return a.Unmap().WithZone("").String()
}

// IPBansName is the name of a fleet's history of ip.
func IPBansName(fleet, ip string) string {
	sum := sha256.Sum256([]byte(ip))
	return fleet + "-ip-" + hex.EncodeToString(sum[:])[:16]
}

// banBurst is how close two bans of one domain on one address are one
// ban, extended, rather than two in its history: a burst of reports (or
// of an origin's 429s) must not push other domains' bans out.
const banBurst = time.Minute

// maxHistoryBytes bounds the history annotation read: anything larger was
// written by no store, and reads as none.
const maxHistoryBytes = 64 << 10

// RecordIPBan writes a ban of domain, reported on proxy, to the history of
// its egress ip in fleet. A proxy without a known IP records nothing.
func (s *Store) RecordIPBan(ctx context.Context, namespace, fleet, proxy, ip, domain string, cooldown time.Duration) error {
	return s.recordIPBan(ctx, namespace, fleet, proxy, ip, domain, cooldown, false)
}

// RecordAnswerIPBan is RecordIPBan for a ban taken from an origin's answer
// (IPBan.Answer).
func (s *Store) RecordAnswerIPBan(ctx context.Context, namespace, fleet, proxy, ip, domain string, cooldown time.Duration) error {
	return s.recordIPBan(ctx, namespace, fleet, proxy, ip, domain, cooldown, true)
}

func (s *Store) recordIPBan(ctx context.Context, namespace, fleet, proxy, ip, domain string, cooldown time.Duration, answer bool) error {
	now := s.Now()
	entry := IPBan{Domain: strings.ToLower(domain), At: now.Unix(), Until: now.Add(cooldown).Unix(), Answer: answer}
	return errors.Wrap(s.changeHistory(ctx, namespace, fleet, proxy, ip, true, func(h []IPBan) ([]IPBan, bool) {
		for i := len(h) - 1; i >= 0; i-- {
			if h[i].Domain == entry.Domain && entry.At-h[i].At < int64(banBurst/time.Second) && entry.At >= h[i].At {
				// Extended, a ban stays whose it was, as its Lease does.
				h[i].Until = max(h[i].Until, entry.Until)
				return h, true
			}
		}
		return append(h, entry), true
	}), errRecordIPBan)
}

// LiftIPBan ends the live bans of domain in the history of ip (an "ok"
// report on a proxy leaving from it): the record stays, its cooldown ends
// now. Nothing live, nothing written; a lift never renews the history.
func (s *Store) LiftIPBan(ctx context.Context, namespace, fleet, ip, domain string) error {
	domain = strings.ToLower(domain)
	now := s.Now().Unix()
	return errors.Wrap(s.changeHistory(ctx, namespace, fleet, "", ip, false, func(h []IPBan) ([]IPBan, bool) {
		changed := false
		for i := range h {
			if h[i].Domain == domain && h[i].Until > now {
				h[i].Until, changed = now, true
			}
		}
		return h, changed
	}), errLiftIPBan)
}

// changeHistory applies change to the history of ip in fleet, made (owned
// as proxy's fleet) when it does not exist and create is set, retried on
// a conflict. change says whether it changed anything; a ban recorded
// (create) renews the history for IPHistoryRetention. An object of the
// name that is not the fleet's history of ip is an error, never
// overwritten.
func (s *Store) changeHistory(ctx context.Context, namespace, fleet, proxy, ip string, create bool, change func([]IPBan) ([]IPBan, bool)) error {
	if ip = CanonicalIP(ip); ip == "" {
		return nil
	}
	key := types.NamespacedName{Namespace: namespace, Name: IPBansName(fleet, ip)}
	owner := func() *metav1.OwnerReference {
		if s.FleetOwnerOf == nil || proxy == "" {
			return nil
		}
		return s.FleetOwnerOf(ctx, namespace, proxy)
	}
	for range 3 {
		now := s.Now()
		cur := &coordv1.Lease{}
		err := s.Reader.Get(ctx, key, cur)
		switch {
		case kerrors.IsNotFound(err) && !create:
			return nil
		case kerrors.IsNotFound(err):
			want := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{
				Name: key.Name, Namespace: namespace,
				Labels: map[string]string{
					fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindIPBans,
					fleetv1alpha1.LabelFleet:     ownership.LabelValue(fleet),
				},
				Annotations: map[string]string{fleetv1alpha1.AnnotationFleet: fleet, AnnotationEgressIP: ip},
			}}
			if o := owner(); o != nil {
				want.OwnerReferences = []metav1.OwnerReference{*o}
			}
			hist, _ := change(nil)
			setHistory(want, hist, now, true)
			if err := s.Client.Create(ctx, want); !kerrors.IsAlreadyExists(err) {
				return err
			}
			continue
		case err != nil:
			return err
		}
		if cur.Labels[fleetv1alpha1.LabelLeaseKind] != fleetv1alpha1.LeaseKindIPBans || cur.Annotations[fleetv1alpha1.AnnotationFleet] != fleet ||
			CanonicalIP(cur.Annotations[AnnotationEgressIP]) != ip {
			return errors.Errorf(errFmtNotBanHistory, namespace, key.Name, ip, fleet)
		}
		hist, changed := change(HistoryOf(cur, now))
		if len(cur.OwnerReferences) == 0 {
			// Made when the proxy's owner was not known: the fleet owns
			// it from now on, so that deleting the fleet deletes it.
			if o := owner(); o != nil {
				cur.OwnerReferences, changed = []metav1.OwnerReference{*o}, true
			}
		}
		if !changed {
			return nil
		}
		setHistory(cur, hist, now, create)
		if err := s.Client.Update(ctx, cur); !kerrors.IsConflict(err) {
			return err
		}
	}
	return errors.New(errChangedEveryTry)
}

// setHistory writes hist (pruned to what is kept) to l, renewing l for
// IPHistoryRetention from now when renew is set.
func setHistory(l *coordv1.Lease, hist []IPBan, now time.Time, renew bool) {
	hist = prune(hist, now)
	b, _ := json.Marshal(hist) //nolint:errchkjson // Plain structs always marshal.
	l.Annotations[AnnotationBanHistory] = string(b)
	if !renew && l.Spec.RenewTime != nil {
		return
	}
	l.Spec = coordv1.LeaseSpec{
		HolderIdentity: ptr.To("ip:" + l.Annotations[AnnotationEgressIP]), LeaseDurationSeconds: ptr.To(int32(IPHistoryRetention / time.Second)),
		AcquireTime: l.Spec.AcquireTime, RenewTime: &metav1.MicroTime{Time: now},
	}
	if l.Spec.AcquireTime == nil {
		l.Spec.AcquireTime = &metav1.MicroTime{Time: now}
	}
}

// prune keeps the bans of the last IPHistoryRetention, oldest first, and
// at most MaxIPHistory: those whose cooldown is over go first, the oldest
// of them first; then live bans taken from origins' answers, the oldest
// first, so that an origin answering 403 for host after host pushes out
// neither a crawler's report nor, for long, another answer's ban; when
// every one is a live report, the newest goes. A ban from the future (a
// replica whose clock runs ahead) is kept: it counts once its time comes.
func prune(hist []IPBan, now time.Time) []IPBan {
	from := now.Add(-IPHistoryRetention).Unix()
	out := make([]IPBan, 0, len(hist))
	for _, b := range hist {
		if b.At >= from && b.Domain != "" {
			out = append(out, b)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].At < out[j].At })
	for over := len(out) - MaxIPHistory; over > 0; over-- {
		drop := slices.IndexFunc(out, func(b IPBan) bool { return b.Until <= now.Unix() })
		if drop < 0 {
			drop = slices.IndexFunc(out, func(b IPBan) bool { return b.Answer })
		}
		if drop < 0 {
			// The newest of now: one from the future is kept.
			drop = len(out) - 1
			for drop > 0 && out[drop].At > now.Unix() {
				drop--
			}
		}
		out = append(out[:drop], out[drop+1:]...)
	}
	return out
}

// HistoryOf reads an ipbans object's history, as kept at now; a damaged
// or oversized annotation reads as none.
func HistoryOf(l *coordv1.Lease, now time.Time) []IPBan {
	return prune(parseHistory(l.Annotations[AnnotationBanHistory]), now)
}

// parseHistory reads a history annotation: its newest MaxIPHistory bans,
// none when damaged or larger than any store writes.
func parseHistory(raw string) []IPBan {
	var hist []IPBan
	if len(raw) > maxHistoryBytes || json.Unmarshal([]byte(raw), &hist) != nil {
		return nil
	}
	sort.SliceStable(hist, func(i, j int) bool { return hist[i].At < hist[j].At })
	if len(hist) > MaxIPHistory {
		hist = hist[len(hist)-MaxIPHistory:]
	}
	return hist
}

// IPHistories reads the ban histories of a fleet's egress IPs from the
// cache: IP (CanonicalIP) to its bans, oldest first.
func (s *Store) IPHistories(ctx context.Context, namespace, fleet string) (map[string][]IPBan, error) {
	items, err := s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindIPBans)
	if err != nil {
		return nil, errors.Wrap(err, errListBanHistories)
	}
	out := map[string][]IPBan{}
	now := s.Now()
	for i := range items {
		l := &items[i]
		if Expired(l, now) || l.Annotations[fleetv1alpha1.AnnotationFleet] != fleet {
			continue
		}
		ip := CanonicalIP(l.Annotations[AnnotationEgressIP])
		if ip == "" || l.Name != IPBansName(fleet, ip) {
			// Not one this store wrote: its name says which IP it is for.
			continue
		}
		if h := prune(s.histories.of(l), now); len(h) > 0 {
			out[ip] = h
		}
	}
	return out, nil
}

// parsedHistories remembers ban histories parsed, by object; a full
// memory starts over.
type parsedHistories struct {
	mu sync.Mutex
	m  map[types.UID]parsedHistory
}

type parsedHistory struct {
	rv   string
	hist []IPBan
}

// maxParsedHistories bounds the histories remembered.
const maxParsedHistories = 1 << 16

// of is l's history, as written (not pruned): read once per version.
func (p *parsedHistories) of(l *coordv1.Lease) []IPBan {
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.m[l.UID]; ok && e.rv == l.ResourceVersion {
		return e.hist
	}
	hist := parseHistory(l.Annotations[AnnotationBanHistory])
	if p.m == nil || len(p.m) >= maxParsedHistories {
		p.m = map[types.UID]parsedHistory{}
	}
	p.m[l.UID] = parsedHistory{rv: l.ResourceVersion, hist: hist}
	return hist
}

// BannedNow says whether hist holds a ban of domain whose cooldown has not
// ended at now.
func BannedNow(hist []IPBan, domain string, now time.Time) bool {
	domain = strings.ToLower(domain)
	for _, b := range hist {
		if b.Domain == domain && b.Until > now.Unix() {
			return true
		}
	}
	return false
}
