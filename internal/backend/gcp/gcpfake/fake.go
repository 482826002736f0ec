// Package gcpfake is an in-process fake of the parts of the Compute Engine
// REST API the gcp backend uses: instances (insert, get, delete,
// aggregatedList with label filters), zone operations and firewalls. It
// answers with the same JSON bodies and error bodies as GCP, so the real
// client library runs against it unchanged, and tests can script state
// transitions and failures.
package gcpfake

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/option"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"k8s.io/utils/ptr"
)

// Failure is a scripted error answer.
type Failure struct {
	// Code is the HTTP status.
	Code int
	// Reason is GCP's machine-readable reason, such as quotaExceeded.
	Reason string
	// Message is GCP's human-readable message.
	Message string
	// Times is how many calls fail; a negative number means all of them.
	Times int
}

// Server is a running fake Compute API.
type Server struct {
	*httptest.Server

	mu        sync.Mutex
	now       func() time.Time
	instances map[string]*computepb.Instance // zone/name
	firewalls map[string]*computepb.Firewall
	ops       map[string]*computepb.Operation
	failures  map[string]*Failure
	calls     map[string]int
	seq       int
	// OnInsert, when set, decides the status a new VM starts in; nil means
	// PROVISIONING.
	OnInsert func(vm *computepb.Instance)
}

// Start starts a fake, stopped with the test.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		now: time.Now, instances: map[string]*computepb.Instance{}, firewalls: map[string]*computepb.Firewall{},
		ops: map[string]*computepb.Operation{}, failures: map[string]*Failure{}, calls: map[string]int{},
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// ClientOptions point the real client library at the fake.
func (s *Server) ClientOptions() []option.ClientOption {
	return []option.ClientOption{option.WithEndpoint(s.URL), option.WithoutAuthentication(), option.WithHTTPClient(s.Client())}
}

// SetClock makes the fake stamp creationTimestamps with now.
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// Fail scripts failures of a method: instances.insert, instances.get,
// instances.delete, instances.aggregatedList, firewalls.insert,
// firewalls.get, firewalls.delete, or operations.get (the insert operation
// then reports the error, as GCP does for failures found after accepting).
func (s *Server) Fail(method string, f Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[method] = &f
}

// Calls returns how often a method was called.
func (s *Server) Calls(method string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[method]
}

// SetStatus moves a VM to status, with natIP as its external address.
func (s *Server) SetStatus(zone, name, status, natIP string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	vm, ok := s.instances[zone+"/"+name]
	if !ok {
		return false
	}
	vm.Status = ptr.To(status)
	for _, ni := range vm.GetNetworkInterfaces() {
		for _, ac := range ni.GetAccessConfigs() {
			ac.NatIP = nil
			if natIP != "" {
				ac.NatIP = ptr.To(natIP)
			}
		}
	}
	return true
}

// Instance returns a copy of a VM, or nil.
func (s *Server) Instance(zone, name string) *computepb.Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	if vm, ok := s.instances[zone+"/"+name]; ok {
		return proto.Clone(vm).(*computepb.Instance)
	}
	return nil
}

// Instances returns the number of VMs.
func (s *Server) Instances() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.instances)
}

// Firewall returns a copy of a firewall rule, or nil.
func (s *Server) Firewall(name string) *computepb.Firewall {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fw, ok := s.firewalls[name]; ok {
		return proto.Clone(fw).(*computepb.Firewall)
	}
	return nil
}

// PutInstance stores a VM as it is, for tests that need one the backend did
// not create.
func (s *Server) PutInstance(zone string, vm *computepb.Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vm.Zone = ptr.To(s.URL + "/compute/v1/projects/p/zones/" + zone)
	s.instances[zone+"/"+vm.GetName()] = vm
}

var (
	reInstances  = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances(?:/([^/]+))?$`)
	reOperation  = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/zones/([^/]+)/operations/([^/]+)$`)
	reFirewalls  = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/global/firewalls(?:/([^/]+))?$`)
	reAggregated = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/aggregated/instances$`)
	reLabel      = regexp.MustCompile(`labels\.([a-z0-9_-]+)\s*=\s*"([^"]*)"`)
)

// Method names of the Compute API calls the fake serves, as Calls and
// failures name them.
const (
	opInstancesInsert = "instances.insert"
	opInstancesGet    = "instances.get"
	opInstancesDelete = "instances.delete"
	opInstancesList   = "instances.aggregatedList"
	opOperationsGet   = "operations.get"
	opFirewallsInsert = "firewalls.insert"
	opFirewallsGet    = "firewalls.get"
	opFirewallsDelete = "firewalls.delete"
)

