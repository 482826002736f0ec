package local

import (
	"context"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestRotateCredentials rotates a running local proxy's password: the same
// Squid process (same pid, same port) accepts the new password at once
// and the old one during the grace, records which credentials it accepts
// and until when, drops the old ones when told, and refuses a rotation by
// a Proxy that does not hold it.
func TestRotateCredentials(t *testing.T) {
	dir := testbed.SquidStateDir(t)
	b := newBackend(t, dir, &v1alpha1.PortRange{From: 32130, To: 32140})
	target := testbed.StartPlainEchoTarget(t)
	ctx := context.Background()
	s := spec("rot", 3128)
	s.CredentialsSum = squid.CredentialsSum(s.Credentials.Username, s.Credentials.Password, s.Name)
	inst, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if inst.CredentialsSum != s.CredentialsSum {
		t.Fatalf("the instance must record its credentials' sum %q, got %q", s.CredentialsSum, inst.CredentialsSum)
	}
	waitProbe(t, inst, s, target, true)
	pids := Processes(dir)

	old := s
	next := s
	next.Credentials = &backend.Credentials{Username: "crawler", Password: "rotated"}
	next.CredentialsSum = squid.CredentialsSum("crawler", "rotated", s.Name)
	until := time.Now().Add(time.Hour).Truncate(time.Second)

	intruder := next
	intruder.Owner.UID = "someone-else"
	if err := b.RotateCredentials(ctx, intruder, until); backend.ClassOf(err) != backend.ClassTransient {
		t.Errorf("a Proxy not holding the instance must not rotate it: got %v", err)
	}

	if err := b.RotateCredentials(ctx, next, until); err != nil {
		t.Fatal(err)
	}
	got, err := b.Get(ctx, s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.CredentialsSum != next.CredentialsSum || !got.PreviousCredentialsUntil.Equal(until) {
		t.Errorf("after the rotation: sum %q until %v, want %q until %v", got.CredentialsSum, got.PreviousCredentialsUntil, next.CredentialsSum, until)
	}
	waitProbe(t, inst, next, target, true)
	waitProbe(t, inst, old, target, true)

	// Told again (a retried reconcile): nothing changes, the grace holds.
	if err := b.RotateCredentials(ctx, next, until.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Get(ctx, s.Ref); !got.PreviousCredentialsUntil.Equal(until) {
		t.Errorf("a repeated rotation must keep the first deadline %v, got %v", until, got.PreviousCredentialsUntil)
	}

	// The grace ends: only the new password. Squid revalidates cached
	// credentials within 10s.
	if err := b.RotateCredentials(ctx, next, time.Time{}); err != nil {
		t.Fatal(err)
	}
	if got, _ := b.Get(ctx, s.Ref); !got.PreviousCredentialsUntil.IsZero() {
		t.Errorf("the previous credentials must be gone, still until %v", got.PreviousCredentialsUntil)
	}
	testbed.Eventually(t, 20*time.Second, "the old password refused", func() (bool, string) {
		r := probeOnce(inst, old, target)
		return !r.OK, r.Error
	})
	waitProbe(t, inst, next, target, true)
	if after := Processes(dir); len(after) != 1 || after[0] != pids[0] {
		t.Errorf("squid must not be restarted by a rotation: pids %v, then %v", pids, after)
	}
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Fatal(err)
	}
}
