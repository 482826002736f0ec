// Package kubernetes runs each proxy as a Squid pod. Pods share their node's
// egress IP, so spread them over nodes with distinct NAT addresses; the
// observed egress IP makes any sharing visible.
//
// kubernetes.go holds the backend: the pod and its config Secret (create,
// observe, delete, list, adopt, credential rotation, retention) and the
// classification of API errors; networkpolicy.go holds the NetworkPolicy
// that confines each proxy pod's traffic in and out.
package kubernetes

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/squid"
)

// DefaultImage is the pinned Squid image: the project's own, assembled by
// cluster/images from Debian's squid package and the libraries it loads
// (the same Squid the config generator is tested against), running as
// Debian's proxy user. make cluster serves it; publish it with the other
// images.
const DefaultImage = "gitea.home.hrajfrisbee.cz/kacerr/egress-squid:v0.1.0"

// AnnotationSpecHash records the Spec.Hash a pod was made from.
const AnnotationSpecHash = "egress.crawl.example.com/spec-hash"

// AnnotationCredentials records, on a pod and its config Secret, which
// credentials it accepts (Spec.CredentialsSum), and
// AnnotationPreviousCredentialsUntil until when it accepts those of before
// its last rotation (RFC 3339). Changing them on the pod has the kubelet
// sync it, and so refresh its mounted config Secret, at once rather than
// within its sync period.
const (
	AnnotationCredentials              = "egress.crawl.example.com/credentials"
	AnnotationPreviousCredentialsUntil = "egress.crawl.example.com/previous-credentials-until"
)

const (
	configDir = "/etc/egress-proxy"
	// squidUID and squidGID are the proxy user and group in Debian and
	// Ubuntu images. The pod runs as them, not as root: a real kubelet
	// refuses runAsNonRoot for an image whose user is root unless the UID
	// is explicit. The htpasswd file must be readable by the auth helper,
	// which runs as that group.
	squidUID = 13
	squidGID = 13
)

// writable are the folders Squid writes in a pod with a read-only root
// filesystem: its IPC sockets and pid, core dumps, and the spool and log
// folders it checks at start. Each gets an emptyDir.
// ownAddressesFile is where the pod writes its own IPs when it starts,
// for Squid to deny as destinations: on clusters that give pods public
// (say, IPv6 global) addresses, a crawler could otherwise reach the pod's
// own listeners through them.
const ownAddressesFile = "/tmp/egress-proxy-self"

// startCommand writes the pod's and its node's addresses, which the
// downward API hands it in POD_IPS and HOST_IPS, to ownAddressesFile and then becomes Squid. The
// broadcast address keeps the file from being empty.
func startCommand() []string {
	return []string{"/bin/sh", "-ec", `{ echo 255.255.255.255; echo "${POD_IPS:-},${HOST_IPS:-}" | tr ',' '\n'; } | grep -E '^[0-9a-fA-F:.]+$' > ` +
		ownAddressesFile + `; exec squid -N -f ` + configDir + `/squid.conf`}
}

var writable = map[string]string{"tmp": "/tmp", "run": "/run/squid", "varrun": "/var/run/squid", "spool": "/var/spool/squid", "cache": "/var/cache/squid", "logs": "/var/log/squid"}

// Config configures a kubernetes backend.
type Config struct {
	// Client reaches the cluster pods run in.
	Client client.Client
	// ClusterID is stamped on every pod.
	ClusterID string
	// Image overrides DefaultImage.
	Image string
}

// Backend manages Squid pods.
type Backend struct {
	cfg Config
}

var _ backend.Backend = &Backend{}

// New returns a kubernetes backend.
func New(cfg Config) *Backend {
	if cfg.Image == "" {
		cfg.Image = DefaultImage
	}
	return &Backend{cfg: cfg}
}

// Classify sorts a Kubernetes API error into the backend taxonomy. RBAC
// denial and quota exhaustion both arrive as 403; only the message tells
// them apart.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var status kerrors.APIStatus
	code := int32(0)
	if errors.As(err, &status) {
		code = status.Status().Code
	}
	switch {
	case kerrors.IsNotFound(err):
		return backend.Wrap(backend.ClassNotFound, err)
	case code == http.StatusForbidden && strings.Contains(strings.ToLower(err.Error()), "quota"):
		return backend.Wrap(backend.ClassQuota, err)
	case code == http.StatusTooManyRequests:
		return backend.Wrap(backend.ClassQuota, err)
	case code == http.StatusForbidden, kerrors.IsInvalid(err), kerrors.IsBadRequest(err):
		return backend.Wrap(backend.ClassPermanent, err)
	default:
		return backend.Wrap(backend.ClassTransient, err)
	}
}

