package discovery_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	authzv1 "k8s.io/api/authorization/v1"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/function"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

const (
	discoverySA  = "system:serviceaccount:egress-system:egress-discovery"
	crossplaneSA = "system:serviceaccount:crossplane-system:crossplane"
)

func apply(t *testing.T, c client.Client, objs ...client.Object) {
	t.Helper()
	for _, o := range objs {
		if err := c.Create(context.Background(), o); err != nil && !kerrors.IsAlreadyExists(err) {
			t.Fatalf("%T %s: %v", o, o.GetName(), err)
		}
	}
}

// crossplaneRules are the rules of Crossplane's own ClusterRole, read from
// the Helm chart of the Crossplane release the tools module pins: what
// Crossplane's ServiceAccount holds before any aggregation.
func crossplaneRules(t *testing.T, root string) []rbacv1.PolicyRule {
	t.Helper()
	cmd := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/crossplane/crossplane/v2")
	cmd.Dir = filepath.Join(root, "hack", "tools")
	dir, err := cmd.Output()
	if err != nil {
		t.Fatalf("cannot find Crossplane's module (run `make tools`): %v", err)
	}
	raw, err := os.ReadFile(filepath.Join(strings.TrimSpace(string(dir)), "cluster", "charts", "crossplane", "templates", "clusterrole.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The rules follow the templated metadata.
	i := bytes.Index(raw, []byte("\nrules:\n"))
	if i < 0 {
		t.Fatal("Crossplane's ClusterRole template has no rules")
	}
	var doc struct {
		Rules []rbacv1.PolicyRule `json:"rules"`
	}
	if err := yaml.Unmarshal(raw[i+1:], &doc); err != nil || len(doc.Rules) == 0 {
		t.Fatalf("cannot read Crossplane's ClusterRole rules: %v", err)
	}
	return doc.Rules
}

// can asks the apiserver whether user may do verb on resource.
func can(t *testing.T, bed *testbed.Env, user string, a authzv1.ResourceAttributes) bool {
	t.Helper()
	sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{
		User: user, Groups: testbed.ServiceAccountGroups(user), ResourceAttributes: &a,
	}}
	if err := bed.Client.Create(context.Background(), sar); err != nil {
		t.Fatal(err)
	}
	return sar.Status.Allowed
}

// composeAccess runs function-proxyfleet on a fleet and returns the Role
// and RoleBinding it composes for egress-discovery.
func composeAccess(t *testing.T, namespace, authSecret string) []*unstructured.Unstructured {
	t.Helper()
	xr := resource.MustStructJSON(fmt.Sprintf(`{"apiVersion": "crawl.example.com/v1alpha1", "kind": "ProxyFleet",
		"metadata": {"name": "crawlers", "namespace": %q},
		"spec": {"zones": ["a"], "placement": {"local": {}}, "proxy": {"authSecretRef": {"name": %q}}, "healthCheck": {"url": "https://example.com/ip"}}}`, namespace, authSecret))
	rsp, err := function.New(function.Config{Log: logging.NewNopLogger(), Now: func() time.Time { return time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC) }}).
		RunFunction(context.Background(), &fnv1.RunFunctionRequest{
			Observed:          &fnv1.State{Composite: &fnv1.Resource{Resource: xr}},
			RequiredResources: map[string]*fnv1.Resources{"leases": {}},
		})
	if err != nil || len(rsp.GetResults()) != 0 {
		t.Fatalf("function: %v %v", err, rsp.GetResults())
	}
	var out []*unstructured.Unstructured
	for name, r := range rsp.GetDesired().GetResources() {
		if k := r.GetResource().GetFields()["kind"].GetStringValue(); k == "Role" || k == "RoleBinding" {
			if r.GetReady() != fnv1.Ready_READY_TRUE {
				t.Errorf("%s: RBAC objects have no status and must be composed ready", name)
			}
			out = append(out, &unstructured.Unstructured{Object: r.GetResource().AsMap()})
		}
	}
	if len(out) != 2 {
		t.Fatalf("want a Role and a RoleBinding for egress-discovery, got %d objects", len(out))
	}
	return out
}

