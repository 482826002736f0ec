package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clientfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe/pool"
)

// These tests pin the branches of Observe that TestObserve's table does
// not: the probing a managed Proxy's Observe stops, the wait for a lagging
// listing, letting go of a deleted Proxy, delete errors, the events of
// transitions, and the diffs that replace an instance.

// runningInstance is unitProxy's instance, running and current.
func runningInstance() backend.Instance {
	want := desiredSpec(unitProxy(), &config{Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}, "unit", nil, "")
	return backend.Instance{
		Ref: want.Ref, ProviderID: localID, Host: "127.0.0.1", Port: 3128,
		Phase: v1alpha1.InstancePhaseRunning, CreatedAt: epoch.Add(-time.Hour), SpecHash: want.Hash,
	}
}

// TestObserveStopsProbing: a managed Proxy whose instance is not running,
// is gone, is refused or whose Proxy is deleted has its probes stopped; a
// running one keeps them.
func TestObserveStopsProbing(t *testing.T) {
	cases := map[string]struct {
		reason string
		// then changes the backend or the Proxy after a first Observe
		// that started the probes.
		then    func(*fake.Backend, *v1alpha1.Proxy)
		probing bool
	}{
		"StillRunning": {
			reason:  "A running instance keeps its probes (so the checks below can fail).",
			then:    func(*fake.Backend, *v1alpha1.Proxy) {},
			probing: true,
		},
		"Provisioning": {
			reason: "An instance that does not run (restarting, say) is not probed.",
			then: func(b *fake.Backend, _ *v1alpha1.Proxy) {
				i := runningInstance()
				i.Phase, i.Host = v1alpha1.InstancePhaseProvisioning, ""
				b.Put(i)
			},
		},
		"Terminated": {
			reason: "A terminated instance, deleted to be replaced, is not probed.",
			then: func(b *fake.Backend, _ *v1alpha1.Proxy) {
				i := runningInstance()
				i.Phase, i.Host = v1alpha1.InstancePhaseTerminated, ""
				b.Put(i)
			},
		},
		"Gone": {
			reason: "An instance that is gone is not probed.",
			then: func(b *fake.Backend, _ *v1alpha1.Proxy) {
				_ = b.Delete(context.Background(), runningInstance().Ref)
			},
		},
		"GetFails": {
			reason: "An instance that cannot be observed is not probed on an old verdict.",
			then: func(b *fake.Backend, _ *v1alpha1.Proxy) {
				b.GetErr = backend.Errorf(backend.ClassTransient, "backend down")
			},
		},
		"Deleted": {
			reason: "A deleted Proxy's instance is not probed.",
			then: func(_ *fake.Backend, p *v1alpha1.Proxy) {
				p.SetDeletionTimestamp(&metav1.Time{Time: epoch})
			},
		},
		"NotPermitted": {
			reason: "A refused instance is not probed.",
			then: func(_ *fake.Backend, p *v1alpha1.Proxy) {
				p.Spec.ForProvider.AllowedPrivateDestinations = []v1alpha1.CIDR{"10.1.0.0/16"}
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := &clock{t: epoch}
			pr := &fakeProber{res: probe.Result{OK: true, EgressIP: "192.0.2.1"}}
			b := fake.New()
			b.Put(runningInstance())
			e := newExternal(b, pr, c)
			e.sched.pool = pool.New(pool.Config{Prober: pr, Workers: 1, Poll: time.Minute, Now: c.now, Metrics: metrics.NewProvider()})
			p := unitProxy()
			if _, err := e.Observe(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			if _, ok := e.sched.pool.Polled(p.GetUID(), time.Minute); !ok {
				t.Fatal("a running instance's Observe did not start its probes")
			}
			tc.then(b, p)
			_, _ = e.Observe(context.Background(), p)
			if _, got := e.sched.pool.Polled(p.GetUID(), time.Minute); got != tc.probing {
				t.Errorf("%s\nprobing: got %v, want %v", tc.reason, got, tc.probing)
			}
		})
	}
}

// laggingList is a backend whose listing may miss a new instance for lag.
type laggingList struct {
	*fake.Backend
	lag time.Duration
}

func (l laggingList) ListingLag() time.Duration { return l.lag }

// TestObserveLetsGo: a deleted Proxy whose instance is not found deletes
// what remains of it and lets go, except while a lagging backend may not
// list an instance a cut-short create made, and except for an imported
// instance, whose remains are not the Proxy's to delete.
func TestObserveLetsGo(t *testing.T) {
	deleted := func(mods ...func(*v1alpha1.Proxy)) *v1alpha1.Proxy {
		return unitProxy(append([]func(*v1alpha1.Proxy){func(p *v1alpha1.Proxy) { p.SetDeletionTimestamp(&metav1.Time{Time: epoch}) }}, mods...)...)
	}
	cutShort := func(ago time.Duration) func(*v1alpha1.Proxy) {
		return func(p *v1alpha1.Proxy) { meta.SetExternalCreatePending(p, epoch.Add(-ago)) }
	}
	cases := map[string]struct {
		reason    string
		proxy     *v1alpha1.Proxy
		lag       time.Duration
		deleteErr error
		err       error
		deletes   int
		lets      bool
	}{
		"Deleted": {
			reason: "What remains is deleted, and the Proxy let go.",
			proxy:  deleted(), deletes: 1, lets: true,
		},
		"CutShortMomentsAgo": {
			reason: "A create cut short within the listing's lag may have made an instance not listed yet: nothing is deleted, the Proxy is held.",
			proxy:  deleted(cutShort(10 * time.Second)), lag: time.Minute,
			err: errors.Errorf(errFmtCutShort, 10*time.Second, "Local", time.Minute),
		},
		"CutShortLongAgo": {
			reason: "Past the lag, the instance was never made.",
			proxy:  deleted(cutShort(2 * time.Minute)), lag: time.Minute, deletes: 1, lets: true,
		},
		"CutShortInTheFuture": {
			reason: "A create-pending time ahead of this clock (an edited annotation) holds nothing up.",
			proxy:  deleted(cutShort(-time.Hour)), lag: time.Minute, deletes: 1, lets: true,
		},
		"CutShortNotLagging": {
			reason: "A backend that lists at once holds nothing up.",
			proxy:  deleted(cutShort(10 * time.Second)), deletes: 1, lets: true,
		},
		"Imported": {
			reason: "What remains of an imported instance is the orphan collector's: the Proxy is let go, nothing deleted.",
			proxy:  deleted(func(p *v1alpha1.Proxy) { p.Status.AtProvider.ProviderID = victimID }), lets: true,
		},
		"DeleteFails": {
			reason:    "A delete that fails keeps the Proxy, and says why.",
			proxy:     deleted(),
			deleteErr: errBackendDown,
			err:       errors.Wrap(errBackendDown, errDeleteRemains), deletes: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := fake.New()
			b.DeleteErr = tc.deleteErr
			e := newExternal(b, &fakeProber{}, &clock{t: epoch})
			if tc.lag > 0 {
				e.backend = laggingList{Backend: b, lag: tc.lag}
			}
			e.sched.seen[tc.proxy.GetUID()] = epoch.Add(-time.Hour)
			obs, err := e.Observe(context.Background(), tc.proxy)
			if diff := cmp.Diff(tc.err, err, test.EquateErrors()); diff != "" {
				t.Errorf("%s\nerror: -want, +got:\n%s", tc.reason, diff)
			}
			if got := b.CallCount("Delete"); got != tc.deletes {
				t.Errorf("%s\ndeletes: got %d, want %d", tc.reason, got, tc.deletes)
			}
			_, seen := e.sched.seen[tc.proxy.GetUID()]
			if lets := err == nil && !obs.ResourceExists; lets != tc.lets || lets == seen {
				t.Errorf("%s\nlet go: got %v (scheduler still knows it: %v), want %v", tc.reason, lets, seen, tc.lets)
			}
			wantErrors := 0.0
			if tc.deleteErr != nil {
				wantErrors = 1
			}
			if got := testutil.ToFloat64(e.metrics.BackendErrors.WithLabelValues(e.backendName(), "delete", string(backend.ClassTransient))); got != wantErrors {
				t.Errorf("%s\ndelete errors counted: got %v, want %v", tc.reason, got, wantErrors)
			}
		})
	}
}

