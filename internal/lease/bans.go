package lease

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Bans: a (proxy, domain) pair every replica honours until its cooldown.

// BanName is the name of a (proxy, domain) ban object.
func BanName(proxy, domain string) string {
	sum := sha256.Sum256([]byte(strings.ToLower(domain)))
	return fmt.Sprintf("%s-ban-%s", proxy, hex.EncodeToString(sum[:])[:12])
}

// Ban records that a proxy is banned for a domain until cooldown passes,
// as identity reported. It is a Lease object too, so every replica
// honours it.
func (s *Store) Ban(ctx context.Context, namespace, fleet, proxy, domain string, cooldown time.Duration, identity string) error {
	return s.ban(ctx, namespace, fleet, proxy, domain, cooldown, identity, 0, "")
}

// BanFromAnswer is Ban for an origin's answer with status to a request of
// identity's, recorded by replica (AnnotationBanAnswer,
// AnnotationBanReplica).
func (s *Store) BanFromAnswer(ctx context.Context, namespace, fleet, proxy, domain string, cooldown time.Duration, identity string, status int, replica string) error {
	return s.ban(ctx, namespace, fleet, proxy, domain, cooldown, identity, status, replica)
}

func (s *Store) ban(ctx context.Context, namespace, fleet, proxy, domain string, cooldown time.Duration, identity string, status int, replica string) error {
	if !validTTL(cooldown) {
		return ErrInvalidTTL
	}
	domain = strings.ToLower(domain)
	now := s.Now()
	want := &coordv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name: BanName(proxy, domain), Namespace: namespace,
			Labels: map[string]string{
				fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindBan,
				LabelBanDomain:               ownership.LabelValue(domain),
			},
			Annotations: map[string]string{AnnotationDomain: domain},
		},
		Spec: coordv1.LeaseSpec{
			HolderIdentity: ptr.To("ban:" + domain), LeaseDurationSeconds: ptr.To(int32(cooldown / time.Second)),
			AcquireTime: &metav1.MicroTime{Time: now}, RenewTime: &metav1.MicroTime{Time: now},
		},
	}
	if identity != "" {
		want.Annotations[AnnotationIdentity] = identity
	}
	if status != 0 {
		want.Annotations[AnnotationBanAnswer] = strconv.Itoa(status)
		want.Annotations[AnnotationBanReplica] = replica
	}
	names(&want.ObjectMeta, fleet, proxy)
	s.own(ctx, &want.ObjectMeta, proxy)
	err := s.Client.Create(ctx, want)
	if !kerrors.IsAlreadyExists(err) {
		return errors.Wrap(err, errRecordBan)
	}
	cur := &coordv1.Lease{}
	if err := s.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: want.Name}, cur); err != nil {
		return errors.Wrap(err, errGetBan)
	}
	if Expired(cur, now) {
		// A lapsed ban not swept yet: the new one is the new reporter's.
		cur.Labels, cur.Annotations = want.Labels, want.Annotations
	}
	cur.Spec = want.Spec
	return errors.Wrap(s.Client.Update(ctx, cur), errExtendBan)
}

// Unban lifts a proxy's ban for a domain (an "ok" report).
func (s *Store) Unban(ctx context.Context, namespace, proxy, domain string) error {
	err := s.Client.Delete(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: BanName(proxy, strings.ToLower(domain))}})
	return errors.Wrap(client.IgnoreNotFound(err), errLiftBan)
}

// Ban is one live ban, and who reported it; FromAnswer when it was
// recorded from an origin's answer to Identity's request, by Replica.
type Ban struct {
	Proxy, Domain, Identity string
	FromAnswer              bool
	Replica                 string
}

// ActiveBans lists a fleet's live bans, from the cache.
func (s *Store) ActiveBans(ctx context.Context, namespace, fleet string) ([]Ban, error) {
	items, err := s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindBan)
	if err != nil {
		return nil, errors.Wrap(err, errListBans)
	}
	var out []Ban
	now := s.Now()
	for i := range items {
		if b := &items[i]; !Expired(b, now) && fleetv1alpha1.FleetName(b) == fleet {
			out = append(out, Ban{Proxy: fleetv1alpha1.ProxyName(b), Domain: b.Annotations[AnnotationDomain], Identity: b.Annotations[AnnotationIdentity],
				FromAnswer: b.Annotations[AnnotationBanAnswer] != "", Replica: b.Annotations[AnnotationBanReplica]})
		}
	}
	return out, nil
}

// Bans lists a fleet's live bans: proxy name to banned domains.
func (s *Store) Bans(ctx context.Context, namespace, fleet string) (map[string][]string, error) {
	items, err := s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindBan)
	if err != nil {
		return nil, errors.Wrap(err, errListBans)
	}
	out := map[string][]string{}
	now := s.Now()
	for i := range items {
		if b := &items[i]; !Expired(b, now) && fleetv1alpha1.FleetName(b) == fleet {
			out[fleetv1alpha1.ProxyName(b)] = append(out[fleetv1alpha1.ProxyName(b)], b.Annotations[AnnotationDomain])
		}
	}
	return out, nil
}

// BannedFor returns the proxies of a fleet with a live ban for domain,
// from the cache: what an acquisition for the domain skips.
func (s *Store) BannedFor(ctx context.Context, namespace, fleet, domain string) (map[string]bool, error) {
	domain = strings.ToLower(domain)
	items, ok, err := s.listBy(ctx, namespace, indexBanDomain, fleet+"/"+domain)
	if err != nil {
		return nil, errors.Wrap(err, errListBans)
	}
	if !ok {
		if items, err = s.fleetLeases(ctx, namespace, fleet, fleetv1alpha1.LeaseKindBan); err != nil {
			return nil, errors.Wrap(err, errListBans)
		}
	}
	out := map[string]bool{}
	now := s.Now()
	for i := range items {
		if b := &items[i]; !Expired(b, now) && fleetv1alpha1.FleetName(b) == fleet && strings.EqualFold(b.Annotations[AnnotationDomain], domain) {
			out[fleetv1alpha1.ProxyName(b)] = true
		}
	}
	return out, nil
}
