package proxy_test

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/api/option"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/local"
	xcontroller "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/proxy"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var sharedBed testbed.Lazy

func TestMain(m *testing.M) { sharedBed.Main(m) }

const password = "Sup3r-Secret-Pa55"

// logBuffer collects everything the provider logs, to prove no secret is
// ever written there.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) write(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	fmt.Fprintln(&l.b, prefix, args)
}

// providerLogs returns an empty log for the providers of a test, shown when
// the test fails.
func providerLogs(t testing.TB) *logBuffer {
	l := &logBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("provider logs:\n%s", tail(l.String(), 400))
		}
	})
	return l
}

// silenceRuntimeLog quiets controller-runtime's global logger; the
// provider's own logs go to a logBuffer.
var silenceRuntimeLog sync.Once

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// since returns what was logged after the log was mark bytes long.
func (l *logBuffer) since(mark int) string {
	return l.String()[mark:]
}

// provider runs the provider's controllers against the test bed until stop.
type provider struct {
	cancel   context.CancelFunc
	done     chan struct{}
	backends *proxy.Backends
	stopped  sync.Once
	test     string
}

// running holds the providers started and not yet stopped.
var running = struct {
	sync.Mutex
	set map[*provider]struct{}
}{set: map[*provider]struct{}{}}

// noCloud is where a test's provider sends what would go to a cloud whose
// fake the test did not start: a loopback port nothing listens on.
const noCloud = "http://127.0.0.1:9"

