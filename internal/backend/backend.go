// Package backend is the boundary between the Proxy reconciler and the
// places proxies run: local Squid processes, Squid pods, GCP VMs, EC2
// instances. The reconciler calls a Backend; each backend package
// implements it.
//
// backend.go holds the Backend interface, what it is asked for and what it
// reports (Ref, Spec, Instance), and the optional interfaces a backend may
// add (repair, adoption, credential rotation, retention); errors.go
// classifies backend errors and says how long a failed create waits.
package backend

import (
	"context"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"k8s.io/apimachinery/pkg/types"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// Ref locates an instance on its backend.
type Ref struct {
	// Name is the deterministic instance name (ownership.InstanceName).
	Name string
	// Namespace of a pod; empty elsewhere.
	Namespace string
	// Zone of a VM; empty elsewhere.
	Zone string
	// NetworkProject is the Shared VPC host project of a VM's network,
	// where its firewall rule lives; empty for the backend's own project.
	NetworkProject string
	// ID is the cloud's own ID of the instance, where the backend records
	// one (EC2: i-...), as the Proxy recorded it; empty elsewhere.
	ID string
	// Rule names the network rule a VM shares with the other VMs of its
	// fleet, as the VM says (GCP: its egress-rule label); empty for a VM
	// with a rule of its own, named after it.
	Rule string
}

// Credentials clients present to the proxy.
type Credentials struct {
	Username string
	Password string
}

// Spec is what the reconciler asks a backend to run.
type Spec struct {
	Ref
	Owner ownership.Owner
	// Port the proxy listens on (the local backend may allocate another).
	Port int32
	// Credentials, when set, are required of every client.
	Credentials *Credentials
	// AllowedSourceRanges restrict the clients. They include
	// ProbeSourceRanges.
	AllowedSourceRanges []string
	// ProbeSourceRanges are those of AllowedSourceRanges that the
	// ProviderConfig added for the provider's own probe
	// (spec.probe.sourceRanges), not the Proxy: named apart so that an
	// error about one says which field to change.
	ProbeSourceRanges []string
	// AllowedPrivateDestinations are private networks the proxy may reach,
	// already checked against the ProviderConfig's policy.
	AllowedPrivateDestinations []string
	// AllowLoopbackDestinations lets a local proxy reach its host's
	// loopback services, as local targets (and tests) need. Only a
	// ClusterProviderConfig's proxies get it: a tenant's must not reach
	// the provider's host.
	AllowLoopbackDestinations bool
	// Exactly one placement is set, matching the backend.
	Local      *v1alpha1.LocalPlacement
	Kubernetes *v1alpha1.KubernetesPlacement
	GCP        *v1alpha1.GCPPlacement
	AWS        *v1alpha1.AWSPlacement
	// UserData is the user's own cloud-init or startup script (GCP), already
	// read from its Secret; it replaces the generated one.
	UserData string
	// Hash covers what forces a replacement: placement, port and the
	// resolved proxy configuration, but not the credentials themselves,
	// only whether there are any. Backends store it on the instance.
	Hash string
	// CredentialsSum says which credentials the instance accepts
	// (squid.CredentialsSum); backends store it on the instance.
	CredentialsSum string
}

// Instance is what a backend observed of one proxy.
type Instance struct {
	Ref
	// ProviderID names the instance on its backend.
	ProviderID string
	// Host and Port clients connect to. Host is empty until the instance
	// has an address.
	Host string
	Port int32
	// Phase is never Running without a Host.
	Phase     v1alpha1.InstancePhase
	CreatedAt time.Time
	// SpecHash is the Spec.Hash the instance was created from.
	SpecHash string
	// CredentialsSum is the Spec.CredentialsSum of the credentials the
	// instance accepts; empty for an instance recorded before sums were.
	CredentialsSum string
	// PreviousCredentialsUntil is when the credentials it accepted before
	// its last rotation stop being accepted; zero when there are none.
	PreviousCredentialsUntil time.Time
	Owner                    ownership.Owner
	// Operation names a creation still running when Create returned, for
	// an OperationChecker to look at later.
	Operation string
	// Repair, when set, says why the instance is not usable yet although
	// it runs: something it depends on is being put right.
	Repair string
	// Reason is what the backend says of a terminated instance: a VM's
	// status, a pod's phase and reason.
	Reason string
	// CrashLoop, when set, says why the instance is crash-looping: its
	// proxy keeps exiting soon after it starts, and is restarted with a
	// back-off. It is held out of service, whatever a probe says in a
	// moment when it is up, until it stays up.
	CrashLoop string
}

// A Backend creates, observes and deletes proxy instances. Every call is
// idempotent. Create may wait, for a bounded time, for the backend to report
// how the creation went; later Gets report progress.
type Backend interface {
	// Create starts an instance for s. Creating an instance that already
	// exists returns it rather than making a second one.
	Create(ctx context.Context, s Spec) (*Instance, error)
	// Get observes an instance; a missing one is an error of class NotFound.
	Get(ctx context.Context, r Ref) (*Instance, error)
	// Delete removes an instance; deleting a missing one succeeds.
	Delete(ctx context.Context, r Ref) error
	// ListOwned lists every instance carrying this cluster's ownership
	// labels, for orphan collection.
	ListOwned(ctx context.Context) ([]Instance, error)
}

// A Repairer puts right, from the spec, what an instance depends on outside
// itself (a GCP VM's firewall rule), and reports whether it is in place. An
// instance whose dependencies are not in place is not handed out.
type Repairer interface {
	Repair(ctx context.Context, s Spec) (bool, error)
}

// A RuleNamer names the network rule an instance of s shares with the
// other instances of its fleet (Ref.Rule), derived from s alone: Delete
// lets go of it even when the instance is gone. Empty: none is shared.
type RuleNamer interface {
	RuleFor(s Spec) string
}

// An OperationChecker reports how a creation that Create left running
// (Instance.Operation) ended: nil while it runs, when it succeeded or when
// the backend no longer knows it, else its error, classified.
type OperationChecker interface {
	CheckOperation(ctx context.Context, r Ref, operation string) error
}

// An Adopter hands an instance, and everything made for it, to the Proxy
// that imports it through its external-name: it relabels them with
// ownership.Owner.AdoptedBy(to), but only while they belong to from (their
// Holder) or already to to, so that of two Proxies importing one instance
// at once only one gets it; the other gets an error of class Transient,
// and finds the instance held when it looks again.
type Adopter interface {
	Adopt(ctx context.Context, r Ref, from types.UID, to ownership.Owner) error
}

// A CredentialRotator changes the credentials a running instance accepts,
// in place and without a restart, so that no proxy is replaced and no
// egress IP changes. RotateCredentials is called at every observation and
// compares with what the instance really holds, so a rotation cut short,
// or a change reverted half-way, is put right when called again:
//   - when the instance does not accept s.Credentials, it does from now on,
//     and the credentials it accepted until now are accepted too until
//     previousUntil (not at all when that is zero): Rotated;
//   - when it does and the previous credentials' deadline is not after
//     now, they are removed: Retired.
//
// Backends that cannot (a VM's startup script runs only at boot) do not
// implement it; an instance made before its credentials could rotate
// answers ErrNoRotation.
type CredentialRotator interface {
	RotateCredentials(ctx context.Context, s Spec, previousUntil, now time.Time) (Rotation, error)
}

// Rotation is what RotateCredentials did, and until when the instance
// accepts its previous credentials (zero when it accepts none).
type Rotation struct {
	Rotated, Retired bool
	PreviousUntil    time.Time
}

// ErrNoRotation says an instance was made before its credentials could
// rotate in place: it must be replaced for new ones.
var ErrNoRotation = errors.New("the instance was made without credentials that rotate in place")

// A Retainer marks an instance to outlive its Proxy, or not
// (ownership.LabelRetain), as the Proxy's management policies come to
// include or leave out Delete after the instance was made.
type Retainer interface {
	SetRetain(ctx context.Context, r Ref, retain bool) error
}

// A Lagging backend's listing may miss an instance for a while after it
// was launched (EC2's eventual consistency): a Proxy deleted that soon
// after a create cut short (its create incomplete) waits out ListingLag
// before it takes "not found" for "never made", so that the instance it
// cannot yet see is not left behind.
type Lagging interface {
	ListingLag() time.Duration
}
