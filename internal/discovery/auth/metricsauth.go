package auth

import (
	"context"
	"net/http"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"

	apiv1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/discovery/v1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// MetricsPath is where the metrics are served.
const MetricsPath = "/metrics"

// MetricsAuth serves next only to callers whose bearer token the API server
// authenticates (for its own audience, as a scraper's mounted ServiceAccount
// token is) and who may get the /metrics non-resource URL, as
// kube-rbac-proxy does: the fleet-level series name every fleet, which a
// crawler of one team must not list. Static tokens never scrape. Answers
// are remembered as the API's are.
func (k *Kubernetes) MetricsAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := Bearer(r)
		if t == "" {
			problem.WriteError(w, &problem.Error{Code: http.StatusUnauthorized, Reason: apiv1.ReasonUnauthenticated, Msg: "authenticate with a bearer token that may get " + MetricsPath})
			return
		}
		ok, err := k.mayScrape(r.Context(), t)
		switch {
		case err != nil:
			problem.WriteError(w, problem.ToAPIError(err))
		case !ok:
			problem.WriteError(w, &problem.Error{Code: http.StatusForbidden, Reason: apiv1.ReasonForbidden, Msg: "the token may not get " + MetricsPath + ": bind its subject to a ClusterRole with nonResourceURLs [" + MetricsPath + "] and verb get"})
		default:
			next.ServeHTTP(w, r)
		}
	})
}

// mayScrape reviews a token and its subject's access to /metrics.
func (k *Kubernetes) mayScrape(ctx context.Context, t string) (bool, error) {
	if k.Static != nil && k.Static.lookup(t) != nil {
		// A crawler's static token: never sent to the API server.
		return false, nil
	}
	key := tokenKey("metrics\x00" + t)
	k.mu.Lock()
	if allowed, ok := k.authz.Get(key, k.Now(), k.TTL); ok {
		k.mu.Unlock()
		return allowed, nil
	}
	k.mu.Unlock()
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: t}}
	if err := k.Client.Create(ctx, tr); err != nil {
		return false, errors.Wrap(err, "cannot review the token")
	}
	if !tr.Status.Authenticated {
		// Not remembered: random tokens must not crowd the cache that
		// crawlers' answers live in.
		return false, nil
	}
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: tr.Status.User.Username, Groups: tr.Status.User.Groups, UID: tr.Status.User.UID,
		NonResourceAttributes: &authzv1.NonResourceAttributes{Path: MetricsPath, Verb: "get"},
	}}
	if err := k.Client.Create(ctx, sar); err != nil {
		return false, errors.Wrap(err, "cannot review access")
	}
	allowed := sar.Status.Allowed
	k.mu.Lock()
	k.authz.Add(key, allowed, k.Now())
	k.mu.Unlock()
	return allowed, nil
}