func (b *Backend) labels(s backend.Spec) map[string]string {
	l := s.Owner.Labels()
	l["app.kubernetes.io/name"] = "egress-proxy"
	return l
}

// Create makes the Secret holding the generated config, then the pod.
func (b *Backend) Create(ctx context.Context, s backend.Spec) (*backend.Instance, error) {
	if s.Kubernetes == nil {
		return nil, backend.Errorf(backend.ClassPermanent, "the kubernetes backend needs spec.forProvider.kubernetes")
	}
	if s.Namespace == "" {
		return nil, backend.Errorf(backend.ClassPermanent, "no namespace for the pod: set spec.forProvider.kubernetes.namespace")
	}
	cfg := squid.Config{
		Port: s.Port, AllowedSourceRanges: s.AllowedSourceRanges, AllowedPrivateDestinations: s.AllowedPrivateDestinations,
		OwnAddressesFile: ownAddressesFile,
	}
	data := map[string][]byte{}
	var annotations map[string]string
	if s.Credentials != nil {
		// Credentials rotate in place: the helper script accepts the
		// previous file's too, until its deadline.
		cfg.HtpasswdPath = configDir + "/" + keyHtpasswd
		cfg.PreviousHtpasswdPath = configDir + "/" + keyPrevious
		cfg.AuthScriptPath = configDir + "/" + keyAuth
		h, err := squid.HtpasswdWithSalt(s.Credentials.Username, s.Credentials.Password, saltFor(s.Owner.UID))
		if err != nil {
			return nil, backend.Wrap(backend.ClassPermanent, err)
		}
		data[keyHtpasswd] = h
		data[keyAuth] = []byte(squid.AuthScript)
		annotations = map[string]string{AnnotationCredentials: s.CredentialsSum}
	}
	conf, err := squid.Render(cfg)
	if err != nil {
		return nil, backend.Wrap(backend.ClassPermanent, err)
	}
	data["squid.conf"] = conf

	sec := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: b.labels(s), Annotations: annotations},
		Type:       corev1.SecretTypeOpaque,
		Data:       data,
	}
	if err := b.cfg.Client.Create(ctx, sec); kerrors.IsAlreadyExists(err) {
		existing := &corev1.Secret{}
		if err := b.cfg.Client.Get(ctx, client.ObjectKeyFromObject(sec), existing); err != nil {
			return nil, Classify(errors.Wrap(err, "cannot get proxy config secret"))
		}
		if l := existing.GetLabels(); l[ownership.LabelManagedBy] != ownership.ManagedBy || l[ownership.LabelUID] != sec.Labels[ownership.LabelUID] {
			// Somebody else's Secret of that name: never overwritten.
			return nil, backend.Errorf(backend.ClassPermanent, "Secret %s/%s exists and is not this Proxy's config: delete or rename it", sec.Namespace, sec.Name)
		}
		existing.Data = data
		existing.Annotations = annotations
		if err := b.cfg.Client.Update(ctx, existing); err != nil {
			return nil, Classify(errors.Wrap(err, "cannot update proxy config secret"))
		}
	} else if err != nil {
		return nil, Classify(errors.Wrap(err, "cannot create proxy config secret"))
	}

	// The network policy goes first, so that a pod is never unconfined.
	if err := b.cfg.Client.Create(ctx, b.networkPolicy(s)); err != nil && !kerrors.IsAlreadyExists(err) {
		return nil, Classify(errors.Wrap(err, "cannot create proxy network policy"))
	}
	pod := b.pod(s)
	if err := b.cfg.Client.Create(ctx, pod); err != nil && !kerrors.IsAlreadyExists(err) {
		return nil, Classify(errors.Wrap(err, "cannot create proxy pod"))
	}
	return b.Get(ctx, s.Ref)
}

// Keys of a pod's config Secret.
const (
	keyHtpasswd = "htpasswd"
	keyPrevious = "htpasswd.previous"
	keyAuth     = "auth.sh"
)

func podAnnotations(s backend.Spec) map[string]string {
	a := map[string]string{AnnotationSpecHash: s.Hash}
	if s.Credentials != nil {
		a[AnnotationCredentials] = s.CredentialsSum
	}
	return a
}

