package gateway

import (
	"context"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/allocator"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
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
	// maxNamespaceBanWrites bounds those of one namespace's fleets.
	maxNamespaceBanWrites = 4
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
// An answer Squid made itself (X-Squid-Error: its destination policy
// refused the request, or it could not reach the origin) is no origin's
// and bans nothing. The allocator bounds such bans (BanFromAnswer): at
// most half of the fleet's serving proxies for a domain, and a budget of
// their own; a ban a bound refuses is counted, not recorded. Writes in
// flight are bounded per replica and per namespace, so one tenant's
// origins cannot take every write.
func (gw *Gateway[S]) banOnStatus(ctx context.Context, id *auth.Identity, u User, domain string, up *upstream, rsp *http.Response) {
	if domain == "" || rsp.StatusCode < 400 || rsp.Header.Get("X-Squid-Error") != "" {
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
	proxy, status := up.g.Member.Name, rsp.StatusCode
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
	if gw.banWrites >= maxBanWrites || gw.nsBanWrites[u.Namespace] >= maxNamespaceBanWrites {
		gw.mu.Unlock()
		gw.Metrics.Bans.WithLabelValues("dropped").Inc()
		return
	}
	if gw.nsBanWrites == nil {
		gw.nsBanWrites = map[string]int{}
	}
	gw.bansSeen[key] = now
	gw.banWrites++
	gw.nsBanWrites[u.Namespace]++
	gw.mu.Unlock()
	go func() {
		defer func() {
			gw.mu.Lock()
			gw.banWrites--
			if gw.nsBanWrites[u.Namespace]--; gw.nsBanWrites[u.Namespace] <= 0 {
				delete(gw.nsBanWrites, u.Namespace)
			}
			gw.mu.Unlock()
		}()
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), banWriteTimeout)
		defer cancel()
		err := a.BanFromAnswer(bctx, u.Namespace, u.Fleet, proxy, domain, cooldown, id, status)
		var pe *problem.Error
		switch {
		case errors.As(err, &pe) && pe.Reason == apiv1.ReasonBanLimit:
			gw.Metrics.Bans.WithLabelValues("refused").Inc()
			return
		case err != nil:
			gw.Metrics.Bans.WithLabelValues("failed").Inc()
			return
		}
		gw.Metrics.Bans.WithLabelValues("recorded").Inc()
	}()
}