// TestObserveTerminatedDeleteFails: a terminated instance that cannot be
// deleted is not reported gone (no second instance beside it), and the
// error is counted.
func TestObserveTerminatedDeleteFails(t *testing.T) {
	b := fake.New()
	i := runningInstance()
	i.Phase, i.Host = v1alpha1.InstancePhaseTerminated, ""
	b.Put(i)
	b.DeleteErr = errBackendDown
	e := newExternal(b, &fakeProber{}, &clock{t: epoch})
	_, err := e.Observe(context.Background(), unitProxy())
	if diff := cmp.Diff(errors.Wrap(errBackendDown, errDeleteTerminated), err, test.EquateErrors()); diff != "" {
		t.Errorf("error: -want, +got:\n%s", diff)
	}
	if got := testutil.ToFloat64(e.metrics.BackendErrors.WithLabelValues(e.backendName(), "delete", string(backend.ClassTransient))); got != 1 {
		t.Errorf("delete errors counted: %v, want 1", got)
	}
}

// failingRetain is a Retainer that cannot mark its instances.
type failingRetain struct{ *fake.Backend }

func (failingRetain) SetRetain(context.Context, backend.Ref, bool) error {
	return errors.New("label refused")
}

// TestObserveEvents: the events Observe records. CrashLoopBackOff is
// recorded once, on the transition, however often the instance is
// observed; the others are recorded at each Observe that finds their
// cause (the event recorder folds repeats into a count), so their cases
// observe once.
func TestObserveEvents(t *testing.T) {
	crashing := runningInstance()
	crashing.CrashLoop = "squid restarted 5 times in 10 minutes"
	cases := map[string]struct {
		reason   string
		proxy    *v1alpha1.Proxy
		instance *backend.Instance
		retain   bool
		repair   *repairing
		observes int
		want     string
	}{
		"ImportedInstanceGone": {
			reason: "An imported instance that is gone is reported, and the Proxy makes its own.",
			proxy:  unitProxy(func(p *v1alpha1.Proxy) { p.Status.AtProvider.ProviderID = victimID }),
			want:   "ImportedInstanceGone", observes: 2,
		},
		"ImportRefused": {
			reason: "A deleted Proxy whose status names another's instance is let go with a warning.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.Status.AtProvider.ProviderID = victimID
				p.SetDeletionTimestamp(&metav1.Time{Time: epoch})
			}),
			instance: victimInstance(),
			want:     "ImportRefused", observes: 1,
		},
		"CrashLoopBackOff": {
			reason:   "A crash-looping instance is reported once, on the transition, however often it is observed.",
			proxy:    unitProxy(),
			instance: &crashing,
			want:     "CrashLoopBackOff", observes: 3,
		},
		"CannotMarkInstance": {
			reason: "An instance that cannot be marked to outlive its Proxy is reported.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate})
			}),
			instance: ptrTo(runningInstance()),
			retain:   true,
			want:     "CannotMarkInstance", observes: 1,
		},
		"RepairingInstance": {
			reason:   "A running instance whose firewall rule is being restored is reported, and not used meanwhile.",
			proxy:    unitProxy(),
			instance: ptrTo(runningInstance()),
			repair:   &repairing{ready: false},
			want:     "RepairingInstance", observes: 1,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := fake.New()
			if tc.instance != nil {
				b.Put(*tc.instance)
			}
			rec := &countingRecorder{}
			e := newExternal(b, &fakeProber{res: probe.Result{OK: true, EgressIP: "192.0.2.1"}}, &clock{t: epoch})
			e.record = rec
			e.sched.seen[tc.proxy.GetUID()] = epoch.Add(-time.Hour)
			switch {
			case tc.retain:
				e.backend = failingRetain{b}
			case tc.repair != nil:
				tc.repair.Backend = b
				e.backend = tc.repair
			}
			for range tc.observes {
				_, _ = e.Observe(context.Background(), tc.proxy)
			}
			if got := rec.reasons[tc.want]; got != 1 {
				t.Errorf("%s\n%s events: got %d, want 1 (all: %v)", tc.reason, tc.want, got, rec.reasons)
			}
		})
	}
}

