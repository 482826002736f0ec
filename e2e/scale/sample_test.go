//go:build scale

package scale

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	fleetv1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/fleet/v1alpha1"
)

// sampled is one reading of every counter the window compares.
type sampled struct {
	at  time.Time
	api metrics
	xp  metrics
	fn  metrics
	// prov is the provider's.
	prov metrics
	cpu  map[string]float64 // seconds
	rss  map[string]float64
}

var components = []string{"kube-apiserver", "etcd", "crossplane", "provider-egressproxy", "function-proxyfleet", "egress-discovery"}

func (e *env) sample(t *testing.T) sampled {
	t.Helper()
	s, err := e.read()
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// read samples every counter, or says why it cannot.
func (e *env) read() (sampled, error) {
	s := sampled{at: time.Now(), cpu: map[string]float64{}, rss: map[string]float64{}}
	body, err := e.cs.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		return s, err
	}
	s.api = parseMetrics(string(body))
	for comp, dst := range map[string]*metrics{"crossplane": &s.xp, "function-proxyfleet": &s.fn, "provider-egressproxy": &s.prov} {
		url, err := e.stack.MetricsURL(comp)
		if err != nil {
			return s, err
		}
		rsp, err := http.Get(url) //nolint:noctx // A test's scrape.
		if err != nil {
			return s, err
		}
		b := new(strings.Builder)
		_, _ = bufio.NewReader(rsp.Body).WriteTo(b)
		_ = rsp.Body.Close()
		*dst = parseMetrics(b.String())
	}
	procs := e.stack.Processes()
	// envtest starts etcd and kube-apiserver as this process's children.
	for _, c := range []string{"kube-apiserver", "etcd"} {
		if procs[c] == 0 {
			procs[c] = childPID(c)
		}
	}
	for _, c := range components {
		cpu, rss, err := procStat(procs[c])
		if err != nil {
			return s, fmt.Errorf("%s: %w", c, err)
		}
		s.cpu[c], s.rss[c] = cpu, rss
	}
	s.cpu["test"], _, _ = procStat(os.Getpid())
	return s, nil
}

// childPID is the process ID of this process's child named name, or 0.
func childPID(name string) int {
	dirs, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, d := range dirs {
		b, err := os.ReadFile(d)
		if err != nil {
			continue
		}
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open || s[open+1:end] != name {
			continue
		}
		f := strings.Fields(s[end+2:])
		if ppid, _ := strconv.Atoi(f[1]); ppid == os.Getpid() {
			pid, _ := strconv.Atoi(strings.TrimSpace(s[:open]))
			return pid
		}
	}
	return 0
}

// procStat is a process's CPU time (user + system, seconds) and resident
// memory (bytes).
func procStat(pid int) (float64, float64, error) {
	if pid == 0 {
		return 0, 0, fmt.Errorf("not running")
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	// Fields after the command name in parentheses.
	f := strings.Fields(string(b)[strings.LastIndexByte(string(b), ')')+2:])
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	rssPages, _ := strconv.ParseFloat(f[21], 64)
	return (utime + stime) / 100, rssPages * float64(os.Getpagesize()), nil
}

// metrics are samples of the Prometheus text format: name{labels} -> value.
type metrics map[string]float64

var sampleLine = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? ([^ ]+)`)

func parseMetrics(text string) metrics {
	m := metrics{}
	for _, line := range strings.Split(text, "\n") {
		g := sampleLine.FindStringSubmatch(line)
		if g == nil {
			continue
		}
		v, err := strconv.ParseFloat(g[3], 64)
		if err == nil {
			m[g[1]+g[2]] = v
		}
	}
	return m
}

var labelRE = regexp.MustCompile(`([a-zA-Z_]+)="([^"]*)"`)

func labels(key string) (string, map[string]string) {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key, nil
	}
	out := map[string]string{}
	for _, g := range labelRE.FindAllStringSubmatch(key[i:], -1) {
		out[g[1]] = g[2]
	}
	return key[:i], out
}

// sum adds the deltas of name's samples for which keep says yes, grouped
// by group.
func sum(before, after metrics, name string, keep func(map[string]string) (string, bool)) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		n, l := labels(k)
		if n != name {
			continue
		}
		if g, ok := keep(l); ok {
			out[g] += v - before[k]
		}
	}
	return out
}

// timed is a histogram's count, mean and p99 between two samples.
func timed(before, after metrics, name string, match func(map[string]string) bool) timing {
	total := func(suffix string) float64 {
		var v float64
		for _, x := range sum(before, after, name+suffix, func(l map[string]string) (string, bool) { return "", match(l) }) {
			v += x
		}
		return v
	}
	t := timing{count: total("_count"), p99: quantile(before, after, name, match, 0.99)}
	if t.count > 0 {
		t.mean = total("_sum") / t.count
	}
	return t
}

