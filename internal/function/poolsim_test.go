package function

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"math/rand"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"github.com/crossplane/function-sdk-go/resource"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/leasewire"
)

// The simulation below runs the real function for a pooled fleet and its
// pools against an in-memory cluster: what each run composes is applied,
// Proxies turn Ready a while after they are made, egress-discovery's
// summaries list what drains. Reconciles read and write at different
// moments, with other reconciles in between, as Crossplane's workers and
// caches do.

type simProxy struct {
	obj     *structpb.Struct // as composed
	created time.Time
	// ip is its egress IP, each in a /24 of its own.
	ip string
}

type simPool struct {
	spec   *structpb.Struct // as the fleet last composed it
	status *structpb.Struct // as the pool last wrote it
	ready  bool
	// proxies by composition resource name.
	proxies map[string]*simProxy
}

type simCluster struct {
	t       *testing.T
	fn      *Function
	now     time.Time
	spec    string
	fleetSt *structpb.Struct
	pools   map[string]*simPool // by composition resource name
	boot    time.Duration
	// mutate, when set, changes what the fleet observes of its pools;
	// mutateXR what it observes of itself: the broken variants.
	mutate, mutateXR func(*structpb.Struct)
	// lag, when set, has the fleet see each pool as it was up to a few
	// steps ago (a cache behind the fleet's own writes); view is that.
	lag  *rand.Rand
	view map[string]*fnv1.Resource
	// made counts the Proxies made, which numbers their egress IPs;
	// burned names those the fleet's summary lists as burned.
	made   int
	burned map[string]bool
	// poolSkew is how far the clock of the function replica composing
	// the pools is ahead of the fleet's (behind, negative).
	poolSkew time.Duration
	poolFn   *Function
}

func newSim(t *testing.T, spec string) *simCluster {
	c := &simCluster{t: t, now: t0, spec: spec, pools: map[string]*simPool{}, boot: 20 * time.Second}
	c.fn = New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return c.now }})
	c.poolFn = New(Config{Log: logging.NewNopLogger(), Now: func() time.Time { return c.now.Add(c.poolSkew) }})
	return c
}

func (c *simCluster) runFn(fn *Function, req *fnv1.RunFunctionRequest) *fnv1.RunFunctionResponse {
	rsp, err := fn.RunFunction(context.Background(), req)
	if err != nil {
		c.t.Fatal(err)
	}
	for _, r := range rsp.GetResults() {
		if r.GetSeverity() == fnv1.Severity_SEVERITY_FATAL {
			c.t.Fatalf("fatal: %s", r.GetMessage())
		}
	}
	return rsp
}

// summary is one discovery replica's summary of a pool ("" the fleet's),
// now: no leases, every draining Proxy seen draining since its label says.
func (c *simCluster) summary(pool string) map[string]*fnv1.Resources {
	return c.summaryAt(pool, c.now)
}

// summaryAt is the summary as a replica whose clock reads now wrote it.
func (c *simCluster) summaryAt(pool string, now time.Time) map[string]*fnv1.Resources {
	ls := v1alpha1.LeaseSummary{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.LeaseSummaryKind},
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: leasewire.PoolSummaryName("crawlers", pool, "r1"), Labels: leasewire.SummaryLabels("crawlers", pool)},
		Spec: v1alpha1.LeaseSummarySpec{Fleet: "crawlers", Pool: pool, Replica: "r1",
			ObservedAt: metav1.MicroTime{Time: now}, ValidUntil: metav1.MicroTime{Time: now.Add(leasewire.SummaryFreshness)}},
	}
	for _, p := range c.pools {
		if pool != "" && str(p.spec, "metadata", "name") != pool {
			continue
		}
		for _, x := range p.proxies {
			if name := str(x.obj, "metadata", "name"); pool == "" && c.burned[name] {
				ls.Spec.Burned = append(ls.Spec.Burned, v1alpha1.BurnedProxy{Name: name, Reason: x.ip + " banned 1 or more times by one domain within 1h0m0s"})
			}
			if v := str(x.obj, "metadata", "labels", fleetv1alpha1.LabelDrainingSince); v != "" {
				since, _ := strconv.ParseInt(v, 10, 64)
				ls.Spec.Draining = append(ls.Spec.Draining, v1alpha1.DrainingProxy{Name: str(x.obj, "metadata", "name"), Since: since})
			}
		}
	}
	b, _ := json.Marshal(ls)
	return summaries(resource.MustStructJSON(string(b)))
}