// TestObserveReplaces: an instance whose cloud-init cannot be read is not
// judged, and one recorded where the spec no longer places it is replaced.
func TestObserveReplaces(t *testing.T) {
	t.Run("UserDataUnreadable", func(t *testing.T) {
		pc := &config{Kind: "ProviderConfig", Name: "aws", Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendAWS, Policy: &v1alpha1.Policy{AWS: &v1alpha1.AWSPolicy{AllowUserData: true}},
		}}
		p := unitProxy(func(p *v1alpha1.Proxy) {
			p.Spec.ForProvider.Local = nil
			p.Spec.ForProvider.AWS = &v1alpha1.AWSPlacement{Zone: "eu-west-1a", AWSInstance: v1alpha1.AWSInstance{UserData: &v1alpha1.CloudInit{}}}
		})
		b := fake.New()
		b.Put(backend.Instance{Ref: instanceRef(p, pc), ProviderID: "aws", Phase: v1alpha1.InstancePhaseRunning, Host: "192.0.2.7", Port: 3128})
		e := newExternal(b, &fakeProber{}, &clock{t: epoch})
		e.pc = pc
		_, err := e.Observe(context.Background(), p)
		if diff := cmp.Diff(errors.New("spec.forProvider.aws.userData needs inline or secretRef"), err, test.EquateErrors()); diff != "" {
			t.Errorf("error: -want, +got:\n%s", diff)
		}
		if c := p.GetCondition(xpv2.TypeReady); c.Reason != ReasonSecretUnavailable || c.Status != corev1.ConditionFalse {
			t.Errorf("Ready: got %s %s, want False %s", c.Status, c.Reason, ReasonSecretUnavailable)
		}
	})
	t.Run("NamespaceMoved", func(t *testing.T) {
		pc := &config{Kind: "ProviderConfig", Name: "pods", Spec: v1alpha1.ProviderConfigSpec{
			Backend: v1alpha1.BackendKubernetes, Policy: &v1alpha1.Policy{Kubernetes: &v1alpha1.KubernetesPolicy{AllowedNamespaces: []string{"proxies-a", "proxies-b"}}},
		}}
		p := unitProxy(func(p *v1alpha1.Proxy) {
			p.Spec.ForProvider.Local = nil
			p.Spec.ForProvider.Kubernetes = &v1alpha1.KubernetesPlacement{Namespace: "proxies-b"}
		})
		want := desiredSpec(p, pc, "unit", nil, "")
		old := want.Ref
		old.Namespace = "proxies-a"
		p.Status.AtProvider.ProviderID = "proxies-a/" + old.Name
		b := fake.New()
		b.Put(backend.Instance{Ref: old, ProviderID: p.Status.AtProvider.ProviderID, Phase: v1alpha1.InstancePhaseRunning, Host: "10.0.0.7", Port: 3128, SpecHash: want.Hash, CreatedAt: epoch})
		e := newExternal(b, &fakeProber{res: probe.Result{OK: true}}, &clock{t: epoch})
		e.pc = pc
		obs, err := e.Observe(context.Background(), p)
		if err != nil {
			t.Fatal(err)
		}
		if !obs.ResourceExists || obs.ResourceUpToDate || !strings.Contains(obs.Diff, `is not where the spec places it (zone "", namespace "proxies-b")`) {
			t.Errorf("an instance recorded in another namespace than the spec's is replaced: %+v", obs)
		}
	})
}

