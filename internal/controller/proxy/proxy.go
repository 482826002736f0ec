// Package proxy is the managed reconciler of Proxy resources: it creates each
// proxy on the backend its ProviderConfig chooses, and in Observe probes
// through the proxy to decide whether it is Ready.
//
// proxy.go holds the controller's setup and the external client (Observe,
// Create, Update, Delete); config.go and spec.go resolve a Proxy's
// ProviderConfig and what the backend is asked for, policy.go checks it
// against the config's policy, credentials.go reads and rotates the
// proxy's password, backends.go builds and keeps each config's backend;
// verdict.go folds probe outcomes into the Proxy's health and conditions,
// schedule.go says when each is probed (the probes run in
// internal/probe/pool); gate.go holds create failures back, import.go
// adopts an existing instance, statuswrite.go writes status only on
// change, watch.go requeues Proxies when what they are made from changes.
package proxy

import (
	"context"
	"crypto/x509"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	ctrlevent "sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/source"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	"github.com/crossplane/crossplane-runtime/v2/pkg/statemetrics"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/metrics"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/probe/pool"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/reach"
)

const (
	// A new instance is probed this often until its first verdict, so a
	// fresh proxy turns Ready in seconds rather than after a full interval.
	startupInterval = time.Second
	// startupWindow bounds the fast probing of a new instance.
	startupWindow = time.Minute
	// restartJitter spreads the first probes after a provider restart.
	restartJitter = 10 * time.Second
)

// Errors of the external client, which its tests compare.
const (
	errGetInstance        = "cannot get instance"
	errDeleteRemains      = "cannot delete what remains of the instance"
	errDeleteTerminated   = "cannot delete terminated instance"
	errDeleteReplaced     = "cannot delete the instance being replaced"
	errDeleteInstance     = "cannot delete instance"
	errEndpointRequired   = "spec.forProvider.endpoint is required when mode is External"
	errFmtCreate          = "cannot create instance (%s)"
	errFmtLastCreate      = "the last create failed (%s)"
	errFmtKeptRefused     = "instance %s is no longer permitted; its management policies keep it"
	errFmtDeleteRefused   = "cannot delete instance %s, which its ProviderConfig no longer permits"
	errFmtCutShort        = "a create was cut short %s ago and %s may not list its instance yet: waiting %s before taking it for never made"
	errFmtObserveInstance = "cannot observe the instance: %v"
)

// Connection detail keys written to writeConnectionSecretToRef.
const (
	ConnectionProxyURL = "proxyURL"
	ConnectionHost     = "host"
	ConnectionPort     = "port"
	ConnectionUsername = "username"
	ConnectionPassword = "password"
)

// Options configure the Proxy controller.
type Options struct {
	controller.Options

	// Backends gives the backend a ProviderConfig chooses.
	Backends BackendSource
	// ClusterID is stamped on every instance.
	ClusterID string
	// Prober probes through proxies; nil means a probe.Prober.
	Prober Prober
	// RootCAs verify probe targets behind a private CA; nil means the
	// system pool.
	RootCAs *x509.CertPool
	// TenantPrivateNetworks are the private networks (loopback
	// included) the probe may dial a proxy in whose address its tenant
	// chose (an External endpoint, a namespaced ProviderConfig's
	// backend): the platform's policy. Nil: none, only public addresses.
	TenantPrivateNetworks *reach.Networks
	// Metrics, when set, record probes, instances and backend errors.
	Metrics *metrics.Provider
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// ProbeConcurrency is how many probes run at once, on workers of their
	// own; zero means pool.DefaultConcurrency.
	ProbeConcurrency int
	// RefusedGrace is how long an instance its ProviderConfig no longer
	// permits keeps running, not handed out, before it is deleted: a
	// policy typo fixed within it costs nothing. Zero means
	// DefaultRefusedGrace; negative deletes at once.
	RefusedGrace time.Duration
}

// DefaultRefusedGrace is how long a no-longer-permitted instance is kept.
const DefaultRefusedGrace = 5 * time.Minute

// Prober probes through a proxy: Probe with its credentials, Closed without
// them.
type Prober = pool.Prober

// BackendSource gives the backend a resolved ProviderConfig chooses.
type BackendSource interface {
	For(ctx context.Context, pc *config) (backend.Backend, error)
}

