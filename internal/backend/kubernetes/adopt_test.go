package kubernetes_test

import (
	"context"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/test"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/kubernetes"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/ownership"
)

// TestAdoptCutShort: an import that fails part way, after some of the
// pod's objects were relabelled, is finished by the next try, whichever
// object failed; a pod without its NetworkPolicy is not imported at all.
func TestAdoptCutShort(t *testing.T) {
	bed := sharedBed.Env(t)
	ctx := context.Background()
	ns := bed.Namespace(t)
	ww, err := client.NewWithWatch(bed.Config, client.Options{Scheme: bed.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	for i, failOn := range []client.Object{&corev1.Secret{}, &networkingv1.NetworkPolicy{}, &corev1.Pod{}} {
		uid := types.UID("7a1b2c3d-0000-4000-8000-00000000000" + string(rune('0'+i)))
		s := podSpec(ns, "adopt", uid)
		if _, err := kubernetes.New(kubernetes.Config{Client: bed.Client, ClusterID: "adopt"}).Create(ctx, s); err != nil {
			t.Fatal(err)
		}
		failed := false
		flaky := interceptor.NewClient(ww, interceptor.Funcs{
			Patch: func(ctx context.Context, c client.WithWatch, o client.Object, p client.Patch, opts ...client.PatchOption) error {
				if !failed && sameKind(o, failOn) {
					failed = true
					return errHiccup
				}
				return c.Patch(ctx, o, p, opts...)
			},
		})
		b := kubernetes.New(kubernetes.Config{Client: flaky, ClusterID: "adopt"})
		to := ownership.Owner{ClusterID: "adopt", Namespace: ns, Name: "importer", UID: "importer-uid"}
		if err := b.Adopt(ctx, s.Ref, uid, to); !errors.Is(err, errHiccup) {
			t.Fatalf("%T: the first try must fail with the apiserver's error, got %v", failOn, err)
		}
		if err := b.Adopt(ctx, s.Ref, uid, to); err != nil {
			t.Fatalf("%T failed first: the second try must finish the import: %v", failOn, err)
		}
		for _, o := range []client.Object{&corev1.Pod{}, &corev1.Secret{}, &networkingv1.NetworkPolicy{}} {
			if err := bed.Client.Get(ctx, types.NamespacedName{Namespace: ns, Name: s.Name}, o); err != nil {
				t.Fatal(err)
			}
			if got, _ := ownership.FromLabels(o.GetLabels()); got.Holder() != to.UID {
				t.Errorf("%T failed first: %T belongs to %s, want the importer", failOn, o, got.Holder())
			}
		}
	}

	uid := types.UID("7a1b2c3d-0000-4000-8000-000000000009")
	s := podSpec(ns, "adopt", uid)
	b := kubernetes.New(kubernetes.Config{Client: bed.Client, ClusterID: "adopt"})
	if _, err := b.Create(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := bed.Client.Delete(ctx, &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: s.Name}}); err != nil {
		t.Fatal(err)
	}
	err = b.Adopt(ctx, s.Ref, uid, ownership.Owner{ClusterID: "adopt", Namespace: ns, Name: "importer", UID: "importer-uid"})
	want := backend.Errorf(backend.ClassPermanent, kubernetes.ErrFmtMissing, "NetworkPolicy", ns, s.Name)
	if diff := cmp.Diff(want, err, test.EquateErrors()); diff != "" {
		t.Errorf("a pod without its NetworkPolicy must not be imported: -want, +got:\n%s", diff)
	}
	if i, err := b.Get(ctx, s.Ref); err != nil || i.Owner.Holder() != uid {
		t.Errorf("the refused import leaves the pod its maker's: %+v %v", i, err)
	}
}

func sameKind(a, b client.Object) bool {
	switch b.(type) {
	case *corev1.Secret:
		_, ok := a.(*corev1.Secret)
		return ok
	case *networkingv1.NetworkPolicy:
		_, ok := a.(*networkingv1.NetworkPolicy)
		return ok
	default:
		_, ok := a.(*corev1.Pod)
		return ok
	}
}

// errHiccup is the apiserver's failure of one patch.
var errHiccup = errors.New("apiserver hiccup")
