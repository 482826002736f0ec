package kubernetes_test

import (
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/backend/kubernetes"
)

func TestPhase(t *testing.T) {
	cases := map[string]struct {
		reason string
		status corev1.PodStatus
		gone   bool
		want   v1alpha1.InstancePhase
	}{
		"Pending":       {reason: "A pending pod is provisioning.", status: corev1.PodStatus{Phase: corev1.PodPending}, want: v1alpha1.InstancePhaseProvisioning},
		"RunningNoIP":   {reason: "Running without a pod IP is still provisioning: no empty address is published.", status: corev1.PodStatus{Phase: corev1.PodRunning}, want: v1alpha1.InstancePhaseProvisioning},
		"Running":       {reason: "Running with an IP is running.", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"}, want: v1alpha1.InstancePhaseRunning},
		"Failed":        {reason: "A failed pod is terminated and recreated.", status: corev1.PodStatus{Phase: corev1.PodFailed}, want: v1alpha1.InstancePhaseTerminated},
		"Succeeded":     {reason: "A pod whose Squid exited is terminated.", status: corev1.PodStatus{Phase: corev1.PodSucceeded}, want: v1alpha1.InstancePhaseTerminated},
		"Unknown":       {reason: "A pod on a lost node is terminated.", status: corev1.PodStatus{Phase: corev1.PodUnknown}, want: v1alpha1.InstancePhaseTerminated},
		"BeingDeleted":  {reason: "A pod being deleted is on its way out.", status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"}, gone: true, want: v1alpha1.InstancePhaseTerminated},
		"NoStatusAtAll": {reason: "A pod no kubelet has seen is provisioning.", want: v1alpha1.InstancePhaseProvisioning},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := &corev1.Pod{Status: tc.status}
			if tc.gone {
				p.DeletionTimestamp = &metav1.Time{}
			}
			if diff := cmp.Diff(tc.want, kubernetes.Phase(p)); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}

func TestClassify(t *testing.T) {
	gr := schema.GroupResource{Resource: "pods"}
	cases := map[string]struct {
		reason string
		err    error
		want   backend.Class
	}{
		"NotFound":  {reason: "A missing pod is not found.", err: kerrors.NewNotFound(gr, "p"), want: backend.ClassNotFound},
		"RBAC":      {reason: "An RBAC denial is permanent: retrying will not grant rights.", err: kerrors.NewForbidden(gr, "p", errors.New("user cannot create pods")), want: backend.ClassPermanent},
		"Quota":     {reason: "A 403 that says quota is a quota error.", err: kerrors.NewForbidden(gr, "p", errors.New("exceeded quota: compute-resources, requested: pods=1")), want: backend.ClassQuota},
		"TooMany":   {reason: "429 is a rate limit.", err: kerrors.NewTooManyRequests("slow down", 5), want: backend.ClassQuota},
		"Invalid":   {reason: "An invalid pod will stay invalid.", err: kerrors.NewInvalid(schema.GroupKind{Kind: "Pod"}, "p", nil), want: backend.ClassPermanent},
		"Server":    {reason: "A 500 is transient.", err: kerrors.NewInternalError(errors.New("etcd hiccup")), want: backend.ClassTransient},
		"Timeout":   {reason: "A timeout is transient.", err: kerrors.NewTimeoutError("slow", 1), want: backend.ClassTransient},
		"NotAPIErr": {reason: "A connection error is transient.", err: errors.New("dial tcp: connection refused"), want: backend.ClassTransient},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, backend.ClassOf(kubernetes.Classify(tc.err))); diff != "" {
				t.Errorf("%s\n-want, +got:\n%s", tc.reason, diff)
			}
		})
	}
}
