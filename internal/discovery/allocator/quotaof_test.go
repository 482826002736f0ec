package allocator

import (
	"strings"
	"testing"

	"k8s.io/utils/ptr"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery/auth"
)

// TestQuotaOf: a ServiceAccount's or a static token's override wins over
// a group's, whatever their order; of several groups', the largest; then
// the default; no quotas, or a default of 0, set no bound.
func TestQuotaOf(t *testing.T) {
	q := &fleetv1alpha1.Quotas{
		MaxLeasesPerIdentity: ptr.To[int32](2),
		Overrides: []fleetv1alpha1.QuotaOverride{
			{Group: "crawlers", MaxLeases: 10},
			{ServiceAccount: "team-a/bot", MaxLeases: 1},
			{Group: "big-crawlers", MaxLeases: 50},
			{StaticToken: "vip", MaxLeases: 7},
			{Group: "small", MaxLeases: 3},
		},
	}
	for _, c := range []struct {
		name string
		id   auth.Identity
		want int
		from string
		none bool
	}{
		{name: "ServiceAccount over its groups", id: auth.Identity{User: "system:serviceaccount:team-a:bot", Groups: []string{"big-crawlers"}}, want: 1, from: "overrides[1] (serviceAccount team-a/bot)"},
		{name: "another namespace's account of that name", id: auth.Identity{User: "system:serviceaccount:team-b:bot"}, want: 2, from: "maxLeasesPerIdentity"},
		{name: "static token", id: auth.Identity{User: auth.StaticPrefix + "vip", Groups: []string{"crawlers"}}, want: 7, from: "overrides[3] (staticToken vip)"},
		{name: "largest group", id: auth.Identity{User: "alice", Groups: []string{"small", "crawlers", "big-crawlers"}}, want: 50, from: "overrides[2] (group big-crawlers)"},
		{name: "one group", id: auth.Identity{User: "bob", Groups: []string{"small"}}, want: 3, from: "overrides[4] (group small)"},
		{name: "default", id: auth.Identity{User: "carol"}, want: 2, from: "maxLeasesPerIdentity"},
	} {
		got, from, ok := QuotaOf(q, &c.id)
		if !ok || got != c.want || !strings.Contains(from, c.from) {
			t.Errorf("%s: got %d from %q (%v), want %d from %q", c.name, got, from, ok, c.want, c.from)
		}
	}
	if _, _, ok := QuotaOf(nil, &auth.Identity{User: "x"}); ok {
		t.Error("no quotas set a bound")
	}
	if _, _, ok := QuotaOf(&fleetv1alpha1.Quotas{MaxLeasesPerIdentity: ptr.To[int32](0)}, &auth.Identity{User: "x"}); ok {
		t.Error("a default of 0 set a bound")
	}
}