// TestDiscoveryLeastPrivilege installs egress-discovery's RBAC as
// cluster/discovery renders it and the grant function-proxyfleet composes
// for one fleet, created under Crossplane's real ServiceAccount (its
// chart's ClusterRole plus cluster/crossplane-rbac, not an admin), and asks
// the apiserver what egress-discovery may do: read its fleet's auth Secret
// and write Leases in its fleet's namespace, and nothing else.
func TestDiscoveryLeastPrivilege(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	team, other := bed.Namespace(t), bed.Namespace(t)
	for _, u := range append(testbed.Kustomize(t, bed, "discovery"), testbed.Kustomize(t, bed, "crossplane-rbac")...) {
		switch u.GetKind() {
		case "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding":
			apply(t, bed.Client, u)
		}
	}

	// Crossplane's ServiceAccount, with its chart's ClusterRole. No
	// controller-manager runs here to aggregate ClusterRoles, so the
	// aggregated one is bound directly, as aggregation would grant it.
	apply(t, bed.Client,
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "crossplane-system"}},
		&rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "test:crossplane-chart"}, Rules: crossplaneRules(t, bed.Root)},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test:crossplane-chart"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "test:crossplane-chart"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "crossplane-system", Name: "crossplane"}, {Kind: rbacv1.ServiceAccountKind, Namespace: "crossplane-system", Name: "crossplane-unaggregated"}}},
		&rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "test:crossplane-aggregated"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "crossplane:aggregate-to-crossplane:egress-proxies"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "crossplane-system", Name: "crossplane"}}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "crawlers-proxy-auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "u", "password": "p"}},
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "unrelated"}},
	)

	// The apiserver's RBAC authorizer learns of new bindings through its
	// informers: wait until Crossplane's are in force.
	testbed.Eventually(t, 10*time.Second, "Crossplane's bindings in force", func() (bool, string) {
		return can(t, bed, crossplaneSA, authzv1.ResourceAttributes{Namespace: team, Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "roles"}), ""
	})
	grant := composeAccess(t, team, "crawlers-proxy-auth")
	t.Run("ComposedWithoutTheAggregatedRoleIsForbidden", func(t *testing.T) {
		c := testbed.Impersonating(t, bed, "system:serviceaccount:crossplane-system:crossplane-unaggregated")
		if err := c.Create(ctx, grant[0].DeepCopy()); !kerrors.IsForbidden(err) {
			t.Errorf("Crossplane's chart role alone must not create %s: %v", grant[0].GetKind(), err)
		}
	})
	xp := testbed.Impersonating(t, bed, crossplaneSA)
	// The Role first: a binding to a Role that does not exist yet is
	// refused (Crossplane retries it on its next reconcile).
	sort.Slice(grant, func(i, j int) bool { return grant[i].GetKind() == "Role" })
	for _, u := range grant {
		if err := xp.Create(ctx, u.DeepCopy()); err != nil {
			t.Fatalf("Crossplane's ServiceAccount cannot create the composed %s: %v", u.GetKind(), err)
		}
	}

	testbed.Eventually(t, 10*time.Second, "the fleet's grant in force", func() (bool, string) {
		return can(t, bed, discoverySA, authzv1.ResourceAttributes{Namespace: team, Verb: "get", Resource: "secrets", Name: "crawlers-proxy-auth"}), ""
	})
	leaseAttrs := func(ns, verb string) authzv1.ResourceAttributes {
		return authzv1.ResourceAttributes{Namespace: ns, Verb: verb, Group: "coordination.k8s.io", Resource: "leases", Name: "x"}
	}
	secret := func(ns, name, verb string) authzv1.ResourceAttributes {
		return authzv1.ResourceAttributes{Namespace: ns, Verb: verb, Resource: "secrets", Name: name}
	}
	for _, tc := range []struct {
		what string
		attr authzv1.ResourceAttributes
		want bool
	}{
		{"get its fleet's auth Secret", secret(team, "crawlers-proxy-auth", "get"), true},
		{"get another Secret of the fleet's namespace", secret(team, "unrelated", "get"), false},
		{"list the fleet namespace's Secrets", secret(team, "", "list"), false},
		{"get a Secret of the same name elsewhere", secret(other, "crawlers-proxy-auth", "get"), false},
		{"get a Secret in kube-system", secret("kube-system", "bootstrap-token-abcdef", "get"), false},
		{"list Secrets cluster-wide", secret("", "", "list"), false},
		{"create a Lease in its fleet's namespace", leaseAttrs(team, "create"), true},
		{"update a Lease in its fleet's namespace", leaseAttrs(team, "update"), true},
		// A renewal is a JSON patch: without it every renewal fails.
		{"patch a Lease in its fleet's namespace", leaseAttrs(team, "patch"), true},
		{"patch a Lease in kube-system", leaseAttrs("kube-system", "patch"), false},
		{"delete a Lease in its fleet's namespace", leaseAttrs(team, "delete"), true},
		{"update a Lease in kube-system (leader election)", leaseAttrs("kube-system", "update"), false},
		{"delete a Lease in kube-system", leaseAttrs("kube-system", "delete"), false},
		{"update a node heartbeat in kube-node-lease", leaseAttrs("kube-node-lease", "update"), false},
		{"create a Lease in a namespace without a fleet", leaseAttrs(other, "create"), false},
		{"update a Lease in a namespace without a fleet", leaseAttrs(other, "update"), false},
		{"watch Leases (its informer selects its own by label)", leaseAttrs("", "watch"), true},
		{"create pods", authzv1.ResourceAttributes{Namespace: team, Verb: "create", Resource: "pods"}, false},
		{"create Roles", authzv1.ResourceAttributes{Namespace: team, Verb: "create", Group: "rbac.authorization.k8s.io", Resource: "roles"}, false},
	} {
		if got := can(t, bed, discoverySA, tc.attr); got != tc.want {
			t.Errorf("egress-discovery may %s: want %v, got %v", tc.what, tc.want, got)
		}
	}

	// Within its fleet's namespace, the admission policy keeps it to the
	// Leases it labels: the team's own leader election is out of reach.
	t.Run("OnlyItsOwnLeases", func(t *testing.T) {
		theirs := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "team-leader-election"}, Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To("team-operator")}}
		apply(t, bed.Client, theirs)
		d := testbed.Impersonating(t, bed, discoverySA)
		mine := func(name string) *coordv1.Lease {
			return &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: name, Labels: map[string]string{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot}}}
		}
		// The policy takes effect once the apiserver has loaded it.
		testbed.Eventually(t, 30*time.Second, "the admission policy refuses an unlabelled Lease", func() (bool, string) {
			err := d.Create(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "unlabelled"}})
			if err == nil {
				_ = bed.Client.Delete(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "unlabelled"}})
			}
			return kerrors.IsForbidden(err) || kerrors.IsInvalid(err), fmt.Sprint(err)
		})
		cur := &coordv1.Lease{}
		if err := d.Get(ctx, client.ObjectKeyFromObject(theirs), cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.HolderIdentity = ptr.To("egress-discovery")
		if err := d.Update(ctx, cur); !kerrors.IsForbidden(err) && !kerrors.IsInvalid(err) {
			t.Errorf("egress-discovery took over the team's leader election Lease, or was refused for another reason: %v", err)
		}
		cur.Labels = map[string]string{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot}
		if err := d.Update(ctx, cur); !kerrors.IsForbidden(err) && !kerrors.IsInvalid(err) {
			t.Errorf("egress-discovery relabelled the team's Lease as its own, or was refused for another reason: %v", err)
		}
		if err := d.Delete(ctx, theirs.DeepCopy()); !kerrors.IsForbidden(err) && !kerrors.IsInvalid(err) {
			t.Errorf("egress-discovery deleted the team's Lease, or was refused for another reason: %v", err)
		}
		m := mine("crawlers-0-slot-0")
		if err := d.Create(ctx, m); err != nil {
			t.Fatalf("egress-discovery may create its own Lease: %v", err)
		}
		m.Spec.HolderIdentity = ptr.To("crawler")
		if err := d.Update(ctx, m); err != nil {
			t.Errorf("egress-discovery may update its own Lease: %v", err)
		}
		if err := d.Delete(ctx, m); err != nil {
			t.Errorf("egress-discovery may delete its own Lease: %v", err)
		}
		// Its demand Leases, which autoscaled fleets are sized by.
		dl := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: leasewire.DemandName("crawlers", "replica-1")}}
		leasewire.SetDemand(dl, "crawlers", "replica-1", leasewire.Demand{Waiting: 1}, time.Now())
		if err := d.Create(ctx, dl); err != nil {
			t.Fatalf("egress-discovery may create its demand Lease: %v", err)
		}
		leasewire.SetDemand(dl, "crawlers", "replica-1", leasewire.Demand{Waiting: 2}, time.Now())
		if err := d.Update(ctx, dl); err != nil {
			t.Errorf("egress-discovery may update its demand Lease: %v", err)
		}
		if err := d.Delete(ctx, dl); err != nil {
			t.Errorf("egress-discovery may delete its demand Lease: %v", err)
		}
	})

	// Nobody else writes the Leases discovery labels: a tenant's workload
	// that may write Leases (leader election) keeps its own, but cannot
	// forge a slot (which pins a proxy), nor change or delete discovery's.
	t.Run("OnlyItWritesItsLeases", func(t *testing.T) {
		tenant := "system:serviceaccount:" + team + ":team-elector"
		apply(t, bed.Client,
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "elector"}, Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"*"},
			}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "elector"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "elector"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: team, Name: "team-elector"}}},
		)
		testbed.Eventually(t, 10*time.Second, "the elector's Role in force", func() (bool, string) {
			return can(t, bed, tenant, leaseAttrs(team, "create")), ""
		})
		ten := testbed.Impersonating(t, bed, tenant)
		slot := func(name string) *coordv1.Lease {
			return &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: name, Labels: map[string]string{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot}},
				Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To("forged")}}
		}
		testbed.Eventually(t, 30*time.Second, "the policy refuses a forged slot", func() (bool, string) {
			err := ten.Create(ctx, slot("crawlers-1-slot-0"))
			if err == nil {
				_ = bed.Client.Delete(ctx, slot("crawlers-1-slot-0"))
			}
			return err != nil && strings.Contains(err.Error(), "egress-leases-by-discovery"), fmt.Sprint(err)
		})
		own := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "team-elector"}, Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To("pod-a")}}
		if err := ten.Create(ctx, own); err != nil {
			t.Fatalf("a tenant's own leader election Lease is refused: %v", err)
		}
		own.Spec.HolderIdentity = ptr.To("pod-b")
		if err := ten.Update(ctx, own); err != nil {
			t.Errorf("a tenant's own leader election Lease cannot be renewed: %v", err)
		}
		own.Labels = map[string]string{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindBan}
		if err := ten.Update(ctx, own.DeepCopy()); err == nil || !strings.Contains(err.Error(), "egress-leases-by-discovery") {
			t.Errorf("a tenant relabelled its Lease as a ban (or was refused for another reason): %v", err)
		}
		d := testbed.Impersonating(t, bed, discoverySA)
		theirs := slot("crawlers-0-slot-1")
		if err := d.Create(ctx, theirs); err != nil {
			t.Fatalf("egress-discovery may create its slot: %v", err)
		}
		cur := &coordv1.Lease{}
		if err := ten.Get(ctx, client.ObjectKeyFromObject(theirs), cur); err != nil {
			t.Fatal(err)
		}
		cur.Labels = nil
		if err := ten.Update(ctx, cur.DeepCopy()); err == nil || !strings.Contains(err.Error(), "egress-leases-by-discovery") {
			t.Errorf("a tenant unlabelled discovery's slot (or was refused for another reason): %v", err)
		}
		if err := ten.Delete(ctx, cur.DeepCopy()); err == nil || !strings.Contains(err.Error(), "egress-leases-by-discovery") {
			t.Errorf("a tenant deleted discovery's slot (or was refused for another reason): %v", err)
		}
		gc := testbed.Impersonating(t, bed, "system:serviceaccount:kube-system:generic-garbage-collector")
		if err := gc.Delete(ctx, cur); err != nil {
			t.Errorf("the garbage collector may delete a slot whose Proxy is gone: %v", err)
		}
	})

	// LeaseSummaries decide which proxies the function may remove and how
	// far an autoscaled fleet grows: only egress-discovery writes them,
	// though a tenant's workload be granted every verb on them.
	t.Run("OnlyItWritesLeaseSummaries", func(t *testing.T) {
		tenant := "system:serviceaccount:" + team + ":team-operator"
		apply(t, bed.Client,
			&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "summaries"}, Rules: []rbacv1.PolicyRule{{
				APIGroups: []string{v1alpha1.Group}, Resources: []string{"leasesummaries"}, Verbs: []string{"*"},
			}}},
			&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "summaries"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "summaries"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: team, Name: "team-operator"}}},
		)
		summary := func(name string) *v1alpha1.LeaseSummary {
			return &v1alpha1.LeaseSummary{
				ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: name, Labels: leasewire.SummarySelector("crawlers")},
				Spec: v1alpha1.LeaseSummarySpec{Fleet: "crawlers", Replica: "replica-1",
					ObservedAt: metav1.MicroTime{Time: time.Now()}, ValidUntil: metav1.MicroTime{Time: time.Now().Add(time.Minute)},
					Leased: []v1alpha1.LeasedProxy{{Name: "crawlers-0", Holders: 1, HeldUntil: metav1.MicroTime{Time: time.Now().Add(time.Hour)}}}},
			}
		}
		testbed.Eventually(t, 10*time.Second, "the tenant's Role in force", func() (bool, string) {
			return can(t, bed, tenant, authzv1.ResourceAttributes{Namespace: team, Verb: "create", Group: v1alpha1.Group, Resource: "leasesummaries"}), ""
		})
		ten := testbed.Impersonating(t, bed, tenant)
		testbed.Eventually(t, 30*time.Second, "the admission policy refuses the tenant's summary", func() (bool, string) {
			err := ten.Create(ctx, summary("forged"))
			if err == nil {
				_ = bed.Client.Delete(ctx, summary("forged"))
			}
			return err != nil && strings.Contains(err.Error(), "lease-summaries-by-discovery"), fmt.Sprint(err)
		})
		d := testbed.Impersonating(t, bed, discoverySA)
		mine := summary(leasewire.SummaryName("crawlers", "replica-1"))
		if err := d.Create(ctx, mine); err != nil {
			t.Fatalf("egress-discovery may create its LeaseSummary: %v", err)
		}
		cur := &v1alpha1.LeaseSummary{}
		if err := ten.Get(ctx, client.ObjectKeyFromObject(mine), cur); err != nil {
			t.Fatal(err)
		}
		cur.Spec.Leased = nil
		if err := ten.Update(ctx, cur.DeepCopy()); err == nil || !strings.Contains(err.Error(), "lease-summaries-by-discovery") {
			t.Errorf("a tenant emptied egress-discovery's LeaseSummary (or was refused for another reason): %v", err)
		}
		if err := ten.Delete(ctx, cur.DeepCopy()); err == nil || !strings.Contains(err.Error(), "lease-summaries-by-discovery") {
			t.Errorf("a tenant deleted egress-discovery's LeaseSummary (or was refused for another reason): %v", err)
		}
		cur.Spec.Demand.Waiting = 3
		if err := d.Update(ctx, cur); err != nil {
			t.Errorf("egress-discovery may update its LeaseSummary: %v", err)
		}
		// The namespace controller empties a deleted namespace.
		nsc := testbed.Impersonating(t, bed, "system:serviceaccount:kube-system:namespace-controller")
		if err := nsc.Delete(ctx, cur); err != nil {
			t.Errorf("the namespace controller may delete a LeaseSummary: %v", err)
		}
	})

	// Discovery's ClusterRole itself holds no Secret access and no Lease
	// writes: only the fleet's Role does.
	for _, u := range testbed.Kustomize(t, bed, "discovery") {
		if u.GetKind() != "ClusterRole" {
			continue
		}
		cr := &rbacv1.ClusterRole{}
		b, _ := yaml.Marshal(u.Object)
		if err := yaml.Unmarshal(b, cr); err != nil {
			t.Fatal(err)
		}
		for _, r := range cr.Rules {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					if res == "secrets" || (res == "leases" && v != "get" && v != "list" && v != "watch") {
						t.Errorf("egress-discovery's ClusterRole grants %s on %s", v, res)
					}
				}
			}
		}
	}
}

