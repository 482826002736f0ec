package local

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

func newBackend(t *testing.T, dir string, pr *v1alpha1.PortRange) *Backend {
	t.Helper()
	return newLoggedBackend(t, dir, pr, nil)
}

func newLoggedBackend(t *testing.T, dir string, pr *v1alpha1.PortRange, log logging.Logger) *Backend {
	t.Helper()
	b, err := New(Config{SquidPath: testbed.SquidBinary(t), StateDir: dir, PortRange: pr, ClusterID: "test", RestartDelay: 300 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func spec(uid string, port int32) backend.Spec {
	o := ownership.Owner{ClusterID: "test", Namespace: "ns", Name: "p-" + uid, UID: types.UID("uid-" + uid)}
	return backend.Spec{
		Ref:         backend.Ref{Name: ownership.InstanceName(o.UID)},
		Owner:       o,
		Port:        port,
		Credentials: &backend.Credentials{Username: "crawler", Password: "pw-" + uid},
		Local:       &v1alpha1.LocalPlacement{BindAddress: "127.0.0.1"},
		// The probe targets live on this host.
		AllowLoopbackDestinations: true,
		Hash:                      "h-" + uid,
	}
}

// waitProbe probes through inst until the probe's OK is want, for up to
// 15s, and returns that probe's result.
func waitProbe(t *testing.T, inst *backend.Instance, s backend.Spec, target testbed.Target, want bool) probe.Result {
	t.Helper()
	var last probe.Result
	testbed.Eventually(t, 15*time.Second, fmt.Sprintf("a probe through %s with OK=%t", inst.ProviderID, want), func() (bool, string) {
		last = probeOnce(inst, s, target)
		return last.OK == want, fmt.Sprintf("%+v", last)
	})
	return last
}

// probeOnce probes through inst with s's credentials.
func probeOnce(inst *backend.Instance, s backend.Spec, target testbed.Target) probe.Result {
	return probe.Prober{}.Probe(context.Background(), probe.Target{
		Proxy: inst.Host + ":" + itoa(inst.Port), Username: s.Credentials.Username, Password: s.Credentials.Password,
		URL: target.URL, Timeout: 2 * time.Second, RootCAs: target.RootCAs,
	})
}

// recorder is a logger that keeps every message, with its values.
type recorder struct {
	mu    *sync.Mutex
	lines *[]string
	kv    []any
}

func newRecorder() recorder { return recorder{mu: &sync.Mutex{}, lines: &[]string{}} }

func (r recorder) Info(msg string, kv ...any)  { r.add(msg, kv) }
func (r recorder) Debug(msg string, kv ...any) { r.add(msg, kv) }
func (r recorder) WithValues(kv ...any) logging.Logger {
	return recorder{mu: r.mu, lines: r.lines, kv: append(append([]any{}, r.kv...), kv...)}
}

func (r recorder) add(msg string, kv []any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	*r.lines = append(*r.lines, fmt.Sprint(msg, " ", append(append([]any{}, r.kv...), kv...)))
}

// count returns how many messages start with msg.
func (r recorder) count(msg string) (int, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, l := range *r.lines {
		if strings.HasPrefix(l, msg) {
			n++
		}
	}
	return n, strings.Join(*r.lines, "\n")
}

func itoa(p int32) string { return strconv.Itoa(int(p)) }

func TestLifecycle(t *testing.T) {
	dir := testbed.SquidStateDir(t)
	b := newBackend(t, dir, &v1alpha1.PortRange{From: 32100, To: 32120})
	target := testbed.StartEchoTarget(t)
	ctx := context.Background()
	s := spec("a", 3128)

	inst, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if inst.Port < 32100 || inst.Port > 32120 {
		t.Errorf("port %d must come from the range", inst.Port)
	}
	if want := "local/" + inst.Name; inst.ProviderID != want {
		t.Errorf("providerID: want %s, got %s", want, inst.ProviderID)
	}
	res := waitProbe(t, inst, s, target, true)
	// Its own loopback address, for a loopback target.
	if want := EgressAddress(inst.Port); res.EgressIP != want {
		t.Errorf("egress IP: want %s, got %q", want, res.EgressIP)
	}

	// A second Create finds the same instance.
	again, err := b.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(inst.ProviderID, again.ProviderID); diff != "" {
		t.Errorf("a retried Create must return the same instance: %s", diff)
	}

	// Wrong credentials are refused by the real Squid.
	bad := probe.Prober{}.Probe(ctx, probe.Target{Proxy: "127.0.0.1:" + itoa(inst.Port), Username: "crawler", Password: "nope", URL: target.URL, RootCAs: target.RootCAs, Timeout: 2 * time.Second})
	if bad.OK || !strings.Contains(bad.Error, "407") {
		t.Errorf("wrong credentials must fail with 407, got %+v", bad)
	}

	// Killing Squid: the supervisor restarts it.
	pids := Processes(dir)
	if len(pids) != 1 {
		t.Fatalf("want exactly one squid, got %v", pids)
	}
	if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, fmt.Sprintf("one new squid in place of the killed %d", pids[0]), func() (bool, string) {
		got := Processes(dir)
		return len(got) == 1 && got[0] != pids[0], fmt.Sprintf("squids %v", got)
	})
	waitProbe(t, inst, s, target, true)

	// Delete: no process, no files.
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Fatal(err)
	}
	if got := Processes(dir); len(got) != 0 {
		t.Errorf("squid processes left after Delete: %v", got)
	}
	var left []string
	for _, g := range []string{"[^.]*", ".ports/*", ".staging/*"} {
		m, _ := filepath.Glob(filepath.Join(dir, g))
		left = append(left, m...)
	}
	if len(left) != 0 {
		t.Errorf("files left after Delete: %v", left)
	}
	if _, err := b.Get(ctx, s.Ref); !backend.IsNotFound(err) {
		t.Errorf("Get after Delete: want NotFound, got %v", err)
	}
	if err := b.Delete(ctx, s.Ref); err != nil {
		t.Errorf("Delete must be idempotent: %v", err)
	}
}

func TestRestartReadopts(t *testing.T) {
	dir := testbed.SquidStateDir(t)
	target := testbed.StartEchoTarget(t)
	ctx := context.Background()
	s := spec("b", 32130)

	first := newBackend(t, dir, nil)
	inst, err := first.Create(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	waitProbe(t, inst, s, target, true)
	before := Processes(dir)

	if len(before) != 1 {
		t.Fatalf("want one squid, got %v", before)
	}

	// The provider goes away without stopping its proxies, and a new one
	// starts on the same state dir. Its supervisor decides once whether to
	// adopt the running Squid or start one; once it has settled, a duplicate
	// would be running.
	first.Close()
	log := newRecorder()
	second := newLoggedBackend(t, dir, nil, log)
	testbed.Eventually(t, 10*time.Second, "the new provider to adopt the running Squid", func() (bool, string) {
		n, lines := log.count(msgAdopted)
		return n == 1, lines
	})
	if n, lines := log.count(msgStarted); n != 0 {
		t.Errorf("the new provider started a Squid of its own:\n%s", lines)
	}
	if diff := cmp.Diff(before, Processes(dir)); diff != "" {
		t.Errorf("a restart must re-adopt the running squid, not start a duplicate: -before, +after:\n%s", diff)
	}
	got, err := second.Get(ctx, s.Ref)
	if err != nil {
		t.Fatal(err)
	}
	if got.Phase != v1alpha1.InstancePhaseRunning {
		t.Errorf("re-adopted instance phase: want Running, got %s", got.Phase)
	}

	// The new provider supervises it: a kill is healed.
	if err := syscall.Kill(before[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, 10*time.Second, fmt.Sprintf("one new squid in place of the killed %d", before[0]), func() (bool, string) {
		got := Processes(dir)
		return len(got) == 1 && got[0] != before[0], fmt.Sprintf("squids %v", got)
	})
	waitProbe(t, got, s, target, true)
	if err := second.Delete(ctx, s.Ref); err != nil {
		t.Fatal(err)
	}
	if n := len(Processes(dir)); n != 0 {
		t.Errorf("squid left after Delete: %d", n)
	}
}

func TestPortClaims(t *testing.T) {
	dir := testbed.SquidStateDir(t)
	ctx := context.Background()
	b := newBackend(t, dir, nil)
	a := spec("c", 32140)
	if _, err := b.Create(ctx, a); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Delete(ctx, a.Ref) })
	clash := spec("d", 32140)
	_, err := b.Create(ctx, clash)
	owner, _ := os.ReadFile(b.portFile(32140))
	if backend.ClassOf(err) != backend.ClassPermanent || err.Error() != fmt.Sprintf(errFmtPortTaken, 32140, owner) {
		t.Errorf("a second proxy on a taken port must fail permanently and say so, got %v", err)
	}

	ranged := newBackend(t, testbed.SquidStateDir(t), &v1alpha1.PortRange{From: 32150, To: 32151})
	var made []backend.Spec
	t.Cleanup(func() {
		for _, s := range made {
			_ = ranged.Delete(ctx, s.Ref)
		}
	})
	ports := map[int32]bool{}
	for _, id := range []string{"e", "f"} {
		s := spec(id, 0)
		inst, err := ranged.Create(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		made = append(made, s)
		ports[inst.Port] = true
	}
	if len(ports) != 2 {
		t.Errorf("two proxies must get two ports, got %v", ports)
	}
	_, err = ranged.Create(ctx, spec("g", 0))
	if backend.ClassOf(err) != backend.ClassQuota || err.Error() != fmt.Sprintf(errFmtNoFreePort, 32150, 32151) {
		t.Errorf("an exhausted range is a quota error that says so, got %v", err)
	}

	// The ProviderConfig's range widened: the next create takes a port of
	// the new range at once, and the running instances stay its own.
	if err := ranged.Reconfigure(testbed.SquidBinary(t), &v1alpha1.PortRange{From: 32150, To: 32153}); err != nil {
		t.Fatal(err)
	}
	g := spec("g", 0)
	inst, err := ranged.Create(ctx, g)
	if err != nil {
		t.Fatalf("a create after the range was widened: %v", err)
	}
	made = append(made, g)
	if inst.Port != 32152 && inst.Port != 32153 {
		t.Errorf("the create after widening got port %d, want one of the new 32152-32153", inst.Port)
	}
	for _, s := range made {
		testbed.Eventually(t, 20*time.Second, s.Name+" running after the reconfiguration", func() (bool, string) {
			got, err := ranged.Get(ctx, s.Ref)
			if err != nil {
				return false, err.Error()
			}
			return got.Phase == v1alpha1.InstancePhaseRunning, string(got.Phase)
		})
	}
	if err := ranged.Reconfigure("/nonexistent/squid", nil); backend.ClassOf(err) != backend.ClassPermanent {
		t.Errorf("a Squid binary that is not there: %v, want a permanent error", err)
	}
	if pr := ranged.PortRange(); pr == nil || pr.To != 32153 {
		t.Errorf("a refused reconfiguration changed the range to %v", pr)
	}
}

func TestListOwned(t *testing.T) {
	dir := testbed.SquidStateDir(t)
	ctx := context.Background()
	b := newBackend(t, dir, &v1alpha1.PortRange{From: 32160, To: 32169})
	s := spec("h", 0)
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Delete(ctx, s.Ref) })
	got, err := b.ListOwned(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].Owner.UID != s.Owner.UID {
		t.Errorf("ListOwned: want the one instance owned by %s, got %+v", s.Owner.UID, got)
	}
	other := newBackend(t, dir, nil)
	other.cfg.ClusterID = "another-cluster"
	if got, _ := other.ListOwned(ctx); len(got) != 0 {
		t.Errorf("another cluster must not list this cluster's instances: %+v", got)
	}
	// The retain mark is kept in the instance's record and listed.
	for _, retain := range []bool{true, false} {
		if err := b.SetRetain(ctx, s.Ref, retain); err != nil {
			t.Fatal(err)
		}
		if got, err := b.ListOwned(ctx); err != nil || len(got) != 1 || got[0].Owner.Retain != retain {
			t.Errorf("retain %v: listed %+v, %v", retain, got, err)
		}
	}
	// An import hands the instance to its adopter, once: a second
	// importer, which read it as the maker's, is refused.
	to := ownership.Owner{ClusterID: "test", Namespace: "ns", Name: "importer", UID: "uid-importer"}
	if err := b.Adopt(ctx, s.Ref, s.Owner.UID, to); err != nil {
		t.Fatal(err)
	}
	if err := b.Adopt(ctx, s.Ref, s.Owner.UID, ownership.Owner{ClusterID: "test", Namespace: "ns", Name: "late", UID: "uid-late"}); !errors.Is(err, backend.ErrHeldElsewhere) {
		t.Errorf("a second import of the maker's instance must be refused as held elsewhere, got %v", err)
	}
	got, err = b.ListOwned(ctx)
	if err != nil || len(got) != 1 || got[0].Owner.Holder() != to.UID || got[0].Owner.UID != s.Owner.UID || got[0].Owner.Name != "importer" {
		t.Errorf("the instance belongs to its adopter, its maker's UID kept: %+v %v", got, err)
	}
}