func startProvider(t testing.TB, stateDir string, logs *logBuffer, target testbed.Target, tweak ...func(*proxy.Options)) *provider {
	t.Helper()
	bed := sharedBed.Env(t)
	silenceRuntimeLog.Do(func() { ctrl.SetLogger(logr.Discard()) })
	log := logging.NewLogrLogger(funcr.New(logs.write, funcr.Options{Verbosity: 1}))
	mgr, err := ctrl.NewManager(bed.Config, ctrl.Options{
		Scheme:  bed.Scheme,
		Metrics: metricsserver.Options{BindAddress: "0"},
		Logger:  funcr.New(logs.write, funcr.Options{}),
		// A restarted provider registers the same controller names again.
		Controller: ctrlconfig.Controller{SkipNameValidation: ptr.To(true)},
	})
	if err != nil {
		t.Fatal(err)
	}
	backends := proxy.NewBackends(proxy.BackendsConfig{Kube: mgr.GetClient(), Config: bed.Config, ClusterID: "it", StateDir: stateDir, RestartDelay: 4 * time.Second, Logger: log,
		// Cloud ProviderConfigs are cluster-wide and outlive the test that
		// made them: a provider whose test brought no fake of a cloud
		// (the orphan collector runs over every configuration) reaches a
		// port on loopback that refuses, never the cloud.
		AWSEndpoint: noCloud, GCPClientOptions: []option.ClientOption{option.WithEndpoint(noCloud), option.WithoutAuthentication()}})
	o := proxy.Options{
		Options: controller.Options{
			Logger: log, GlobalRateLimiter: ratelimiter.NewGlobal(100), PollInterval: time.Minute,
			MaxConcurrentReconciles: 4, Features: managementPolicies(),
		},
		Backends: backends, ClusterID: "it", RootCAs: target.RootCAs,
		// External proxies in these tests are Squids on loopback, as a
		// platform would permit them.
		TenantPrivateNetworks: &reach.Networks{netip.MustParsePrefix("127.0.0.0/8")},
	}
	for _, f := range tweak {
		f(&o)
	}
	if err := xcontroller.Setup(mgr, o); err != nil {
		t.Fatal(err)
	}
	// A provider left running reconciles every later test's Proxies
	// beside that test's own provider: two writers of one status (a CI
	// run saw no-op status writes, and a refusal overwritten by the
	// other provider's credentials error). Each test stops its own.
	running.Lock()
	left := slices.Collect(maps.Keys(running.set))
	running.Unlock()
	for _, q := range left {
		t.Errorf("the provider %s started is still running: a test stops its providers (defer prov.stop())", q.test)
		q.stop()
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &provider{cancel: cancel, done: make(chan struct{}), backends: backends, test: t.Name()}
	running.Lock()
	running.set[p] = struct{}{}
	running.Unlock()
	go func() {
		defer close(p.done)
		if err := mgr.Start(ctx); err != nil {
			t.Errorf("manager: %v", err)
		}
	}()
	return p
}

// managementPolicies enables them, as the provider does.
func managementPolicies() *feature.Flags {
	f := &feature.Flags{}
	f.Enable(feature.EnableBetaManagementPolicies)
	return f
}

// stop stops the provider the way a pod is stopped: controllers end, local
// Squids keep running for the next provider to adopt.
func (p *provider) stop() {
	p.stopped.Do(func() {
		p.cancel()
		<-p.done
		p.backends.Close()
		running.Lock()
		delete(running.set, p)
		running.Unlock()
	})
}

func get(t *testing.T, key types.NamespacedName) *v1alpha1.Proxy {
	t.Helper()
	bed := sharedBed.Env(t)
	p := &v1alpha1.Proxy{}
	if err := bed.Client.Get(context.Background(), key, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func ready(t *testing.T, key types.NamespacedName, want corev1.ConditionStatus) func() (bool, string) {
	return func() (bool, string) {
		p := get(t, key)
		c := p.GetCondition(xpv2.TypeReady)
		return c.Status == want, fmt.Sprintf("Ready=%s reason=%s message=%q atProvider=%+v", c.Status, c.Reason, c.Message, p.Status.AtProvider)
	}
}

func create(t *testing.T, objs ...client.Object) {
	t.Helper()
	bed := sharedBed.Env(t)
	for _, o := range objs {
		if err := bed.Client.Create(context.Background(), o); err != nil {
			t.Fatal(err)
		}
	}
}

// deleteProxies deletes every Proxy of ns and waits until they are gone,
// while the test's provider still runs: a Proxy left behind would be
// reconciled by the next test's provider, against that test's backends.
func deleteProxies(t testing.TB, ns string) {
	t.Helper()
	bed := sharedBed.Env(t)
	ctx := context.Background()
	if err := bed.Client.DeleteAllOf(ctx, &v1alpha1.Proxy{}, client.InNamespace(ns)); err != nil {
		t.Errorf("cannot delete the test's Proxies: %v", err)
		return
	}
	// A Proxy that failed for long is requeued on a long per-object
	// back-off (up to a minute), which its deletion waits out too.
	testbed.Eventually(t, 90*time.Second, "the test's Proxies gone", func() (bool, string) {
		l := &v1alpha1.ProxyList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
			return false, err.Error()
		}
		return len(l.Items) == 0, fmt.Sprintf("%d left", len(l.Items))
	})
}

func proxyObject(ns, name string, port int32, healthURL string) *v1alpha1.Proxy {
	return &v1alpha1.Proxy{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: v1alpha1.ProxySpec{
			ManagedResourceSpec: xpv2.ManagedResourceSpec{
				// The platform's configuration: a tenant's own
				// ProviderConfig's proxies may not reach this host's
				// loopback, where the tests' targets are.
				ProviderConfigReference:          &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "local-" + ns},
				WriteConnectionSecretToReference: &xpv2.LocalSecretReference{Name: name + "-conn"},
			},
			ForProvider: v1alpha1.ProxyParameters{
				Local:         &v1alpha1.LocalPlacement{BindAddress: "127.0.0.1"},
				Port:          port,
				AuthSecretRef: &v1alpha1.AuthSecretReference{Name: "auth"},
				HealthCheck: v1alpha1.HealthCheck{
					URL:              healthURL,
					Interval:         &metav1.Duration{Duration: time.Second},
					Timeout:          &metav1.Duration{Duration: 500 * time.Millisecond},
					FailureThreshold: 2,
				},
			},
		},
	}
}

func TestLocalProxyLifecycle(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := namespace(t)
	dir := testbed.SquidStateDir(t)
	target := testbed.StartEchoTarget(t)
	logs := providerLogs(t)
	pm := metrics.NewProvider()
	prov := startProvider(t, dir, logs, target, func(o *proxy.Options) { o.Metrics = pm })
	ctx := context.Background()

	create(t,
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "auth", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": password}},
		&v1alpha1.ClusterProviderConfig{ObjectMeta: metav1.ObjectMeta{Name: "local-" + ns}, Spec: v1alpha1.ProviderConfigSpec{Backend: v1alpha1.BackendLocal,
			// The tests' targets listen on this host's loopback.
			Policy: &v1alpha1.Policy{Local: &v1alpha1.LocalPolicy{AllowLoopbackDestinations: true}}}},
		proxyObject(ns, "p1", 32310, target.URL),
	)
	key := types.NamespacedName{Namespace: ns, Name: "p1"}

	start := time.Now()
	testbed.Eventually(t, 10*time.Second, "Proxy Ready=True", ready(t, key, corev1.ConditionTrue))
	t.Logf("Ready %s after apply", time.Since(start).Round(time.Millisecond))
	p := get(t, key)
	// The echo target on loopback saw the proxy's own loopback address.
	if ap := p.Status.AtProvider; ap.EgressIP != local.EgressAddress(32310) || ap.ProviderID != "local/"+ownership.InstanceName(p.GetUID()) || ap.Host != "127.0.0.1" || ap.Port != 32310 {
		t.Errorf("atProvider: want egressIP %s on local/%s at 127.0.0.1:32310, got %+v", local.EgressAddress(32310), ownership.InstanceName(p.GetUID()), ap)
	}
	conn := &corev1.Secret{}
	if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: "p1-conn"}, conn); err != nil {
		t.Fatalf("connection secret: %v", err)
	}
	if got, want := string(conn.Data[proxy.ConnectionProxyURL]), "http://crawler:"+password+"@127.0.0.1:32310"; got != want {
		t.Errorf("connection proxyURL: want %s, got %s", want, got)
	}
	pc := &v1alpha1.ClusterProviderConfig{}
	testbed.Eventually(t, 5*time.Second, "ClusterProviderConfig counts its user", func() (bool, string) {
		_ = bed.Client.Get(ctx, types.NamespacedName{Name: "local-" + ns}, pc)
		return pc.Status.Users == 1, fmt.Sprintf("users=%d", pc.Status.Users)
	})

	t.Run("KillSquid", func(t *testing.T) {
		pids := local.Processes(dir)
		if len(pids) != 1 {
			t.Fatalf("want one squid, got %v", pids)
		}
		if err := syscall.Kill(pids[0], syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 10*time.Second, "Ready=False after failureThreshold failed probes", ready(t, key, corev1.ConditionFalse))
		p := get(t, key)
		if p.Status.AtProvider.ConsecutiveFailures < 2 || p.GetCondition(xpv2.TypeReady).Reason != proxy.ReasonProbeFailing {
			t.Errorf("want ProbeFailing after >= 2 failures, got %+v, %+v", p.Status.AtProvider, p.GetCondition(xpv2.TypeReady))
		}
		testbed.Eventually(t, 15*time.Second, "Proxy heals", ready(t, key, corev1.ConditionTrue))
	})

	t.Run("RestartProvider", func(t *testing.T) {
		before := local.Processes(dir)
		prov.stop()
		mark := len(logs.String())
		prov = startProvider(t, dir, logs, target, func(o *proxy.Options) { o.Metrics = pm })
		// The new provider re-adopts the Squid, or would start a duplicate,
		// when it first reaches the local backend: before its first
		// reconcile of p1 ends.
		request := fmt.Sprintf(`"request"={"name"=%q "namespace"=%q}`, key.Name, key.Namespace)
		testbed.Eventually(t, 10*time.Second, "the new provider finding p1 up to date", func() (bool, string) {
			for _, l := range strings.Split(logs.since(mark), "\n") {
				if strings.Contains(l, `"msg"="External resource is up to date"`) && strings.Contains(l, request) {
					return true, ""
				}
			}
			return false, tail(logs.since(mark), 5)
		})
		after := local.Processes(dir)
		if len(before) != 1 || len(after) != 1 || before[0] != after[0] {
			t.Errorf("a provider restart must re-adopt the squid, not duplicate it: before %v, after %v", before, after)
		}
		testbed.Eventually(t, 10*time.Second, "still Ready after restart", ready(t, key, corev1.ConditionTrue))
	})

	t.Run("ChangePort", func(t *testing.T) {
		err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			p := get(t, key)
			p.Spec.ForProvider.Port = 32311
			return bed.Client.Update(ctx, p)
		})
		if err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 20*time.Second, "replaced on the new port and Ready", func() (bool, string) {
			p := get(t, key)
			c := p.GetCondition(xpv2.TypeReady)
			return p.Status.AtProvider.Port == 32311 && c.Status == corev1.ConditionTrue, fmt.Sprintf("%+v %s", p.Status.AtProvider, c.Message)
		})
		if n := len(local.Processes(dir)); n != 1 {
			t.Errorf("the old squid must be gone: %d running", n)
		}
	})

	t.Run("WrongCredentials", func(t *testing.T) {
		create(t,
			&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "wrong", Labels: map[string]string{v1alpha1.LabelProxySecret: "true"}}, StringData: map[string]string{"username": "crawler", "password": "Not-The-" + password}},
			&v1alpha1.Proxy{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ext"},
				Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{
					Mode:          v1alpha1.ProxyModeExternal,
					Endpoint:      &v1alpha1.Endpoint{Host: "127.0.0.1", Port: 32311},
					AuthSecretRef: &v1alpha1.AuthSecretReference{Name: "wrong"},
					HealthCheck:   v1alpha1.HealthCheck{URL: target.URL, Interval: &metav1.Duration{Duration: time.Second}, Timeout: &metav1.Duration{Duration: 500 * time.Millisecond}},
				}},
			})
		extKey := types.NamespacedName{Namespace: ns, Name: "ext"}
		testbed.Eventually(t, 10*time.Second, "a clear Unavailable message", func() (bool, string) {
			c := get(t, extKey).GetCondition(xpv2.TypeReady)
			return c.Status == corev1.ConditionFalse && strings.Contains(c.Message, "rejected the credentials"), c.Message
		})
		if err := bed.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "ext"}}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("OpenProxyFlagged", func(t *testing.T) {
		// A Squid whose configuration the provider did not write, as a
		// user's cloud-init could run: it has credentials on paper but
		// serves everyone.
		open := "http_port 127.0.0.1:32312\npid_filename none\ncache deny all\nshutdown_lifetime 1 seconds\naccess_log none\nhttp_access allow all\n"
		testbed.RunSquid(t, []byte(open), "", nil, "127.0.0.1:32312")
		create(t, &v1alpha1.Proxy{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "open", Labels: map[string]string{fleetv1alpha1.LabelFleet: "crawlers"}},
			Spec: v1alpha1.ProxySpec{ForProvider: v1alpha1.ProxyParameters{
				Mode:          v1alpha1.ProxyModeExternal,
				Endpoint:      &v1alpha1.Endpoint{Host: "127.0.0.1", Port: 32312},
				AuthSecretRef: &v1alpha1.AuthSecretReference{Name: "auth"},
				HealthCheck:   v1alpha1.HealthCheck{URL: target.URL, Interval: &metav1.Duration{Duration: time.Second}, Timeout: &metav1.Duration{Duration: 500 * time.Millisecond}},
			}},
		})
		openKey := types.NamespacedName{Namespace: ns, Name: "open"}
		testbed.Eventually(t, 10*time.Second, "OpenProxy=True and Ready=False", func() (bool, string) {
			p := get(t, openKey)
			o, r := p.GetCondition(proxy.TypeOpenProxy), p.GetCondition(xpv2.TypeReady)
			return o.Status == corev1.ConditionTrue && r.Status == corev1.ConditionFalse && r.Reason == proxy.ReasonOpenProxy,
				fmt.Sprintf("OpenProxy=%s (%s) Ready=%s %s: %s healthy=%v", o.Status, o.Message, r.Status, r.Reason, r.Message, p.Status.AtProvider.Healthy)
		})
		// Its health probe passes, yet egress-discovery does not hand it out.
		if !get(t, openKey).Status.AtProvider.Healthy {
			t.Error("the open proxy's probe should pass: only the closure check flags it")
		}
		cat := discovery.NewCatalog(discovery.CatalogConfig{Cache: bed.Client, Direct: bed.Client})
		members, err := cat.Fleet(ctx, ns, "crawlers")
		if err != nil || len(members) != 1 {
			t.Fatalf("catalog: %v, %v", members, err)
		}
		if members[0].Healthy {
			t.Error("egress-discovery would hand out an open proxy")
		}
		found := 0.0
		for _, b := range []string{"external", "local"} {
			found += testutil.ToFloat64(pm.OpenProxies.WithLabelValues(b))
		}
		if found < 1 {
			t.Errorf("egress_proxy_open_proxies_total is %v after an open proxy was found", found)
		}
		// Events are sent asynchronously, after the status.
		testbed.Eventually(t, 10*time.Second, "a Warning event for the open proxy", func() (bool, string) {
			events := &corev1.EventList{}
			if err := bed.Client.List(ctx, events, client.InNamespace(ns)); err != nil {
				return false, err.Error()
			}
			for _, e := range events.Items {
				if e.InvolvedObject.Name == "open" && e.Type == corev1.EventTypeWarning && e.Reason == string(proxy.ReasonServesWithoutCredentials) {
					return true, ""
				}
			}
			return false, fmt.Sprintf("%d events", len(events.Items))
		})
		if err := bed.Client.Delete(ctx, &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "open"}}); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Delete", func(t *testing.T) {
		if err := bed.Client.Delete(ctx, get(t, key)); err != nil {
			t.Fatal(err)
		}
		testbed.Eventually(t, 15*time.Second, "Proxy gone (finalizer removed)", func() (bool, string) {
			err := bed.Client.Get(ctx, key, &v1alpha1.Proxy{})
			return kerrors.IsNotFound(err), fmt.Sprint(err)
		})
		if n := local.Processes(dir); len(n) != 0 {
			t.Errorf("squid processes left: %v", n)
		}
		var left []string
		for _, g := range []string{"[^.]*", ".ports/*", ".staging/*"} {
			m, _ := filepath.Glob(filepath.Join(dir, g))
			left = append(left, m...)
		}
		if len(left) != 0 {
			t.Errorf("files left: %v", left)
		}
	})

	prov.stop()

	t.Run("NoSecretsInLogsOrEvents", func(t *testing.T) {
		if strings.Contains(logs.String(), password) {
			t.Error("the password appears in the provider's logs")
		}
		events := &corev1.EventList{}
		if err := bed.Client.List(ctx, events, client.InNamespace(ns)); err != nil {
			t.Fatal(err)
		}
		if len(events.Items) == 0 {
			t.Error("want Kubernetes events on transitions, got none")
		}
		for _, e := range events.Items {
			if strings.Contains(e.Message, password) {
				t.Errorf("event %s/%s leaks the password: %q", e.Reason, e.InvolvedObject.Name, e.Message)
			}
		}
	})
}