// TestClaimUseAuthorizes: a crawler team that holds "use" only on the
// ProxyFleetClaim (the legacy path) may use the fleet of that name in its
// namespace, and nowhere else.
func TestClaimUseAuthorizes(t *testing.T) {
	bed := sharedBed.Env(t)
	team, other := bed.Namespace(t), bed.Namespace(t)
	apply(t, bed.Client,
		&rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "claim-user"}, Rules: []rbacv1.PolicyRule{{
			APIGroups: []string{fleetv1alpha1.Group}, Resources: []string{fleetv1alpha1.ProxyFleetClaimResource}, Verbs: []string{"use"},
		}}},
		&rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Namespace: team, Name: "claim-user"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "claim-user"},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "legacy-crawler"}}},
	)
	testbed.Eventually(t, 10*time.Second, "the claim Role in force", func() (bool, string) {
		sar := &authzv1.SubjectAccessReview{Spec: authzv1.SubjectAccessReviewSpec{User: "legacy-crawler", ResourceAttributes: &authzv1.ResourceAttributes{
			Namespace: team, Verb: "use", Group: fleetv1alpha1.Group, Resource: fleetv1alpha1.ProxyFleetClaimResource, Name: "crawlers"}}}
		if err := bed.Client.Create(context.Background(), sar); err != nil {
			return false, err.Error()
		}
		return sar.Status.Allowed, sar.Status.Reason
	})
	// A fresh authoriser for each question: answers are cached by token,
	// and these identities have none.
	authorize := func(user, ns string) error {
		return (discovery.NewKubernetes(discovery.KubernetesConfig{Client: bed.Client})).Authorize(context.Background(), &discovery.Identity{User: user}, ns, "crawlers")
	}
	if err := authorize("legacy-crawler", team); err != nil {
		t.Errorf("use on the claim must authorise its fleet: %v", err)
	}
	if err := authorize("legacy-crawler", other); !errors.Is(err, discovery.ErrForbidden) {
		t.Errorf("use on a claim in one namespace must not reach another: %v", err)
	}
	if err := authorize("stranger", team); !errors.Is(err, discovery.ErrForbidden) {
		t.Errorf("nobody else may use it: %v", err)
	}
}

