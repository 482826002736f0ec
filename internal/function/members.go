package function

import (
	"net"
	"sort"
	"strconv"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	corev1 "k8s.io/api/core/v1"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// The members: the fleet's Proxies as Crossplane observed them.

// observedMembers reads the fleet's observed Proxies. Each nested object is
// looked up once: with thousands of proxies these lookups are most of the
// function's work. A Proxy without a template revision label was made
// before revisions were, when every Proxy was rewritten to the template of
// the last composition: it is of the current revision.
func observedMembers(observed map[string]*fnv1.Resource, leased map[string]bool, current string) []*member {
	out := make([]*member, 0, len(observed))
	for name, oc := range observed {
		ord, ok := ordinalOf(name)
		r := oc.GetResource().GetFields()
		if !ok || r["kind"].GetStringValue() != v1alpha1.ProxyKind {
			continue
		}
		meta := r["metadata"].GetStructValue().GetFields()
		labels := meta["labels"].GetStructValue().GetFields()
		status := r["status"].GetStructValue().GetFields()
		ap := status["atProvider"].GetStructValue().GetFields()
		m := &member{
			Ordinal: ord, Name: meta["name"].GetStringValue(), Zone: labels[fleetv1alpha1.LabelZone].GetStringValue(),
			Replaces: -1, Healthy: ap["healthy"].GetBoolValue(),
			EgressIP: ap["egressIP"].GetStringValue(), Error: ap["lastProbeError"].GetStringValue(),
			Revision: labels[fleetv1alpha1.LabelTemplateRevision].GetStringValue(), spec: r["spec"],

			CredentialsOutdated: ap["credentialsOutdated"].GetBoolValue(),
		}
		if m.Revision == "" {
			m.Revision = current
		}
		if ann := meta["annotations"].GetStructValue().GetFields(); ann[fleetv1alpha1.AnnotationRecycleOf].GetStringValue() != "" {
			m.RecycleOf, m.RecycleIP = ann[fleetv1alpha1.AnnotationRecycleOf].GetStringValue(), ann[fleetv1alpha1.AnnotationRecycleIP].GetStringValue()
			m.RecycleReason = ann[fleetv1alpha1.AnnotationRecycleReason].GetStringValue()
			m.RecycleAt, _ = time.Parse(time.RFC3339, ann[fleetv1alpha1.AnnotationRecycleAt].GetStringValue())
			m.RecycleGrant = ann[fleetv1alpha1.AnnotationRecycleGrant].GetStringValue()
		}
		m.Created, _ = time.Parse(time.RFC3339, meta["creationTimestamp"].GetStringValue())
		if v := labels[fleetv1alpha1.LabelReplaces].GetStringValue(); v != "" {
			if o, err := strconv.Atoi(v); err == nil {
				m.Replaces = o
			}
		}
		if v := labels[fleetv1alpha1.LabelRotationGeneration].GetStringValue(); v != "" {
			m.Generation, _ = strconv.Atoi(v)
		}
		if v, err := strconv.ParseInt(labels[fleetv1alpha1.LabelDrainingSince].GetStringValue(), 10, 64); err == nil && v > 0 {
			m.DrainSince = time.Unix(v, 0).UTC()
		}
		if v := labels[fleetv1alpha1.LabelUnhealthyStreak].GetStringValue(); v != "" {
			m.Streak, _ = strconv.Atoi(v)
			m.Streak = max(m.Streak, 0)
		}
		for _, c := range status["conditions"].GetListValue().GetValues() {
			cf := c.GetStructValue().GetFields()
			if cf["type"].GetStringValue() == "Ready" {
				m.Ready = cf["status"].GetStringValue() == string(corev1.ConditionTrue)
				m.Since, _ = time.Parse(time.RFC3339, cf["lastTransitionTime"].GetStringValue())
				// The provider refused it by its ProviderConfig's
				// policy: the fleet says why, and a replacement, which
				// would be refused alike, is not made.
				if !m.Ready && cf["reason"].GetStringValue() == v1alpha1.ReasonNotPermitted {
					m.Refused = true
					m.Error = cf["message"].GetStringValue()
				}
				break
			}
		}
		if m.Since.IsZero() {
			m.Since = m.Created
		}
		if host, port := ap["host"].GetStringValue(), ap["port"].GetNumberValue(); host != "" && port > 0 {
			m.Endpoint = net.JoinHostPort(host, strconv.Itoa(int(port)))
		}
		m.Leased = leased[m.Name]
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Ordinal < out[j].Ordinal })
	return out
}