// route names the API method of a request and returns its path parameters.
func route(r *http.Request) (string, []string) {
	switch {
	case reInstances.MatchString(r.URL.Path):
		return map[string]string{http.MethodPost: opInstancesInsert, http.MethodGet: opInstancesGet, http.MethodDelete: opInstancesDelete}[r.Method],
			reInstances.FindStringSubmatch(r.URL.Path)
	case reOperation.MatchString(r.URL.Path):
		return opOperationsGet, reOperation.FindStringSubmatch(r.URL.Path)
	case reFirewalls.MatchString(r.URL.Path):
		return map[string]string{http.MethodPost: opFirewallsInsert, http.MethodGet: opFirewallsGet, http.MethodDelete: opFirewallsDelete}[r.Method],
			reFirewalls.FindStringSubmatch(r.URL.Path)
	case reAggregated.MatchString(r.URL.Path):
		return opInstancesList, reAggregated.FindStringSubmatch(r.URL.Path)
	}
	return "", nil
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	method, m := route(r)
	if method == "" {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The requested URL %s was not found on this server.", r.URL.Path))
		return
	}
	s.calls[method]++
	if f := s.failures[method]; f != nil && f.Times != 0 && method != opOperationsGet {
		if f.Times > 0 {
			f.Times--
		}
		writeError(w, f.Code, f.Reason, f.Message)
		return
	}
	handlers := map[string]func(){
		opInstancesInsert: func() { s.insertInstance(w, r, m[1], m[2]) },
		opInstancesGet:    func() { s.getInstance(w, m[1], m[2], m[3]) },
		opInstancesDelete: func() { s.deleteInstance(w, m[1], m[2], m[3]) },
		opInstancesList:   func() { s.aggregatedList(w, r) },
		opOperationsGet: func() {
			if op, ok := s.ops[m[3]]; ok {
				writeProto(w, op)
				return
			}
			writeError(w, http.StatusNotFound, "notFound", "operation not found")
		},
		opFirewallsInsert: func() { s.insertFirewall(w, r, m[1]) },
		opFirewallsGet:    func() { s.getFirewall(w, m[1], m[2]) },
		opFirewallsDelete: func() { s.deleteFirewall(w, m[1], m[2]) },
	}
	handlers[method]()
}

func (s *Server) getInstance(w http.ResponseWriter, project, zone, name string) {
	vm, ok := s.instances[zone+"/"+name]
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", project, zone, name))
		return
	}
	writeProto(w, vm)
}

func (s *Server) deleteInstance(w http.ResponseWriter, project, zone, name string) {
	if _, ok := s.instances[zone+"/"+name]; !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' was not found", project, zone, name))
		return
	}
	delete(s.instances, zone+"/"+name)
	writeProto(w, s.op(project, zone, "delete", name, nil))
}

func (s *Server) insertFirewall(w http.ResponseWriter, r *http.Request, project string) {
	fw := &computepb.Firewall{}
	if !readProto(w, r, fw) {
		return
	}
	if _, ok := s.firewalls[fw.GetName()]; ok {
		writeError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' already exists", project, fw.GetName()))
		return
	}
	fw.CreationTimestamp = ptr.To(s.now().Format(time.RFC3339))
	s.firewalls[fw.GetName()] = fw
	writeProto(w, s.op(project, "", "insert", fw.GetName(), nil))
}

func (s *Server) getFirewall(w http.ResponseWriter, project, name string) {
	fw, ok := s.firewalls[name]
	if !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' was not found", project, name))
		return
	}
	writeProto(w, fw)
}