func (b *Backend) pod(s backend.Spec) *corev1.Pod {
	image := b.cfg.Image
	if s.Kubernetes.Image != "" {
		image = s.Kubernetes.Image
	}
	mounts := []corev1.VolumeMount{{Name: "config", MountPath: configDir, ReadOnly: true}}
	volumes := []corev1.Volume{{
		Name: "config",
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: s.Name, DefaultMode: ptr.To(int32(0o440)),
		}},
	}}
	names := make([]string, 0, len(writable))
	for name := range writable {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		mounts = append(mounts, corev1.VolumeMount{Name: name, MountPath: writable[name]})
		volumes = append(volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: s.Name, Namespace: s.Namespace, Labels: b.labels(s),
			Annotations: podAnnotations(s),
		},
		Spec: corev1.PodSpec{
			// The backend recreates a pod that ended, so that the
			// replacement is visible as a new instance with a new verdict.
			RestartPolicy:                corev1.RestartPolicyNever,
			AutomountServiceAccountToken: ptr.To(false),
			EnableServiceLinks:           ptr.To(false),
			NodeSelector:                 s.Kubernetes.NodeSelector,
			// Pod Security Standard "restricted".
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To(int64(squidUID)), RunAsGroup: ptr.To(int64(squidGID)),
				FSGroup:        ptr.To(int64(squidGID)),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:    "squid",
				Image:   image,
				Command: startCommand(),
				Env: []corev1.EnvVar{
					{Name: "POD_IPS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIPs"}}},
					// The node's own addresses, where the kubelet
					// and NodePorts listen.
					{Name: "HOST_IPS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIPs"}}},
				},
				Ports: []corev1.ContainerPort{{Name: "proxy", ContainerPort: s.Port, Protocol: corev1.ProtocolTCP}},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{
					TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(s.Port)},
				}, PeriodSeconds: 5},
				Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")},
				},
				SecurityContext: &corev1.SecurityContext{
					AllowPrivilegeEscalation: ptr.To(false), RunAsNonRoot: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
				},
				VolumeMounts: mounts,
			}},
			Volumes: volumes,
		},
	}
}

// Phase maps a pod to an instance phase. A running pod without an IP is
// still provisioning: an empty address is never published.
func Phase(p *corev1.Pod) v1alpha1.InstancePhase {
	if p.DeletionTimestamp != nil {
		return v1alpha1.InstancePhaseTerminated
	}
	switch p.Status.Phase {
	case corev1.PodRunning:
		if p.Status.PodIP == "" {
			return v1alpha1.InstancePhaseProvisioning
		}
		return v1alpha1.InstancePhaseRunning
	case corev1.PodFailed, corev1.PodSucceeded, corev1.PodUnknown:
		return v1alpha1.InstancePhaseTerminated
	default:
		return v1alpha1.InstancePhaseProvisioning
	}
}

func (b *Backend) instance(p *corev1.Pod) *backend.Instance {
	owner, _ := ownership.FromLabels(p.Labels)
	i := &backend.Instance{
		Ref:        backend.Ref{Name: p.Name, Namespace: p.Namespace},
		ProviderID: p.Namespace + "/" + p.Name,
		Phase:      Phase(p),
		CreatedAt:  p.CreationTimestamp.Time,
		SpecHash:   p.Annotations[AnnotationSpecHash],
		Owner:      owner,

		CredentialsSum: p.Annotations[AnnotationCredentials],
	}
	if t, err := time.Parse(time.RFC3339, p.Annotations[AnnotationPreviousCredentialsUntil]); err == nil {
		i.PreviousCredentialsUntil = t
	}
	if len(p.Spec.Containers) > 0 && len(p.Spec.Containers[0].Ports) > 0 {
		i.Port = p.Spec.Containers[0].Ports[0].ContainerPort
	}
	if i.Phase == v1alpha1.InstancePhaseRunning {
		i.Host = p.Status.PodIP
	}
	if i.Phase == v1alpha1.InstancePhaseTerminated {
		i.Reason = terminationReason(p)
	}
	i.CrashLoop = crashLoop(p, time.Now())
	return i
}

// podCrashWindow is how long a restarted container must stay up before
// its pod is no longer crash-looping.
const podCrashWindow = time.Minute

