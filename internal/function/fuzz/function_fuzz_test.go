// Package fuzz fuzzes function-proxyfleet with arbitrary composite
// resources and observed resources, checking what it composes against the
// real apiserver's validation of the Proxy CRD.
package fuzz_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	fnv1 "github.com/crossplane/function-sdk-go/proto/v1"
	"google.golang.org/protobuf/types/known/structpb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/function"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testbed"
)

var sharedBed testbed.Lazy

// TestMain starts one test bed for a fuzzing coordinator's workers.
func TestMain(m *testing.M) { sharedBed.FuzzMain(m) }

// seedTime is when the render examples' observed Proxies were observed.
var seedTime = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// namesField is how a Fatal result names the field at fault.
var namesField = regexp.MustCompile(`(^|[\s(])(spec|metadata)[.\[]`)

// FuzzFunction composes arbitrary fleets: an XR and the observed resources,
// each any JSON. Properties: no panic (the function turns one into a Fatal
// "failed unexpectedly", a failure here); either a Fatal result that names
// the field at fault, or desired resources that the real apiserver accepts
// (a dry-run create, so the Proxy CRD's schema and CEL rules judge them).
func FuzzFunction(f *testing.F) {
	bed := sharedBed.Env(f)
	ns := bed.Namespace(f)
	for _, s := range seeds(f, bed.Root) {
		f.Add(s[0], s[1])
	}
	fn := function.New(function.Config{Log: logging.NewNopLogger(), Now: func() time.Time { return seedTime }})
	f.Fuzz(func(t *testing.T, xrJSON, observedJSON string) {
		req, ok := request(xrJSON, observedJSON)
		if !ok {
			return // not JSON objects: Crossplane sends nothing else
		}
		rsp, err := fn.RunFunction(context.Background(), req)
		if err != nil {
			t.Fatalf("RunFunction returned an error rather than a result: %v", err)
		}
		if err := check(bed, ns, rsp); err != nil {
			t.Fatalf("%v\nXR: %s\nobserved: %s", err, xrJSON, observedJSON)
		}
	})
}

// check says what is wrong with a response: a Fatal result that does not
// name a field, or a desired resource the apiserver refuses.
func check(bed *testbed.Env, ns string, rsp *fnv1.RunFunctionResponse) error {
	for _, r := range rsp.GetResults() {
		if r.GetSeverity() != fnv1.Severity_SEVERITY_FATAL {
			continue
		}
		if strings.Contains(r.GetMessage(), "failed unexpectedly") || !namesField.MatchString(r.GetMessage()) {
			return errors.Errorf("a Fatal result must name the field at fault; got %q", r.GetMessage())
		}
		return nil
	}
	for name, r := range rsp.GetDesired().GetResources() {
		b, err := r.GetResource().MarshalJSON()
		if err != nil {
			return err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			return errors.Errorf("desired resource %s is no Kubernetes object: %v\n%s", name, err, b)
		}
		// Crossplane names composed resources and puts them in the XR's
		// namespace.
		u.SetNamespace(ns)
		if u.GetName() == "" {
			u.SetGenerateName("fuzz-")
		}
		if err := bed.Client.Create(context.Background(), u, client.DryRunAll); err != nil {
			return errors.Errorf("desired resource %s is invalid: %v\n%s", name, err, b)
		}
	}
	return nil
}

