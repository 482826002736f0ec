// Package function is function-proxyfleet: it composes a ProxyFleet into
// Proxy managed resources, spread over zones, rotated by age, replaced when
// unhealthy, and reports the fleet's health on the XR.
//
// fn.go holds RunFunction and the order of its steps; fleet.go reads and
// checks the spec; members.go reads the observed Proxies; summaries.go the
// LeaseSummaries of egress-discovery; plan.go decides which Proxies there
// are (rotation, repairs, surge), rollout.go paces a change; recycle.go and
// egressip.go judge and replace egress addresses; autoscale.go sizes a
// fleet by its demand; compose.go writes the desired Proxies; access.go the
// Role that lets egress-discovery serve the fleet; status.go the XR's
// status, conditions and results; pool.go, pooled.go and poolrecycle.go a
// fleet composed through ProxyPools; metrics.go and pb.go are helpers.
package function

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/request"
	"github.com/crossplane/function-sdk-go/response"
	"k8s.io/apimachinery/pkg/types"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
)

// Labels Crossplane puts on a LegacyCluster XR that a claim created.
const (
	labelClaimName      = "crossplane.io/claim-name"
	labelClaimNamespace = "crossplane.io/claim-namespace"
)

// Function composes ProxyFleets.
type Function struct {
	fnv1.UnimplementedFunctionRunnerServiceServer

	log logging.Logger
	now func() time.Time
	// discovery is egress-discovery's ServiceAccount, which each fleet
	// grants access to its Leases and auth Secret; nil grants none.
	discovery *types.NamespacedName
	// asn says which autonomous system an egress IP belongs to, for
	// spec.diversity.maxPerASN; nil counts none.
	asn egressip.ASNLookup
}

// Config is what New builds a Function from.
type Config struct {
	Log logging.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// Discovery is egress-discovery's ServiceAccount, which each fleet
	// grants access to its Leases and auth Secret; nil means
	// DefaultDiscoveryServiceAccount, and one with no name grants none
	// (installations without egress-discovery).
	Discovery *types.NamespacedName
	// ASN is the IP-to-ASN database spec.diversity.maxPerASN is counted
	// with; nil counts no ASN.
	ASN egressip.ASNLookup
}

// New returns the function, cfg's zero settings taking their defaults.
func New(cfg Config) *Function {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = logging.NewNopLogger()
	}
	switch {
	case cfg.Discovery == nil:
		sa := DefaultDiscoveryServiceAccount
		cfg.Discovery = &sa
	case cfg.Discovery.Name == "":
		cfg.Discovery = nil
	}
	return &Function{log: cfg.Log, now: cfg.Now, discovery: cfg.Discovery, asn: cfg.ASN}
}

// RunFunction composes one ProxyFleet. Bad input gets a Fatal result that
// names the field; it never panics.
func (f *Function) RunFunction(_ context.Context, req *fnv1.RunFunctionRequest) (*fnv1.RunFunctionResponse, error) {
	began := time.Now()
	rsp, err := f.run(req)
	observeRun(req, rsp, time.Since(began))
	return rsp, err
}

// run composes one request; RunFunction measures it.
func (f *Function) run(req *fnv1.RunFunctionRequest) (rsp *fnv1.RunFunctionResponse, err error) {
	rsp = response.To(req, response.DefaultTTL)
	defer func() {
		// A bug must not take the function server down with it.
		if r := recover(); r != nil {
			response.Fatal(rsp, errors.Errorf("function-proxyfleet failed unexpectedly: %v", r))
			err = nil
		}
	}()
	now := f.now().UTC().Truncate(time.Second)

	oxr, err := request.GetObservedCompositeResource(req)
	if err != nil {
		response.Fatal(rsp, errors.Wrap(err, "cannot get the observed composite resource"))
		return rsp, nil
	}
	xr := oxr.Resource
	if xr.GetKind() == fleetv1alpha1.ProxyPoolKind {
		f.runPool(rsp, req, xr.GetName(), xr.GetNamespace(), xr.Object, now)
		return rsp, nil
	}
	fleetName, namespace := xr.GetName(), xr.GetNamespace()
	if namespace == "" {
		// A LegacyCluster XProxyFleet is cluster scoped; its Proxies live in
		// the namespace of the claim that made it.
		namespace = xr.GetLabels()[labelClaimNamespace]
		if namespace == "" {
			response.Fatal(rsp, errors.Errorf("metadata.labels[%s] is missing: create a %s through a ProxyFleetClaim, whose namespace its Proxies live in", labelClaimNamespace, xr.GetKind()))
			return rsp, nil
		}
		if c := xr.GetLabels()[labelClaimName]; c != "" {
			fleetName = c
		}
	}
	spec, _ := xr.Object["spec"].(map[string]any)
	fleet, err := parseFleet(fleetName, namespace, spec)
	if err == nil && fleet.autoscale != nil && xr.GetNamespace() == "" {
		// egress-discovery publishes the demand of namespaced
		// ProxyFleets only: a legacy fleet would never wake from zero.
		err = fieldError("spec.autoscaling", "is for namespaced ProxyFleets (crawl.example.com/v1alpha1, kind ProxyFleet); a %s made through a ProxyFleetClaim is sized by spec.replicas: remove spec.autoscaling", xr.GetKind())
	}
	if err == nil && fleet.spec.Pools != nil && xr.GetNamespace() == "" {
		err = fieldError("spec.pools", "is for namespaced ProxyFleets (crawl.example.com/v1alpha1, kind ProxyFleet); a %s made through a ProxyFleetClaim has one level of Proxies: remove spec.pools", xr.GetKind())
	}
	if err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	if fleet.spec.Pools != nil {
		f.runPooledFleet(rsp, req, fleet, now)
		return rsp, nil
	}

	view := requireLeases(rsp, req, fleet, now)
	members := observedMembers(req.GetObserved().GetResources(), view.leased, fleet.Revision)
	for _, m := range members {
		m.DrainSeen = view.drainSeen(m.Name, m.DrainSince)
	}
	egress := assessEgress(fleet, members, f.asn)
	recycled := pickRecycles(fleet, members, view.burned, field(req.GetObserved().GetComposite().GetResource(), "status").GetStructValue(), now)
	sc := autoscale(req, fleet, countsOf(members, now), view, now)
	p := decide(fleet, members, view.known, now)
	p.leasesChange = view.next
	recycled.settle(p, now)
	if err := composeProxies(rsp, fleet, members, p, now); err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	if err := f.grantAccess(rsp, fleet); err != nil {
		response.Fatal(rsp, err)
		return rsp, nil
	}
	finish(rsp, req, fleet, members, p, sc, now)
	compositeStatus(rsp.Desired).Fields["egress"] = egressStatus(egress)
	setRecycles(rsp, recycled)
	reportDiversity(rsp, fleet, len(egress.Excess), egress.Excess)
	return rsp, nil
}
