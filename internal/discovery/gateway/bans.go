package gateway

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
)

const (
	// banRepeat is how long a ban recorded from an origin's answer is not
	// recorded again for the same proxy and domain: a burst of 429s is
	// one ban, not a write each.
	banRepeat = 10 * time.Second
	// maxBanWrites bounds the bans from origins' answers being written at
	// once on a replica; more are dropped (counted): an origin answering
	// 403 to everything costs a bounded number of writes, never a wait
	// for the crawlers, whose answer is on its way already.
	maxBanWrites = 8
	// banWriteTimeout bounds one such write.
	banWriteTimeout = 10 * time.Second
	// minStatusCooldown is the shortest cooldown a Retry-After sets.
	minStatusCooldown = time.Minute
)

// banOnStatus records, in the background, a ban of up's proxy (and so of
// its egress IP) for domain when the origin answered a plain-HTTP request
// with one of the fleet's spec.gateway.banStatusCodes, as a crawler's
// banned report would: its cooldown is the answer's Retry-After (in
// seconds, at least a minute), else the default, within maxBanCooldown.
// An origin's answers ban at most half of the fleet's serving proxies for
// a domain: one that refuses everyone (a login wall) cannot cost the
// whole fleet the domain. A ban the bounds refuse (half the fleet,
// --max-bans-per-fleet, per identity) is counted, not recorded.
func (gw *Gateway[S]) banOnStatus(ctx context.Context, id *auth.Identity, u User, domain string, up *upstream, rsp *http.Response) {
	if domain == "" || rsp.StatusCode < 400 {
		return
	}
	a := gw.Server.Allocator()
	pol, err := a.Catalog.Policy(ctx, u.Namespace, u.Fleet)
	if err != nil || !slices.Contains(pol.BanStatusCodes, rsp.StatusCode) {
		return
	}
	cooldown := min(allocator.DefaultCooldown, pol.MaxBanCooldown)
	if s, err := strconv.Atoi(rsp.Header.Get("Retry-After")); err == nil && s > 0 {
		cooldown = min(max(time.Duration(s)*time.Second, minStatusCooldown), pol.MaxBanCooldown)
	}
	proxy := up.g.Member.Name
	key := u.Namespace + "/" + u.Fleet + "/" + proxy + "/" + domain
	now := a.Time()
	gw.mu.Lock()
	if gw.bansSeen == nil || len(gw.bansSeen) >= rotationKeys {
		gw.bansSeen = map[string]time.Time{}
	}
	if last, ok := gw.bansSeen[key]; ok && now.Sub(last) < banRepeat && !now.Before(last) {
		gw.mu.Unlock()
		return
	}
	if gw.banWrites >= maxBanWrites {
		gw.mu.Unlock()
		gw.Metrics.Bans.WithLabelValues("dropped").Inc()
		return
	}
	gw.bansSeen[key] = now
	gw.banWrites++
	gw.mu.Unlock()
	go func() {
		defer func() {
			gw.mu.Lock()
			gw.banWrites--
			gw.mu.Unlock()
		}()
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), banWriteTimeout)
		defer cancel()
		if !gw.mayBan(bctx, u, domain, proxy) {
			gw.Metrics.Bans.WithLabelValues("refused").Inc()
			return
		}
		if err := a.Ban(bctx, u.Namespace, u.Fleet, proxy, domain, cooldown, id); err != nil {
			gw.Metrics.Bans.WithLabelValues("refused").Inc()
			return
		}
		gw.Metrics.Bans.WithLabelValues("recorded").Inc()
	}()
}

// mayBan says whether an origin's answer may ban proxy for domain: while
// fewer than half of the fleet's serving proxies are banned for it.
func (gw *Gateway[S]) mayBan(ctx context.Context, u User, domain, proxy string) bool {
	a := gw.Server.Allocator()
	f, err := a.Catalog.Members(ctx, u.Namespace, u.Fleet)
	if err != nil {
		return false
	}
	banned, err := a.Leases.BannedFor(ctx, u.Namespace, u.Fleet, domain)
	if err != nil {
		return false
	}
	serving, out := 0, 0
	for i := range f.Items {
		if m := &f.Items[i]; m.Serving() {
			serving++
			if banned[m.Name] {
				out++
			}
		}
	}
	return banned[proxy] || 2*(out+1) <= serving
}