func TestUnreachableStateDir(t *testing.T) {
	type want struct {
		class backend.Class
		says  string
		errno error
	}
	type unreachable struct {
		reason   string
		stateDir func(t *testing.T) string
		want     want
	}
	cases := map[string]unreachable{
		"UnderAFile": {
			reason: "A state dir under a regular file cannot be made by anyone, root included.",
			stateDir: func(t *testing.T) string {
				f := filepath.Join(t.TempDir(), "file")
				if err := os.WriteFile(f, nil, 0o600); err != nil {
					t.Fatal(err)
				}
				return filepath.Join(f, "state")
			},
			want: want{class: backend.ClassTransient, says: "cannot create state dir", errno: syscall.ENOTDIR},
		},
	}
	if os.Geteuid() == 0 {
		cases["SquidUserCannotEnter"] = unreachable{
			reason: "As root the provider reaches any folder, but Squid drops to its own user, which cannot enter a 0700 one: refused, saying the fix.",
			stateDir: func(t *testing.T) string {
				return filepath.Join(t.TempDir(), "state") // t.TempDir is 0700, owned by root
			},
			want: want{class: backend.ClassPermanent, says: "chmod o+x"},
		}
	} else {
		cases["ProviderCannotEnter"] = unreachable{
			reason: "Unprivileged, Squid keeps the provider's user: a folder the provider cannot enter is refused.",
			stateDir: func(t *testing.T) string {
				dir := t.TempDir()
				if err := os.Chmod(dir, 0); err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = os.Chmod(dir, 0o700) })
				return filepath.Join(dir, "state")
			},
			want: want{class: backend.ClassTransient, says: "cannot create state dir", errno: syscall.EACCES},
		}
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := New(Config{SquidPath: testbed.SquidBinary(t), StateDir: tc.stateDir(t)})
			if err == nil {
				t.Fatalf("%s\nNew must fail", tc.reason)
			}
			if c := backend.ClassOf(err); c != tc.want.class {
				t.Errorf("%s\nwant class %s, got %s: %v", tc.reason, tc.want.class, c, err)
			}
			if !strings.Contains(err.Error(), tc.want.says) {
				t.Errorf("%s\nthe error must say %q, got %v", tc.reason, tc.want.says, err)
			}
			if tc.want.errno != nil && !errors.Is(err, tc.want.errno) {
				t.Errorf("%s\nwant %v, got %v", tc.reason, tc.want.errno, err)
			}
		})
	}
}