// crashLoop says why a pod's proxy is crash-looping: the kubelet backs
// its restarts off (CrashLoopBackOff), or it restarted more than once and
// has not stayed up for podCrashWindow since the last. Empty when it is
// not.
func crashLoop(p *corev1.Pod, now time.Time) string {
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason == "CrashLoopBackOff" {
			return fmt.Sprintf("container %s restarted %d times and is in CrashLoopBackOff: %s", cs.Name, cs.RestartCount, w.Message)
		}
		if r := cs.State.Running; r != nil && cs.RestartCount >= 2 && now.Sub(r.StartedAt.Time) < podCrashWindow {
			if t := cs.LastTerminationState.Terminated; t != nil && r.StartedAt.Sub(t.FinishedAt.Time) < podCrashWindow*5 {
				return fmt.Sprintf("container %s restarted %d times, the last after it exited %d (%s); it is held out of service until it stays up for %s",
					cs.Name, cs.RestartCount, t.ExitCode, t.Reason, podCrashWindow)
			}
		}
	}
	return ""
}

// terminationReason says why a pod stopped, as its status does.
func terminationReason(p *corev1.Pod) string {
	why := "pod " + string(p.Status.Phase)
	if p.DeletionTimestamp != nil {
		why = "pod being deleted"
	}
	if p.Status.Reason != "" {
		why += ": " + p.Status.Reason
	}
	for _, cs := range p.Status.ContainerStatuses {
		if t := cs.State.Terminated; t != nil {
			why += fmt.Sprintf("; container %s exited %d (%s) %s", cs.Name, t.ExitCode, t.Reason, t.Message)
		}
	}
	if p.Status.Message != "" {
		why += ": " + p.Status.Message
	}
	return why
}

// Get observes a pod.
func (b *Backend) Get(ctx context.Context, r backend.Ref) (*backend.Instance, error) {
	p := &corev1.Pod{}
	if err := b.cfg.Client.Get(ctx, types.NamespacedName{Namespace: r.Namespace, Name: r.Name}, p); err != nil {
		return nil, Classify(errors.Wrapf(err, "cannot get proxy pod %s/%s", r.Namespace, r.Name))
	}
	return b.instance(p), nil
}

// Delete removes the pod and its config Secret.
func (b *Backend) Delete(ctx context.Context, r backend.Ref) error {
	meta := metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace}
	if err := b.cfg.Client.Delete(ctx, &corev1.Pod{ObjectMeta: meta}); err != nil && !kerrors.IsNotFound(err) {
		return Classify(errors.Wrap(err, "cannot delete proxy pod"))
	}
	if err := b.cfg.Client.Delete(ctx, &corev1.Secret{ObjectMeta: meta}); err != nil && !kerrors.IsNotFound(err) {
		return Classify(errors.Wrap(err, "cannot delete proxy config secret"))
	}
	if err := b.cfg.Client.Delete(ctx, &networkingv1.NetworkPolicy{ObjectMeta: meta}); err != nil && !kerrors.IsNotFound(err) {
		return Classify(errors.Wrap(err, "cannot delete proxy network policy"))
	}
	return nil
}

// ListOwned lists this cluster's proxy pods in every namespace, which is why
// the provider's pod RBAC is a ClusterRole, and the network policies left
// without their pod.
func (b *Backend) ListOwned(ctx context.Context) ([]backend.Instance, error) {
	l := &corev1.PodList{}
	if err := b.cfg.Client.List(ctx, l, client.MatchingLabels(ownership.Selector(b.cfg.ClusterID))); err != nil {
		return nil, Classify(errors.Wrap(err, "cannot list proxy pods"))
	}
	out := make([]backend.Instance, 0, len(l.Items))
	pods := map[string]bool{}
	for i := range l.Items {
		out = append(out, *b.instance(&l.Items[i]))
		pods[l.Items[i].Namespace+"/"+l.Items[i].Name] = true
	}
	// A network policy or config Secret whose pod never came, or is gone,
	// is an instance too: Delete removes what is left of it.
	nps := &networkingv1.NetworkPolicyList{}
	if err := b.cfg.Client.List(ctx, nps, client.MatchingLabels(ownership.Selector(b.cfg.ClusterID))); err != nil {
		return nil, Classify(errors.Wrap(err, "cannot list proxy network policies"))
	}
	// Crossplane grants a provider Secrets in every namespace; where a
	// platform has narrowed that, lone config Secrets are left to Delete
	// and the pods and policies are still collected.
	secrets := &corev1.SecretList{}
	if err := b.cfg.Client.List(ctx, secrets, client.MatchingLabels(ownership.Selector(b.cfg.ClusterID))); err != nil && !kerrors.IsForbidden(err) {
		return nil, Classify(errors.Wrap(err, "cannot list proxy config Secrets"))
	}
	left := make([]client.Object, 0, len(nps.Items)+len(secrets.Items))
	for i := range nps.Items {
		left = append(left, &nps.Items[i])
	}
	for i := range secrets.Items {
		left = append(left, &secrets.Items[i])
	}
	for _, o := range left {
		key := o.GetNamespace() + "/" + o.GetName()
		if pods[key] {
			continue
		}
		pods[key] = true
		owner, _ := ownership.FromLabels(o.GetLabels())
		out = append(out, backend.Instance{
			Ref: backend.Ref{Name: o.GetName(), Namespace: o.GetNamespace()}, ProviderID: key,
			Phase: v1alpha1.InstancePhaseTerminated, CreatedAt: o.GetCreationTimestamp().Time, Owner: owner,
		})
	}
	return out, nil
}

