package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// reconcileFor plays the managed reconciler's loop at one reconcile per
// second of fake time, the worst case its rate limiter allows, and returns
// how often the backend was asked to create.
func reconcileFor(t *testing.T, e *external, b *fake.Backend, c *clock, p *v1alpha1.Proxy, d time.Duration) int {
	t.Helper()
	count := func() int {
		if b == nil {
			return 0
		}
		return b.CallCount("Create")
	}
	before := count()
	for end := c.t.Add(d); c.t.Before(end); c.t = c.t.Add(time.Second) {
		obs, err := e.Observe(context.Background(), p)
		if err != nil || obs.ResourceExists {
			continue
		}
		_, _ = e.Create(context.Background(), p)
	}
	return count() - before
}

func TestNoCreateLoop(t *testing.T) {
	cases := map[string]struct {
		reason  string
		err     error
		maxCall int
		reason2 xpv2.ConditionReason
	}{
		"Quota": {
			reason:  "Quota errors back off from 30s to 5m: at most 5 creates in 10 minutes (0s, 30s, 1m30s, 3m30s, 7m30s).",
			err:     backend.Errorf(backend.ClassQuota, "QUOTA_EXCEEDED: instances"),
			maxCall: 5, reason2: xpv2.ConditionReason(backend.ClassQuota),
		},
		"Permanent": {
			reason:  "A permanent error is tried once and latched until the spec changes.",
			err:     backend.Errorf(backend.ClassPermanent, "invalid machine type"),
			maxCall: 1, reason2: xpv2.ConditionReason(backend.ClassPermanent),
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b := fake.New()
			b.CreateErr = tc.err
			c := &clock{t: epoch}
			e := newExternal(b, &fakeProber{}, c)
			p := unitProxy()
			n := reconcileFor(t, e, b, c, p, 10*time.Minute)
			if n > tc.maxCall || n == 0 {
				t.Errorf("%s\nbackend Create calls in 10 minutes: got %d, want 1..%d", tc.reason, n, tc.maxCall)
			}
			cond := p.GetCondition(xpv2.TypeReady)
			if cond.Reason != tc.reason2 || !strings.Contains(cond.Message, strings.SplitN(tc.err.Error(), ":", 2)[0]) {
				t.Errorf("%s\nReady must say why: got %s %q", tc.reason, cond.Reason, cond.Message)
			}
			t.Logf("%d Create calls in 10 minutes of fake time; Ready: %s: %s", n, cond.Reason, cond.Message)
		})
	}

	t.Run("PermanentClearsOnSpecChange", func(t *testing.T) {
		b := fake.New()
		b.CreateErr = backend.Errorf(backend.ClassPermanent, "invalid image")
		c := &clock{t: epoch}
		e := newExternal(b, &fakeProber{}, c)
		p := unitProxy()
		reconcileFor(t, e, b, c, p, time.Minute)
		p.Generation++
		b.CreateErr = nil
		if n := reconcileFor(t, e, b, c, p, time.Minute); n != 1 {
			t.Errorf("after a spec change the create must be retried once and succeed; got %d calls", n)
		}
		if _, ok := p.GetAnnotations()[annotationCreateFailures]; ok {
			t.Error("a successful create must clear the recorded failures")
		}
	})

	t.Run("TransientUsesControllerBackoff", func(t *testing.T) {
		b := fake.New()
		b.CreateErr = errors.New("connection reset")
		c := &clock{t: epoch}
		e := newExternal(b, &fakeProber{}, c)
		p := unitProxy()
		if n := reconcileFor(t, e, b, c, p, 10*time.Second); n != 10 {
			t.Errorf("transient errors are not gated here (the controller's rate limiter backs off); got %d calls in 10 reconciles", n)
		}
	})
}

func TestDeleteNeverLatches(t *testing.T) {
	b := fake.New()
	b.DeleteErr = backend.Errorf(backend.ClassPermanent, "forbidden")
	e := newExternal(b, &fakeProber{}, &clock{t: epoch})
	p := unitProxy(func(p *v1alpha1.Proxy) { p.DeletionTimestamp = &metav1.Time{Time: epoch} })
	for range 3 {
		if _, err := e.Delete(context.Background(), p); cmp.Diff(errors.Wrap(b.DeleteErr, errDeleteInstance), err, test.EquateErrors()) != "" {
			t.Fatalf("a failing delete must return its error every time, got %v", err)
		}
	}
	if n := b.CallCount("Delete"); n != 3 {
		t.Errorf("a failing delete is retried each time, never latched: want 3 backend calls, got %d", n)
	}
}

func TestDeletionProgressed(t *testing.T) {
	deleting := func(finalizers ...string) *v1alpha1.Proxy {
		return unitProxy(func(p *v1alpha1.Proxy) {
			p.DeletionTimestamp = &metav1.Time{Time: epoch}
			p.Finalizers = finalizers
		})
	}
	cases := map[string]struct {
		reason   string
		old, new *v1alpha1.Proxy
		want     bool
	}{
		"GarbageCollectorLetGo": {
			reason: "The garbage collector removing its finalizer from a deleted Proxy is worth a reconcile: deletion can proceed.",
			old:    deleting("finalizer.managedresource.crossplane.io", "foregroundDeletion"),
			new:    deleting("finalizer.managedresource.crossplane.io"),
			want:   true,
		},
		"Deleting": {
			reason: "The Deleting status written after the instance was deleted prompts the look that lets the Proxy go.",
			old:    deleting("finalizer.managedresource.crossplane.io"),
			new: func() *v1alpha1.Proxy {
				p := deleting("finalizer.managedresource.crossplane.io")
				p.SetConditions(xpv2.Deleting())
				return p
			}(),
			want: true,
		},
		"NotDeleting": {
			reason: "Finalizers changing on a live Proxy are not either (the reconciler adds its own).",
			old:    unitProxy(),
			new:    unitProxy(func(p *v1alpha1.Proxy) { p.Finalizers = []string{"finalizer.managedresource.crossplane.io"} }),
			want:   false,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := deletionProgressed().Update(ctrlevent.UpdateEvent{ObjectOld: tc.old, ObjectNew: tc.new})
			if got != tc.want {
				t.Errorf("%s\ngot %t, want %t", tc.reason, got, tc.want)
			}
		})
	}
}

