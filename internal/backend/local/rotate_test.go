package local

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// rotating makes a local instance with credentials, and the spec of the
// same Proxy with the password changed to next.
func rotating(t *testing.T, from, to int32, uid, next string) (*Backend, backend.Spec, backend.Spec) {
	t.Helper()
	b := newBackend(t, testbed.SquidStateDir(t), &v1alpha1.PortRange{From: from, To: to})
	s := spec(uid, 3128)
	s.CredentialsSum = squid.CredentialsSum(s.Credentials.Username, s.Credentials.Password, s.Name)
	if _, err := b.Create(context.Background(), s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Delete(context.Background(), s.Ref) })
	n := s
	n.Credentials = &backend.Credentials{Username: s.Credentials.Username, Password: next}
	n.CredentialsSum = squid.CredentialsSum(s.Credentials.Username, next, s.Name)
	return b, s, n
}

// TestRotateCredentials rotates a running local proxy's password: the same
// Squid process (same pid, same port) accepts the new password at once
// and the old one during the grace, records which credentials it accepts
// and until when, drops the old ones when told, and refuses a rotation by
// a Proxy that does not hold it.
func TestRotateCredentials(t *testing.T) {
	b, s, next := rotating(t, 32130, 32140, "rot", "rotated")
	dir := b.cfg.StateDir
	target := testbed.StartPlainEchoTarget(t)
	ctx := context.Background()
	inst, err := b.Get(ctx, s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if inst.CredentialsSum != s.CredentialsSum {
		t.Fatalf("the instance must record its credentials' sum %q, got %q", s.CredentialsSum, inst.CredentialsSum)
	}
	waitProbe(t, inst, s, target, true)
	pids := Processes(dir)

	old := s
	until := time.Now().Add(time.Hour).Truncate(time.Second)

	intruder := next
	intruder.Owner.UID = "someone-else"
	if _, err := b.RotateCredentials(ctx, intruder, until, time.Now()); backend.ClassOf(err) != backend.ClassTransient {
		t.Errorf("a Proxy not holding the instance must not rotate it: got %v", err)
	}

	if r, err := b.RotateCredentials(ctx, next, until, time.Now()); err != nil || !r.Rotated || !r.PreviousUntil.Equal(until) {
		t.Fatalf("want rotated, the previous credentials until %v: %+v %v", until, r, err)
	}
	got, err := b.Get(ctx, s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.CredentialsSum != next.CredentialsSum {
		t.Errorf("after the rotation: sum %q, want %q", got.CredentialsSum, next.CredentialsSum)
	}
	waitProbe(t, inst, next, target, true)
	waitProbe(t, inst, old, target, true)

	// Told again (the next observation): nothing changes, the grace holds.
	if r, err := b.RotateCredentials(ctx, next, until.Add(time.Hour), time.Now()); err != nil || r.Rotated || r.Retired || !r.PreviousUntil.Equal(until) {
		t.Fatalf("observed again: want nothing done, the grace until %v: %+v %v", until, r, err)
	}

	// The grace ends: only the new password. Squid revalidates cached
	// credentials within 10s.
	if r, err := b.RotateCredentials(ctx, next, until.Add(time.Hour), until); err != nil || !r.Retired || !r.PreviousUntil.IsZero() {
		t.Fatalf("at the deadline: want the previous credentials retired: %+v %v", r, err)
	}
	if _, err := os.Lstat(filepath.Join(b.dir(s.Name), filePrevious)); !os.IsNotExist(err) {
		t.Errorf("the previous credentials' file must be gone: %v", err)
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
	b, s, next := rotating(t, 32141, 32150, "cut", "rotated")
	ctx := context.Background()
	until := time.Now().Add(time.Hour)
	// What the cut-short rotation left: both files, the old record.
	rec, err := b.readRecord(s.Name)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.RotateCredentials(ctx, next, until, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := b.writeRecord(s.Name, rec); err != nil {
		t.Fatal(err)
	}
	if r, err := b.RotateCredentials(ctx, next, until.Add(time.Minute), time.Now()); err != nil || r.Rotated {
		t.Fatalf("the retried rotation finds the new password in place: %+v %v", r, err)
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
	if d, ok := squid.PreviousDeadline(previous); !ok || !d.Equal(until.Truncate(time.Second)) {
		t.Errorf("the retried rotation must keep the first deadline %v, got %v", until, d)
	}

	// The change reverted half-way (the Secret back to the old password):
	// the instance takes it again, and keeps the abandoned one for the
	// grace, rather than trusting its record.
	if err := b.writeRecord(s.Name, rec); err != nil {
		t.Fatal(err)
	}
	if r, err := b.RotateCredentials(ctx, s, until, time.Now()); err != nil || !r.Rotated {
		t.Fatalf("reverting: want rotated back: %+v %v", r, err)
	}
	if !squid.HtpasswdMatches(read(fileHtpasswd), "crawler", s.Credentials.Password) {
		t.Error("reverted: the current file must hold the old password again")
	}
}

// TestRotationFollowsNoSymlink: the instance folder is Squid's user's, so
// whoever runs as that user may plant symlinks in it. A rotation by a
// provider running as root must neither write nor give away the file a
// planted temporary name points at, nor copy into the folder the file a
// planted htpasswd points at.
func TestRotationFollowsNoSymlink(t *testing.T) {
	b, s, next := rotating(t, 32151, 32160, "link", "rotated")
	ctx := context.Background()
	victim := filepath.Join(t.TempDir(), "root-only")
	if err := os.WriteFile(victim, []byte("root's secret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(victim)
	if err != nil {
		t.Fatal(err)
	}
	inst := b.dir(s.Name)
	for _, name := range []string{filePrevious + ".tmp", fileHtpasswd + ".tmp", fileRecord + ".tmp"} {
		if err := os.Symlink(victim, filepath.Join(inst, name)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := b.RotateCredentials(ctx, next, time.Now().Add(time.Hour), time.Now()); err != nil {
		t.Fatalf("a rotation past planted temporary names: %v", err)
	}
	check := func(step string) {
		t.Helper()
		after, err := os.Stat(victim)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := os.ReadFile(victim)
		if string(raw) != "root's secret\n" || !os.SameFile(before, after) || after.Mode() != before.Mode() ||
			after.Sys().(*syscall.Stat_t).Uid != before.Sys().(*syscall.Stat_t).Uid {
			t.Errorf("%s: the file a symlink pointed at was changed: %q, %v", step, raw, after.Mode())
		}
	}
	check("planted temporary names")

	// A planted htpasswd pointing at root's file: not read into the
	// previous file.
	if err := os.Remove(filepath.Join(inst, fileHtpasswd)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, filepath.Join(inst, fileHtpasswd)); err != nil {
		t.Fatal(err)
	}
	again := next
	again.Credentials = &backend.Credentials{Username: "crawler", Password: "third"}
	again.CredentialsSum = squid.CredentialsSum("crawler", "third", s.Name)
	if _, err := b.RotateCredentials(ctx, again, time.Now().Add(time.Hour), time.Now()); !errors.Is(err, syscall.ELOOP) {
		t.Errorf("a rotation must refuse an htpasswd that is a symlink (ELOOP), got %v", err)
	}
	if raw, _ := os.ReadFile(filepath.Join(inst, filePrevious)); strings.Contains(string(raw), "root's secret") {
		t.Error("root's file was copied into the instance folder")
	}
	check("planted htpasswd")

	// A FIFO planted as the previous file blocks nothing, and a missing
	// htpasswd is written again.
	if err := os.Remove(filepath.Join(inst, fileHtpasswd)); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(filepath.Join(inst, filePrevious)); err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(inst, filePrevious), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := b.Get(ctx, s.Ref)
		if err == nil {
			_, err = b.RotateCredentials(ctx, again, time.Now().Add(time.Hour), time.Now())
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a FIFO as the previous file, a missing htpasswd: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a FIFO planted as the previous file blocked the backend")
	}
	if !squid.HtpasswdMatches(readFile(t, filepath.Join(inst, fileHtpasswd)), "crawler", "third") {
		t.Error("a missing htpasswd must be written again")
	}
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
