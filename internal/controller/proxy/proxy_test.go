package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/gcp/gcpfake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
)

// fakeProber answers every probe with res and counts the calls; a request
// without credentials gets closure, Closed when unset.
type fakeProber struct {
	res     probe.Result
	calls   int
	closure probe.Closure
}

func (f *fakeProber) Probe(context.Context, probe.Target) probe.Result {
	f.calls++
	return f.res
}

func (f *fakeProber) Closed(context.Context, probe.Target) (probe.Closure, string) {
	if f.closure == "" {
		return probe.ClosureClosed, "the proxy demanded credentials"
	}
	return f.closure, "fake closure " + string(f.closure)
}

// clock is a settable fake clock.
type clock struct{ t time.Time }

func (c *clock) now() time.Time { return c.t }

var epoch = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func newExternal(b backend.Backend, pr Prober, c *clock) *external {
	return &external{
		connector: &connector{
			clusterID: "unit", prober: pr, metrics: metrics.NewProvider(), now: c.now,
			sched:  &scheduler{started: c.t, seen: map[types.UID]time.Time{}, now: c.now},
			record: event.NewNopRecorder(),
		},
		pc:      localConfig(),
		backend: b,
	}
}

// localConfig is the ProviderConfig of newExternal's client.
func localConfig() *config {
	return &config{Kind: "ProviderConfig", Name: "local", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
}

// unitProxy restricts sources instead of using credentials, so these tests
// need no Secret.
func unitProxy(mods ...func(*v1alpha1.Proxy)) *v1alpha1.Proxy {
	p := &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "uid-1", Generation: 1},
		Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{
			Local: &v1alpha1.LocalPlacement{BindAddress: "127.0.0.1"}, Port: 3128,
			AllowedSourceRanges: []v1alpha1.CIDR{"127.0.0.0/8"},
			HealthCheck: v1alpha1.HealthCheck{
				URL: "https://target/ip", Interval: &metav1.Duration{Duration: 10 * time.Second},
				SuccessThreshold: 1, FailureThreshold: 2,
			},
		}},
	}
	for _, m := range mods {
		m(p)
	}
	return p
}