// saltFor derives a stable htpasswd salt from the owner, so the Secret's
// bytes change only when the credentials do.
func saltFor(uid types.UID) string {
	return ownership.InstanceName(uid)[len("egress-"):][:8]
}

// ErrFmtMissing refuses the import of a pod that lacks one of the objects
// made for it (kind, namespace, name).
const ErrFmtMissing = "%s %s/%s is missing: a pod without it is not imported"

// Adopt relabels the pod's config Secret and network policy, then the pod,
// for the Proxy that imports them, each only if it still belongs to from or
// already to to: a patch carries the resourceVersion read, so of two imports
// racing the second is refused. The pod goes last because it is what
// ListOwned and Get report, so an import cut short is retried from the
// same holder. A pod without its Secret or network policy is not imported:
// nothing would put them back while it runs. The network policy keeps
// selecting the pod by its maker's UID label, which stays.
func (b *Backend) Adopt(ctx context.Context, r backend.Ref, from types.UID, to ownership.Owner) error {
	meta := metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace}
	kinds := []string{"config Secret", "NetworkPolicy", "pod"}
	objs := []client.Object{&corev1.Secret{ObjectMeta: meta}, &networkingv1.NetworkPolicy{ObjectMeta: meta}, &corev1.Pod{ObjectMeta: meta}}
	for i, o := range objs {
		if err := b.cfg.Client.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
			if kerrors.IsNotFound(err) {
				return backend.Errorf(backend.ClassPermanent, ErrFmtMissing, kinds[i], r.Namespace, r.Name)
			}
			return Classify(errors.Wrapf(err, "cannot get %s %s/%s", kinds[i], r.Namespace, r.Name))
		}
		cur, ok := ownership.FromLabels(o.GetLabels())
		if !ok {
			return backend.Errorf(backend.ClassPermanent, "%s %s/%s carries no ownership labels: it is not a provider's, and is not imported", kinds[i], r.Namespace, r.Name)
		}
		if h := cur.Holder(); h != from && h != to.UID {
			return backend.HeldElsewhere(kinds[i]+" "+r.Namespace+"/"+r.Name, h, from)
		}
	}
	for i, o := range objs {
		cur, _ := ownership.FromLabels(o.GetLabels())
		base := o.DeepCopyObject().(client.Object) //nolint:forcetypeassert // A copy of a client.Object is one.
		o.SetLabels(cur.AdoptedBy(to).Relabel(o.GetLabels(), false))
		if err := b.cfg.Client.Patch(ctx, o, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return Classify(errors.Wrapf(err, "cannot label %s %s/%s for its new Proxy", kinds[i], r.Namespace, r.Name))
		}
	}
	return nil
}

