package auth

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/problem"
)

// reviewer is an API server that authenticates every token but those
// beginning bad-, and allows every access, counting the reviews.
type reviewer struct {
	client.Client
	tokenReviews, accessReviews int
}

func (r *reviewer) Create(_ context.Context, obj client.Object, _ ...client.CreateOption) error {
	switch o := obj.(type) {
	case *authnv1.TokenReview:
		r.tokenReviews++
		if strings.HasPrefix(o.Spec.Token, "bad-") {
			return nil
		}
		o.Status.Authenticated, o.Status.User.Username = true, "user-"+o.Spec.Token
		if name, ok := strings.CutPrefix(o.Spec.Token, "as:"); ok {
			o.Status.User.Username = name
		}
	case *authzv1.SubjectAccessReview:
		r.accessReviews++
		o.Status.Allowed = true
	}
	return nil
}

// TestAuthCachesBounded: random tokens and random fleet names cost a review
// each, but the answers remembered never exceed the cache size; a token
// seen again within the TTL costs none.
func TestAuthCachesBounded(t *testing.T) {
	api := &reviewer{}
	now := time.Unix(1000, 0)
	k := NewKubernetes(KubernetesConfig{Client: api, CacheSize: 100, Now: func() time.Time { return now }})
	ctx := context.Background()
	req := func(token string) *http.Request {
		r, _ := http.NewRequestWithContext(ctx, http.MethodGet, "/", nil)
		r.Header.Set("Authorization", "Bearer "+token)
		return r
	}
	for i := range 1000 {
		id, err := k.Authenticate(ctx, req(fmt.Sprintf("random-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		if err := k.Authorize(ctx, id, "ns", fmt.Sprintf("fleet-%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if n, m := k.authn.Len(), k.authz.Len(); n > 100 || m > 100 {
		t.Errorf("remembered %d token and %d access reviews, want at most 100 each", n, m)
	}
	before := api.tokenReviews
	for range 10 {
		if _, err := k.Authenticate(ctx, req("random-999")); err != nil {
			t.Fatal(err)
		}
	}
	if api.tokenReviews != before {
		t.Errorf("a token seen within the TTL was reviewed again %d times", api.tokenReviews-before)
	}
	now = now.Add(31 * time.Second)
	if _, err := k.Authenticate(ctx, req("random-999")); err != nil || api.tokenReviews != before+1 {
		t.Errorf("past the TTL a token is reviewed again: %d reviews, %v", api.tokenReviews-before, err)
	}

	// A fleet name of a megabyte costs a key of a hash, not a megabyte.
	id, _ := k.Authenticate(ctx, req("long"))
	_ = k.Authorize(ctx, id, "ns", strings.Repeat("x", 1<<20))
	for key := range k.authz.Keys() {
		if len(key) > 64 {
			t.Fatalf("an access review is remembered under a key of %d bytes", len(key))
		}
	}
	// No Kubernetes identity passes for a static token's, nor goes
	// without a name.
	for _, name := range []string{StaticPrefix + "0123456789abcdef", ""} {
		if _, err := k.Authenticate(ctx, req("as:"+name)); !errors.Is(err, ErrUnauthenticated) {
			t.Errorf("a token reviewed as user %q: want unauthenticated, got %v", name, err)
		}
	}
}

// TestFailedReviewsKeptApart: a flood of refused tokens is remembered in a
// cache of its own, so a crawler's identity stays cached (no review per
// request), and a refused token sent again costs no review either.
func TestFailedReviewsKeptApart(t *testing.T) {
	api := &reviewer{}
	now := time.Unix(1000, 0)
	k := NewKubernetes(KubernetesConfig{Client: api, CacheSize: 100, FailedCacheSize: 10, Now: func() time.Time { return now }})
	ctx := context.Background()
	if _, err := k.AuthenticateToken(ctx, "crawler"); err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		if _, err := k.AuthenticateToken(ctx, fmt.Sprintf("bad-%d", i)); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("bad token %d: %v, want ErrUnauthenticated", i, err)
		}
	}
	before := api.tokenReviews
	if id, err := k.AuthenticateToken(ctx, "crawler"); err != nil || id.User != "user-crawler" {
		t.Fatalf("the crawler: %v %v", id, err)
	}
	if api.tokenReviews != before {
		t.Errorf("1000 refused tokens pushed the crawler's identity out of the cache: reviewed again")
	}
	if _, err := k.AuthenticateToken(ctx, "bad-999"); !errors.Is(err, ErrUnauthenticated) || api.tokenReviews != before {
		t.Errorf("a refused token sent again: %v, %d more reviews; want it remembered as refused", err, api.tokenReviews-before)
	}
	if n := k.failed.Len(); n > 10 {
		t.Errorf("%d refused tokens remembered, want at most 10", n)
	}
}

// TestReviewsBoundedPerAddress: new tokens from one client address are
// reviewed at its bucket's rate, before any authentication; another
// address, and a token reviewed already, are not held up by it.
func TestReviewsBoundedPerAddress(t *testing.T) {
	api := &reviewer{}
	now := time.Unix(1000, 0)
	k := NewKubernetes(KubernetesConfig{Client: api, Now: func() time.Time { return now }, Reviews: &IdentityLimits{Rate: 1, Burst: 3, Size: 100}})
	flood := WithClientAddress(context.Background(), "192.0.2.7:41000")
	if _, err := k.AuthenticateToken(flood, "crawler"); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := k.AuthenticateToken(flood, fmt.Sprintf("bad-%d", i)); !errors.Is(err, ErrUnauthenticated) {
			t.Fatalf("token %d within the burst: %v", i, err)
		}
	}
	_, err := k.AuthenticateToken(flood, "bad-2")
	var ae *problem.Error
	if !errors.As(err, &ae) || ae.Code != http.StatusTooManyRequests || ae.RetryAfter < 1 {
		t.Fatalf("a fourth new token from one address: %v, want 429 with Retry-After", err)
	}
	if api.tokenReviews != 3 {
		t.Errorf("%d token reviews made, want 3: the one over the bound is refused before a review", api.tokenReviews)
	}
	if _, err := k.AuthenticateToken(flood, "crawler"); err != nil {
		t.Errorf("a token reviewed already, from the flooding address: %v", err)
	}
	if _, err := k.AuthenticateToken(WithClientAddress(context.Background(), "198.51.100.9:5000"), "other"); err != nil {
		t.Errorf("another address: %v", err)
	}
	now = now.Add(2 * time.Second)
	if _, err := k.AuthenticateToken(flood, "bad-2"); !errors.Is(err, ErrUnauthenticated) {
		t.Errorf("after the bucket refilled: %v, want a review (refused token)", err)
	}

	// Past its TTL, while a flood keeps the shared address's bucket empty,
	// a token that passed lately is still answered (for staleGrace), and a
	// new one is not.
	now = now.Add(31 * time.Second)
	for i := 3; i < 200; i++ {
		_, _ = k.AuthenticateToken(flood, fmt.Sprintf("bad-%d", i))
	}
	if id, err := k.AuthenticateToken(flood, "crawler"); err != nil || id.User != "user-crawler" {
		t.Errorf("a crawler whose token passed 33 s ago, behind a flooded address: %v %v; want its identity", id, err)
	}
	if _, err := k.AuthenticateToken(flood, "newcomer"); !errors.As(err, &ae) || ae.Code != http.StatusTooManyRequests {
		t.Errorf("a new token behind the flooded address: %v, want 429", err)
	}
	now = now.Add(staleGrace)
	for i := 200; i < 210; i++ {
		_, _ = k.AuthenticateToken(flood, fmt.Sprintf("bad-%d", i))
	}
	if _, err := k.AuthenticateToken(flood, "crawler"); !errors.As(err, &ae) || ae.Code != http.StatusTooManyRequests {
		t.Errorf("past the grace, the crawler's token is reviewed again like any: %v, want 429 while the flood lasts", err)
	}

	// One IPv6 host is one bucket, whatever address of its /64 it takes.
	v6 := NewKubernetes(KubernetesConfig{Client: api, Now: func() time.Time { return now }, Reviews: &IdentityLimits{Rate: 1, Burst: 2, Size: 100}})
	for i := range 3 {
		_, err = v6.AuthenticateToken(WithClientAddress(context.Background(), fmt.Sprintf("[2001:db8:1:2::%x]:443", i+1)), fmt.Sprintf("bad-v6-%d", i))
	}
	if !errors.As(err, &ae) || ae.Code != http.StatusTooManyRequests {
		t.Errorf("a third new token from another address of the same /64: %v, want 429", err)
	}
}
