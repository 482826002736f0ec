package kubernetes

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestCrashLoop(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	at := func(d time.Duration) metav1.Time { return metav1.Time{Time: now.Add(d)} }
	exited := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", FinishedAt: at(-20 * time.Second)}}
	cases := map[string]struct {
		reason string
		status corev1.ContainerStatus
		want   string // in the message; empty for not crash-looping
	}{
		"BackOff": {
			reason: "The kubelet backs the container's restarts off.",
			status: corev1.ContainerStatus{Name: "squid", RestartCount: 3, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 40s"}}},
			want:   "CrashLoopBackOff",
		},
		"UpMomentarily": {
			reason: "Restarted twice and up for 10s: a probe passing now proves nothing.",
			status: corev1.ContainerStatus{Name: "squid", RestartCount: 2, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(-10 * time.Second)}}, LastTerminationState: exited},
			want:   "held out of service",
		},
		"StayedUp": {
			reason: "Up for longer than the crash window since its last restart.",
			status: corev1.ContainerStatus{Name: "squid", RestartCount: 5, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(-2 * time.Minute)}}, LastTerminationState: exited},
		},
		"RestartedOnce": {
			reason: "One restart is a proxy that died and came back, not a loop.",
			status: corev1.ContainerStatus{Name: "squid", RestartCount: 1, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: at(-10 * time.Second)}}, LastTerminationState: exited},
		},
		"Waiting": {
			reason: "Waiting for another reason (pulling its image) is not a crash loop.",
			status: corev1.ContainerStatus{Name: "squid", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "ContainerCreating"}}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := &corev1.Pod{Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{tc.status}}}
			got := crashLoop(p, now)
			if (got != "") != (tc.want != "") || !strings.Contains(got, tc.want) {
				t.Errorf("%s\nwant a message containing %q, got %q", tc.reason, tc.want, got)
			}
		})
	}
}
