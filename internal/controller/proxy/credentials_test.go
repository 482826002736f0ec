package proxy

import (
	"context"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientfake "sigs.k8s.io/controller-runtime/pkg/client/fake"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/fake"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
)

// TestCredentialsChange changes the password in a Proxy's auth Secret under
// an instance whose spec is otherwise current, on a backend that changes
// credentials in place and on one that cannot (as GCP), in a fleet and
// alone, and checks what the provider does: rotate in place with the grace
// period and drop the previous ones after it, never replacing; report an
// outdated fleet member without probing it with credentials it does not
// accept; replace a lone one.
func TestCredentialsChange(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	type want struct {
		upToDate  bool
		rotations []time.Duration // previousUntil - now of each call; -1 for zero
		outdated  bool
		probes    bool
		previous  time.Duration // status previousCredentialsUntil - now; 0 for unset
		events    map[string]int
	}
	grace := 10 * time.Minute
	cases := map[string]struct {
		reason   string
		inPlace  bool
		fleet    bool
		grace    *metav1.Duration
		policies xpv2.ManagementPolicies
		err      error
		want     want
	}{
		"InPlaceNotPossible": {
			reason:  "A lone instance made before its credentials could rotate is replaced.",
			inPlace: true, err: backend.Wrap(backend.ClassPermanent, backend.ErrNoRotation),
			want: want{upToDate: false, probes: true, events: map[string]int{string(ReasonCannotRotateCredentials): 0, string(ReasonCredentialsRotated): 0}},
		},
		"InPlaceNotPossibleInFleet": {
			reason:  "A fleet's instance made before its credentials could rotate is reported outdated, for the fleet to replace within its budget.",
			inPlace: true, fleet: true, err: backend.Wrap(backend.ClassPermanent, backend.ErrNoRotation),
			want: want{upToDate: true, outdated: true, probes: false, events: map[string]int{string(ReasonCredentialsOutdated): 1}},
		},
		"InPlaceFailing": {
			reason:  "A rotation that fails for now is reported and retried; the observation goes on, and the probe says whether the proxy takes the new credentials.",
			inPlace: true, err: backend.Errorf(backend.ClassTransient, "conflict"),
			want: want{upToDate: true, probes: true, events: map[string]int{string(ReasonCannotRotateCredentials): 2}},
		},
		"InPlace": {
			reason:  "Local processes and pods change credentials in place: no replacement, the previous ones for the grace period.",
			inPlace: true, grace: &metav1.Duration{Duration: grace},
			want: want{upToDate: true, rotations: []time.Duration{grace}, probes: true, previous: grace, events: map[string]int{string(ReasonCredentialsRotated): 1}},
		},
		"InPlaceDefaultGrace": {
			reason:  "Without a grace period set, an hour.",
			inPlace: true,
			want:    want{upToDate: true, rotations: []time.Duration{time.Hour}, probes: true, previous: time.Hour, events: map[string]int{string(ReasonCredentialsRotated): 1}},
		},
		"InPlaceNoGrace": {
			reason:  "A zero grace period refuses the previous credentials at once.",
			inPlace: true, grace: &metav1.Duration{},
			want: want{upToDate: true, rotations: []time.Duration{-1}, probes: true, events: map[string]int{string(ReasonCredentialsRotated): 1}},
		},
		"InPlaceObserveOnly": {
			reason:  "Observe-only changes nothing: the instance is out of date, for Crossplane to report.",
			inPlace: true, policies: xpv2.ManagementPolicies{xpv2.ManagementActionObserve},
			want: want{upToDate: false, probes: true, events: map[string]int{}},
		},
		"InPlaceObserveOnlyInFleet": {
			reason:  "Observe-only in a fleet is out of date too, not outdated: the fleet would delete a Proxy whose instance observe-only leaves running.",
			inPlace: true, fleet: true, policies: xpv2.ManagementPolicies{xpv2.ManagementActionObserve},
			want: want{upToDate: false, probes: true, events: map[string]int{string(ReasonCredentialsOutdated): 0}},
		},
		"FleetMemberCannotRotate": {
			reason: "A fleet's VM is reported outdated, for the fleet to replace within its budget; it is not probed with credentials it does not accept.",
			fleet:  true,
			want:   want{upToDate: true, outdated: true, probes: false, events: map[string]int{string(ReasonCredentialsOutdated): 1}},
		},
		"LoneProxyCannotRotate": {
			reason: "A VM outside a fleet is replaced by the provider.",
			want:   want{upToDate: false, probes: true, events: map[string]int{}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			secret := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}},
				Data:       map[string][]byte{"username": []byte("crawler"), "password": []byte("old")},
			}
			kube := clientfake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build()
			p := unitProxy(func(p *v1alpha1.Proxy) {
				p.Spec.ForProvider.AllowedSourceRanges = nil
				p.Spec.ForProvider.AuthSecretRef = &v1alpha1.AuthSecretReference{Name: "auth"}
				p.Spec.ForProvider.CredentialGracePeriod = tc.grace
				p.SetManagementPolicies(tc.policies)
				if tc.fleet {
					p.SetAnnotations(map[string]string{fleetv1alpha1.AnnotationFleet: "rotor"})
				}
			})
			base := fake.New()
			var b backend.Backend = base
			rot := &fake.Rotating{Backend: base, RotateErr: tc.err}
			if tc.inPlace {
				b = rot
			}
			c := &clock{t: epoch}
			pr := &fakeProber{res: probe.Result{OK: true, EgressIP: "203.0.113.7"}}
			e := newExternal(b, pr, c)
			e.kube = kube
			rec := &countingRecorder{}
			e.record = rec
			ctx := context.Background()
			// The instance as made with the old password, and judged.
			old, err := credentials(ctx, kube, p)
			if err != nil {
				t.Fatal(err)
			}
			s := desiredSpec(p, e.pc, "unit", old, "")
			if _, err := base.Create(ctx, s); err != nil {
				t.Fatal(err)
			}
			if obs, err := e.Observe(ctx, p); err != nil || !obs.ResourceUpToDate {
				t.Fatalf("before the change the instance is current: %+v %v", obs, err)
			}
			pr.calls = 0
			rec.reasons = nil

			secret.Data["password"] = []byte("new")
			if err := kube.Update(ctx, secret); err != nil {
				t.Fatal(err)
			}
			c.t = c.t.Add(time.Minute)
			obs, err := e.Observe(ctx, p)
			if err != nil {
				t.Fatal(err)
			}
			// Observed again at once: nothing more happens.
			if _, err := e.Observe(ctx, p); err != nil {
				t.Fatal(err)
			}
			if obs.ResourceUpToDate != tc.want.upToDate {
				t.Errorf("%s\nup to date: got %v (%s), want %v", tc.reason, obs.ResourceUpToDate, obs.Diff, tc.want.upToDate)
			}
			if !tc.want.upToDate && !strings.Contains(obs.Diff, "credentials") && len(tc.policies) == 0 {
				t.Errorf("the diff must say the credentials replace the instance: %q", obs.Diff)
			}
			var got []time.Duration
			for _, u := range rot.Untils {
				if u.IsZero() {
					got = append(got, -1)
					continue
				}
				got = append(got, u.Sub(c.t))
			}
			if len(got) != len(tc.want.rotations) || (len(got) > 0 && got[0] != tc.want.rotations[0]) {
				t.Errorf("%s\nrotations (deadline after now): got %v, want %v", tc.reason, got, tc.want.rotations)
			}
			ap := p.Status.AtProvider
			if ap.CredentialsOutdated != tc.want.outdated {
				t.Errorf("credentialsOutdated: got %v, want %v", ap.CredentialsOutdated, tc.want.outdated)
			}
			if (pr.calls > 0) != tc.want.probes {
				t.Errorf("probed %d times, want probes: %v", pr.calls, tc.want.probes)
			}
			var prev time.Duration
			if ap.PreviousCredentialsUntil != nil {
				prev = ap.PreviousCredentialsUntil.Sub(c.t)
			}
			if prev != tc.want.previous {
				t.Errorf("previousCredentialsUntil: %v after now, want %v", prev, tc.want.previous)
			}
			for r, n := range tc.want.events {
				if rec.reasons[r] != n {
					t.Errorf("events %s: got %d, want %d (all %v)", r, rec.reasons[r], n, rec.reasons)
				}
			}
			if tc.want.outdated && len(obs.ConnectionDetails) != 0 {
				t.Error("an outdated instance must not publish the new credentials as its own")
			}
			if base.CallCount("Delete") != 0 {
				t.Error("Observe never deletes")
			}
			if tc.want.previous == 0 {
				return
			}
			// The grace ends: the previous credentials are dropped, once.
			c.t = ap.PreviousCredentialsUntil.Time
			for range 2 {
				if _, err := e.Observe(ctx, p); err != nil {
					t.Fatal(err)
				}
			}
			if n := len(rot.Untils); n != 2 || !rot.Untils[1].IsZero() {
				t.Errorf("after the grace the previous credentials must be dropped once: calls %v", rot.Untils)
			}
			if p.Status.AtProvider.PreviousCredentialsUntil != nil || rec.reasons[string(ReasonPreviousCredentialsRetired)] != 1 {
				t.Errorf("after the grace: status %v, events %v", p.Status.AtProvider.PreviousCredentialsUntil, rec.reasons)
			}
		})
	}
}

