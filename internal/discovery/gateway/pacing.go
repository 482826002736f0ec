package gateway

import (
	"context"
	"math"
	"net/http"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
)

// Pacing (spec.gateway.pacing): per rule, the least interval between two
// connections (a CONNECT tunnel, a plain-HTTP request) that leave one
// egress IP for the rule's domains, after a burst: a token bucket per
// (fleet, rule, egress IP), refilled one token an interval, holding at
// most the burst. The buckets are this replica's, each paced at its share
// of the rule (allocator.PacingFor): behind N replicas of a fleet, the
// interval N times as long and the burst split, so that the replicas
// together keep to the rule (docs/gateway.md, Pacing).

// rotatePaced is rotate under the domain's pacing rule (nil: none): when
// every proxy that serves the connection is paced, it reserves the turn
// of the IP that is free first, if that comes within MaxPaceWait, waits
// for it and goes out through that IP; else it answers 429 with
// Retry-After. Connections that find every IP paced queue over the IPs,
// each with a turn of its own, rather than wake together for one token.
func (gw *Gateway[S]) rotatePaced(ctx context.Context, key, strategy string, id *auth.Identity, u User, domain string, exclude map[string]bool, rule *catalog.PacingRule) (*upstream, error) {
	up, err := gw.rotate(ctx, key, strategy, id, u, domain, exclude, rule, "")
	var pe *pacedError
	if !errors.As(err, &pe) {
		return up, err
	}
	a := gw.Server.Allocator()
	f, err := a.Catalog.Members(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return nil, err
	}
	serving, err := a.Admits(ctx, f.Items, u.Zone, exclude, domain)
	if err != nil {
		return nil, err
	}
	now := a.Time()
	ip, at, ok := a.PaceReserveSoonest(pe.fleet, rule, f.Items, serving, now, allocator.MaxPaceWait)
	if !ok {
		if !at.IsZero() {
			pe.next = at
		}
		return nil, gw.paceWait(ctx, pe, true)
	}
	pe.next = at
	if at.After(now) {
		if err := gw.paceWait(ctx, pe, false); err != nil {
			return nil, err
		}
	}
	// The turn is this connection's: through a proxy of that IP (as the
	// members are after the wait), no token taken again.
	up, err = gw.rotate(ctx, key, strategy, id, u, domain, exclude, nil, ip)
	if up == nil && err == nil {
		// No proxy of that IP could take it after all (its slots full).
		pe.next = a.Time().Add(rule.Interval)
		return nil, gw.paceWait(ctx, pe, true)
	}
	return up, err
}

// paceWait waits until pe's IP is free when that is within maxPaceWait
// and this connection has not waited yet, and else is the 429 to answer.
func (gw *Gateway[S]) paceWait(ctx context.Context, pe *pacedError, waited bool) error {
	wait := pe.next.Sub(gw.Server.Allocator().Time())
	if waited || wait > allocator.MaxPaceWait {
		gw.Metrics.Paced.WithLabelValues(pe.fleet, "refused").Inc()
		return &gwError{code: http.StatusTooManyRequests, reason: allocator.ReasonPaced, retryAfter: int(math.Ceil(max(wait, time.Second).Seconds())),
			msg: pe.Error() + "; retry in " + wait.Round(time.Millisecond).String()}
	}
	gw.Metrics.Paced.WithLabelValues(pe.fleet, "waited").Inc()
	t := time.NewTimer(max(wait, time.Millisecond))
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// paceSession spends a token of the session's proxy's IP for domain
// under the fleet's pacing, waiting for one within MaxPaceWait: a session
// does not move for pacing, it waits or is answered 429.
func (gw *Gateway[S]) paceSession(ctx context.Context, u User, domain string, m *catalog.Member) error {
	p, err := gw.Server.Allocator().Catalog.Policy(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return err
	}
	return gw.paceOn(ctx, u, domain, gw.Server.Allocator().PacingFor(ctx, u.Namespace, u.Fleet, p, domain), m)
}

// paceSeat is paceSession for a seat the rotation did not choose.
func (gw *Gateway[S]) paceSeat(ctx context.Context, u User, domain string, rule *catalog.PacingRule, up *upstream) error {
	return gw.paceOn(ctx, u, domain, rule, &up.g.Member)
}

// currentMember is m as the cache shows it now (its egress IP may be
// known since the lease was granted), or m.
func (gw *Gateway[S]) currentMember(ctx context.Context, m *catalog.Member) *catalog.Member {
	if f, err := gw.Server.Allocator().Catalog.Members(ctx, m.Namespace, m.Fleet); err == nil {
		if cur := catalog.MemberNamed(f.Items, m.Name); cur != nil {
			return cur
		}
	}
	return m
}

// paceOn spends a token of m's IP under rule (nil: none): now, or at its
// turn, waiting for it within MaxPaceWait (connections waiting for one IP
// are served in turn, each its own token); else the 429 to answer.
func (gw *Gateway[S]) paceOn(ctx context.Context, u User, domain string, rule *catalog.PacingRule, m *catalog.Member) error {
	if rule == nil {
		return nil
	}
	fleet := u.Namespace + "/" + u.Fleet
	key := allocator.PaceKey(fleet, rule, allocator.IPOf(gw.currentMember(ctx, m)))
	now := gw.Server.Allocator().Time()
	at, ok := gw.Server.Allocator().PaceReserve(key, rule, now, allocator.MaxPaceWait)
	if !at.After(now) {
		return nil
	}
	pe := &pacedError{rule: rule, domain: domain, fleet: fleet, next: at}
	if !ok {
		return gw.paceWait(ctx, pe, true)
	}
	return gw.paceWait(ctx, pe, false)
}
