package gateway

import (
	"context"
	"slices"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
)

// banRepeat is how long a ban recorded from an origin's answer is not
// recorded again for the same proxy and domain: a burst of 429s is one
// ban, not a write each.
const banRepeat = 10 * time.Second

// banOnStatus records a ban of up's proxy (and so of its egress IP) for
// domain when the origin answered a plain-HTTP request with one of the
// fleet's spec.gateway.banStatusCodes, as a crawler's banned report
// would, with the default cooldown within maxBanCooldown. A ban the
// bounds refuse (--max-bans-per-fleet, per identity) is counted, not
// recorded; the answer reaches the crawler either way.
func (gw *Gateway[S]) banOnStatus(ctx context.Context, id *auth.Identity, u User, domain string, up *upstream, code int) {
	if domain == "" || code < 400 {
		return
	}
	a := gw.Server.Allocator()
	pol, err := a.Catalog.Policy(ctx, u.Namespace, u.Fleet)
	if err != nil || !slices.Contains(pol.BanStatusCodes, code) {
		return
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
	gw.bansSeen[key] = now
	gw.mu.Unlock()
	if err := a.Ban(ctx, u.Namespace, u.Fleet, proxy, domain, min(allocator.DefaultCooldown, pol.MaxBanCooldown), id); err != nil {
		gw.Metrics.Bans.WithLabelValues("refused").Inc()
		return
	}
	gw.Metrics.Bans.WithLabelValues("recorded").Inc()
}