// victimInstance is another Proxy's running local instance.
func victimInstance() *backend.Instance {
	return &backend.Instance{Ref: backend.Ref{Name: strings.TrimPrefix(victimID, "local/")}, ProviderID: victimID, Phase: v1alpha1.InstancePhaseRunning, Host: "127.0.0.1", Port: 3129,
		Owner: ownership.Owner{ClusterID: "unit", Namespace: "team", Name: "victim", UID: "victim-uid"}}
}

func ptrTo[T any](v T) *T { return &v }

// errBackendDown is a backend's transient failure.
var errBackendDown = backend.Errorf(backend.ClassTransient, "backend down")

// TestObserveCountsHeldCreates: a Proxy whose create is held back after
// failures is counted in egress_proxy_creates_held, by backend and the
// failures' class, for as long as the hold lasts, and once.
func TestObserveCountsHeldCreates(t *testing.T) {
	c := &clock{t: epoch}
	e := newExternal(fake.New(), &fakeProber{}, c)
	p := unitProxy()
	recordCreateFailure(p, backend.Errorf(backend.ClassQuota, "Quota 'CPUS' exceeded"), epoch)
	held := func() float64 {
		return testutil.ToFloat64(e.metrics.CreatesHeld.WithLabelValues(e.backendName(), string(backend.ClassQuota)))
	}
	for range 2 {
		if _, err := e.Observe(context.Background(), p); err == nil {
			t.Fatal("a held create is reported")
		}
	}
	if got := held(); got != 1 {
		t.Errorf("a held create is counted once however often observed: %v", got)
	}
	c.t = epoch.Add(time.Hour)
	if _, err := e.Observe(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if got := held(); got != 0 {
		t.Errorf("a hold that ended is counted no more: %v", got)
	}
}

// adoptedFirst is a backend whose instances another Proxy has just
// imported: every Adopt is refused as held elsewhere.
type adoptedFirst struct{ *fake.Backend }

func (adoptedFirst) Adopt(_ context.Context, r backend.Ref, from types.UID, _ ownership.Owner) error {
	return backend.HeldElsewhere("local instance "+r.Name, "first-importer-uid", from)
}

// TestImportLostToAnother: an import another Proxy won (Adopt refused as
// held elsewhere) is the import's refusal, ImportRefused, not a failure of
// the backend: nothing is counted against it.
func TestImportLostToAnother(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := v1alpha1.SchemeBuilder.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	b := fake.New()
	b.Put(backend.Instance{Ref: backend.Ref{Name: strings.TrimPrefix(victimID, "local/")}, ProviderID: victimID, Phase: v1alpha1.InstancePhaseRunning, Host: "127.0.0.1", Port: 3129,
		Owner: ownership.Owner{ClusterID: "unit", Namespace: "ns", Name: "gone", UID: "gone-uid"}})
	e := newExternal(adoptedFirst{b}, &fakeProber{}, &clock{t: epoch})
	e.kube = clientfake.NewClientBuilder().WithScheme(scheme).Build()
	p := unitProxy(func(p *v1alpha1.Proxy) { meta.SetExternalName(p, victimID) })
	_, err := e.Observe(context.Background(), p)
	if err == nil || !strings.Contains(err.Error(), "belongs to Proxy uid first-importer-uid") {
		t.Errorf("the import is refused saying who holds the instance: %v", err)
	}
	if c := p.GetCondition(xpv2.TypeReady); c.Reason != ReasonImportRefused {
		t.Errorf("Ready: %s %s, want %s", c.Reason, c.Message, ReasonImportRefused)
	}
	if got := testutil.ToFloat64(e.metrics.BackendErrors.WithLabelValues(e.backendName(), "adopt", string(backend.ClassTransient))); got != 0 {
		t.Errorf("a lost import counted as a backend error: %v", got)
	}
}