// Setup adds a controller that reconciles Proxies.
func Setup(mgr ctrl.Manager, o Options) error {
	name := managed.ControllerName(v1alpha1.ProxyGroupKind)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Metrics == nil {
		o.Metrics = metrics.NewProvider()
	}
	if o.Prober == nil {
		o.Prober = probe.Prober{}
	}
	if o.RefusedGrace == 0 {
		o.RefusedGrace = DefaultRefusedGrace
	}
	// Each probe outcome requeues its Proxy through this channel, so
	// Observe folds it in at once.
	outcomes := make(chan ctrlevent.GenericEvent)
	sched := &scheduler{started: o.Now(), seen: map[types.UID]time.Time{}, now: o.Now}
	pp := pool.New(pool.Config{
		Prober: o.Prober, Workers: o.ProbeConcurrency, Poll: o.PollInterval, Now: o.Now, Metrics: o.Metrics,
		Requeue: func(ctx context.Context, key types.NamespacedName) {
			select {
			case outcomes <- ctrlevent.GenericEvent{Object: &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}}:
			case <-ctx.Done():
			}
		},
		Forget: sched.forget,
	})
	sched.pool = pp
	if err := mgr.Add(pp); err != nil {
		return errors.Wrap(err, "cannot add the probe pool")
	}
	recorder := event.NewAPIRecorder(mgr.GetEventRecorderFor(name)) //nolint:staticcheck // crossplane-runtime's recorder takes the old events API.
	c := &connector{
		kube: mgr.GetClient(), usage: newUsageTracker(mgr.GetClient()),
		backends: o.Backends, clusterID: o.ClusterID, prober: o.Prober, rootCAs: o.RootCAs,
		tenantPrivate: o.TenantPrivateNetworks,
		metrics:       o.Metrics, now: o.Now, sched: sched, record: recorder, refusedGrace: o.RefusedGrace,
	}

	opts := []managed.ReconcilerOption{
		managed.WithTypedExternalConnector[*v1alpha1.Proxy](c),
		managed.WithLogger(o.Logger.WithValues("controller", name)),
		managed.WithRecorder(recorder),
		managed.WithPollInterval(o.PollInterval),
		// The probe cadence follows each Proxy's healthCheck.interval.
		managed.WithPollIntervalHook(sched.pollAfter),
		managed.WithManagementPolicies(),
		// Instance names derive from the Proxy UID, so a create interrupted
		// before its result was recorded is found again, not duplicated.
		managed.WithDeterministicExternalName(true),
		managed.WithInitializers(),
		// Every backend sees its own instances at once, so a missing
		// instance is missing: no grace period, which would also hold up the
		// deletion of a Proxy created moments before.
		managed.WithCreationGracePeriod(0),
	}
	if o.MetricOptions != nil {
		opts = append(opts, managed.WithMetricRecorder(o.MetricOptions.MRMetrics))
		if o.MetricOptions.MRStateMetrics != nil {
			sm := statemetrics.NewMRStateRecorder(mgr.GetClient(), o.Logger, o.MetricOptions.MRStateMetrics, &v1alpha1.ProxyList{}, o.MetricOptions.PollStateMetricInterval)
			if err := mgr.Add(sm); err != nil {
				return errors.Wrap(err, "cannot register MR state metrics recorder")
			}
		}
	}

	r := managed.NewReconciler(newChangesOnly(mgr, o.Metrics), resource.ManagedKind(v1alpha1.ProxyGroupVersionKind), opts...)
	if err := setupIndexes(context.Background(), mgr); err != nil {
		return errors.Wrap(err, "cannot index Proxies by their Secrets and ProviderConfigs")
	}
	w := watcher{kube: mgr.GetClient()}
	return ctrl.NewControllerManagedBy(mgr).
		Named(name).
		WithOptions(o.ForControllerRuntime()).
		For(&v1alpha1.Proxy{}, builder.WithPredicates(predicate.Or(resource.DesiredStateChanged(), deletionProgressed()))).
		// What a Proxy is made from: a changed Secret or ProviderConfig
		// reaches its Proxies within seconds.
		Watches(&corev1.Secret{}, handler.EnqueueRequestsFromMapFunc(w.forSecret), builder.WithPredicates(secretContentChanged())).
		Watches(&v1alpha1.ProviderConfig{}, handler.EnqueueRequestsFromMapFunc(w.forConfig), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		Watches(&v1alpha1.ClusterProviderConfig{}, handler.EnqueueRequestsFromMapFunc(w.forConfig), builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		WatchesRawSource(source.Channel(outcomes, &handler.EnqueueRequestForObject{})).
		Complete(r)
}

// deletionProgressed lets through every update of a Proxy being deleted.
// The desired-state filter drops them all, and crossplane-runtime then
// notices on a per-object backoff that doubles with every look: first while
// it waits for the garbage collector's finalizer (Crossplane deletes a
// fleet's Proxies in the foreground), then while it confirms the instance is
// gone. That took half a minute; each of these few updates now prompts the
// next step at once.
func deletionProgressed() predicate.Predicate {
	return predicate.Funcs{
		CreateFunc:  func(ctrlevent.CreateEvent) bool { return false },
		DeleteFunc:  func(ctrlevent.DeleteEvent) bool { return false },
		GenericFunc: func(ctrlevent.GenericEvent) bool { return false },
		UpdateFunc: func(e ctrlevent.UpdateEvent) bool {
			return e.ObjectNew.GetDeletionTimestamp() != nil
		},
	}
}

// connector resolves a Proxy's ProviderConfig into a backend.
type connector struct {
	kube      client.Client
	usage     *usageTracker
	backends  BackendSource
	clusterID string
	prober    Prober
	rootCAs   *x509.CertPool
	// tenantPrivate: see Options.TenantPrivateNetworks.
	tenantPrivate *reach.Networks
	metrics       *metrics.Provider
	now           func() time.Time
	sched         *scheduler
	record        event.Recorder
	// refusedGrace: see Options.RefusedGrace.
	refusedGrace time.Duration
}

// Connect returns the external client of one reconcile. An External Proxy
// needs no ProviderConfig: nothing is created for it.
func (c *connector) Connect(ctx context.Context, p *v1alpha1.Proxy) (managed.TypedExternalClient[*v1alpha1.Proxy], error) {
	e := &external{connector: c}
	if p.Spec.ForProvider.Mode == v1alpha1.ProxyModeExternal {
		return e, nil
	}
	if err := c.usage.Track(ctx, p); err != nil {
		return nil, errors.Wrap(err, "cannot track ProviderConfig usage")
	}
	pc, err := resolveConfig(ctx, c.kube, p)
	if err != nil {
		return nil, err
	}
	if err := placementMatches(p, pc); err != nil {
		return nil, err
	}
	b, err := c.backends.For(ctx, pc)
	if err != nil {
		return nil, errors.Wrapf(err, "cannot use the %s backend of %s %s", pc.Spec.Backend, pc.Kind, pc.Name)
	}
	e.pc, e.backend = pc, b
	return e, nil
}

func placementMatches(p *v1alpha1.Proxy, pc *config) error {
	fp := p.Spec.ForProvider
	want := map[v1alpha1.BackendType]bool{
		v1alpha1.BackendLocal:      fp.Local != nil,
		v1alpha1.BackendKubernetes: fp.Kubernetes != nil,
		v1alpha1.BackendGCP:        fp.GCP != nil,
		v1alpha1.BackendAWS:        fp.AWS != nil,
	}
	if !want[pc.Spec.Backend] {
		return errors.Errorf("%s %s uses the %s backend, but the Proxy's placement is for another: set spec.forProvider.%s or reference a matching ProviderConfig",
			pc.Kind, pc.Name, pc.Spec.Backend, placementField(pc.Spec.Backend))
	}
	return nil
}

func placementField(b v1alpha1.BackendType) string {
	switch b {
	case v1alpha1.BackendKubernetes:
		return "kubernetes"
	case v1alpha1.BackendGCP:
		return "gcp"
	case v1alpha1.BackendAWS:
		return "aws"
	default:
		return "local"
	}
}

// external is the client of one reconcile of one Proxy.
type external struct {
	*connector
	pc      *config
	backend backend.Backend
	// probing records that this Observe asked for the instance's probes;
	// one that did not stops them. held records that it held the Proxy's
	// create back; one that did not counts it held no more.
	probing, held bool
	// crashLoop is why the instance observed is crash-looping, which
	// holds it out of service whatever its probes say; empty when not.
	crashLoop string
}

func (e *external) backendName() string {
	if e.pc == nil {
		return "external"
	}
	return string(e.pc.Spec.Backend)
}

func (e *external) countError(op string, err error) {
	if err != nil && !backend.IsNotFound(err) {
		e.metrics.BackendErrors.WithLabelValues(e.backendName(), op, string(backend.ClassOf(err))).Inc()
	}
}

// Observe gets the instance and, when it runs, folds the probes through it
// into its verdict. It reads top to bottom, in the order the checks must
// run: External mode, which never touches a backend; an instance recorded
// where this configuration cannot see it; the Get; a missing instance (let
// go while deleting, else imported or created); an instance that is not
// the Proxy's; a deleted Proxy's; a terminated one; the policy, before any
// Secret is read; the Secrets; the spec and the credentials; the probes;
// the comparison with the spec. Whatever path probes nothing stops the
// instance's probes.
func (e *external) Observe(ctx context.Context, p *v1alpha1.Proxy) (managed.ExternalObservation, error) {
	e.probing, e.held = false, false
	defer func() {
		if !e.probing {
			e.stopProbing(p)
		}
		if !e.held {
			e.metrics.SetHeld(p.GetUID(), "", "")
		}
	}()
	if p.Spec.ForProvider.Mode == v1alpha1.ProxyModeExternal {
		return e.observeExternal(ctx, p)
	}

	ref := recordedRef(p, e.pc)
	if elsewhere := recordedElsewhere(p, e.pc); elsewhere != "" {
		// The instance lives where this configuration cannot see it:
		// creating another would leave it running, unobserved, and
		// letting a deleted Proxy go would leave it running for good.
		p.SetConditions(unavailable(ReasonBackendError, elsewhere))
		return managed.ExternalObservation{}, errors.New(elsewhere)
	}
	inst, err := e.backend.Get(ctx, ref)
	e.countError("get", err)
	if backend.IsNotFound(err) {
		e.metrics.SetPhase(p.GetUID(), "", "")
		if meta.WasDeleted(p) {
			return e.letGo(ctx, p, ref)
		}
		return e.noInstance(ctx, p, ref)
	}
	if err != nil {
		p.SetConditions(unavailable(ReasonBackendError, fmt.Sprintf(errFmtObserveInstance, err)))
		return managed.ExternalObservation{}, errors.Wrap(err, errGetInstance)
	}
	if err := e.checkHeld(p, inst); err != nil {
		if meta.WasDeleted(p) {
			// Not this Proxy's to delete: it is let go, and the
			// instance left to whose it is.
			e.record.Event(p, event.Warning(ReasonImportRefused, err))
			e.sched.forget(p.GetUID())
			return managed.ExternalObservation{ResourceExists: false}, nil
		}
		return managed.ExternalObservation{}, err
	}
	e.metrics.SetPhase(p.GetUID(), e.backendName(), string(inst.Phase))
	if meta.WasDeleted(p) {
		// Tell the truth while deleting: the instance still exists, so the
		// reconciler calls Delete.
		return managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, nil
	}

	e.syncRetain(ctx, p, inst)
	if inst.Phase == v1alpha1.InstancePhaseTerminated {
		return e.replaceTerminated(ctx, p, ref, inst)
	}
	// The policy first: it needs no Secret, so a tenant cannot keep a
	// refused instance alive by making its Secrets unreadable. A refused
	// terminated instance was replaced above all the same.
	if err := admit(p, e.pc); err != nil {
		return managed.ExternalObservation{}, e.refuse(ctx, p, ref, inst, err)
	}
	creds, err := credentials(ctx, e.kube, p)
	if err != nil {
		p.SetConditions(unavailable(ReasonSecretUnavailable, err.Error()))
		return managed.ExternalObservation{}, err
	}
	ud, err := userData(ctx, e.kube, p)
	if err != nil {
		p.SetConditions(unavailable(ReasonSecretUnavailable, err.Error()))
		return managed.ExternalObservation{}, err
	}
	want := desiredSpec(p, e.pc, e.clusterID, creds, ud)
	current, verdict := e.specCurrent(p, inst, want)
	if current {
		e.repair(ctx, p, inst, repairSpec(p, inst, want))
		verdict = e.syncCredentials(ctx, p, inst, want)
	}

	// A probe that passes in a moment when a crash-looping proxy is up
	// changes nothing: handed out, it would fail its crawlers moments
	// later. The verdict says so (setReadiness), so that the probe pool
	// does not take the proxy for steady and wait for the poll.
	wasReason := p.GetCondition(xpv2.TypeReady).Reason
	e.crashLoop = inst.CrashLoop
	// Probing an outdated instance with credentials it does not accept
	// would judge it down while it serves its crawlers: its probes stop,
	// and its last verdict stands until the fleet replaces it.
	e.recordInstance(ctx, p, inst, creds, verdict != credentialsOutdated)
	recordCredentials(p, inst, verdict, e.now())
	if inst.Repair != "" {
		p.SetConditions(unavailable(ReasonProvisioning, inst.Repair))
	}
	if c := p.GetCondition(xpv2.TypeReady); c.Reason == ReasonCrashLoopBackOff && wasReason != ReasonCrashLoopBackOff {
		e.record.Event(p, event.Warning(event.Reason(ReasonCrashLoopBackOff), errors.New(c.Message)))
	}
	return observation(ref, inst, want, creds, current, verdict), nil
}

// stopProbing stops the probes of the Proxy's instance, which is not
// running, or is being deleted or replaced.
func (e *external) stopProbing(p *v1alpha1.Proxy) {
	if e.sched.pool != nil {
		e.sched.pool.Stop(p.GetUID())
	}
}

// observation compares an instance that exists with the spec: whether it
// is up to date, what differs, and how it is reached.
func observation(ref backend.Ref, inst *backend.Instance, want backend.Spec, creds *backend.Credentials, current bool, verdict credentialsVerdict) managed.ExternalObservation {
	obs := managed.ExternalObservation{
		ResourceExists:   true,
		ResourceUpToDate: current && verdict != credentialsReplace,
	}
	switch {
	case !current && verdict == credentialsOutdated:
		obs.ResourceUpToDate = true
	case !current:
		obs.Diff = fmt.Sprintf("instance spec hash %s, desired %s: the instance is replaced", inst.SpecHash, want.Hash)
	case verdict == credentialsReplace:
		obs.Diff = fmt.Sprintf("the credentials of the auth Secret changed, and instance %s cannot change them in place: the instance is replaced", inst.ProviderID)
	}
	if ref.Zone != want.Zone || ref.Namespace != want.Namespace {
		// Recorded elsewhere than the spec (now) wants it, as after a
		// change of the ProviderConfig's default namespace: replaced.
		obs.ResourceUpToDate = false
		obs.Diff = fmt.Sprintf("instance %s is not where the spec places it (zone %q, namespace %q): the instance is replaced", inst.ProviderID, want.Zone, want.Namespace)
	}
	if inst.Phase == v1alpha1.InstancePhaseRunning && inst.Host != "" && verdict == credentialsCurrent {
		obs.ConnectionDetails = connectionDetails(inst.Host, inst.Port, creds)
	}
	return obs
}

// repairSpec is what an instance's dependencies are put right from: the
// desired spec, for the instance as it is named and owned; an imported
// instance keeps its name and its maker's UID, from which its firewall
// rule's name derives.
func repairSpec(p *v1alpha1.Proxy, inst *backend.Instance, want backend.Spec) backend.Spec {
	// The rule it is reached through is the one it was made with.
	want.Rule = inst.Rule
	if imported(p, inst.Ref) {
		want.Ref = inst.Ref
		want.Owner.UID, want.Owner.Adopter = inst.Owner.UID, inst.Owner.Adopter
	}
	return want
}

// withRule names on ref the network rule the Proxy's instance shares with
// its fleet, as the backend derives it from the spec (a GCP fleet's
// firewall rule), so that a delete that finds the instance gone (a create
// cut short after the rule, a VM whose insert failed) still lets go of it.
func (e *external) withRule(p *v1alpha1.Proxy, ref backend.Ref) backend.Ref {
	if rn, ok := e.backend.(backend.RuleNamer); ok && ref.Rule == "" {
		ref.Rule = rn.RuleFor(desiredSpec(p, e.pc, e.clusterID, nil, ""))
	}
	return ref
}

// repair has the backend put right what the instance depends on outside
// itself, such as a GCP VM's firewall rule. Until that is in place the
// instance is not used: it is reported as provisioning, with the reason.
func (e *external) repair(ctx context.Context, p *v1alpha1.Proxy, inst *backend.Instance, want backend.Spec) {
	r, ok := e.backend.(backend.Repairer)
	if !ok || inst.Phase == v1alpha1.InstancePhaseTerminated || !allows(p, xpv2.ManagementActionUpdate) {
		// Observe-only changes nothing, not even a missing firewall rule.
		return
	}
	ready, err := r.Repair(ctx, want)
	e.countError("repair", err)
	switch {
	case err != nil:
		inst.Repair = fmt.Sprintf("instance %s is not used until its firewall rule is in place: %v", inst.ProviderID, err)
	case !ready:
		inst.Repair = fmt.Sprintf("instance %s is not used until its firewall rule, being restored, is in place", inst.ProviderID)
	default:
		return
	}
	if inst.Phase == v1alpha1.InstancePhaseRunning {
		e.record.Event(p, event.Warning("RepairingInstance", errors.New(inst.Repair)))
	}
	inst.Phase, inst.Host = v1alpha1.InstancePhaseProvisioning, ""
}

// letGo lets go of a deleted Proxy whose instance is not found, after
// deleting what was made for the instance; but not while a create cut
// short moments ago may have made an instance the backend does not list
// yet.
func (e *external) letGo(ctx context.Context, p *v1alpha1.Proxy, ref backend.Ref) (managed.ExternalObservation, error) {
	if l, ok := e.backend.(backend.Lagging); ok && meta.ExternalCreateIncomplete(p) {
		// A create-pending time ahead of this clock (an edited annotation)
		// holds nothing up.
		if since := e.now().Sub(meta.GetExternalCreatePending(p)); since >= 0 && since < l.ListingLag() {
			// A create was cut short moments ago: its instance may exist
			// and not be listed yet. Deleting now would leave it behind.
			return managed.ExternalObservation{}, errors.Errorf(errFmtCutShort, since.Round(time.Second), e.backendName(), l.ListingLag())
		}
	}
	// The instance is gone, but what was made for it may not be: a GCP
	// firewall rule of a VM whose insert failed, or whose create was cut
	// short. Delete is idempotent and finds it. What was left of an
	// imported instance, whose labels can no longer say whose it was, is
	// the orphan collector's.
	if mayDelete(p) && !imported(p, ref) {
		if err := e.backend.Delete(ctx, e.withRule(p, ref)); err != nil {
			e.countError("delete", err)
			return managed.ExternalObservation{}, errors.Wrap(err, errDeleteRemains)
		}
	}
	e.sched.forget(p.GetUID())
	return managed.ExternalObservation{ResourceExists: false}, nil
}

// noInstance handles a Proxy that is not deleted and has no instance: one
// is imported or created, unless the policy refuses it or past failures
// hold it off.
func (e *external) noInstance(ctx context.Context, p *v1alpha1.Proxy, ref backend.Ref) (managed.ExternalObservation, error) {
	if imported(p, ref) && p.Status.AtProvider.ProviderID != "" {
		e.record.Event(p, event.Warning("ImportedInstanceGone", errors.Errorf("imported instance %s is gone; the Proxy makes one of its own", p.Status.AtProvider.ProviderID)))
	}
	resetInstanceStatus(p)
	if err := admit(p, e.pc); err != nil {
		// Refused before anything is made for it.
		p.SetConditions(unavailable(ReasonNotPermitted, err.Error()))
		return managed.ExternalObservation{}, err
	}
	if x := wantsImport(p, e.pc); x != "" {
		// Imported, the instance is observed as the Proxy's own.
		if err := e.importInstance(ctx, p, x); err != nil {
			return managed.ExternalObservation{}, err
		}
		return e.Observe(ctx, p)
	}
	g := readGate(p)
	if (g.Class == backend.ClassPermanent || g.Class == backend.ClassAccessDenied) && g.Inputs != "" && g.Inputs != e.inputs(ctx, p) {
		// The ProviderConfig, its credentials or the Proxy's Secrets
		// changed since the failure, which retrying alone would never
		// fix: try again now. Time-based holds (quota, stockout, rate
		// limits) keep their back-off.
		g.Failures = 0
	}
	if c, blocked := g.blocked(p, e.now()); blocked {
		e.held = true
		e.metrics.SetHeld(p.GetUID(), e.backendName(), string(g.Class))
		p.SetConditions(c)
		return managed.ExternalObservation{}, errors.New(c.Message)
	}
	p.SetConditions(unavailable(ReasonProvisioning, "no instance yet: creating one"))
	return managed.ExternalObservation{ResourceExists: false}, nil
}

// inputs versions what a create depends on besides the Proxy's spec: its
// ProviderConfig (generation), that config's credentials Secret and the
// Proxy's auth and cloud-init Secrets (resourceVersions; "-" for one that
// cannot be read).
func (e *external) inputs(ctx context.Context, p *v1alpha1.Proxy) string {
	parts := []string{string(e.pc.UID), e.pc.Version}
	for _, key := range usedSecrets(p, e.pc) {
		s := &corev1.Secret{}
		rv := "-"
		if err := e.kube.Get(ctx, key, s); err == nil {
			rv = s.ResourceVersion
		}
		parts = append(parts, rv)
	}
	return strings.Join(parts, "/")
}

// syncRetain marks the instance to outlive its Proxy for as long as the
// Proxy's management policies leave out Delete, and unmarks it when they
// include it again: crossplane-runtime lets go of such a Proxy without a
// word to the provider, and the mark keeps the orphan collector off it.
func (e *external) syncRetain(ctx context.Context, p *v1alpha1.Proxy, inst *backend.Instance) {
	want := !mayDelete(p)
	r, ok := e.backend.(backend.Retainer)
	if !ok || inst.Owner.Retain == want {
		return
	}
	err := r.SetRetain(ctx, inst.Ref, want)
	e.countError("retain", err)
	if err != nil {
		e.record.Event(p, event.Warning("CannotMarkInstance", errors.Wrapf(err, "cannot mark instance %s to outlive the Proxy (retain=%v)", inst.ProviderID, want)))
	}
}

// replaceTerminated replaces a stopped instance by a fresh one, unless the
// Proxy's management policies keep it.
func (e *external) replaceTerminated(ctx context.Context, p *v1alpha1.Proxy, ref backend.Ref, inst *backend.Instance) (managed.ExternalObservation, error) {
	if !mayDelete(p) {
		// Management policies without Delete keep even a stopped
		// instance: it is reported, never replaced.
		p.Status.AtProvider.ProviderID, p.Status.AtProvider.Phase, p.Status.AtProvider.Healthy = inst.ProviderID, inst.Phase, false
		p.SetConditions(unavailable(ReasonTerminated, fmt.Sprintf("instance %s terminated; its management policies do not let the provider delete and replace it", inst.ProviderID)))
		return managed.ExternalObservation{ResourceExists: true, ResourceUpToDate: true}, nil
	}
	id := inst.ProviderID + "@" + inst.CreatedAt.UTC().Format(time.RFC3339)
	if p.GetAnnotations()[annotationCountedTermination] != id {
		e.record.Event(p, event.Warning("InstanceTerminated", errors.Errorf("instance %s terminated (%s); replacing it", inst.ProviderID, inst.Reason)))
	}
	meta.AddAnnotations(p, map[string]string{annotationTerminatedInstance: id})
	if err := e.backend.Delete(ctx, e.withRule(p, ref)); err != nil {
		e.countError("delete", err)
		return managed.ExternalObservation{}, errors.Wrap(err, errDeleteTerminated)
	}
	resetInstanceStatus(p)
	p.SetConditions(unavailable(ReasonTerminated, fmt.Sprintf("instance %s terminated (%s); creating a new one", inst.ProviderID, inst.Reason)))
	return managed.ExternalObservation{ResourceExists: false}, nil
}

// refuse handles an instance its ProviderConfig no longer permits (the
// platform tightened its policy): it is not handed out at once, and it is
// deleted once the refusal has stood for the grace period, if the Proxy's
// management policies let the provider delete. None replaces it until the
// Proxy or the policy is fixed.
func (e *external) refuse(ctx context.Context, p *v1alpha1.Proxy, ref backend.Ref, inst *backend.Instance, reason error) error {
	was := p.GetCondition(xpv2.TypeReady)
	since := e.now()
	if was.Reason == ReasonNotPermitted && was.Status == corev1.ConditionFalse {
		since = was.LastTransitionTime.Time
	}
	c := unavailable(ReasonNotPermitted, reason.Error())
	c.LastTransitionTime = metav1.Time{Time: since}
	p.SetConditions(c)
	switch {
	case !mayDelete(p):
		return errors.Wrapf(reason, errFmtKeptRefused, inst.ProviderID)
	case e.now().Sub(since) < e.refusedGrace:
		if was.Reason != ReasonNotPermitted {
			e.record.Event(p, event.Warning(event.Reason(ReasonNotPermitted), errors.Errorf("instance %s is no longer permitted and is deleted in %s unless this is fixed: %v", inst.ProviderID, e.refusedGrace, reason)))
		}
		return reason
	}
	e.record.Event(p, event.Warning(event.Reason(ReasonNotPermitted), errors.Errorf("deleting instance %s: %v", inst.ProviderID, reason)))
	err := e.backend.Delete(ctx, e.withRule(p, ref))
	e.countError("delete", err)
	if err != nil {
		return errors.Wrapf(err, errFmtDeleteRefused, inst.ProviderID)
	}
	resetInstanceStatus(p)
	p.SetConditions(c)
	return reason
}

// mayDelete reports whether the Proxy's management policies let the
// provider delete what it made.
func mayDelete(p *v1alpha1.Proxy) bool { return allows(p, xpv2.ManagementActionDelete) }

// allows reports whether the Proxy's management policies include action.
func allows(p *v1alpha1.Proxy, action xpv2.ManagementAction) bool {
	if len(p.GetManagementPolicies()) == 0 {
		return true
	}
	for _, mp := range p.GetManagementPolicies() {
		if mp == xpv2.ManagementActionAll || mp == action {
			return true
		}
	}
	return false
}

// resetInstanceStatus forgets everything observed of a previous instance:
// a new instance never inherits its predecessor's verdict or address.
func resetInstanceStatus(p *v1alpha1.Proxy) {
	// What was imported stays known: it is not imported again.
	p.Status.AtProvider = v1alpha1.ProxyObservation{ImportedFrom: p.Status.AtProvider.ImportedFrom}
	// A new instance inherits no closure verdict either: it must refuse a
	// request without credentials itself before it is Ready.
	forgetClosure(p, "NewInstance", "a new instance has not been checked yet")
}

// forgetClosure resets a closure verdict the Proxy has to Unknown.
func forgetClosure(p *v1alpha1.Proxy, reason xpv2.ConditionReason, msg string) {
	if p.GetCondition(TypeOpenProxy).Status != corev1.ConditionUnknown {
		p.SetConditions(xpv2.Condition{Type: TypeOpenProxy, Status: corev1.ConditionUnknown, Reason: reason, Message: msg, LastTransitionTime: metav1.Now()})
	}
}

// recordInstance records the instance and probes it when due.
// With probe false, the instance is not probed and its verdict stands.
func (e *external) recordInstance(ctx context.Context, p *v1alpha1.Proxy, inst *backend.Instance, creds *backend.Credentials, probe bool) {
	ap := &p.Status.AtProvider
	if ap.InstanceCreatedAt == nil || !ap.InstanceCreatedAt.Time.Equal(inst.CreatedAt.Truncate(time.Second)) || ap.ProviderID != inst.ProviderID {
		// A new instance: probed at once, and judged afresh.
		resetInstanceStatus(p)
		e.sched.forget(p.GetUID())
		ap.InstanceCreatedAt = &metav1.Time{Time: inst.CreatedAt.Truncate(time.Second)}
	}
	ap.ProviderID = inst.ProviderID
	ap.Host = inst.Host
	ap.Port = inst.Port
	ap.Phase = inst.Phase

	if inst.Phase != v1alpha1.InstancePhaseRunning || inst.Host == "" {
		ap.Healthy = false
		p.SetConditions(unavailable(ReasonProvisioning, fmt.Sprintf("instance %s is provisioning", inst.ProviderID)))
		return
	}
	if !probe {
		return
	}
	e.probe(ctx, p, net.JoinHostPort(inst.Host, strconv.Itoa(int(inst.Port))), instanceID(p), creds)
}

// instanceID identifies the instance a Proxy's status describes, and where
// it listens.
func instanceID(p *v1alpha1.Proxy) string {
	ap := p.Status.AtProvider
	id := fmt.Sprintf("%s@%s:%d", ap.ProviderID, ap.Host, ap.Port)
	if ap.InstanceCreatedAt != nil {
		id += "@" + ap.InstanceCreatedAt.UTC().Format(time.RFC3339)
	}
	return id
}

// observeExternal probes a proxy somebody else runs. Nothing exists to
// delete, so a deleted External Proxy is simply let go.
func (e *external) observeExternal(ctx context.Context, p *v1alpha1.Proxy) (managed.ExternalObservation, error) {
	if meta.WasDeleted(p) {
		e.sched.forget(p.GetUID())
		return managed.ExternalObservation{ResourceExists: false}, nil
	}
	creds, err := credentials(ctx, e.kube, p)
	if err != nil {
		return managed.ExternalObservation{}, err
	}
	ep := p.Spec.ForProvider.Endpoint
	if ep == nil {
		return managed.ExternalObservation{}, errors.New(errEndpointRequired)
	}
	ap := &p.Status.AtProvider
	id := "external/" + net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port)))
	if ap.ProviderID != "" && ap.ProviderID != id {
		// Another endpoint inherits nothing of the old one's verdict:
		// not its health, nor its refusal of requests without
		// credentials.
		resetInstanceStatus(p)
		e.sched.forget(p.GetUID())
	}
	ap.ProviderID = id
	ap.Host, ap.Port, ap.Phase = ep.Host, ep.Port, v1alpha1.InstancePhaseRunning
	if ap.InstanceCreatedAt == nil {
		ap.InstanceCreatedAt = &metav1.Time{Time: p.GetCreationTimestamp().Time}
	}
	e.probe(ctx, p, net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port))), instanceID(p), creds)
	return managed.ExternalObservation{
		ResourceExists: true, ResourceUpToDate: true,
		ConnectionDetails: connectionDetails(ep.Host, ep.Port, creds),
	}, nil
}