func TestObserve(t *testing.T) {
	pc := &config{Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	want := desiredSpec(unitProxy(), pc, "unit", nil, "")
	running := backend.Instance{
		Ref: want.Ref, ProviderID: localID, Host: "127.0.0.1", Port: 3128,
		Phase: v1alpha1.InstancePhaseRunning, CreatedAt: epoch.Add(-time.Hour), SpecHash: want.Hash,
	}

	type result struct {
		Obs        managed.ExternalObservation
		Err        error
		Reason     xpv2.ConditionReason
		Status     corev1.ConditionStatus
		Probes     int
		Deletes    int
		Healthy    bool
		EgressIP   string
		ProviderID string
	}
	cases := map[string]struct {
		reason   string
		proxy    *v1alpha1.Proxy
		instance *backend.Instance
		getErr   error
		probe    probe.Result
		// restarted: the provider sees this Proxy for the first time.
		restarted bool
		want      result
	}{
		"NotFound": {
			reason: "No instance means Create is needed.",
			proxy:  unitProxy(),
			want:   result{Obs: managed.ExternalObservation{}, Reason: ReasonProvisioning, Status: corev1.ConditionFalse},
		},
		"NotFoundWhileDeleting": {
			reason: "A deleted Proxy whose instance is gone deletes what remains of it (a firewall rule) and lets go of its finalizer.",
			proxy:  unitProxy(func(p *v1alpha1.Proxy) { p.DeletionTimestamp = &metav1.Time{Time: epoch} }),
			want:   result{Obs: managed.ExternalObservation{}, Status: corev1.ConditionUnknown, Deletes: 1},
		},
		"NotFoundWhileOrphaning": {
			reason: "Management policies that exclude Delete leave what remains alone.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.DeletionTimestamp = &metav1.Time{Time: epoch}
				p.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate})
			}),
			want: result{Obs: managed.ExternalObservation{}, Status: corev1.ConditionUnknown},
		},
		"ExistsWhileDeleting": {
			reason:   "Observe tells the truth while deleting, so Delete is called.",
			proxy:    unitProxy(func(p *v1alpha1.Proxy) { p.DeletionTimestamp = &metav1.Time{Time: epoch} }),
			instance: &running,
			want:     result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Status: corev1.ConditionUnknown},
		},
		"GetFails": {
			reason: "A backend error is returned, and says so in Ready.",
			proxy:  unitProxy(), getErr: backend.Errorf(backend.ClassTransient, "backend down"),
			want: result{Err: errors.Wrap(backend.Errorf(backend.ClassTransient, "backend down"), errGetInstance), Reason: ReasonBackendError, Status: corev1.ConditionFalse},
		},
		"Provisioning": {
			reason:   "A provisioning instance is not probed and not Ready.",
			proxy:    unitProxy(),
			instance: &backend.Instance{Ref: want.Ref, ProviderID: localID, Phase: v1alpha1.InstancePhaseProvisioning, SpecHash: want.Hash, CreatedAt: epoch},
			want:     result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Reason: ReasonProvisioning, Status: corev1.ConditionFalse, ProviderID: localID},
		},
		"RunningProbePasses": {
			reason:   "A running instance whose probe passes is Ready, with its egress IP.",
			proxy:    unitProxy(),
			instance: &running,
			probe:    probe.Result{OK: true, Latency: 42 * time.Millisecond, EgressIP: "203.0.113.9"},
			want: result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Reason: xpv2.ReasonAvailable, Status: corev1.ConditionTrue,
				Probes: 1, Healthy: true, EgressIP: "203.0.113.9", ProviderID: localID},
		},
		"CrashLoopingProbePasses": {
			reason:   "A crash-looping instance whose probe passes in a moment when it is up is not Ready: handed out, it would fail its crawlers moments later.",
			proxy:    unitProxy(),
			instance: crashLooping(running),
			probe:    probe.Result{OK: true, Latency: 42 * time.Millisecond, EgressIP: "203.0.113.9"},
			want: result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Reason: ReasonCrashLoopBackOff, Status: corev1.ConditionFalse,
				Probes: 1, Healthy: true, EgressIP: "203.0.113.9", ProviderID: localID},
		},
		"RunningProbeFailsOnce": {
			reason:   "One failed probe of a never-healthy proxy leaves it not Ready, saying why.",
			proxy:    unitProxy(),
			instance: &running,
			probe:    probe.Result{Error: "proxy refused the connection"},
			want: result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Reason: ReasonProbeFailing, Status: corev1.ConditionFalse,
				Probes: 1, ProviderID: localID},
		},
		"HealthyStaysThroughOneFailure": {
			reason: "failureThreshold 2: one failed probe does not flip a healthy proxy.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.Status.AtProvider = v1alpha1.ProxyObservation{ProviderID: localID, Healthy: true, ConsecutiveSuccesses: 4,
					InstanceCreatedAt: &metav1.Time{Time: epoch.Add(-time.Hour)}, LastProbeTime: &metav1.Time{Time: epoch.Add(-time.Minute)}, EgressIP: "203.0.113.9"}
			}),
			instance: &running,
			probe:    probe.Result{Error: "timeout"},
			want: result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Reason: xpv2.ReasonAvailable, Status: corev1.ConditionTrue,
				Probes: 1, Healthy: true, EgressIP: "203.0.113.9", ProviderID: localID},
		},
		"FirstSightAfterRestart": {
			reason: "A provider that just started does not probe an overdue proxy at once: it jitters, and the verdict from status stands meanwhile.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.Status.AtProvider = v1alpha1.ProxyObservation{ProviderID: localID, Healthy: true, ConsecutiveSuccesses: 4,
					InstanceCreatedAt: &metav1.Time{Time: epoch.Add(-time.Hour)}, LastProbeTime: &metav1.Time{Time: epoch.Add(-time.Minute)}, EgressIP: "203.0.113.9"}
			}),
			restarted: true,
			instance:  &running,
			probe:     probe.Result{Error: "would fail"},
			want: result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Reason: xpv2.ReasonAvailable, Status: corev1.ConditionTrue,
				Healthy: true, EgressIP: "203.0.113.9", ProviderID: localID},
		},
		"NotDueYet": {
			reason: "A probe is not repeated before its interval, however often Observe runs.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.Status.AtProvider = v1alpha1.ProxyObservation{ProviderID: localID, Healthy: true, ConsecutiveSuccesses: 1,
					InstanceCreatedAt: &metav1.Time{Time: epoch.Add(-time.Hour)}, LastProbeTime: &metav1.Time{Time: epoch.Add(-time.Second)}, EgressIP: "203.0.113.9"}
			}),
			instance: &running,
			want: result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Reason: xpv2.ReasonAvailable, Status: corev1.ConditionTrue,
				Healthy: true, EgressIP: "203.0.113.9", ProviderID: localID},
		},
		"NewInstanceForgetsOldVerdict": {
			reason: "A new instance never inherits its predecessor's verdict or egress IP.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.Status.AtProvider = v1alpha1.ProxyObservation{ProviderID: localID, Healthy: true, ConsecutiveSuccesses: 9,
					InstanceCreatedAt: &metav1.Time{Time: epoch.Add(-48 * time.Hour)}, LastProbeTime: &metav1.Time{Time: epoch.Add(-time.Second)}, EgressIP: "198.51.100.1"}
			}),
			instance: &running,
			probe:    probe.Result{Error: "refused"},
			want: result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Reason: ReasonProbeFailing, Status: corev1.ConditionFalse,
				Probes: 1, ProviderID: localID},
		},
		"SpecChanged": {
			reason:   "A different spec hash makes the Proxy not up to date, so Update replaces it.",
			proxy:    unitProxy(func(p *v1alpha1.Proxy) { p.Spec.ForProvider.Port = 8080 }),
			instance: &running,
			probe:    probe.Result{OK: true},
			want: result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: false}, Reason: xpv2.ReasonAvailable, Status: corev1.ConditionTrue,
				Probes: 1, Healthy: true, ProviderID: localID},
		},
		"NotPermitted": {
			reason: "A healthy proxy asking for a private network its ProviderConfig no longer permits is not Ready, and its instance, which may still reach it, is deleted.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.Spec.ForProvider.AllowedPrivateDestinations = []v1alpha1.CIDR{"10.1.0.0/16"}
				p.Status.AtProvider = v1alpha1.ProxyObservation{ProviderID: localID, Healthy: true, ConsecutiveSuccesses: 4,
					InstanceCreatedAt: &metav1.Time{Time: epoch.Add(-time.Hour)}, LastProbeTime: &metav1.Time{Time: epoch.Add(-time.Minute)}, EgressIP: "203.0.113.9"}
				p.SetConditions(xpv2.Available())
			}),
			instance: &running,
			// The refusal is the policy's own error, unchanged.
			want: result{Err: admit(unitProxy(func(p *v1alpha1.Proxy) {
				p.Spec.ForProvider.AllowedPrivateDestinations = []v1alpha1.CIDR{"10.1.0.0/16"}
			}), localConfig()),
				Reason: ReasonNotPermitted, Status: corev1.ConditionFalse, Deletes: 1},
		},
		"Terminated": {
			reason:   "A terminated instance is deleted and reported missing, so a fresh one is created.",
			proxy:    unitProxy(),
			instance: &backend.Instance{Ref: want.Ref, ProviderID: localID, Phase: v1alpha1.InstancePhaseTerminated, SpecHash: want.Hash},
			want:     result{Obs: managed.ExternalObservation{}, Reason: ReasonTerminated, Status: corev1.ConditionFalse, Deletes: 1},
		},
		"RecordNamesAnotherInstance": {
			reason: "A status naming an instance that is not the Proxy's (another's, as an edited status would) gets nothing done to it.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.Status.AtProvider.ProviderID = victimID
			}),
			instance: &backend.Instance{Ref: backend.Ref{Name: ownership.InstanceName("victim-uid")}, ProviderID: victimID, Phase: v1alpha1.InstancePhaseTerminated, SpecHash: "other",
				Owner: ownership.Owner{ClusterID: "unit", Namespace: "team", Name: "victim", UID: "victim-uid"}},
			want: result{Err: errors.Errorf(errFmtNotHeld, victimID, "victim-uid", "team"), Reason: ReasonImportRefused, Status: corev1.ConditionFalse, ProviderID: victimID},
		},
		"RecordNamesAnotherInstanceWhileDeleting": {
			reason: "Nor does deleting the Proxy delete another's instance its status names: the Proxy is let go.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.Status.AtProvider.ProviderID = victimID
				p.SetDeletionTimestamp(&metav1.Time{Time: epoch})
			}),
			instance: &backend.Instance{Ref: backend.Ref{Name: ownership.InstanceName("victim-uid")}, ProviderID: victimID, Phase: v1alpha1.InstancePhaseRunning, SpecHash: "other",
				Owner: ownership.Owner{ClusterID: "unit", Namespace: "team", Name: "victim", UID: "victim-uid"}},
			want: result{Obs: managed.ExternalObservation{ResourceExists: false}, Reason: ReasonImportRefused, Status: corev1.ConditionFalse, ProviderID: victimID},
		},
		"TerminatedObserveOnly": {
			reason: "Observe-only never deletes: a terminated instance is reported, and kept.",
			proxy: unitProxy(func(p *v1alpha1.Proxy) {
				p.SetManagementPolicies(xpv2.ManagementPolicies{xpv2.ManagementActionObserve})
			}),
			instance: &backend.Instance{Ref: want.Ref, ProviderID: localID, Phase: v1alpha1.InstancePhaseTerminated, SpecHash: want.Hash},
			want: result{Obs: managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, Reason: ReasonTerminated, Status: corev1.ConditionFalse,
				ProviderID: localID},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := fake.New()
			b.GetErr = tc.getErr
			if tc.instance != nil {
				b.Put(*tc.instance)
			}
			pr := &fakeProber{res: tc.probe}
			e := newExternal(b, pr, &clock{t: epoch})
			if !tc.restarted {
				e.sched.seen[tc.proxy.GetUID()] = epoch.Add(-time.Hour)
			}
			obs, err := e.Observe(context.Background(), tc.proxy)
			c := tc.proxy.GetCondition(xpv2.TypeReady)
			ap := tc.proxy.Status.AtProvider
			got := result{
				Obs: obs, Err: err, Reason: c.Reason, Status: c.Status, Probes: pr.calls, Deletes: b.CallCount("Delete"),
				Healthy: ap.Healthy, EgressIP: ap.EgressIP, ProviderID: ap.ProviderID,
			}
			if diff := cmp.Diff(tc.want, got, test.EquateErrors(), cmpopts.IgnoreFields(managed.ExternalObservation{}, "Diff", "ConnectionDetails")); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

// TestExternalModeNeverCallsBackend: observing, updating and deleting an
// External Proxy makes no backend call, with a backend attached that would
// count one (proven: a Delete that calls the backend in External mode
// fails it; and the same steps on a managed Proxy are counted).
func TestExternalModeNeverCallsBackend(t *testing.T) {
	// backendCalls observes, updates and deletes p through an external
	// client that holds a backend (Connect gives an External Proxy none:
	// here one is attached, so that a call would be counted, not a nil
	// dereference), and counts the calls the backend saw.
	backendCalls := func(p *v1alpha1.Proxy) (int, error) {
		b := fake.New()
		e := newExternal(b, &fakeProber{res: probe.Result{OK: true, EgressIP: "192.0.2.1"}}, &clock{t: epoch})
		ctx := context.Background()
		obs, err := e.Observe(ctx, p)
		if err == nil && p.Spec.ForProvider.Mode == v1alpha1.ProxyModeExternal && (!obs.ResourceExists || !p.Status.AtProvider.Healthy || p.Status.AtProvider.EgressIP != "192.0.2.1") {
			t.Errorf("an External proxy is observed by probing its endpoint: obs=%+v status=%+v", obs, p.Status.AtProvider)
		}
		if err == nil {
			_, err = e.Update(ctx, p)
		}
		if err == nil {
			_, err = e.Delete(ctx, p)
		}
		n := 0
		for _, c := range b.Calls {
			n += c
		}
		return n, err
	}
	external := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.Mode = v1alpha1.ProxyModeExternal
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.Endpoint = &v1alpha1.Endpoint{Host: "proxy.example.net", Port: 8080}
	})
	if n, err := backendCalls(external); n != 0 || err != nil {
		t.Errorf("External mode must never call the backend: %d calls (err %v)", n, err)
	}
	// The count sees calls: the same steps on a managed Proxy make some.
	if n, _ := backendCalls(unitProxy()); n == 0 {
		t.Error("a managed Proxy's observe, update and delete made no backend call: the count above cannot fail")
	}
}