// TestUpgradeReplacesNothing: instances made before credentials rotated in
// place carry the hash of the old formula, which held the password. The
// values here are what that formula (commit e7b74aa) gave. Such an
// instance running the current password is current, not replaced by the
// upgrade; one without credentials hashes as before; and a fleet's
// instance whose old hash matches nothing any more (its password changed
// since) is reported outdated, for the fleet to replace within its budget,
// rather than replaced at once.
func TestUpgradeReplacesNothing(t *testing.T) {
	pc := &config{Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal}}
	creds := &backend.Credentials{Username: "crawler", Password: "Sup3r-Secret-Pa55"}
	gcpProxy := unitProxy(func(p *v1alpha1.Proxy) {
		p.Spec.ForProvider.Local = nil
		p.Spec.ForProvider.GCP = &v1alpha1.GCPPlacement{Zone: "europe-west1-b"}
	})
	for name, tc := range map[string]struct {
		got, want string
	}{
		"Local":  {legacySpecHash(desiredSpec(unitProxy(), pc, "unit", creds, "")), "67bd4d93a845eb7d"},
		"GCP":    {legacySpecHash(desiredSpec(gcpProxy, pc, "unit", creds, "")), "a85c4bc5823b43b4"},
		"NoAuth": {specHash(desiredSpec(unitProxy(), pc, "unit", nil, "")), "0d42853344984251"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: the old formula gave %s, this gives %s", name, tc.want, tc.got)
		}
	}

	e := newExternal(fake.New(), &fakeProber{res: probe.Result{OK: true}}, &clock{t: epoch})
	want := desiredSpec(gcpProxy, pc, "unit", creds, "")
	old := &backend.Instance{Ref: want.Ref, SpecHash: "a85c4bc5823b43b4", Phase: v1alpha1.InstancePhaseRunning}
	if current, v := e.specCurrent(gcpProxy, old, want); !current || v != credentialsCurrent || old.CredentialsSum != want.CredentialsSum {
		t.Errorf("an instance of the old formula with the current password is current: %v %v %q", current, v, old.CredentialsSum)
	}
	changed := desiredSpec(gcpProxy, pc, "unit", &backend.Credentials{Username: "crawler", Password: "new"}, "")
	old = &backend.Instance{Ref: want.Ref, SpecHash: "a85c4bc5823b43b4", Phase: v1alpha1.InstancePhaseRunning}
	if current, v := e.specCurrent(gcpProxy, old, changed); current || v != credentialsReplace && v != credentialsCurrent {
		t.Errorf("a lone instance of the old formula whose password changed is replaced: %v %v", current, v)
	}
	member := gcpProxy.DeepCopy()
	member.SetAnnotations(map[string]string{fleetv1alpha1.AnnotationFleet: "vms"})
	if current, v := e.specCurrent(member, old, changed); current || v != credentialsOutdated {
		t.Errorf("a fleet's instance of the old formula whose password changed is outdated: %v %v", current, v)
	}
}