// TestSeedsCompose keeps the fuzzing honest: every seed composes Proxies
// (or, a pooled fleet, ProxyPools)
// (a seed that ends in a Fatal result would leave the dry-run unexercised),
// and the check refuses a Proxy the CRD refuses, and a Fatal result that
// names no field.
func TestSeedsCompose(t *testing.T) {
	bed := sharedBed.Env(t)
	ns := bed.Namespace(t)
	fn := function.New(function.Config{Log: logging.NewNopLogger(), Now: func() time.Time { return seedTime }})
	for _, s := range seeds(t, bed.Root) {
		req, ok := request(s[0], s[1])
		if !ok {
			t.Fatalf("seed is not JSON: %s", s[0])
		}
		rsp, err := fn.RunFunction(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		proxies := 0
		for _, r := range rsp.GetDesired().GetResources() {
			// A pooled fleet composes ProxyPools, a pool its Proxies.
			if k := r.GetResource().GetFields()["kind"].GetStringValue(); k == "Proxy" || k == "ProxyPool" {
				proxies++
			}
		}
		if proxies == 0 || len(rsp.GetResults()) > 0 && rsp.GetResults()[0].GetSeverity() == fnv1.Severity_SEVERITY_FATAL {
			t.Errorf("seed composed %d Proxies or ProxyPools, results %v\n%s", proxies, rsp.GetResults(), s[0])
			continue
		}
		if err := check(bed, ns, rsp); err != nil {
			t.Errorf("seed: %v", err)
		}
		// The mutations: a Proxy without its health check, and a Fatal
		// result without a field.
		for name, r := range rsp.GetDesired().GetResources() {
			if r.GetResource().GetFields()["kind"].GetStringValue() != "Proxy" {
				continue
			}
			fp := r.GetResource().GetFields()["spec"].GetStructValue().GetFields()["forProvider"].GetStructValue()
			delete(fp.GetFields(), "healthCheck")
			if err := check(bed, ns, rsp); err == nil {
				t.Errorf("the check accepted Proxy %s without spec.forProvider.healthCheck", name)
			}
			break
		}
		rsp.Results = []*fnv1.Result{{Severity: fnv1.Severity_SEVERITY_FATAL, Message: "cannot compose the fleet"}}
		if err := check(bed, ns, rsp); err == nil {
			t.Error("the check accepted a Fatal result naming no field")
		}
	}
}

// request builds a RunFunctionRequest from an XR and an array of observed
// resources, keyed by their composition-resource-name annotation.
func request(xrJSON, observedJSON string) (*fnv1.RunFunctionRequest, bool) {
	xr := &structpb.Struct{}
	if err := xr.UnmarshalJSON([]byte(xrJSON)); err != nil {
		return nil, false
	}
	req := &fnv1.RunFunctionRequest{Observed: &fnv1.State{Composite: &fnv1.Resource{Resource: xr}, Resources: map[string]*fnv1.Resource{}}}
	var observed []json.RawMessage
	if observedJSON != "" {
		if err := json.Unmarshal([]byte(observedJSON), &observed); err != nil {
			return nil, false
		}
	}
	for _, raw := range observed {
		o := &structpb.Struct{}
		if err := o.UnmarshalJSON(raw); err != nil {
			return nil, false
		}
		meta := o.GetFields()["metadata"].GetStructValue()
		name := meta.GetFields()["annotations"].GetStructValue().GetFields()["crossplane.io/composition-resource-name"].GetStringValue()
		req.Observed.Resources[name] = &fnv1.Resource{Resource: o}
	}
	return req, true
}

// seeds are the example fleets and the render examples with their observed
// Proxies, as JSON.
func seeds(f testing.TB, root string) [][2]string {
	var out [][2]string
	fleets, _ := filepath.Glob(filepath.Join(root, "examples", "*", "proxyfleet*.yaml"))
	renders, _ := filepath.Glob(filepath.Join(root, "examples", "render", "*", "xr.yaml"))
	for _, p := range append(fleets, renders...) {
		docs := documents(f, p)
		if len(docs) == 0 {
			f.Fatalf("%s holds no document", p)
		}
		var observed []json.RawMessage
		for _, d := range documents(f, filepath.Join(filepath.Dir(p), "observed-resources.yaml")) {
			observed = append(observed, d)
		}
		o, err := json.Marshal(observed)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, [2]string{string(docs[0]), string(o)})
	}
	if len(out) < 5 {
		f.Fatalf("found only %d seed fleets under examples/", len(out))
	}
	return out
}

// documents returns the YAML documents in path as JSON; none when there
// is no such file.
func documents(f testing.TB, path string) [][]byte {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		f.Fatal(err)
	}
	var out [][]byte
	for _, d := range bytes.Split(b, []byte("\n---")) {
		j, err := yaml.YAMLToJSON(d)
		if err != nil {
			f.Fatalf("%s: %v", path, err)
		}
		if string(j) != "null" {
			out = append(out, j)
		}
	}
	return out
}