// Create starts an instance. Failures are recorded so that Observe holds
// off the next attempt according to their class.
func (e *external) Create(ctx context.Context, p *v1alpha1.Proxy) (managed.ExternalCreation, error) {
	// What the create is tried with, taken before it is tried: a fix made
	// while it runs is a change the next Observe sees.
	in := e.inputs(ctx, p)
	creds, err := credentials(ctx, e.kube, p)
	if err != nil {
		return managed.ExternalCreation{}, err
	}
	ud, err := userData(ctx, e.kube, p)
	if err != nil {
		return managed.ExternalCreation{}, err
	}
	if err := admit(p, e.pc); err != nil {
		return managed.ExternalCreation{}, err
	}
	// Replacing an instance that terminated: not at once if its
	// predecessors keep terminating.
	if p.GetCondition(xpv2.TypeReady).Reason == ReasonTerminated {
		if n, d := replaceTerminated(p, e.now()); d > 0 {
			msg := holdTerminated(p, n, d, e.now())
			p.SetConditions(unavailable(ReasonTerminated, msg))
			return managed.ExternalCreation{}, errors.New(msg)
		}
	}
	// An earlier Create left its creation running, and the instance is
	// gone now: that creation failed. Report how, and hold off as its
	// class says, rather than create again blindly.
	if op := p.GetAnnotations()[annotationCreateOperation]; op != "" {
		meta.RemoveAnnotations(p, annotationCreateOperation)
		if oc, ok := e.backend.(backend.OperationChecker); ok {
			if err := oc.CheckOperation(ctx, instanceRef(p, e.pc), op); err != nil {
				e.countError("create", err)
				recordCreateFailure(p, err, e.now())
				meta.AddAnnotations(p, map[string]string{annotationCreateInputs: in})
				return managed.ExternalCreation{}, errors.Wrapf(err, errFmtLastCreate, backend.ClassOf(err))
			}
		}
	}
	inst, err := e.backend.Create(ctx, desiredSpec(p, e.pc, e.clusterID, creds, ud))
	e.countError("create", err)
	if err != nil {
		recordCreateFailure(p, err, e.now())
		meta.AddAnnotations(p, map[string]string{annotationCreateInputs: in})
		return managed.ExternalCreation{}, errors.Wrapf(err, errFmtCreate, backend.ClassOf(err))
	}
	clearCreateFailures(p)
	// Where the instance is, for Observe, Update and Delete to find it.
	p.Status.AtProvider.ProviderID = inst.ProviderID
	if inst.Operation != "" {
		meta.AddAnnotations(p, map[string]string{annotationCreateOperation: inst.Operation})
	}
	meta.SetExternalName(p, inst.ProviderID)
	meta.AddAnnotations(p, map[string]string{annotationMadeInstance: inst.ProviderID})
	return managed.ExternalCreation{}, nil
}