// TestCredentialsAnHtpasswdCannotHold: a password ending in a newline (a
// Secret made with --from-file) or a username with ':' is refused when the
// Secret is read, before anything is done to the instance, rather than
// found unwritable by the backend, which would replace it.
func TestCredentialsAnHtpasswdCannotHold(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ user, pass string }{{"crawler", "pw\n"}, {"a:b", "pw"}, {"crawler\r", "pw"}, {"#crawler", "pw"}, {" crawler", "pw"}} {
		secret := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}},
			Data:       map[string][]byte{"username": []byte(c.user), "password": []byte(c.pass)},
		}
		kube := clientfake.NewClientBuilder().WithScheme(scheme).WithObjects(secret).Build()
		b := &fake.Rotating{Backend: fake.New()}
		e := newExternal(b, &fakeProber{}, &clock{t: epoch})
		e.kube = kube
		p := unitProxy(func(p *v1alpha1.Proxy) {
			p.Spec.ForProvider.AllowedSourceRanges = nil
			p.Spec.ForProvider.AuthSecretRef = &v1alpha1.AuthSecretReference{Name: "auth"}
		})
		s := desiredSpec(p, e.pc, "unit", &backend.Credentials{Username: "crawler", Password: "old"}, "")
		if _, err := b.Create(context.Background(), s); err != nil {
			t.Fatal(err)
		}
		_, err := e.Observe(context.Background(), p)
		if err == nil || !strings.Contains(err.Error(), "may not hold") {
			t.Errorf("%q/%q: want the Secret refused, got %v", c.user, c.pass, err)
		}
		if n := b.CallCount("RotateCredentials") + b.CallCount("Delete"); n != 0 {
			t.Errorf("%q/%q: nothing may be done to the instance, %d calls", c.user, c.pass, n)
		}
		if r := p.GetCondition(xpv2.TypeReady).Reason; r != ReasonSecretUnavailable {
			t.Errorf("%q/%q: Ready reason %s, want %s", c.user, c.pass, r, ReasonSecretUnavailable)
		}
	}
}
