package discovery

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/catalog"
	"github.com/pkg/errors"
)

// reasonPaced: every proxy that serves a connection is paced for its
// domain.
const reasonPaced = "Paced"

// Pacing (spec.gateway.pacing): per rule, the least interval between two
// connections (a CONNECT tunnel, a plain-HTTP request) that leave one
// egress IP for the rule's domains, after a burst: a token bucket per
// (fleet, rule, egress IP), refilled one token an interval, holding at
// most the burst. The buckets are this replica's: behind N replicas an IP
// may see up to N times the rule's rate (README).

// maxPaceWait bounds how long a connection waits for a paced IP before it
// is answered 429.
const maxPaceWait = 2 * time.Second

// maxBuckets bounds the buckets a replica keeps: past it, full ones (which
// count as absent) are forgotten.
const maxBuckets = 1 << 16

// pacer holds a replica's buckets.
type pacer struct {
	mu sync.Mutex
	b  map[string]*bucket
}

// bucket is one (fleet, rule, IP)'s tokens as of at, and its rule's
// interval and burst (so that a full one can be told and forgotten).
type bucket struct {
	tokens   float64
	at       time.Time
	interval time.Duration
	burst    int
}

// paceKey names the bucket of fleet (namespace/name), rule and ip.
func paceKey(fleet string, r *catalog.PacingRule, ip string) string {
	return fleet + "\x00" + strconv.Itoa(r.Index) + "\x00" + ip
}

// level is b's tokens at now under r (a clock gone back adds none).
func (b *bucket) level(r *catalog.PacingRule, now time.Time) float64 {
	return math.Min(float64(r.Burst), b.tokens+float64(max(now.Sub(b.at), 0))/float64(r.Interval))
}

// next is when the bucket key next has a token under r (now or before:
// it has one).
func (p *pacer) next(key string, r *catalog.PacingRule, now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.nextLocked(key, r, now)
}

// nextLocked is next with p.mu held.
func (p *pacer) nextLocked(key string, r *catalog.PacingRule, now time.Time) time.Time {
	b := p.b[key]
	if b == nil {
		return now
	}
	l := b.level(r, now)
	if l >= 1 {
		return now
	}
	return now.Add(time.Duration((1 - l) * float64(r.Interval)))
}

// take spends a token of key under r, if it has one.
func (p *pacer) take(key string, r *catalog.PacingRule, now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.b == nil {
		p.b = map[string]*bucket{}
	}
	b := p.b[key]
	if b == nil {
		if len(p.b) >= maxBuckets {
			p.forgetFullLocked(now)
		}
		b = &bucket{tokens: float64(r.Burst), at: now, interval: r.Interval, burst: r.Burst}
		p.b[key] = b
	}
	l := b.level(r, now)
	if l < 1 {
		return false
	}
	b.tokens, b.at, b.interval, b.burst = l-1, now, r.Interval, r.Burst
	return true
}

// soonest is, of the IPs of ms that serve a connection (serving), the
// first time one has a token under rule for fleet: now when one has, zero
// when none serves. One lock for all of them.
func (p *pacer) soonest(fleet string, rule *catalog.PacingRule, ms []catalog.Member, serving func(*catalog.Member) bool, now time.Time) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var first time.Time
	for i := range ms {
		if m := &ms[i]; serving(m) {
			t := p.nextLocked(paceKey(fleet, rule, ipOf(m)), rule, now)
			if !t.After(now) {
				return now
			}
			if first.IsZero() || t.Before(first) {
				first = t
			}
		}
	}
	return first
}

// pacedAmong are the proxies of ms whose IP has no token under rule now.
func (p *pacer) pacedAmong(fleet string, rule *catalog.PacingRule, ms []catalog.Member, now time.Time) map[string]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]bool{}
	for i := range ms {
		if p.nextLocked(paceKey(fleet, rule, ipOf(&ms[i])), rule, now).After(now) {
			out[ms[i].Name] = true
		}
	}
	return out
}

