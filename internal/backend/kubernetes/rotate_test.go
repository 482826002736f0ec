package kubernetes_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/kubernetes"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

// TestRotateCredentials rotates a pod's password in place: its config
// Secret's files, as the pod mounts them and its helper reads them with the
// real basic_ncsa_auth, accept both passwords during the grace and only
// the new one after; the pod is annotated so the kubelet refreshes the
// mount, keeps its spec, and reads back the sum and the deadline.
func TestRotateCredentials(t *testing.T) {
	testbed.SquidBinary(t)
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	b := kubernetes.New(kubernetes.Config{Client: bed.Client, ClusterID: "rot"})
	s := podSpec(ns, "rot", types.UID("8b3d0d7f-1111-4222-8333-944455556666"))
	s.CredentialsSum = squid.CredentialsSum("crawler", "pw", s.Name)
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	before := &corev1.Pod{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: s.Name}, before); err != nil {
		t.Fatal(err)
	}
	accepts := func(step string, want map[string]bool) {
		t.Helper()
		sec := &corev1.Secret{}
		if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: s.Name}, sec); err != nil {
			t.Fatal(err)
		}
		dir := t.TempDir()
		for k, v := range sec.Data {
			if err := os.WriteFile(filepath.Join(dir, k), v, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for pass, ok := range want {
			cmd := exec.Command("/bin/sh", filepath.Join(dir, "auth.sh"), squid.DefaultAuthHelper, filepath.Join(dir, "htpasswd"), filepath.Join(dir, "htpasswd.previous"))
			cmd.Stdin = strings.NewReader("crawler " + pass + "\n")
			out, err := cmd.Output()
			if err != nil {
				t.Fatal(err)
			}
			if got := strings.HasPrefix(string(out), "OK"); got != ok {
				t.Errorf("%s: password %q accepted %v, want %v", step, pass, got, ok)
			}
		}
	}
	accepts("before", map[string]bool{"pw": true, "next": false})

	next := s
	next.Credentials = &backend.Credentials{Username: "crawler", Password: "next"}
	next.CredentialsSum = squid.CredentialsSum("crawler", "next", s.Name)
	until := time.Now().Add(time.Hour).Truncate(time.Second)
	if r, err := b.RotateCredentials(ctx, next, until, time.Now()); err != nil || !r.Rotated {
		t.Fatalf("want rotated: %+v %v", r, err)
	}
	accepts("during the grace", map[string]bool{"pw": true, "next": true})
	i, err := b.Get(ctx, s.Ref)
	if err != nil || i.CredentialsSum != next.CredentialsSum || !i.PreviousCredentialsUntil.Equal(until) {
		t.Fatalf("the pod must read back sum %s until %v: %+v %v", next.CredentialsSum, until, i, err)
	}
	after := &corev1.Pod{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: s.Name}, after); err != nil {
		t.Fatal(err)
	}
	if after.Annotations[kubernetes.AnnotationCredentials] != next.CredentialsSum || after.Generation != before.Generation {
		t.Errorf("the pod must be annotated, not changed: annotations %v, generation %d then %d", after.Annotations, before.Generation, after.Generation)
	}

	if r, err := b.RotateCredentials(ctx, next, until.Add(time.Hour), time.Now()); err != nil || r.Rotated || r.Retired || !r.PreviousUntil.Equal(until) {
		t.Fatalf("observed again: want nothing done, the grace until %v: %+v %v", until, r, err)
	}
	if r, err := b.RotateCredentials(ctx, next, until.Add(time.Hour), until); err != nil || !r.Retired {
		t.Fatalf("at the deadline: want retired: %+v %v", r, err)
	}
	accepts("after the grace", map[string]bool{"pw": false, "next": true})
	if i, _ := b.Get(ctx, s.Ref); !i.PreviousCredentialsUntil.IsZero() {
		t.Errorf("the deadline must be gone, got %v", i.PreviousCredentialsUntil)
	}

	intruder := next
	intruder.Owner.UID = "someone-else"
	if _, err := b.RotateCredentials(ctx, intruder, until, time.Now()); backend.ClassOf(err) != backend.ClassTransient {
		t.Errorf("a Proxy not holding the pod must not rotate it: got %v", err)
	}
}
