package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
)

// repairing is a backend whose instances depend on something outside them
// (a GCP firewall rule), in place or not.
type repairing struct {
	*fake.Backend
	ready   bool
	repairs int
}

// TestObserveRepair: Observe has the backend put right what a running
// instance depends on, and does not hand the instance out until it is in
// place; Observe-only management changes nothing, not even that.
func TestObserveRepair(t *testing.T) {
	pc := &config{Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	want := desiredSpec(unitProxy(), pc, "unit", nil, "")
	cases := map[string]struct {
		reason  string
		ready   bool
		mod     func(*v1alpha1.Proxy)
		repairs int
		host    string
		cond    xpv2.ConditionReason
	}{
		"InPlace":       {reason: "A running instance whose rule is in place is used.", ready: true, repairs: 1, host: "127.0.0.1", cond: ReasonProbeFailing},
		"BeingPutRight": {reason: "An instance whose rule is being restored is not used.", ready: false, repairs: 1, host: "", cond: ReasonProvisioning},
		"ObserveOnly": {reason: "Observe-only never writes, so never repairs.", ready: false, repairs: 0, host: "127.0.0.1", cond: ReasonProbeFailing,
			mod: func(p *v1alpha1.Proxy) {
				p.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve})
			}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := &repairing{Backend: fake.New(), ready: tc.ready}
			b.Put(backend.Instance{Ref: want.Ref, ProviderID: localID, Host: "127.0.0.1", Port: 3128,
				Phase: v1alpha1.InstancePhaseRunning, CreatedAt: epoch.Add(-time.Hour), SpecHash: want.Hash})
			p := unitProxy()
			if tc.mod != nil {
				tc.mod(p)
			}
			e := newExternal(b, &fakeProber{res: probe.Result{OK: false, Error: "not yet"}}, &clock{t: epoch})
			e.sched.seen[p.GetUID()] = epoch
			if _, err := e.Observe(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			if b.repairs != tc.repairs || p.Status.AtProvider.Host != tc.host || p.GetCondition(xpv2.TypeReady).Reason != tc.cond {
				t.Errorf("%s\nwant %d repairs, host %q, %s; got %d, %q, %s", tc.reason, tc.repairs, tc.host, tc.cond,
					b.repairs, p.Status.AtProvider.Host, p.GetCondition(xpv2.TypeReady).Reason)
			}
		})
	}
}

// TestRecordedRef: the instance is looked for where the provider recorded
// it (status.atProvider.providerID), under the name recorded there (an
// imported instance's is not derived from the Proxy's UID), and the
// external-name annotation, which a tenant may edit, is not read at all.
// Whose the recorded instance is, only its labels say: TestObserve's
// RecordNamesAnotherInstance.
func TestRecordedRef(t *testing.T) {
	pc := &config{Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendGCP}}
	vm := func(ext string) backend.Ref {
		p := unitProxy(func(p *v1alpha1.Proxy) {
			p.Spec.ForProvider.Local = nil
			p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-c"}
			p.Status.AtProvider.ProviderID = ext
		})
		return recordedRef(p, pc)
	}
	name := ownership.InstanceName(unitProxy().GetUID())
	cases := map[string]struct {
		ext, zone, name string
	}{
		"Unrecorded":  {ext: "", zone: "europe-west1-c"},
		"DefaultName": {ext: "my-proxy", zone: "europe-west1-c"},
		"Recorded":    {ext: "projects/p/zones/europe-west1-b/instances/" + name, zone: "europe-west1-b"},
		"Imported":    {ext: "projects/p/zones/europe-west1-b/instances/their-vm", zone: "europe-west1-b", name: "their-vm"},
	}
	for n, tc := range cases {
		t.Run(n, func(t *testing.T) {
			want := name
			if tc.name != "" {
				want = tc.name
			}
			if r := vm(tc.ext); r.Zone != tc.zone || r.Name != want {
				t.Errorf("providerID %q: want %s/%s, got %s/%s", tc.ext, tc.zone, want, r.Zone, r.Name)
			}
		})
	}
	pods := &config{Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendKubernetes}}
	p := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.Kubernetes = &v1alpha1.KubernetesPlacement{Namespace: "proxies-new"}
		p.Status.AtProvider.ProviderID = "proxies-old/" + name
	})
	if r := recordedRef(p, pods); r.Namespace != "proxies-old" || r.Name != name {
		t.Errorf("a pod is found in the namespace it was recorded in: %+v", r)
	}
	p.Status.AtProvider.ProviderID = "team/imported"
	if r := recordedRef(p, pods); r.Namespace != "team" || r.Name != "imported" {
		t.Errorf("an imported pod is found where it was recorded: %+v", r)
	}
	p.Status.AtProvider.ProviderID = ""
	meta.SetExternalName(p, "kube-system/"+name)
	if r := recordedRef(p, pods); r.Namespace != "proxies-new" {
		t.Errorf("the external-name annotation, which a tenant may write, is not read: %+v", r)
	}
}