// Update replaces the instance: what changed (placement, port, proxy
// configuration) cannot be changed in place on every backend.
func (e *external) Update(ctx context.Context, p *v1alpha1.Proxy) (managed.ExternalUpdate, error) {
	if p.Spec.ForProvider.Mode == v1alpha1.ProxyModeExternal {
		return managed.ExternalUpdate{}, nil
	}
	if !mayDelete(p) {
		// Replacing means deleting, which the management policies leave
		// out: the instance stays as it is, and says so.
		e.record.Event(p, event.Warning(event.Reason(ReasonOutOfDate), errors.New("the spec changed, but the management policies do not let the provider delete the instance to replace it: it keeps serving as it was made; add Delete to spec.managementPolicies to replace it")))
		return managed.ExternalUpdate{}, nil
	}
	e.record.Event(p, event.Normal("Replacing", "spec changed: replacing the instance"))
	e.stopProbing(p)
	err := e.backend.Delete(ctx, e.withRule(p, recordedRef(p, e.pc)))
	e.countError("delete", err)
	if err != nil {
		return managed.ExternalUpdate{}, errors.Wrap(err, errDeleteReplaced)
	}
	_, err = e.Create(ctx, p)
	return managed.ExternalUpdate{}, err
}

// Delete removes the instance. Failures are returned every time, never
// latched: a delete keeps being retried, visibly.
func (e *external) Delete(ctx context.Context, p *v1alpha1.Proxy) (managed.ExternalDelete, error) {
	if p.Spec.ForProvider.Mode == v1alpha1.ProxyModeExternal {
		return managed.ExternalDelete{}, nil
	}
	e.stopProbing(p)
	err := e.backend.Delete(ctx, e.withRule(p, recordedRef(p, e.pc)))
	e.countError("delete", err)
	if err != nil {
		return managed.ExternalDelete{}, errors.Wrap(err, errDeleteInstance)
	}
	e.metrics.SetPhase(p.GetUID(), "", "")
	return managed.ExternalDelete{}, nil
}

// Disconnect does nothing: backends are shared between reconciles.
func (e *external) Disconnect(context.Context) error { return nil }

func connectionDetails(host string, port int32, creds *backend.Credentials) managed.ConnectionDetails {
	u := &url.URL{Scheme: "http", Host: net.JoinHostPort(host, strconv.Itoa(int(port)))}
	cd := managed.ConnectionDetails{
		ConnectionHost: []byte(host),
		ConnectionPort: []byte(strconv.Itoa(int(port))),
	}
	if creds != nil {
		u.User = url.UserPassword(creds.Username, creds.Password)
		cd[ConnectionUsername] = []byte(creds.Username)
		cd[ConnectionPassword] = []byte(creds.Password)
	}
	cd[ConnectionProxyURL] = []byte(u.String())
	return cd
}