func TestSpecHash(t *testing.T) {
	pc := &config{Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	base := desiredSpec(unitProxy(), pc, "unit", &backend.Credentials{Username: "u", Password: "p"}, "").Hash
	cases := map[string]struct {
		reason  string
		mod     func(*v1alpha1.Proxy)
		creds   *backend.Credentials
		changes bool
	}{
		"Label":       {reason: "Labels do not replace a proxy.", mod: func(p *v1alpha1.Proxy) { p.Labels = map[string]string{"a": "b"} }, changes: false},
		"Annotation":  {reason: "Annotations do not replace a proxy.", mod: func(p *v1alpha1.Proxy) { p.Annotations = map[string]string{"a": "b"} }, changes: false},
		"HealthCheck": {reason: "Probe settings change nothing on the instance.", mod: func(p *v1alpha1.Proxy) { p.Spec.ForProvider.HealthCheck.URL = "http://other/ip" }, changes: false},
		"MaxLeases":   {reason: "Leases are the discovery service's business.", mod: func(p *v1alpha1.Proxy) { p.Spec.ForProvider.MaxLeases = 5 }, changes: false},
		"Port":        {reason: "The port replaces the proxy.", mod: func(p *v1alpha1.Proxy) { p.Spec.ForProvider.Port = 9999 }, changes: true},
		"Placement":   {reason: "The placement replaces the proxy.", mod: func(p *v1alpha1.Proxy) { p.Spec.ForProvider.Local.OutgoingAddress = "127.0.0.2" }, changes: true},
		"Ranges":      {reason: "The resolved config (source ranges) replaces the proxy.", mod: func(p *v1alpha1.Proxy) { p.Spec.ForProvider.AllowedSourceRanges = []v1alpha1.CIDR{"10.0.0.0/8"} }, changes: true},
		"Password":    {reason: "New credentials are the credentials' sum's: they change in place where the backend can.", mod: func(*v1alpha1.Proxy) {}, creds: &backend.Credentials{Username: "u", Password: "q"}, changes: false},
		"NoAuth":      {reason: "Dropping credentials changes the config itself: replaced.", mod: func(*v1alpha1.Proxy) {}, creds: &backend.Credentials{}, changes: true},
	}
	sum := func(c *backend.Credentials) string { return desiredSpec(unitProxy(), pc, "unit", c, "").CredentialsSum }
	if a, b := sum(&backend.Credentials{Username: "u", Password: "p"}), sum(&backend.Credentials{Username: "u", Password: "q"}); a == b || a == "" {
		t.Errorf("the credentials' sum must change with the password: %q, %q", a, b)
	}
	if a, b := sum(&backend.Credentials{Username: "u", Password: "p"}), sum(&backend.Credentials{Username: "v", Password: "p"}); a == b {
		t.Errorf("the credentials' sum must change with the username: %q, %q", a, b)
	}
	vm := func(g v1alpha1.GCPInstance) string {
		p := unitProxy(func(p *v1alpha1.Proxy) {
			p.Spec.ForProvider.Local = nil
			p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b", GCPInstance: g}
		})
		return desiredSpec(p, pc, "unit", &backend.Credentials{Username: "u", Password: "p"}, "").Hash
	}
	if vm(v1alpha1.GCPInstance{}) != vm(v1alpha1.GCPInstance{BootDiskType: v1alpha1.DefaultGCPBootDiskType, ShieldedVM: ptr.To(true)}) {
		t.Error("fields added with defaults must not change the hash when the apiserver defaults them on existing Proxies: every VM would be replaced at once")
	}
	if vm(v1alpha1.GCPInstance{}) == vm(v1alpha1.GCPInstance{ShieldedVM: ptr.To(false)}) || vm(v1alpha1.GCPInstance{}) == vm(v1alpha1.GCPInstance{BootDiskType: "pd-ssd"}) {
		t.Error("a non-default boot disk or Shielded VM setting replaces the VM")
	}
	if h := desiredSpec(unitProxy(), pc, "unit", &backend.Credentials{Username: "u", Password: "p"}, "#cloud-config\n").Hash; h == base {
		t.Error("a change to the user's cloud-init (inline or in its Secret) must replace the VM")
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := unitProxy(tc.mod)
			creds := tc.creds
			switch {
			case creds == nil:
				creds = &backend.Credentials{Username: "u", Password: "p"}
			case creds.Username == "":
				creds = nil
			}
			h := desiredSpec(p, pc, "unit", creds, "").Hash
			if (h != base) != tc.changes {
				t.Errorf("%s\nhash changed: %v, want %v", tc.reason, h != base, tc.changes)
			}
		})
	}
}