// forgetFullLocked drops the buckets full by now, which count as absent
// ones do; if that frees too little, all of them (a forgotten bucket
// starts again full: under that much pressure pacing errs on the side of
// one burst more). p.mu is held.
func (p *pacer) forgetFullLocked(now time.Time) {
	for k, b := range p.b {
		if b.level(&catalog.PacingRule{Interval: b.interval, Burst: b.burst}, now) >= float64(b.burst) {
			delete(p.b, k)
		}
	}
	if len(p.b) >= maxBuckets {
		clear(p.b)
	}
}

// rotatePaced is rotate under the domain's pacing rule (nil: none): when
// every proxy that serves the connection is paced, it waits for the
// first to be free if that is within maxPaceWait, once, and else answers
// 429 with Retry-After.
func (gw *Gateway) rotatePaced(ctx context.Context, key, strategy string, id *auth.Identity, u GatewayUser, domain string, exclude map[string]bool, rule *catalog.PacingRule) (*upstream, error) {
	for waited := false; ; waited = true {
		up, err := gw.rotate(ctx, key, strategy, id, u, domain, exclude, rule)
		var pe *pacedError
		if !errors.As(err, &pe) {
			return up, err
		}
		if err := gw.paceWait(ctx, pe, waited); err != nil {
			return nil, err
		}
	}
}

// paceWait waits until pe's IP is free when that is within maxPaceWait
// and this connection has not waited yet, and else is the 429 to answer.
func (gw *Gateway) paceWait(ctx context.Context, pe *pacedError, waited bool) error {
	wait := pe.next.Sub(gw.Server.now())
	if waited || wait > maxPaceWait {
		gw.Metrics.Paced.WithLabelValues(pe.fleet, "refused").Inc()
		return &gwError{code: http.StatusTooManyRequests, reason: reasonPaced, retryAfter: int(math.Ceil(max(wait, time.Second).Seconds())),
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
// under the fleet's pacing, waiting for one within maxPaceWait: a session
// does not move for pacing, it waits or is answered 429.
func (gw *Gateway) paceSession(ctx context.Context, u GatewayUser, domain string, m *catalog.Member) error {
	p, err := gw.Server.Catalog.Policy(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return err
	}
	return gw.paceOn(ctx, u, domain, p.PacingFor(domain), m)
}

// paceSeat is paceSession for a seat the rotation did not choose.
func (gw *Gateway) paceSeat(ctx context.Context, u GatewayUser, domain string, rule *catalog.PacingRule, up *upstream) error {
	return gw.paceOn(ctx, u, domain, rule, &up.g.m)
}

// currentMember is m as the cache shows it now (its egress IP may be
// known since the lease was granted), or m.
func (gw *Gateway) currentMember(ctx context.Context, m *catalog.Member) *catalog.Member {
	if f, err := gw.Server.Catalog.Members(ctx, m.Namespace, m.Fleet); err == nil {
		if cur := catalog.MemberNamed(f.Items, m.Name); cur != nil {
			return cur
		}
	}
	return m
}

// paceOn spends a token of m's IP under rule (nil: none), waiting for one
// within maxPaceWait, else the 429 to answer.
func (gw *Gateway) paceOn(ctx context.Context, u GatewayUser, domain string, rule *catalog.PacingRule, m *catalog.Member) error {
	if rule == nil {
		return nil
	}
	fleet := u.Namespace + "/" + u.Fleet
	key := paceKey(fleet, rule, ipOf(gw.currentMember(ctx, m)))
	for waited := false; ; waited = true {
		now := gw.Server.now()
		if gw.Server.pace.take(key, rule, now) {
			return nil
		}
		pe := &pacedError{rule: rule, domain: domain, fleet: fleet, next: gw.Server.pace.next(key, rule, now)}
		if err := gw.paceWait(ctx, pe, waited); err != nil {
			return err
		}
	}
}