// observedProxy is a Proxy as Crossplane observes it.
func (c *simCluster) observedProxy(x *simProxy) *fnv1.Resource {
	o := proto.Clone(x.obj).(*structpb.Struct) //nolint:forcetypeassert // A clone of a Struct.
	field(o, "metadata").GetStructValue().Fields["creationTimestamp"] = structpb.NewStringValue(x.created.Format(time.RFC3339))
	ready, since := "False", x.created
	if x.ready(c.now, c.boot) {
		ready, since = "True", x.created.Add(c.boot)
	}
	o.Fields["status"] = structpb.NewStructValue(resource.MustStructJSON(fmt.Sprintf(`{
		"conditions": [{"type": "Ready", "status": %q, "reason": "x", "lastTransitionTime": %q}],
		"atProvider": {"healthy": %t, "host": "127.0.0.1", "port": 3128, "egressIP": %q}}`, ready, since.Format(time.RFC3339), ready == "True", x.ip)))
	return &fnv1.Resource{Resource: o}
}

// observedPool is a pool as Crossplane observes it; forFleet passes it
// through the broken variant, if any, which changes only what the fleet
// sees.
func (c *simCluster) observedPool(p *simPool, forFleet bool) *fnv1.Resource {
	o := &structpb.Struct{Fields: map[string]*structpb.Value{
		"apiVersion": structpb.NewStringValue(fleetv1alpha1.SchemeGroupVersion.String()),
		"kind":       structpb.NewStringValue(fleetv1alpha1.ProxyPoolKind),
		"metadata":   structpb.NewStructValue(resource.MustStructJSON(fmt.Sprintf(`{"name": %q, "namespace": "team"}`, str(p.spec, "metadata", "name")))),
		"spec":       structpb.NewStructValue(proto.Clone(field(p.spec, "spec").GetStructValue()).(*structpb.Struct)), //nolint:forcetypeassert // A clone.
	}}
	if p.status != nil {
		st := proto.Clone(p.status).(*structpb.Struct) //nolint:forcetypeassert // A clone.
		ready := "False"
		if p.ready {
			ready = "True"
		}
		st.Fields["conditions"] = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{
			structpb.NewStructValue(resource.MustStructJSON(`{"type": "Ready", "status": "` + ready + `"}`)),
		}})
		o.Fields["status"] = structpb.NewStructValue(st)
	}
	if c.mutate != nil && forFleet {
		c.mutate(o)
	}
	return &fnv1.Resource{Resource: o}
}

// readFleet takes the fleet's observation now; the returned func applies
// the composition made from it, later.
func (c *simCluster) readFleet() func() {
	observed := map[string]*fnv1.Resource{}
	// In order of name: the lag's draws go to the same pools each run.
	for _, name := range slices.Sorted(maps.Keys(c.pools)) {
		p := c.pools[name]
		observed[name] = c.observedPool(p, true)
		if c.lag != nil {
			if v, ok := c.view[name]; ok && c.lag.Intn(3) > 0 {
				observed[name] = v
			}
			c.view[name] = observed[name]
		}
	}
	x := xr(c.spec)
	if c.fleetSt != nil {
		x.Fields["status"] = structpb.NewStructValue(proto.Clone(c.fleetSt).(*structpb.Struct)) //nolint:forcetypeassert // A clone.
		if c.mutateXR != nil {
			c.mutateXR(x)
		}
	}
	req := &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: x}, Resources: observed}, RequiredResources: c.summary("")}
	rsp := c.runFn(c.fn, req)
	return func() {
		c.fleetSt = field(rsp.GetDesired().GetComposite().GetResource(), "status").GetStructValue()
		seen := map[string]bool{}
		for name, r := range rsp.GetDesired().GetResources() {
			if !strings.HasPrefix(name, "pool-") {
				continue
			}
			seen[name] = true
			p, ok := c.pools[name]
			if !ok {
				p = &simPool{proxies: map[string]*simProxy{}}
				c.pools[name] = p
			}
			p.spec = r.GetResource()
		}
		for name, p := range c.pools {
			if !seen[name] {
				if len(p.proxies) > 0 {
					c.t.Fatalf("the fleet deleted %s, which still has %d Proxies", name, len(p.proxies))
				}
				delete(c.pools, name)
			}
		}
	}
}

// readPool takes a pool's observation now; the returned func applies its
// composition, later.
func (c *simCluster) readPool(name string) func() {
	p := c.pools[name]
	observed := map[string]*fnv1.Resource{}
	for rn, x := range p.proxies {
		observed[rn] = c.observedProxy(x)
	}
	x := c.observedPool(p, false).GetResource()
	// The discovery replicas' clocks agree with the pool's.
	required := c.summaryAt(str(p.spec, "metadata", "name"), c.now.Add(c.poolSkew))
	required[requiredFleetSummaries] = c.summaryAt("", c.now.Add(c.poolSkew))[requiredSummaries]
	req := &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: x}, Resources: observed}, RequiredResources: required}
	rsp := c.runFn(c.poolFn, req)
	return func() {
		if c.pools[name] != p {
			return // deleted meanwhile
		}
		p.status = field(rsp.GetDesired().GetComposite().GetResource(), "status").GetStructValue()
		p.ready = rsp.GetDesired().GetComposite().GetReady() == fnv1.Ready_READY_TRUE
		seen := map[string]bool{}
		for rn, r := range rsp.GetDesired().GetResources() {
			if _, ok := ordinalOf(rn); !ok {
				continue
			}
			seen[rn] = true
			if old, ok := p.proxies[rn]; ok {
				old.obj = proto.Clone(r.GetResource()).(*structpb.Struct) //nolint:forcetypeassert // A clone.
				continue
			}
			c.made++
			ip := fmt.Sprintf("10.%d.%d.1", c.made/256, c.made%256)
			p.proxies[rn] = &simProxy{obj: proto.Clone(r.GetResource()).(*structpb.Struct), created: c.now, ip: ip} //nolint:forcetypeassert // A clone.
		}
		for rn := range p.proxies {
			if !seen[rn] {
				delete(p.proxies, rn)
			}
		}
	}
}