// TestCacheHoldsOnlyDiscoveryLeases: egress-discovery's cache, built with
// discovery.CacheOptions, sees the Leases it makes and none of the
// cluster's others (node heartbeats, leader elections).
func TestCacheHoldsOnlyDiscoveryLeases(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	opts := discovery.CacheOptions()
	opts.Scheme = bed.Scheme
	c, err := cache.New(bed.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = c.Start(ctx) }()
	apply(t, bed.Client,
		&coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "node-heartbeat"}, Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To("node-1")}},
		&coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "slot", Labels: map[string]string{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindSlot}}},
		&coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ban", Labels: map[string]string{fleetv1alpha1.LabelLeaseKind: fleetv1alpha1.LeaseKindBan}}},
	)
	testbed.Eventually(t, 10*time.Second, "the cache holds exactly discovery's Leases", func() (bool, string) {
		l := &coordv1.LeaseList{}
		if err := c.List(ctx, l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		var names []string
		for _, x := range l.Items {
			names = append(names, x.Name)
		}
		return len(names) == 2 && !strings.Contains(strings.Join(names, ","), "heartbeat"), strings.Join(names, ",")
	})
	// It holds no managedFields, and an update of what it holds (as the
	// ban store extends a ban) leaves the API server's as they were.
	cached := &coordv1.Lease{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ban"}, cached); err != nil {
		t.Fatal(err)
	}
	if len(cached.ManagedFields) != 0 {
		t.Errorf("the cache holds managedFields: %d entries", len(cached.ManagedFields))
	}
	cached.Spec.HolderIdentity = ptr.To("extended")
	if err := bed.Client.Update(ctx, cached); err != nil {
		t.Fatal(err)
	}
	live := &coordv1.Lease{}
	if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "ban"}, live); err != nil {
		t.Fatal(err)
	}
	if len(live.ManagedFields) == 0 || *live.Spec.HolderIdentity != "extended" {
		t.Errorf("an update from the cache: want the API server's managedFields kept and the change made, got %d entries, holder %v", len(live.ManagedFields), live.Spec.HolderIdentity)
	}
}