// TestTerminatedBackoff: an instance that keeps terminating (a pod whose
// image cannot run) is replaced at once the first time, then after 10s
// doubling to 10 minutes, and each termination's Event says what the
// backend said of it.
func TestTerminatedBackoff(t *testing.T) {
	b := fake.New()
	b.Phase = v1alpha1.InstancePhaseTerminated
	c := &clock{t: epoch}
	b.Now = c.now
	e := newExternal(b, &fakeProber{}, c)
	p := unitProxy()
	n := reconcileFor(t, e, b, c, p, 10*time.Minute)
	// 0s, then about 10, 20, 40, 80, 160 and 320s later: 7 in 10 minutes,
	// against one every two seconds without back-off.
	if n < 5 || n > 8 {
		t.Errorf("replacements of an instance that keeps terminating in 10 minutes: got %d, want 5..8", n)
	}
	if got := p.GetAnnotations()[annotationTerminations]; got == "" {
		t.Error("the terminations are counted on the Proxy")
	}
	c.t = c.t.Add(time.Hour)
	if _, d := replaceTerminated(p, c.t); d != 0 {
		t.Errorf("after an instance lasted %s, the next termination is replaced at once: waits %s", terminationMemory, d)
	}
}

// TestTerminationCountsOnce: an instance on its way out is seen terminated
// by several reconciles (a VM STOPPING keeps its name); it counts as one
// termination, with one Event, and its replacement is made at once.
func TestTerminationCountsOnce(t *testing.T) {
	b := fake.New()
	b.Linger = 5
	c := &clock{t: epoch}
	b.Now = c.now
	rec := &countingRecorder{}
	e := newExternal(b, &fakeProber{}, c)
	e.record = rec
	p := unitProxy()
	reconcileFor(t, e, b, c, p, 3*time.Second)
	want := desiredSpec(p, e.pc, "unit", nil, "")
	i, err := b.Get(context.Background(), want.Ref)
	if err != nil {
		t.Fatal(err)
	}
	i.Phase = v1alpha1.InstancePhaseTerminated
	b.Put(*i)
	reconcileFor(t, e, b, c, p, 20*time.Second)
	if got := p.GetAnnotations()[annotationTerminations]; got != "1" {
		t.Errorf("one terminated instance counts once, however many reconciles see it: %s", got)
	}
	if rec.reasons["InstanceTerminated"] != 1 {
		t.Errorf("and gets one Event: %d", rec.reasons["InstanceTerminated"])
	}
	if i, err := b.Get(context.Background(), want.Ref); err != nil || i.Phase != v1alpha1.InstancePhaseRunning {
		t.Errorf("its replacement runs: %+v, %v", i, err)
	}
}

type countingRecorder struct{ reasons map[string]int }

// TestMovedToAnotherProject: a VM recorded in another project than the
// Proxy's configuration now uses is out of its reach; no second VM is made
// while the first runs unobserved, and the Proxy says why.
func TestMovedToAnotherProject(t *testing.T) {
	b := fake.New()
	e := newExternal(b, &fakeProber{}, &clock{t: epoch})
	e.pc = &config{Kind: v1alpha1.ClusterProviderConfigKind, Name: "gcp", Spec: v1alpha1.ProviderConfigSpec{
		Backend: v1alpha1.BackendGCP, GCP: &v1alpha1.GCPBackend{Project: "new-proj"}}}
	p := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b"}
	})
	p.Status.AtProvider.ProviderID = "projects/old-proj/zones/europe-west1-b/instances/" + ownership.InstanceName(p.GetUID())
	obs, err := e.Observe(context.Background(), p)
	if err == nil || obs.ResourceExists || !strings.Contains(err.Error(), "project old-proj") {
		t.Fatalf("want an error naming the old project, got %+v, %v", obs, err)
	}
	if c := p.GetCondition(xpv2.TypeReady); !strings.Contains(c.Message, "new-proj") || b.CallCount("Get") != 0 {
		t.Errorf("the condition says so, and nothing is asked of the new project: %q, %d gets", c.Message, b.CallCount("Get"))
	}
	deleted := p.DeepCopy()
	deleted.DeletionTimestamp = &metav1.Time{Time: epoch}
	if obs, err := e.Observe(context.Background(), deleted); err == nil || obs.ResourceExists {
		t.Errorf("a deleted Proxy whose VM may still run elsewhere keeps its finalizer: %+v, %v", obs, err)
	}
	p.Status.AtProvider.ProviderID = "projects/new-proj/zones/europe-west1-b/instances/" + ownership.InstanceName(p.GetUID())
	if _, err := e.Observe(context.Background(), p); err != nil || b.CallCount("Get") != 1 {
		t.Errorf("an instance in the configuration's project is observed as usual: %v, %d gets", err, b.CallCount("Get"))
	}
}

func crashLooping(i backend.Instance) *backend.Instance {
	i.CrashLoop = "Squid exited 3 times in a row within 1m0s of starting"
	return &i
}