// namespace is a namespace for one test. Proxies the test leaves in it
// lose their finalizers and go when it ends, after its provider stopped
// (cleanups run last in, first out): left there, they would be reconciled by
// the next test's provider, against that test's backends, and fail that
// test too (a CI run saw a failed kill test's VMs counted by two later
// tests). A test that passed yet never deleted a Proxy fails: it did not
// clean up.
func namespace(t testing.TB) string {
	t.Helper()
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	t.Cleanup(func() {
		ctx := context.Background()
		l := &v1alpha1.ProxyList{}
		if err := bed.Client.List(ctx, l, client.InNamespace(ns)); err != nil {
			t.Errorf("cannot list the Proxies left in %s: %v", ns, err)
			return
		}
		// One the test deleted may still be finishing (its provider
		// stopped with the test); one it never deleted is a test that
		// does not clean up.
		var kept []string
		for _, p := range l.Items {
			if p.DeletionTimestamp == nil {
				kept = append(kept, p.Name)
			}
		}
		if len(kept) > 0 && !t.Failed() {
			t.Errorf("the test left Proxies %v in %s undeleted; delete them with deleteProxies while its provider runs", kept, ns)
		}
		for i := range l.Items {
			p := &l.Items[i]
			before := p.DeepCopy()
			p.Finalizers = nil
			if err := bed.Client.Patch(ctx, p, client.MergeFrom(before)); client.IgnoreNotFound(err) != nil {
				t.Errorf("cannot remove the finalizers of Proxy %s/%s: %v", ns, p.Name, err)
			}
			if err := bed.Client.Delete(ctx, p); client.IgnoreNotFound(err) != nil {
				t.Errorf("cannot delete Proxy %s/%s: %v", ns, p.Name, err)
			}
		}
	})
	return ns
}
