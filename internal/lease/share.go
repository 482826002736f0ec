package lease

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	coordv1 "k8s.io/api/coordination/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Sharing a lease between the gateway replicas a session reaches.

// Granter stands in AnnotationReplicas for the replica that granted the
// lease, which did not name itself; no host name has parentheses.
const Granter = "(granter)"

// replicasPath is AnnotationReplicas in a JSON patch.
var replicasPath = "/metadata/annotations/" + strings.ReplaceAll(AnnotationReplicas, "/", "~1")

// sharers reads AnnotationReplicas; nil when the lease was never shared.
func sharers(l *coordv1.Lease) []string {
	v, ok := l.Annotations[AnnotationReplicas]
	if !ok {
		return nil
	}
	out := []string{}
	for _, r := range strings.Split(v, ",") {
		if r != "" && !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// Share renews a lease as Renew does and adds replica to the replicas
// that use it (the granter too, the first time), in one call guarded by
// the resourceVersion it read: a second replica takes up a lease another
// granted.
func (s *Store) Share(ctx context.Context, id, identity string, ttl time.Duration, replica string) (*Grant, error) {
	for range 5 {
		l, err := s.Get(ctx, id, identity)
		if err != nil {
			return nil, err
		}
		users := sharers(l)
		if users == nil {
			users = []string{Granter}
		}
		if !slices.Contains(users, replica) {
			users = append(users, replica)
		}
		g, err := s.renew(ctx, id, identity, ttl, patchOp{opTest, "/metadata/resourceVersion", l.ResourceVersion},
			patchOp{"add", replicasPath, strings.Join(users, ",")})
		if !errors.Is(err, ErrNotFound) {
			return g, err
		}
		// Gone, or changed since it was read: read it again.
	}
	return nil, ErrNotFound
}

// Leave ends replica's use of a lease (the granter's when granter): it
// takes the replica off the lease's replicas, and deletes the lease when
// none is left or it was never shared. It reports whether it deleted it.
// Each write is guarded by the resourceVersion it read, and retried on a
// conflict; a lease still changing after that is left to lapse.
func (s *Store) Leave(ctx context.Context, id, identity, replica string, granter bool) (bool, error) {
	if granter {
		replica = Granter
	}
	for range 5 {
		l, err := s.Get(ctx, id, identity)
		if err != nil {
			return false, err
		}
		users := sharers(l)
		if users == nil && !granter {
			// Never shared: not this replica's to delete.
			return false, nil
		}
		left := slices.DeleteFunc(slices.Clone(users), func(r string) bool { return r == replica })
		rv := l.ResourceVersion
		if len(left) == 0 {
			err = s.Client.Delete(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}, client.Preconditions{UID: &l.UID, ResourceVersion: &rv})
			if err == nil {
				s.released(l.Namespace, l.Name, id)
				return true, nil
			}
		} else {
			if len(left) == len(users) {
				return false, nil
			}
			patch, _ := json.Marshal([]patchOp{{opTest, "/metadata/uid", string(l.UID)}, {opTest, "/metadata/resourceVersion", rv},
				{opReplace, replicasPath, strings.Join(left, ",")}})
			err = s.Client.Patch(ctx, &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: l.Namespace, Name: l.Name}}, client.RawPatch(types.JSONPatchType, patch))
			if err == nil {
				return false, nil
			}
		}
		switch {
		case kerrors.IsNotFound(err):
			return false, ErrNotFound
		case kerrors.IsConflict(err) || kerrors.IsInvalid(err):
			// Renewed or shared since it was read: read it again.
		default:
			return false, errors.Wrap(err, errReleaseLease)
		}
	}
	return false, nil
}