// quantile estimates q of a histogram's deltas between two samples as
// Prometheus' histogram_quantile does: linearly within the bucket it falls
// in (the bucket's lower bound when that is +Inf).
func quantile(before, after metrics, name string, match func(map[string]string) bool, q float64) float64 {
	type bucket struct{ le, count float64 }
	var bs []bucket
	for k, v := range after {
		n, l := labels(k)
		if n != name+"_bucket" || !match(l) {
			continue
		}
		le, err := strconv.ParseFloat(l["le"], 64)
		if l["le"] == "+Inf" {
			le, err = math.Inf(1), nil
		}
		if err != nil {
			continue
		}
		bs = append(bs, bucket{le, v - before[k]})
	}
	merged := map[float64]float64{}
	for _, b := range bs {
		merged[b.le] += b.count
	}
	bs = bs[:0]
	for le, c := range merged {
		bs = append(bs, bucket{le, c})
	}
	sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
	if len(bs) == 0 || bs[len(bs)-1].count == 0 {
		return 0
	}
	want := q * bs[len(bs)-1].count
	lower, below := 0.0, 0.0
	for _, b := range bs {
		if b.count >= want {
			if math.IsInf(b.le, 1) || b.count == below {
				return lower
			}
			return lower + (b.le-lower)*(want-below)/(b.count-below)
		}
		lower, below = b.le, b.count
	}
	return lower
}

// requests are the apiserver's requests between two samples by verb and
// resource ("PUT proxies/status").
func requests(before, after sampled) map[string]float64 {
	return sum(before.api, after.api, "apiserver_request_total", func(l map[string]string) (string, bool) {
		res := l["resource"]
		if l["subresource"] != "" {
			res += "/" + l["subresource"]
		}
		return l["verb"] + " " + res, true
	})
}

func (e *env) diff(r *result, before, after sampled) {
	r.requests = requests(before, after)
	r.proxyStatusWrites = 0
	for k, v := range r.requests {
		if k == "PUT proxies/status" || k == "PATCH proxies/status" || k == "APPLY proxies/status" {
			r.proxyStatusWrites += v
		}
	}
	composite := func(l map[string]string) bool { return strings.HasPrefix(l["controller"], "composite/") }
	xr := sum(before.xp, after.xp, "controller_runtime_reconcile_total", func(l map[string]string) (string, bool) { return "", composite(l) })
	r.xrReconciles = xr[""]
	r.xrReconcileP99 = map[string]float64{}
	for level, plural := range map[string]string{"fleet": "proxyfleets.", "pool": "proxypools."} {
		r.xrReconcileP99[level] = quantile(before.xp, after.xp, "controller_runtime_reconcile_time_seconds", func(l map[string]string) bool {
			return composite(l) && strings.Contains(l["controller"], plural)
		}, 0.99)
	}
	r.timing = map[string]timing{}
	for level, plural := range map[string]string{"fleet": "proxyfleets.", "pool": "proxypools."} {
		match := func(l map[string]string) bool { return composite(l) && strings.Contains(l["controller"], plural) }
		r.timing[level+" reconciles"] = timed(before.xp, after.xp, "controller_runtime_reconcile_time_seconds", match)
	}
	for _, res := range []string{"proxypools", "proxies", "proxyfleets"} {
		match := func(l map[string]string) bool {
			return l["verb"] == "APPLY" && l["resource"] == res && l["subresource"] == ""
		}
		r.timing["APPLY "+res] = timed(before.api, after.api, "apiserver_request_duration_seconds", match)
	}
	r.runP99 = map[string]float64{}
	for _, kind := range []string{"ProxyFleet", fleetv1alpha1.ProxyPoolKind} {
		r.runP99[kind] = quantile(before.fn, after.fn, "function_proxyfleet_run_seconds", func(l map[string]string) bool { return l["kind"] == kind }, 0.99)
	}
	r.largest = map[string]float64{}
	for k, v := range after.fn {
		if n, l := labels(k); n == "function_proxyfleet_largest_message_bytes" {
			r.largest[l["kind"]+" "+l["direction"]] = v
		}
	}
	r.cpu, r.rss = map[string]float64{}, after.rss
	for _, c := range components {
		r.cpu[c] = (after.cpu[c] - before.cpu[c]) / after.at.Sub(before.at).Seconds()
	}
}