// step runs up to three reconciles of the fleet and its pools at once:
// some read, others apply what they read earlier, in any order; then
// time moves on by 1 s to most, in whole seconds.
func (c *simCluster) step(rng *rand.Rand, most time.Duration) {
	var pending []func()
	for range 1 + rng.Intn(3) {
		if rng.Intn(3) == 0 || len(c.pools) == 0 {
			pending = append(pending, c.readFleet())
			continue
		}
		names := make([]string, 0, len(c.pools))
		for n := range c.pools {
			names = append(names, n)
		}
		sort.Strings(names)
		pending = append(pending, c.readPool(names[rng.Intn(len(names))]))
	}
	rng.Shuffle(len(pending), func(i, j int) { pending[i], pending[j] = pending[j], pending[i] })
	for _, apply := range pending {
		apply()
	}
	c.now = c.now.Add(time.Duration(1+rng.Intn(int(most/time.Second))) * time.Second)
}

// counts are the fleet's Proxies: all, Ready and taking leases, and of
// the current revision.
func (c *simCluster) counts(revision string) (total, available, updated int) {
	for _, p := range c.pools {
		for _, x := range p.proxies {
			total++
			if x.ready(c.now, c.boot) && str(x.obj, "metadata", "labels", fleetv1alpha1.LabelDrainingSince) == "" {
				available++
			}
			if str(x.obj, "metadata", "labels", fleetv1alpha1.LabelTemplateRevision) == revision {
				updated++
			}
		}
	}
	return total, available, updated
}

// rollOut runs a template change over a pooled fleet of replicas, with
// reads and writes of the fleet and its pools interleaved at random, and
// returns the fewest Proxies available (Ready, not draining) and the most
// Proxies there were at any moment of it, and whether it completed.
func rollOut(t *testing.T, seed int64, replicas, perPool int, rotation string, v variant) (fewest, most int, done bool) {
	spec := withSpec(t, "replicas", strconv.Itoa(replicas))
	spec = withSpecIn(t, spec, "pools", fmt.Sprintf(`{"proxiesPerPool": %d}`, perPool))
	spec = withSpecIn(t, spec, "rotation", rotation)
	c := newSim(t, spec)
	c.mutate, c.mutateXR = v.pools, v.xr
	if v.lag {
		c.lag, c.view = rand.New(rand.NewSource(seed+100)), map[string]*fnv1.Resource{} //nolint:gosec // A test's reproducible lag.
	}
	rng := rand.New(rand.NewSource(seed)) //nolint:gosec // A test's reproducible interleaving.
	step := func() { c.step(rng, 4*time.Second) }
	for range 400 {
		step()
	}
	f, err := parseFleet("crawlers", "team", mustMap(t, spec))
	if err != nil {
		t.Fatal(err)
	}
	if total, available, updated := c.counts(f.Revision); total != replicas || available != replicas || updated != replicas {
		t.Fatalf("the pooled fleet did not settle: %d proxies, %d available, %d of revision %s", total, available, updated, f.Revision)
	}
	// A template change.
	c.spec = withSpecIn(t, spec, "healthCheck", `{"url": "https://example.com/ip2", "interval": "10s", "timeout": "2s"}`)
	f, err = parseFleet("crawlers", "team", mustMap(t, c.spec))
	if err != nil {
		t.Fatal(err)
	}
	fewest, most = replicas, replicas
	for range 4000 {
		step()
		total, available, updated := c.counts(f.Revision)
		fewest, most = min(fewest, available), max(most, total)
		if updated == replicas && total == replicas && available == replicas {
			return fewest, most, true
		}
	}
	return fewest, most, false
}

func withSpecIn(t *testing.T, spec, field, raw string) string {
	t.Helper()
	m := mustMap(t, spec)
	var v any
	if err := json.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatal(err)
	}
	m[field] = v
	b, _ := json.Marshal(m)
	return string(b)
}

func mustMap(t testing.TB, spec string) map[string]any {
	t.Helper()
	m := map[string]any{}
	if err := json.Unmarshal([]byte(spec), &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// variant is how the simulated fleet sees: with its pools' views lagging
// behind its own writes (lag), and through a broken variant.
type variant struct {
	lag       bool
	pools, xr func(*structpb.Struct)
}