// TestUnlabelledSecretNeverServed: a fleet author names, as the fleet's
// auth Secret, a Secret its owner did not label for proxies (a
// ServiceAccount token, say). egress-discovery, which may read it through
// the fleet's grant, still never hands it to crawlers.
func TestUnlabelledSecretNeverServed(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fleet(t, ns, "stolen", 1, 1, nil)
	ctx := context.Background()
	s := &corev1.Secret{}
	if err := bed.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "stolen-auth"}, s); err != nil {
		t.Fatal(err)
	}
	delete(s.Labels, v1alpha1.LabelProxySecret)
	if err := bed.Client.Update(ctx, s); err != nil {
		t.Fatal(err)
	}
	srv := server(t, "team-token "+ns+"\n")
	code, _, body := call(t, srv, "team-token", "GET", "/v1/fleets/"+ns+"/stolen/proxies.txt", "")
	if code == 200 || strings.Contains(string(body), "s3cret") {
		t.Errorf("proxies.txt from an unlabelled Secret: %d %q", code, body)
	}
	code, _, body = call(t, srv, "team-token", "POST", "/v1/leases", `{"fleet": "`+ns+`/stolen", "holder": "x"}`)
	if code < 400 || strings.Contains(string(body), "s3cret") {
		t.Errorf("a lease on a proxy whose Secret is unlabelled: %d %q", code, body)
	}
	// Not the API server failing, which a 503 would say: the fleet's
	// owner must label the Secret, or create it.
	if code != 404 || !strings.Contains(string(body), "is not labelled") {
		t.Errorf("an unlabelled Secret: want 404 saying so, got %d %q", code, body)
	}
	if err := bed.Client.Delete(ctx, s); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, "a missing Secret answered 404", func() (bool, string) {
		code, _, body := call(t, srv, "team-token", "GET", "/v1/fleets/"+ns+"/stolen/proxies.txt", "")
		return code == 404 && strings.Contains(string(body), "stolen-auth does not exist"), fmt.Sprintf("%d %s", code, body)
	})
}