func (s *Server) deleteFirewall(w http.ResponseWriter, project, name string) {
	if _, ok := s.firewalls[name]; !ok {
		writeError(w, http.StatusNotFound, "notFound", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' was not found", project, name))
		return
	}
	delete(s.firewalls, name)
	writeProto(w, s.op(project, "", "delete", name, nil))
}

func (s *Server) insertInstance(w http.ResponseWriter, r *http.Request, project, zone string) {
	vm := &computepb.Instance{}
	if !readProto(w, r, vm) {
		return
	}
	for _, check := range []struct {
		bad bool
		msg string
	}{
		{vm.GetName() == "", "Invalid value for field 'resource.name': ''. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"},
		{!strings.HasPrefix(vm.GetMachineType(), "zones/"+zone+"/machineTypes/") || strings.HasSuffix(vm.GetMachineType(), "/bogus"), fmt.Sprintf("Invalid value for field 'resource.machineType': '%s'. Machine type with name 'bogus' does not exist in zone '%s'.", vm.GetMachineType(), zone)},
	} {
		if check.bad {
			writeError(w, http.StatusBadRequest, "invalid", check.msg)
			return
		}
	}
	key := zone + "/" + vm.GetName()
	if _, ok := s.instances[key]; ok {
		writeError(w, http.StatusConflict, "alreadyExists", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", project, zone, vm.GetName()))
		return
	}
	var opErr *computepb.Error
	if f := s.failures["operations.get"]; f != nil && f.Times != 0 {
		// Accepted, then failed: the operation carries the error and no VM
		// appears.
		if f.Times > 0 {
			f.Times--
		}
		opErr = &computepb.Error{Errors: []*computepb.Errors{{Code: ptr.To(strings.ToUpper(f.Reason)), Message: ptr.To(f.Message)}}}
		op := s.op(project, zone, "insert", vm.GetName(), opErr)
		op.HttpErrorStatusCode = ptr.To(int32(f.Code))
		op.HttpErrorMessage = ptr.To(http.StatusText(f.Code))
		writeProto(w, op)
		return
	}
	s.seq++
	vm.Id = ptr.To(uint64(1000 + s.seq))
	vm.Status = ptr.To("PROVISIONING")
	vm.CreationTimestamp = ptr.To(s.now().Format(time.RFC3339))
	vm.Zone = ptr.To(s.URL + "/compute/v1/projects/" + project + "/zones/" + zone)
	vm.SelfLink = ptr.To(s.URL + "/compute/v1/projects/" + project + "/zones/" + zone + "/instances/" + vm.GetName())
	if s.OnInsert != nil {
		s.OnInsert(vm)
	}
	s.instances[key] = vm
	writeProto(w, s.op(project, zone, "insert", vm.GetName(), nil))
}

// aggregatedList honours filters of the form labels.K = "V" [AND ...],
// which is what the backend sends.
func (s *Server) aggregatedList(w http.ResponseWriter, r *http.Request) {
	want := map[string]string{}
	for _, m := range reLabel.FindAllStringSubmatch(r.URL.Query().Get("filter"), -1) {
		want[m[1]] = m[2]
	}
	items := map[string]*computepb.InstancesScopedList{}
	keys := make([]string, 0, len(s.instances))
	for k := range s.instances {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		vm := s.instances[k]
		match := true
		for lk, lv := range want {
			if vm.GetLabels()[lk] != lv {
				match = false
			}
		}
		if !match {
			continue
		}
		zone := "zones/" + strings.SplitN(k, "/", 2)[0]
		if items[zone] == nil {
			items[zone] = &computepb.InstancesScopedList{}
		}
		items[zone].Instances = append(items[zone].Instances, vm)
	}
	writeProto(w, &computepb.InstanceAggregatedList{Id: ptr.To("projects/p/aggregated/instances"), Items: items})
}

func (s *Server) op(project, zone, kind, target string, opErr *computepb.Error) *computepb.Operation {
	s.seq++
	op := &computepb.Operation{
		Name:          ptr.To(fmt.Sprintf("operation-%d", s.seq)),
		OperationType: ptr.To(kind),
		Status:        ptr.To(computepb.Operation_DONE),
		Progress:      ptr.To(int32(100)),
		TargetLink:    ptr.To(target),
		Error:         opErr,
	}
	if zone != "" {
		op.Zone = ptr.To(s.URL + "/compute/v1/projects/" + project + "/zones/" + zone)
		s.ops[op.GetName()] = op
	}
	return op
}

func readProto(w http.ResponseWriter, r *http.Request, m proto.Message) bool {
	b, err := io.ReadAll(r.Body)
	if err == nil {
		err = protojson.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, m)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "parseError", "Parse Error: "+err.Error())
		return false
	}
	return true
}

func writeProto(w http.ResponseWriter, m proto.Message) {
	b, err := protojson.Marshal(m)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	_, _ = w.Write(b)
}

// writeError answers with GCP's JSON error body.
func writeError(w http.ResponseWriter, code int, reason, msg string) {
	domain := "global"
	if reason == "quotaExceeded" || reason == "rateLimitExceeded" {
		domain = "usageLimits"
	}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"code": code, "message": msg,
		"errors": []any{map[string]any{"message": msg, "domain": domain, "reason": reason}},
	}})
}
