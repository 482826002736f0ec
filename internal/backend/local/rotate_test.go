package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
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

// TestRotationCutShort: a provider killed after a rotation wrote the new
// htpasswd but before it wrote the record rotates again when it comes
// back; that must not make the new password the "previous" one and so
// drop the old one before its grace is over.
func TestRotationCutShort(t *testing.T) {
	dir := testbed.SquidStateDir(t)
	b := newBackend(t, dir, &v1alpha1.PortRange{From: 32141, To: 32150})
	ctx := context.Background()
	s := spec("cut", 3128)
	s.CredentialsSum = squid.CredentialsSum(s.Credentials.Username, s.Credentials.Password, s.Name)
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	defer b.Delete(ctx, s.Ref) //nolint:errcheck // Cleanup.
	next := s
	next.Credentials = &backend.Credentials{Username: "crawler", Password: "rotated"}
	next.CredentialsSum = squid.CredentialsSum("crawler", "rotated", s.Name)
	until := time.Now().Add(time.Hour)
	// What the cut-short rotation left: both files, the old record.
	rec, err := b.readRecord(s.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.RotateCredentials(ctx, next, until); err != nil {
		t.Fatal(err)
	}
	if err := b.writeRecord(s.Name, rec); err != nil {
		t.Fatal(err)
	}
	if err := b.RotateCredentials(ctx, next, until.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	read := func(f string) []byte {
		raw, err := os.ReadFile(filepath.Join(b.dir(s.Name), f))
		if err != nil {
			t.Fatal(err)
		}
		return raw
	}
	previous := read(filePrevious)
	_, line, _ := strings.Cut(string(previous), "\n")
	if !squid.HtpasswdMatches([]byte(line), "crawler", s.Credentials.Password) {
		t.Errorf("the previous file must still hold the old password after the retried rotation: %q", previous)
	}
	if !squid.HtpasswdMatches(read(fileHtpasswd), "crawler", "rotated") {
		t.Error("the current file must hold the new password")
	}
	if got, _ := b.Get(ctx, s.Ref); got.CredentialsSum != next.CredentialsSum {
		t.Errorf("the retried rotation must complete the record: %+v", got)
	}
}
