package function

import (
	"fmt"
	"sort"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/response"
	"google.golang.org/protobuf/types/known/structpb"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/egressip"
)

// Recycling: egress-discovery's summaries name the proxies whose address
// spec.recycling judges burned; the fleet replaces them through the
// rollout machinery (the holder due, a surge replacement, lease-aware,
// within maxUnavailable), within the policy's bounds, and records each in
// status.egress.recycles, which is what the bounds count: the function
// keeps no state of its own.

const (
	// keyReason is the reason field of a status entry (a recycle, a
	// fault, a recommendation).
	keyReason = "reason"
	// recycleMemory is how long a recycle stays in the fleet's status.
	recycleMemory = 24 * time.Hour
	// maxRecycleRecords bounds the recycles the status lists.
	maxRecycleRecords = 100
)

// recycling is what pickRecycles decided: the fleet's recycles of the last
// day (those it started now included), how many proxies leave from an
// address one of them gave back, and the recycles started now.
type recycling struct {
	records   []fleetv1alpha1.RecycleRecord
	seenAgain int
	started   []fleetv1alpha1.RecycleRecord
}

// pickRecycles marks the members being recycled (Recycle, their due
// reason): those a recycle of the last day started on that are still
// here, and new ones among the burned (by name) as many as the policy
// allows now. A burned member is recycled only while it serves (Ready,
// healthy, not draining, nothing replacing it yet); the floor is
// replicas - maxUnavailable healthy proxies.
func pickRecycles(f *Fleet, members []*member, burned map[string]string, xrStatus *structpb.Struct, now time.Time) *recycling {
	rc := &recycling{records: previousRecycles(xrStatus, now)}
	fl := survey(members)
	gaveBack := map[string]string{}
	for _, r := range rc.records {
		gaveBack[r.EgressIP] = r.Proxy
		if m := fl.byName[r.Proxy]; m != nil {
			m.Recycle = "recycling: " + r.Reason
		}
	}
	for _, m := range members {
		if p, ok := gaveBack[m.EgressIP]; ok && m.EgressIP != "" && p != m.Name {
			rc.seenAgain++
		}
	}
	pol := egressip.PolicyOf(f.spec.Recycling)
	if pol == nil || f.Paused || len(burned) == 0 {
		return rc
	}
	n, _ := pol.Allowed(fl.recent(rc.records, burned), fl.healthy, f.Replicas-f.MaxUnavailable, now)
	names := make([]string, 0, len(burned))
	for name := range burned {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if n == 0 {
			break
		}
		if m := fl.byName[name]; fl.recyclable(m) {
			r := fleetv1alpha1.RecycleRecord{Proxy: m.Name, EgressIP: m.EgressIP, Reason: burned[name], Time: now.UTC().Format(time.RFC3339)}
			rc.records = append(rc.records, r)
			rc.started = append(rc.started, r)
			m.Recycle = "recycling: " + r.Reason
			n--
		}
	}
	if len(rc.records) > maxRecycleRecords {
		rc.records = rc.records[len(rc.records)-maxRecycleRecords:]
	}
	return rc
}

// fleetSurvey is what pickRecycles reads of the members: them by name,
// the replacement of each ordinal being replaced, and how many are
// healthy.
type fleetSurvey struct {
	byName   map[string]*member
	replaced map[int]*member
	healthy  int
}

func survey(members []*member) fleetSurvey {
	fl := fleetSurvey{byName: map[string]*member{}, replaced: map[int]*member{}}
	for _, m := range members {
		fl.byName[m.Name] = m
		if m.Replaces >= 0 && m.Replaces != m.Ordinal {
			fl.replaced[m.Replaces] = m
		}
		if m.Healthy {
			fl.healthy++
		}
	}
	return fl
}

// recent are the recycles the policy's bounds count: the records, and a
// burned member's replacement Crossplane made before the status recording
// it was written, so that the bound never forgets one.
func (fl fleetSurvey) recent(records []fleetv1alpha1.RecycleRecord, burned map[string]string) []egressip.Recycle {
	out := make([]egressip.Recycle, 0, len(records))
	for _, r := range records {
		at, _ := time.Parse(time.RFC3339, r.Time)
		out = append(out, egressip.Recycle{Proxy: r.Proxy, IP: r.EgressIP, At: at})
	}
	for name := range burned {
		if m := fl.byName[name]; m != nil && m.Recycle == "" {
			if r := fl.replaced[m.Ordinal]; r != nil {
				out = append(out, egressip.Recycle{Proxy: m.Name, IP: m.EgressIP, At: r.Created})
			}
		}
	}
	return out
}

// recyclable says whether a burned member may start a recycle: it serves
// (Ready, healthy, not draining, its address known), is not being
// recycled, and nothing replaces it yet.
func (fl fleetSurvey) recyclable(m *member) bool {
	return m != nil && m.Recycle == "" && m.Ready && m.Healthy && m.DrainSince.IsZero() && fl.replaced[m.Ordinal] == nil && m.EgressIP != ""
}

// previousRecycles reads the recycles of the last day from the XR's
// status.egress.recycles, oldest first; entries that do not parse, or
// from the future beyond a skew, are dropped.
func previousRecycles(xrStatus *structpb.Struct, now time.Time) []fleetv1alpha1.RecycleRecord {
	var out []fleetv1alpha1.RecycleRecord
	for _, v := range field(xrStatus, "egress", "recycles").GetListValue().GetValues() {
		s := v.GetStructValue()
		r := fleetv1alpha1.RecycleRecord{Proxy: str(s, "proxy"), EgressIP: str(s, "egressIP"), Reason: str(s, keyReason), Time: str(s, "time")}
		at, err := time.Parse(time.RFC3339, r.Time)
		if err != nil || r.Proxy == "" || now.Sub(at) >= recycleMemory || at.After(now.Add(time.Hour)) {
			continue
		}
		out = append(out, r)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Time < out[j].Time })
	return out
}

// setRecycles writes status.egress.recycles and seenAgain, and says, in a
// Normal result, each recycle started now.
func setRecycles(rsp *fnv1.RunFunctionResponse, rc *recycling) {
	egress := field(rsp.GetDesired().GetComposite().GetResource(), "status", "egress").GetStructValue()
	if egress == nil {
		return
	}
	list := make([]*structpb.Value, 0, len(rc.records))
	for _, r := range rc.records {
		list = append(list, structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			"proxy": structpb.NewStringValue(r.Proxy), "egressIP": structpb.NewStringValue(r.EgressIP),
			keyReason: structpb.NewStringValue(r.Reason), "time": structpb.NewStringValue(r.Time),
		}}))
	}
	if len(list) > 0 {
		egress.Fields["recycles"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	}
	if rc.seenAgain > 0 {
		egress.Fields["seenAgain"] = structpb.NewNumberValue(float64(rc.seenAgain))
	}
	for _, r := range rc.started {
		response.Normalf(rsp, "Recycling proxy %s: its egress IP %s", r.Proxy, r.Reason).TargetCompositeAndClaim()
	}
}

// recycleNote is the warning of a fleet that cannot apply spec.recycling
// (a pooled one, for now); "" for one that can.
func recycleNote(f *Fleet) string {
	if f.spec.Recycling == nil || f.spec.Pools == nil {
		return ""
	}
	return fmt.Sprintf("spec.recycling is not applied to pooled fleets yet: %s/%s recycles no proxy", f.Namespace, f.Name)
}