// RotateCredentials compares the htpasswd file in the pod's config Secret
// (whose mount the kubelet refreshes, and which the pod's helper reads
// afresh for every check) with s.Credentials, and rotates or retires as
// backend.CredentialRotator says, in one write of the Secret carrying the
// resourceVersion read, so of two rotations racing the second is refused
// and retried. Then it annotates the pod with what the Secret now holds,
// which has the kubelet refresh the mount at once; the annotations are put
// right whenever they lag, so a rotation cut short between the two writes
// completes when called again.
func (b *Backend) RotateCredentials(ctx context.Context, s backend.Spec, previousUntil, now time.Time) (backend.Rotation, error) {
	var r backend.Rotation
	if s.Credentials == nil {
		return r, backend.Errorf(backend.ClassPermanent, "no credentials to rotate to")
	}
	sec := &corev1.Secret{}
	if err := b.cfg.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, sec); err != nil {
		return r, Classify(errors.Wrapf(err, "cannot get proxy config secret %s/%s", s.Namespace, s.Name))
	}
	if cur, ok := ownership.FromLabels(sec.Labels); !ok || cur.Holder() != s.Owner.Holder() {
		return r, backend.Errorf(backend.ClassTransient, "config Secret %s/%s is not Proxy uid %s's", s.Namespace, s.Name, s.Owner.Holder())
	}
	if _, ok := sec.Data[keyAuth]; !ok {
		return r, backend.Wrap(backend.ClassPermanent, errors.Wrapf(backend.ErrNoRotation, "pod %s/%s", s.Namespace, s.Name))
	}
	base := sec.DeepCopy()
	previous, hasPrevious := sec.Data[keyPrevious]
	until, held := squid.PreviousDeadline(previous)
	switch {
	case !squid.HtpasswdMatches(sec.Data[keyHtpasswd], s.Credentials.Username, s.Credentials.Password):
		h, err := squid.HtpasswdWithSalt(s.Credentials.Username, s.Credentials.Password, saltFor(s.Owner.UID))
		if err != nil {
			return r, backend.Wrap(backend.ClassPermanent, err)
		}
		if !previousUntil.IsZero() {
			sec.Data[keyPrevious] = append(squid.PreviousHeader(previousUntil), sec.Data[keyHtpasswd]...)
		} else {
			delete(sec.Data, keyPrevious)
		}
		sec.Data[keyHtpasswd] = h
		r.Rotated = true
		until, held = previousUntil, !previousUntil.IsZero()
	case hasPrevious && (!held || !now.Before(until)):
		delete(sec.Data, keyPrevious)
		r.Retired = true
		held = false
	}
	if held {
		r.PreviousUntil = until
	}
	setAnnotation(sec, AnnotationCredentials, s.CredentialsSum)
	setAnnotation(sec, AnnotationPreviousCredentialsUntil, "")
	if held {
		setAnnotation(sec, AnnotationPreviousCredentialsUntil, until.UTC().Format(time.RFC3339))
	}
	if !reflect.DeepEqual(base, sec) {
		if err := b.cfg.Client.Patch(ctx, sec, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{})); err != nil {
			return backend.Rotation{}, Classify(errors.Wrapf(err, "cannot rotate the credentials in config secret %s/%s", s.Namespace, s.Name))
		}
	}
	pod := &corev1.Pod{}
	if err := b.cfg.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace, Name: s.Name}, pod); err != nil {
		return r, Classify(errors.Wrapf(err, "cannot get proxy pod %s/%s", s.Namespace, s.Name))
	}
	podBase := pod.DeepCopy()
	for _, k := range []string{AnnotationCredentials, AnnotationPreviousCredentialsUntil} {
		setAnnotation(pod, k, sec.Annotations[k])
	}
	if reflect.DeepEqual(podBase.Annotations, pod.Annotations) {
		return r, nil
	}
	return r, Classify(errors.Wrapf(b.cfg.Client.Patch(ctx, pod, client.MergeFromWithOptions(podBase, client.MergeFromWithOptimisticLock{})),
		"cannot annotate proxy pod %s/%s with its credentials, for the kubelet to refresh its config at once (it does within its sync period anyway): is the provider's admission policy up to date?", s.Namespace, s.Name))
}

// setAnnotation sets an annotation, or removes it when v is empty.
func setAnnotation(o metav1.Object, k, v string) {
	a := o.GetAnnotations()
	if v == "" {
		delete(a, k)
		o.SetAnnotations(a)
		return
	}
	if a == nil {
		a = map[string]string{}
	}
	a[k] = v
	o.SetAnnotations(a)
}

// SetRetain labels the pod, and its config Secret and network policy, to
// outlive the Proxy or not.
func (b *Backend) SetRetain(ctx context.Context, r backend.Ref, retain bool) error {
	value := any(nil)
	if retain {
		value = "true"
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": map[string]any{ownership.LabelRetain: value}}})
	if err != nil {
		return err
	}
	meta := metav1.ObjectMeta{Name: r.Name, Namespace: r.Namespace}
	for _, o := range []client.Object{&corev1.Pod{ObjectMeta: meta}, &corev1.Secret{ObjectMeta: meta}, &networkingv1.NetworkPolicy{ObjectMeta: meta}} {
		if err := b.cfg.Client.Patch(ctx, o, client.RawPatch(types.MergePatchType, patch)); err != nil && !kerrors.IsNotFound(err) {
			return Classify(errors.Wrapf(err, "cannot label %s/%s", r.Namespace, r.Name))
		}
	}
	return nil
}
