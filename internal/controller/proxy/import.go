package proxy

import (
	"context"
	"fmt"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/event"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// ReasonImportRefused says why the instance a Proxy's external-name names
// is not imported.
const ReasonImportRefused = "ImportRefused"

// wantsImport returns the external-name of an instance the Proxy asks to
// import, or "": an external-name set on a Proxy that has no instance
// recorded, that reads as a providerID of the Proxy's backend (anything
// else, such as a name some tool copied there, is not a request), names
// another instance than the Proxy's own (Create writes the Proxy's own
// there), and was not imported already. An imported instance that is gone
// is not looked for again: the Proxy makes its own.
func wantsImport(p *v1alpha1.Proxy, pc *config) string {
	x := meta.GetExternalName(p)
	ap := p.Status.AtProvider
	if x == "" || ap.ProviderID != "" || x == ap.ImportedFrom || x == p.GetAnnotations()[annotationMadeInstance] {
		return ""
	}
	// An EC2 instance is recorded by its ID alone, which says nothing of
	// its name: one its Proxy's Create did not make is asked for.
	if r, ok := parseRecorded(p, pc, x); !ok || !imported(p, r) && r.ID == "" {
		return ""
	}
	return x
}

// imported reports whether the instance recorded for the Proxy is one it
// imported rather than made: its name is not the one derived from the
// Proxy's UID.
func imported(p *v1alpha1.Proxy, ref backend.Ref) bool {
	return ref.Name != ownership.InstanceName(p.GetUID())
}

// importInstance adopts the instance the Proxy's external-name x names, if
// the provider made it in this cluster for a Proxy of the same namespace
// that is gone, it is where the Proxy's spec (which the ProviderConfig's
// policy has admitted) places it, and it still runs. A refused import
// changes nothing: no instance is made while the Proxy asks for another.
func (e *external) importInstance(ctx context.Context, p *v1alpha1.Proxy, x string) error {
	refuse := func(format string, args ...any) error {
		msg := fmt.Sprintf("cannot import %s (metadata.annotations[crossplane.io/external-name]): ", x) + fmt.Sprintf(format, args...) +
			"; fix or remove the annotation (without it the Proxy makes an instance of its own)"
		p.SetConditions(unavailable(ReasonImportRefused, msg))
		return errors.New(msg)
	}
	ref, _ := parseRecorded(p, e.pc, x)
	inst, err := e.backend.Get(ctx, ref)
	e.countError("get", err)
	switch {
	case backend.IsNotFound(err):
		inst = nil
	case err != nil:
		p.SetConditions(unavailable(ReasonBackendError, fmt.Sprintf("cannot look at %s to import it: %v", x, err)))
		return errors.Wrapf(err, "cannot look at %s to import it", x)
	}
	want := instanceRef(p, e.pc)
	switch {
	case inst == nil || inst.ProviderID != x || inst.Owner.UID == "" || !inst.Owner.OfCluster(e.clusterID):
		return refuse("%s %s has no such instance made by this provider for cluster %q (instances it did not make are never imported)", e.pc.Kind, e.pc.Name, e.clusterID)
	case inst.Owner.Namespace != p.GetNamespace():
		return refuse("it belongs to a Proxy of namespace %q, and only a Proxy of that namespace may import it", inst.Owner.Namespace)
	case inst.Zone != want.Zone || inst.Namespace != want.Namespace:
		return refuse("it is in zone %q, namespace %q, but the Proxy's spec places its instance in zone %q, namespace %q", inst.Zone, inst.Namespace, want.Zone, want.Namespace)
	case inst.Phase == v1alpha1.InstancePhaseTerminated:
		return refuse("it is terminated (%s)", inst.Reason)
	}
	from := inst.Owner.Holder()
	if from != p.GetUID() {
		l := &v1alpha1.ProxyList{}
		if err := e.kube.List(ctx, l, client.InNamespace(p.GetNamespace())); err != nil {
			return errors.Wrap(err, "cannot list the Proxies that may hold the instance")
		}
		for _, o := range l.Items {
			if o.GetUID() == from {
				return refuse("it belongs to Proxy %s/%s, which still exists", o.GetNamespace(), o.GetName())
			}
		}
	}
	a, ok := e.backend.(backend.Adopter)
	if !ok {
		return refuse("the %s backend cannot import instances", e.backendName())
	}
	to := ownership.Owner{
		ClusterID: e.clusterID, Namespace: p.GetNamespace(), Name: p.GetName(), UID: p.GetUID(),
		Fleet: fleetv1alpha1.FleetName(p), Retain: !mayDelete(p),
	}
	err = a.Adopt(ctx, inst.Ref, from, to)
	if errors.Is(err, backend.ErrHeldElsewhere) {
		// Another Proxy imported it first: a refusal, not the backend's
		// failure.
		return refuse("%v", err)
	}
	e.countError("adopt", err)
	if err != nil {
		p.SetConditions(unavailable(ReasonBackendError, fmt.Sprintf("cannot import %s: %v", x, err)))
		return errors.Wrapf(err, "cannot import %s", x)
	}
	p.Status.AtProvider.ProviderID, p.Status.AtProvider.ImportedFrom = inst.ProviderID, x
	e.record.Event(p, event.Normal("Imported", fmt.Sprintf("imported instance %s, made for Proxy %s/%s (uid %s)", x, inst.Owner.Namespace, inst.Owner.Name, from)))
	return nil
}

// errFmtNotHeld refuses to act on an instance recorded for a Proxy that is
// not its holder.
const errFmtNotHeld = "instance %s, recorded in status.atProvider.providerID, belongs to Proxy uid %s of namespace %q, not to this Proxy: nothing is done to it"

// checkHeld refuses to act on an imported instance that is not the
// Proxy's: its record (the status) names the instance, and only the
// instance's labels say whose it is, so an edited status points the
// provider at nothing it may change or delete.
func (e *external) checkHeld(p *v1alpha1.Proxy, inst *backend.Instance) error {
	o := inst.Owner
	if !imported(p, inst.Ref) || o.Holder() == p.GetUID() && o.Namespace == p.GetNamespace() && o.OfCluster(e.clusterID) {
		return nil
	}
	msg := fmt.Sprintf(errFmtNotHeld, inst.ProviderID, o.Holder(), o.Namespace)
	p.SetConditions(unavailable(ReasonImportRefused, msg))
	return errors.New(msg)
}