func TestMetrics(t *testing.T) {
	pc := &config{Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	want := desiredSpec(unitProxy(), pc, "unit", nil, "")
	b := fake.New()
	b.Put(backend.Instance{Ref: want.Ref, ProviderID: localID, Host: "127.0.0.1", Port: 3128, Phase: v1alpha1.InstancePhaseRunning, SpecHash: want.Hash})
	pr := &fakeProber{res: probe.Result{OK: true, Latency: 30 * time.Millisecond}}
	e := newExternal(b, pr, &clock{t: epoch})
	p := unitProxy()
	if _, err := e.Observe(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	pr.res = probe.Result{Error: "refused"}
	e.now = (&clock{t: epoch.Add(time.Minute)}).now
	e.sched.now = e.now
	if _, err := e.Observe(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	b.GetErr = backend.Errorf(backend.ClassQuota, "rate limited")
	_, _ = e.Observe(context.Background(), p)

	m := e.metrics
	got := map[string]float64{
		"success":          testutil.ToFloat64(m.ProbeResults.WithLabelValues("Local", "success")),
		"failure":          testutil.ToFloat64(m.ProbeResults.WithLabelValues("Local", "failure")),
		"running":          testutil.ToFloat64(m.Instances.WithLabelValues("Local", "Running")),
		"quota-get-errors": testutil.ToFloat64(m.BackendErrors.WithLabelValues("Local", "get", "QuotaExceeded")),
		"latency-samples":  float64(testutil.CollectAndCount(m.ProbeDuration)),
	}
	wantM := map[string]float64{"success": 1, "failure": 1, "running": 1, "quota-get-errors": 1, "latency-samples": 1}
	if diff := cmp.Diff(wantM, got); diff != "" {
		t.Errorf("metrics: -want, +got:\n%s", diff)
	}
}

// TestGCPQuotaBounded drives the reconciler's Observe/Create against the
// real GCP backend and the fake Compute API answering every insert with
// QUOTA_EXCEEDED, over ten minutes of fake time, and counts the inserts the
// API received.
func TestGCPQuotaBounded(t *testing.T) {
	api := gcpfake.Start(t)
	api.Fail("instances.insert", gcpfake.Failure{Code: http.StatusForbidden, Reason: "quotaExceeded", Message: "Quota 'INSTANCES' exceeded.  Limit: 24.0 in region europe-west1.", Times: -1})
	b, err := gcp.New(context.Background(), gcp.Config{Project: "p", ClusterID: "unit", ClientOptions: api.ClientOptions()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	c := &clock{t: epoch}
	e := newExternal(b, &fakeProber{}, c)
	e.pc.Spec.Backend = v1alpha1.BackendGCP
	p := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b"}
	})
	reconcileFor(t, e, nil, c, p, 10*time.Minute)
	inserts := api.Calls("instances.insert")
	t.Logf("%d inserts in 10 minutes of fake time; Ready: %s", inserts, p.GetCondition(xpv2.TypeReady).Message)
	if inserts < 1 || inserts > 5 {
		t.Errorf("want 1..5 inserts in 10 minutes under a persistent quota error (backoff 30s doubling to 5m), got %d", inserts)
	}
	if r := p.GetCondition(xpv2.TypeReady).Reason; r != "QuotaExceeded" {
		t.Errorf("Ready reason: want QuotaExceeded, got %s", r)
	}
	if api.Calls("firewalls.insert") > inserts {
		t.Errorf("the firewall rule is made once per attempt at most: %d firewall inserts", api.Calls("firewalls.insert"))
	}
}

func TestProbeKeepsStatusQuiet(t *testing.T) {
	steady := func(latency int64, lastProbe time.Duration) *v1alpha1.Proxy {
		return unitProxy(func(p *v1alpha1.Proxy) {
			p.Status.AtProvider = v1alpha1.ProxyObservation{ProviderID: localID, Healthy: true, ConsecutiveSuccesses: 1,
				InstanceCreatedAt: &metav1.Time{Time: epoch.Add(-time.Hour)}, LastProbeTime: &metav1.Time{Time: epoch.Add(-lastProbe)},
				EgressIP: "203.0.113.9", LatencyMilliseconds: latency}
		})
	}
	cases := map[string]struct {
		reason string
		proxy  *v1alpha1.Proxy
		probe  probe.Result
		// wantLatency and wantProbeTime are the status after the probe.
		wantLatency   int64
		wantProbeTime time.Time
	}{
		"NothingNew": {
			reason:      "A passing probe of a steady proxy with latency noise leaves the status unchanged, so its fleet is not composed again for nothing.",
			proxy:       steady(40, time.Minute),
			probe:       probe.Result{OK: true, Latency: 58 * time.Millisecond, EgressIP: "203.0.113.9"},
			wantLatency: 40, wantProbeTime: epoch.Add(-time.Minute),
		},
		"LatencyMovedAlone": {
			reason:      "A latency more than 2.5 times the recorded one, and nothing else new, writes nothing: latency waits for another change, so that a steady pool is not composed again for a figure nothing decides on.",
			proxy:       steady(40, time.Minute),
			probe:       probe.Result{OK: true, Latency: 130 * time.Millisecond, EgressIP: "203.0.113.9"},
			wantLatency: 40, wantProbeTime: epoch.Add(-time.Minute),
		},
		"LatencyWithNews": {
			reason:      "A change of egress IP records the moved latency with it.",
			proxy:       steady(40, time.Minute),
			probe:       probe.Result{OK: true, Latency: 130 * time.Millisecond, EgressIP: "203.0.113.10"},
			wantLatency: 100, wantProbeTime: epoch,
		},
		"LatencyWithinBand": {
			reason:      "A latency twice the recorded one is noise at this resolution: nothing changes.",
			proxy:       steady(50, time.Minute),
			probe:       probe.Result{OK: true, Latency: 110 * time.Millisecond, EgressIP: "203.0.113.9"},
			wantLatency: 50, wantProbeTime: epoch.Add(-time.Minute),
		},
		"NoHeartbeat": {
			reason:      "A probe that finds nothing new writes nothing, not even the probe time, however long ago the status last changed: a write of lastProbeTime alone would compose the pool for nothing its function reads.",
			proxy:       steady(40, 25*time.Hour),
			probe:       probe.Result{OK: true, Latency: 130 * time.Millisecond, EgressIP: "203.0.113.9"},
			wantLatency: 40, wantProbeTime: epoch.Add(-25 * time.Hour),
		},
		"FailureIsNews": {
			reason:      "A failed probe changes the counters and the error, so it is recorded.",
			proxy:       steady(40, time.Minute),
			probe:       probe.Result{Error: "refused"},
			wantLatency: 40, wantProbeTime: epoch,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := &clock{t: epoch}
			e := newExternal(fake.New(), &fakeProber{res: tc.probe}, c)
			e.sched.seen[tc.proxy.GetUID()] = epoch.Add(-time.Hour) // not a first sight
			e.probe(context.Background(), tc.proxy, "127.0.0.1:3128", instanceID(tc.proxy), nil)
			ap := tc.proxy.Status.AtProvider
			got := struct {
				Latency   int64
				ProbeTime time.Time
			}{ap.LatencyMilliseconds, ap.LastProbeTime.Time}
			want := struct {
				Latency   int64
				ProbeTime time.Time
			}{tc.wantLatency, tc.wantProbeTime}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
			// The next probe is due an interval after this one, whatever the
			// status says.
			if next := e.sched.nextProbe(tc.proxy); !next.Equal(epoch.Add(10 * time.Second)) {
				t.Errorf("next probe at %s, want one interval after this probe (%s)", next, epoch.Add(10*time.Second))
			}
		})
	}
}

// TestPrivateDestinationsPermitted holds a Proxy's private destinations to
// its ProviderConfig's policy, by arithmetic on the CIDRs; a permitted one
// reaches the backend and changes the spec hash.
func TestPrivateDestinationsPermitted(t *testing.T) {
	policy := func(cidrs ...v1alpha1.CIDR) *config {
		pc := &config{Kind: v1alpha1.ProviderConfigKind, Name: "team", Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
		if cidrs != nil {
			pc.Spec.Policy = &v1alpha1.Policy{AllowedPrivateDestinations: cidrs}
		}
		return pc
	}
	asks := func(cidrs ...v1alpha1.CIDR) *v1alpha1.Proxy {
		return unitProxy(func(p *v1alpha1.Proxy) { p.Spec.ForProvider.AllowedPrivateDestinations = cidrs })
	}
	cases := map[string]struct {
		reason string
		p      *v1alpha1.Proxy
		pc     *config
		want   string // an error containing it; "" for none
	}{
		"NoneAsked":   {"A proxy asking for nothing needs no policy.", asks(), policy(), ""},
		"NoPolicy":    {"Without a policy nothing private is permitted.", asks("10.1.0.0/16"), policy(), `spec.forProvider.allowedPrivateDestinations "10.1.0.0/16" is not permitted by ProviderConfig team: its spec.policy.allowedPrivateDestinations allows []`},
		"Inside":      {"A network inside a permitted one is permitted.", asks("10.1.2.0/24"), policy("10.1.0.0/16"), ""},
		"Equal":       {"The permitted network itself is permitted.", asks("10.1.0.0/16"), policy("192.168.0.0/16", "10.1.0.0/16"), ""},
		"Wider":       {"A network wider than the permitted one is not.", asks("10.0.0.0/8"), policy("10.1.0.0/16"), `"10.0.0.0/8" is not permitted by ProviderConfig team`},
		"Beside":      {"A string prefix is no containment.", asks("10.10.0.0/16"), policy("10.1.0.0/16"), `"10.10.0.0/16" is not permitted`},
		"OtherFamily": {"An IPv6 network is not inside an IPv4 one.", asks("fd00::/8"), policy("10.0.0.0/8"), `"fd00::/8" is not permitted`},
		"Public":      {"A public network needs no exception, even where a lax policy lists it.", asks("8.8.8.0/24"), policy("0.0.0.0/0"), `"8.8.8.0/24" is not a private network`},
		"Loopback":    {"The proxy host itself is never an exception.", asks("127.0.0.0/8"), policy("0.0.0.0/0"), `"127.0.0.0/8" is not a private network`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := permitted(tc.p, tc.pc)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("%s\npermitted: want %q, got %q", tc.reason, tc.want, got)
			}
		})
	}

	pc := policy("10.1.0.0/16")
	plain, private := desiredSpec(asks(), pc, "unit", nil, ""), desiredSpec(asks("10.1.2.0/24"), pc, "unit", nil, "")
	if plain.Hash == private.Hash {
		t.Error("a private destination changes the proxy's configuration, so it must change the spec hash")
	}
	if diff := cmp.Diff([]string{"10.1.2.0/24"}, private.AllowedPrivateDestinations); diff != "" {
		t.Errorf("the backend spec carries the destinations: -want +got:\n%s", diff)
	}
}

// TestClosureVerdictBelongsToTheInstance: a replacement instance inherits no
// closure verdict, so it must refuse a request without credentials itself
// before it is Ready; and one whose check is inconclusive is not Ready.
func TestClosureVerdictBelongsToTheInstance(t *testing.T) {
	p := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.AuthSecretRef = &v1alpha1.AuthSecretReference{Name: "auth"}
		p.SetConditions(xpv2.Condition{Type: TypeOpenProxy, Status: corev1.ConditionFalse, Reason: ReasonDemandsCredentials})
	})
	resetInstanceStatus(p)
	if s := p.GetCondition(TypeOpenProxy).Status; s != corev1.ConditionUnknown {
		t.Fatalf("a new instance keeps its predecessor's closure verdict: %s", s)
	}
	check := func(e *external) {
		c, detail := e.prober.Closed(context.Background(), probe.Target{})
		e.closure(p, c, detail)
	}
	e := newExternal(fake.New(), &fakeProber{closure: probe.ClosureUnknown}, &clock{t: epoch})
	p.Status.AtProvider.Healthy = true
	check(e)
	e.setReadiness(p)
	if c := p.GetCondition(xpv2.TypeReady); c.Status != corev1.ConditionFalse || c.Reason != ReasonAwaitingProbe {
		t.Errorf("a healthy proxy whose closure is unknown must wait, got %s %s", c.Status, c.Reason)
	}
	if c := p.GetCondition(TypeOpenProxy); c.Reason != ReasonClosureUnknown || c.Message != "fake closure Unknown" {
		t.Errorf("an inconclusive check says why on OpenProxy, got %s %q", c.Reason, c.Message)
	}
	if c := p.GetCondition(xpv2.TypeReady); !strings.Contains(c.Message, "fake closure Unknown") {
		t.Errorf("Ready says why the proxy waits, got %q", c.Message)
	}
	e = newExternal(fake.New(), &fakeProber{}, &clock{t: epoch})
	check(e)
	e.setReadiness(p)
	if c := p.GetCondition(xpv2.TypeReady); c.Status != corev1.ConditionTrue {
		t.Errorf("once it refuses without credentials it is Ready, got %s %s", c.Status, c.Reason)
	}
	// One inconclusive check later (the target blinked), the verdict and
	// Ready stand: conditions do not flap with single results.
	e = newExternal(fake.New(), &fakeProber{closure: probe.ClosureUnknown}, &clock{t: epoch})
	check(e)
	e.setReadiness(p)
	if c := p.GetCondition(TypeOpenProxy); c.Status != corev1.ConditionFalse {
		t.Errorf("an inconclusive check must keep the verdict, got %s %s", c.Status, c.Reason)
	}
	if c := p.GetCondition(xpv2.TypeReady); c.Status != corev1.ConditionTrue {
		t.Errorf("an inconclusive check must keep Ready, got %s %s", c.Status, c.Reason)
	}
}

func (r *repairing) Repair(context.Context, backend.Spec) (bool, error) {
	r.repairs++
	return r.ready, nil
}

func (r *countingRecorder) Event(_ runtime.Object, e event.Event) {
	if r.reasons == nil {
		r.reasons = map[string]int{}
	}
	r.reasons[string(e.Reason)]++
}

func (r *countingRecorder) WithAnnotations(...string) event.Recorder { return r }

// victimID is the providerID of another Proxy's local instance.
var victimID = "local/" + ownership.InstanceName("victim-uid")

// localID is the providerID of unitProxy's local instance.
var localID = "local/" + ownership.InstanceName(unitProxy().GetUID())