// TestUpdateKeepsWithoutDelete: replacing an instance means deleting it,
// so management policies without Delete keep it as it was made.
func TestUpdateKeepsWithoutDelete(t *testing.T) {
	for name, tc := range map[string]struct {
		policies xpv2.ManagementPolicies
		deletes  int
	}{
		"Default":       {deletes: 1},
		"WithoutDelete": {policies: xpv2.ManagementPolicies{xpv2.ManagementActionObserve, xpv2.ManagementActionCreate, xpv2.ManagementActionUpdate}, deletes: 0},
	} {
		t.Run(name, func(t *testing.T) {
			b := fake.New()
			c := &clock{t: epoch}
			e := newExternal(b, &fakeProber{}, c)
			p := unitProxy(func(p *v1alpha1.Proxy) { p.SetManagementPolicies(tc.policies) })
			if _, err := e.Update(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			if n := b.CallCount("Delete"); n != tc.deletes {
				t.Errorf("deletes: want %d, got %d", tc.deletes, n)
			}
		})
	}
}

// TestInputsLiftHolds: a change to what a create depended on lifts a
// permanent hold, which retrying alone would never fix, but not a quota
// back-off, which a changed Secret does not make shorter.
func TestInputsLiftHolds(t *testing.T) {
	for name, tc := range map[string]struct {
		class   backend.Class
		blocked bool
	}{
		"Permanent":    {class: backend.ClassPermanent, blocked: false},
		"AccessDenied": {class: backend.ClassAccessDenied, blocked: false},
		"Quota":        {class: backend.ClassQuota, blocked: true},
	} {
		t.Run(name, func(t *testing.T) {
			c := &clock{t: epoch}
			e := newExternal(fake.New(), &fakeProber{}, c)
			e.pc.UID, e.pc.Version = "pc-uid", "1"
			p := unitProxy()
			for i := 0; i < backend.AccessDeniedAttempts; i++ {
				recordCreateFailure(p, backend.Errorf(tc.class, "boom"), epoch)
			}
			meta.AddAnnotations(p, map[string]string{annotationCreateInputs: e.inputs(context.Background(), p)})
			_, err := e.Observe(context.Background(), p)
			if err == nil || err.Error() != p.GetCondition(xpv2.TypeReady).Message || !strings.HasSuffix(err.Error(), ": boom") {
				t.Fatalf("held while nothing changed, saying why in Ready: %v", err)
			}
			if held := testutil.ToFloat64(e.metrics.CreatesHeld.WithLabelValues(e.backendName(), string(tc.class))); held != 1 {
				t.Fatalf("the create gate holds the Proxy: creates held %v", held)
			}
			e.pc.Version = "2" // the ProviderConfig was edited
			_, err = e.Observe(context.Background(), p)
			if (err != nil) != tc.blocked {
				t.Errorf("after the ProviderConfig changed: held=%v, want %v (%v)", err != nil, tc.blocked, err)
			}
		})
	}
}

// TestWantsImport: only an external-name that reads as a providerID of the
// Proxy's backend, naming another instance than its own, on a Proxy with no
// instance recorded, asks for an import; a providerID from before local
// instance names were recorded (local/PORT) names the Proxy's own.
func TestWantsImport(t *testing.T) {
	pc := &config{Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	cases := map[string]struct {
		ext, recorded, importedFrom, want string
	}{
		"None":            {},
		"Import":          {ext: victimID, want: victimID},
		"Own":             {ext: localID},
		"NameCopied":      {ext: "my-proxy"},
		"OtherBackend":    {ext: "projects/p/zones/z/instances/" + ownership.InstanceName("victim-uid")},
		"LegacyLocalPort": {ext: "local/32100"},
		"Recorded":        {ext: victimID, recorded: localID},
		"ImportedBefore":  {ext: victimID, importedFrom: victimID},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := unitProxy(func(p *v1alpha1.Proxy) {
				p.Status.AtProvider.ProviderID, p.Status.AtProvider.ImportedFrom = tc.recorded, tc.importedFrom
			})
			meta.SetExternalName(p, tc.ext)
			if got := wantsImport(p, pc); got != tc.want {
				t.Errorf("external-name %q: import %q, want %q", tc.ext, got, tc.want)
			}
		})
	}
	legacy := unitProxy(func(p *v1alpha1.Proxy) { p.Status.AtProvider.ProviderID = "local/32100" })
	if r := recordedRef(legacy, pc); r.Name != ownership.InstanceName(legacy.GetUID()) {
		t.Errorf("a recorded local/PORT names the Proxy's own instance: %+v", r)
	}
}
