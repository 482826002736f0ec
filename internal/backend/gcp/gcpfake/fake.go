// Package gcpfake is an in-process fake of the parts of the Compute Engine
// REST API the gcp backend uses: instances (insert, get, delete,
// aggregatedList with the documented filter grammar), zone and global
// operations (get, and wait, which holds the request until the operation
// is done), firewalls (insert, get, update, delete), and an OAuth token
// endpoint. It answers with GCP's JSON bodies and error bodies (the legacy
// errors[] list and, in details, the google.rpc.ErrorInfo GCP gives), so
// the real client library runs against it unchanged.
//
// It is as strict as Compute Engine where the backend could go wrong: it
// validates names, labels, tags, machine types, images, disk types,
// metadata sizes, networks and subnetworks and firewall ranges; operations
// stay RUNNING for a while and may fail after the request was accepted;
// a deleted VM stays STOPPING and keeps its name; and it can demand a
// bearer token signed by a service-account key.
//
// fake.go holds the Server, its test controls (clock, networks, scripted
// failures, quotas, permissions denied on subnetworks) and the API methods it serves; validate.go refuses
// what Compute Engine would refuse; filter.go parses and applies list
// filters; errors.go holds GCP's failures as tests script them (stockout,
// quota, organisation policy, IAM); auth.go the OAuth token endpoint and
// the check of service-account credentials.
package gcpfake

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"sort"
	"strconv"
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
	// Reason is GCP's machine-readable reason, such as quotaExceeded; in
	// an operation, its error code, such as QUOTA_EXCEEDED.
	Reason string
	// Domain of the reason; empty means GCP's usual one for it.
	Domain string
	// Info is the reason of the google.rpc.ErrorInfo in the body's
	// details; empty means the one GCP gives with Reason, if any.
	Info string
	// Message is GCP's human-readable message.
	Message string
	// Times is how many calls fail: zero means one, a negative number
	// all of them.
	Times int
}

// Server is a running fake Compute API.
type Server struct {
	*httptest.Server

	mu          sync.Mutex
	now         func() time.Time
	opDuration  time.Duration
	instances   map[string]*computepb.Instance // zone/name
	firewalls   map[string]*firewall           // project/name
	networks    map[string]bool                // projects/P/global/networks/N -> auto mode
	removed     map[string]bool                // default networks removed
	subnetworks map[string]string              // projects/P/regions/R/subnetworks/S -> its network
	ops         map[string]*operation          // name
	running     map[string]*operation          // name: the ops not done yet
	// sorted are the keys of instances in order, and zoned the zones they
	// are in, kept until instances change (nil then): a list at 10 000
	// VMs neither sorts nor splits them all again.
	sorted      []string
	zoned       []string
	failures    map[string]*Failure
	opFailures  map[string]*Failure
	calls       map[string]int
	listed      int // VMs the aggregated lists returned
	seq         int
	auth        *authority
	quotas      map[string]int  // metric -> limit; regional metrics per region
	denied      map[string]bool // permission + " " + resource the caller lacks
	unreachable map[string]bool // zones aggregatedList cannot reach
	// BootAfter, when positive, has a VM boot on its own as on GCP: STAGING
	// once its insert operation is done, RUNNING BootAfter later, each of
	// its access configs then given an external address of its own. Zero
	// leaves VMs PROVISIONING until a test moves them (SetStatus).
	BootAfter time.Duration
	booting   map[string]time.Time // zone/name -> when it runs
	natSeq    int
	// OnInsert, when set, decides the status a new VM starts in; nil means
	// PROVISIONING.
	OnInsert func(vm *computepb.Instance)
	// OnRemove, when set, is told of each VM once it is gone (its delete
	// operation done), under the fake's lock.
	OnRemove func(vm *computepb.Instance)
}

// A firewall rule exists once its insert operation is done, and keeps
// existing, unchangeable, until its delete operation is.
type firewall struct {
	fw      *computepb.Firewall
	ready   bool
	pending bool // an operation on it is running
}

// operation is a long-running operation and what happens when it ends.
type operation struct {
	op      *computepb.Operation
	project string
	scope   string // zones/Z or global
	due     time.Time
	failure *Failure
	// finish applies the operation's effect; failed says it ended in error.
	finish func(failed bool)
}

// DefaultOperationDuration is how long operations run unless a test says
// otherwise: long enough that a backend which does not wait for them
// notices.
const DefaultOperationDuration = 50 * time.Millisecond

// Start starts a fake, stopped with the test. Every project has an
// auto-mode network named default, as new projects do.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{
		now: time.Now, opDuration: DefaultOperationDuration,
		instances: map[string]*computepb.Instance{}, firewalls: map[string]*firewall{},
		networks: map[string]bool{}, removed: map[string]bool{}, subnetworks: map[string]string{},
		ops: map[string]*operation{}, running: map[string]*operation{}, failures: map[string]*Failure{}, opFailures: map[string]*Failure{}, calls: map[string]int{},
		quotas: map[string]int{}, unreachable: map[string]bool{}, denied: map[string]bool{},
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	t.Cleanup(s.Close)
	return s
}

// ClientOptions point the real client library at the fake, without
// credentials.
func (s *Server) ClientOptions() []option.ClientOption {
	return []option.ClientOption{option.WithEndpoint(s.URL), option.WithoutAuthentication(), option.WithHTTPClient(s.Client())}
}

// EndpointOptions point the client library at the fake and leave
// authentication to the caller's credentials.
func (s *Server) EndpointOptions() []option.ClientOption {
	return []option.ClientOption{option.WithEndpoint(s.URL)}
}

// SetClock makes the fake stamp creationTimestamps, and time operations,
// with now.
func (s *Server) SetClock(now func() time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.now = now
}

// SetOperationDuration sets how long new operations stay RUNNING, and so
// how long a deleted VM stays STOPPING.
func (s *Server) SetOperationDuration(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opDuration = d
}

// AddNetwork adds a VPC network: auto mode has a subnetwork in every
// region; custom mode needs VMs to name one.
func (s *Server) AddNetwork(project, name string, auto bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.networks[fmt.Sprintf("projects/%s/global/networks/%s", project, name)] = auto
}

// RemoveNetwork removes a network, as organisations without a default
// network have.
func (s *Server) RemoveNetwork(project, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := fmt.Sprintf("projects/%s/global/networks/%s", project, name)
	delete(s.networks, key)
	s.removed[key] = true
}

// AddSubnetwork adds a subnetwork of network (projects/P/global/networks/N)
// in region.
func (s *Server) AddSubnetwork(project, region, name, network string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subnetworks[fmt.Sprintf("projects/%s/regions/%s/subnetworks/%s", project, region, name)] = network
}

// Deny takes permission on resource (a subnetwork's
// projects/P/regions/R/subnetworks/S) from the caller, as a Shared VPC host
// project that grants compute.subnetworks.use but not
// compute.subnetworks.useExternalIp does; Grant gives it back. The fake
// checks compute.subnetworks.use and compute.subnetworks.useExternalIp on
// the subnetworks an inserted VM's interfaces name.
func (s *Server) Deny(permission, resource string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.denied[permission+" "+resource] = true
}

// Grant gives back a permission Deny took.
func (s *Server) Grant(permission, resource string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.denied, permission+" "+resource)
}

// Fail scripts failures of a method: instances.insert, instances.get,
// instances.delete, instances.aggregatedList, firewalls.insert,
// firewalls.get, firewalls.update, firewalls.delete, operations.get or
// operations.wait. A
// Failure without a Code clears the method's script.
func (s *Server) Fail(method string, f Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[method] = script(f)
}

func script(f Failure) *Failure {
	if f.Code == 0 {
		return nil
	}
	if f.Times == 0 {
		f.Times = 1
	}
	return &f
}

// FailOperation makes the next accepted instances.insert or
// firewalls.insert end in error: the request is answered with a running
// operation, which later reports f, as Compute Engine reports quota and
// stockouts. A VM inserted meanwhile disappears.
func (s *Server) FailOperation(method string, f Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opFailures[method] = script(f)
}

// Quota metrics the fake can enforce, as Compute Engine names them.
const (
	// QuotaFirewalls counts a project's firewall rules.
	QuotaFirewalls = "FIREWALLS"
	// QuotaAddresses counts, per region, the VMs holding an external IPv4
	// address (IN_USE_ADDRESSES).
	QuotaAddresses = "IN_USE_ADDRESSES"
	// QuotaCPUs counts, per region, the vCPUs of the VMs not stopped.
	QuotaCPUs = "CPUS"
)

// SetQuota makes inserts beyond limit of metric fail in their operation
// with QUOTA_EXCEEDED, as Compute Engine reports quota; regional metrics
// count per region. A limit below zero lifts it.
func (s *Server) SetQuota(metric string, limit int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if limit < 0 {
		delete(s.quotas, metric)
		return
	}
	s.quotas[metric] = limit
}

// SetUnreachable makes aggregatedList unable to reach zone: its VMs are
// left out, and the zone is named in the list's unreachables, as when a
// zone has an outage.
func (s *Server) SetUnreachable(zone string, unreachable bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unreachable[zone] = unreachable
}

// vcpus are the vCPUs a machine type counts for in the CPUS quota.
var vcpus = map[string]int{"e2-micro": 2, "e2-small": 2, "e2-medium": 2, "e2-standard-2": 2, "e2-standard-4": 4, "n1-standard-1": 1, "n2-standard-2": 2}

func region(zone string) string { return zone[:strings.LastIndexByte(zone, '-')] }

// instanceQuota is the quota failure an insert of vm in zone meets, if
// any: counted over the VMs not stopped, as Compute Engine counts them.
func (s *Server) instanceQuota(zone string, vm *computepb.Instance) *Failure {
	if len(s.quotas) == 0 {
		return nil // no limit set: nothing to count (at 10 000 VMs, a scan per insert)
	}
	addrs, cpus := 0, 0
	for k, other := range s.instances {
		if other == vm || region(strings.SplitN(k, "/", 2)[0]) != region(zone) || other.GetStatus() == "STOPPING" || other.GetStatus() == "TERMINATED" {
			continue
		}
		addrs++
		cpus += vcpus[other.GetMachineType()[strings.LastIndexByte(other.GetMachineType(), '/')+1:]]
	}
	mt := vm.GetMachineType()[strings.LastIndexByte(vm.GetMachineType(), '/')+1:]
	for metric, used := range map[string]int{QuotaAddresses: addrs + 1, QuotaCPUs: cpus + vcpus[mt]} {
		if limit, ok := s.quotas[metric]; ok && used > limit {
			f := QuotaInOperation(metric, region(zone))
			f.Message = fmt.Sprintf("Quota '%s' exceeded.  Limit: %d.0 in region %s.", metric, limit, region(zone))
			return &f
		}
	}
	return nil
}

// Listed returns how many VMs the aggregated lists have returned, over
// all their pages.
func (s *Server) Listed() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.listed
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
	s.tick()
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
	s.tick()
	if vm, ok := s.instances[zone+"/"+name]; ok {
		return proto.Clone(vm).(*computepb.Instance)
	}
	return nil
}

// Instances returns the number of VMs, those being deleted included.
func (s *Server) Instances() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	return len(s.instances)
}

// AllInstances returns copies of every VM, keyed by zone/name.
func (s *Server) AllInstances() map[string]*computepb.Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	out := map[string]*computepb.Instance{}
	for k, vm := range s.instances {
		out[k] = proto.Clone(vm).(*computepb.Instance)
	}
	return out
}

// FirewallNames returns the project/name of every rule, those being
// inserted or deleted included.
func (s *Server) FirewallNames() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	out := make([]string, 0, len(s.firewalls))
	for k := range s.firewalls {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Firewall returns a copy of a firewall rule of any project, or nil.
func (s *Server) Firewall(name string) *computepb.Firewall {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	for k, fw := range s.firewalls {
		if strings.HasSuffix(k, "/"+name) && fw.ready {
			return proto.Clone(fw.fw).(*computepb.Firewall)
		}
	}
	return nil
}

// FirewallIn returns a copy of project's firewall rule, or nil.
func (s *Server) FirewallIn(project, name string) *computepb.Firewall {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	if fw, ok := s.firewalls[project+"/"+name]; ok && fw.ready {
		return proto.Clone(fw.fw).(*computepb.Firewall)
	}
	return nil
}

// DeleteFirewall removes a rule at once, as somebody else might.
func (s *Server) DeleteFirewall(project, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.firewalls, project+"/"+name)
}

// PutFirewall stores a rule as it is, ready, as somebody else might make it.
func (s *Server) PutFirewall(project string, fw *computepb.Firewall) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fw.CreationTimestamp = ptr.To(s.now().Format(time.RFC3339))
	s.firewalls[project+"/"+fw.GetName()] = &firewall{fw: fw, ready: true}
}

// RemoveInstance removes a VM at once, as somebody deleting it by hand
// would (once its deletion finished).
func (s *Server) RemoveInstance(zone, name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropVM(zone + "/" + name)
}

// ChangeFirewall edits a rule in place, as somebody else might.
func (s *Server) ChangeFirewall(project, name string, edit func(*computepb.Firewall)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fw, ok := s.firewalls[project+"/"+name]; ok {
		edit(fw.fw)
	}
}

// PutInstance stores a VM as it is, for tests that need one the backend did
// not create.
func (s *Server) PutInstance(zone string, vm *computepb.Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	vm.Zone = ptr.To(s.URL + "/compute/v1/projects/p/zones/" + zone)
	vm.LabelFingerprint = ptr.To(fingerprint(vm.GetLabels()))
	s.putVM(zone+"/"+vm.GetName(), vm)
}

// Method names of the Compute API calls the fake serves, as Calls and
// failures name them.
const (
	opInstancesInsert = "instances.insert"
	opInstancesGet    = "instances.get"
	opInstancesDelete = "instances.delete"
	opInstancesList   = "instances.aggregatedList"
	opInstancesLabels = "instances.setLabels"
	opOperationsGet   = "operations.get"
	opOperationsWait  = "operations.wait"
	opFirewallsInsert = "firewalls.insert"
	opFirewallsGet    = "firewalls.get"
	opFirewallsList   = "firewalls.list"
	opFirewallsUpdate = "firewalls.update"
	opFirewallsDelete = "firewalls.delete"
	opToken           = "token"
)

var (
	reInstances  = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances(?:/([^/]+))?$`)
	reSetLabels  = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/zones/([^/]+)/instances/([^/]+)/setLabels$`)
	reOperation  = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/(zones/[^/]+|global)/operations/([^/]+)$`)
	reOpWait     = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/(zones/[^/]+|global)/operations/([^/]+)/wait$`)
	reFirewalls  = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/global/firewalls(?:/([^/]+))?$`)
	reAggregated = regexp.MustCompile(`^/compute/v1/projects/([^/]+)/aggregated/instances$`)
)

// route names the API method of a request and returns its path parameters.
func route(r *http.Request) (string, []string) {
	switch {
	case r.URL.Path == tokenPath:
		return opToken, nil
	case reSetLabels.MatchString(r.URL.Path) && r.Method == http.MethodPost:
		return opInstancesLabels, reSetLabels.FindStringSubmatch(r.URL.Path)
	case reInstances.MatchString(r.URL.Path):
		return map[string]string{http.MethodPost: opInstancesInsert, http.MethodGet: opInstancesGet, http.MethodDelete: opInstancesDelete}[r.Method],
			reInstances.FindStringSubmatch(r.URL.Path)
	case reOperation.MatchString(r.URL.Path) && r.Method == http.MethodGet:
		return opOperationsGet, reOperation.FindStringSubmatch(r.URL.Path)
	case reOpWait.MatchString(r.URL.Path) && r.Method == http.MethodPost:
		return opOperationsWait, reOpWait.FindStringSubmatch(r.URL.Path)
	case reFirewalls.MatchString(r.URL.Path):
		m := reFirewalls.FindStringSubmatch(r.URL.Path)
		if m[2] == "" && r.Method == http.MethodGet {
			return opFirewallsList, m
		}
		return map[string]string{http.MethodPost: opFirewallsInsert, http.MethodGet: opFirewallsGet, http.MethodPut: opFirewallsUpdate, http.MethodDelete: opFirewallsDelete}[r.Method], m
	case reAggregated.MatchString(r.URL.Path) && r.Method == http.MethodGet:
		return opInstancesList, reAggregated.FindStringSubmatch(r.URL.Path)
	}
	return "", nil
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick()
	method, m := route(r)
	if method == "" {
		writeError(w, http.StatusNotFound, "notFound", "", fmt.Sprintf("The requested URL %s was not found on this server.", r.URL.Path))
		return
	}
	s.calls[method]++
	if method == opToken {
		s.token(w, r)
		return
	}
	if !s.authorized(w, r) {
		return
	}
	if f := s.failures[method]; f != nil && f.Times != 0 {
		if f.Times > 0 {
			f.Times--
		}
		writeErrorInfo(w, f.Code, f.Reason, f.Domain, f.Info, f.Message)
		return
	}
	s.dispatch(w, r, method, m)
}

// dispatch serves an API method.
func (s *Server) dispatch(w http.ResponseWriter, r *http.Request, method string, m []string) {
	switch method {
	case opInstancesInsert:
		s.insertInstance(w, r, m[1], m[2])
	case opInstancesGet:
		s.getInstance(w, m[1], m[2], m[3])
	case opInstancesDelete:
		s.deleteInstance(w, m[1], m[2], m[3])
	case opInstancesList:
		s.aggregatedList(w, r, m[1])
	case opInstancesLabels:
		s.setLabels(w, r, m[1], m[2], m[3])
	case opOperationsGet:
		// An operation is found only where it runs: its project, and its
		// zone or global scope.
		if op, ok := s.ops[m[3]]; ok && op.project == m[1] && op.scope == m[2] {
			writeProto(w, op.op)
			return
		}
		notFound(w, fmt.Sprintf("projects/%s/%s/operations/%s", m[1], m[2], m[3]))
	case opOperationsWait:
		s.waitOperation(w, r, m)
	case opFirewallsInsert:
		s.insertFirewall(w, r, m[1])
	case opFirewallsGet:
		s.getFirewall(w, m[1], m[2])
	case opFirewallsList:
		s.listFirewalls(w, r, m[1])
	case opFirewallsUpdate:
		s.updateFirewall(w, r, m[1], m[2])
	case opFirewallsDelete:
		s.deleteFirewall(w, m[1], m[2])
	}
}

// MaxOperationWait is how long operations.wait holds a request before it
// answers with the operation still running, as Compute Engine does (about
// two minutes there; shorter here, so that tests see the early answer).
const MaxOperationWait = 20 * time.Second

// waitOperation serves operations.wait: it answers once the operation is
// done, or with it still running when MaxOperationWait passes; a caller
// that gives up first gets nothing. It is called with s.mu held, lets it go
// while it waits, and returns with it held.
func (s *Server) waitOperation(w http.ResponseWriter, r *http.Request, m []string) {
	op, ok := s.ops[m[3]]
	if !ok || op.project != m[1] || op.scope != m[2] {
		notFound(w, fmt.Sprintf("projects/%s/%s/operations/%s", m[1], m[2], m[3]))
		return
	}
	until := time.Now().Add(MaxOperationWait)
	for op.op.GetStatus() != computepb.Operation_DONE && time.Now().Before(until) {
		s.mu.Unlock()
		select {
		case <-r.Context().Done():
			s.mu.Lock()
			return
		case <-time.After(10 * time.Millisecond):
		}
		s.mu.Lock()
		if !s.now().Before(op.due) {
			s.tick()
		}
	}
	writeProto(w, op.op)
}

// tick ends the operations that are due.
func (s *Server) tick() {
	defer s.boot()
	for _, n := range slices.Sorted(maps.Keys(s.running)) {
		op := s.running[n]
		if s.now().Before(op.due) {
			continue
		}
		delete(s.running, n)
		op.op.Status, op.op.Progress = ptr.To(computepb.Operation_DONE), ptr.To(int32(100))
		op.op.EndTime = ptr.To(s.now().Format(time.RFC3339Nano))
		if f := op.failure; f != nil {
			op.op.Error = &computepb.Error{Errors: []*computepb.Errors{{Code: ptr.To(f.Reason), Message: ptr.To(f.Message)}}}
			op.op.HttpErrorStatusCode = ptr.To(int32(f.Code))
			op.op.HttpErrorMessage = ptr.To(strings.ToUpper(http.StatusText(f.Code)))
		}
		if op.finish != nil {
			op.finish(op.failure != nil)
		}
	}
}

// boot runs the VMs whose boot time has come (BootAfter), each access
// config with an external address of its own, as GCP gives an ephemeral
// one; a VM deleted or moved meanwhile is left as it is.
func (s *Server) boot() {
	for _, key := range slices.Sorted(maps.Keys(s.booting)) {
		if s.now().Before(s.booting[key]) {
			continue
		}
		delete(s.booting, key)
		vm := s.instances[key]
		if vm == nil || vm.GetStatus() != "STAGING" {
			continue
		}
		vm.Status = ptr.To("RUNNING")
		for _, ni := range vm.GetNetworkInterfaces() {
			for _, ac := range ni.GetAccessConfigs() {
				if ac.NatIP == nil {
					s.natSeq++
					n := s.natSeq - 1
					ac.NatIP = ptr.To(fmt.Sprintf("35.%d.%d.%d", 200+n/(254*256)%50, n/254%256, 1+n%254))
				}
			}
		}
	}
}

// startOp starts an operation on target; finish runs when it ends.
func (s *Server) startOp(project, zone, kind, target string, failure *Failure, finish func(failed bool)) *computepb.Operation {
	s.seq++
	now := s.now()
	op := &computepb.Operation{
		Name:          ptr.To(fmt.Sprintf("operation-%d-%d", now.UnixMilli(), s.seq)),
		OperationType: ptr.To(kind),
		Status:        ptr.To(computepb.Operation_RUNNING),
		Progress:      ptr.To(int32(0)),
		InsertTime:    ptr.To(now.Format(time.RFC3339Nano)),
		StartTime:     ptr.To(now.Format(time.RFC3339Nano)),
		TargetLink:    ptr.To(target),
	}
	scope := "global"
	if zone != "" {
		op.Zone = ptr.To(s.URL + "/compute/v1/projects/" + project + "/zones/" + zone)
		scope = "zones/" + zone
	}
	op.SelfLink = ptr.To(fmt.Sprintf("%s/compute/v1/projects/%s/%s/operations/%s", s.URL, project, scope, op.GetName()))
	o := &operation{op: op, project: project, scope: scope, due: now.Add(s.opDuration), failure: failure, finish: finish}
	s.ops[op.GetName()], s.running[op.GetName()] = o, o
	s.tick()
	return proto.Clone(op).(*computepb.Operation)
}

// takeOpFailure returns the failure scripted for method's next operation.
func (s *Server) takeOpFailure(method string) *Failure {
	f := s.opFailures[method]
	if f == nil || f.Times == 0 {
		return nil
	}
	if f.Times > 0 {
		f.Times--
	}
	c := *f
	return &c
}

func notFound(w http.ResponseWriter, resource string) {
	writeError(w, http.StatusNotFound, "notFound", "", fmt.Sprintf("The resource '%s' was not found", resource))
}

func notReady(w http.ResponseWriter, resource string) {
	writeError(w, http.StatusBadRequest, "resourceNotReady", "", fmt.Sprintf("The resource '%s' is not ready", resource))
}

func (s *Server) getInstance(w http.ResponseWriter, project, zone, name string) {
	vm, ok := s.instances[zone+"/"+name]
	if !ok {
		notFound(w, fmt.Sprintf("projects/%s/zones/%s/instances/%s", project, zone, name))
		return
	}
	writeProto(w, vm)
}

// deleteInstance stops the VM; it keeps its name, STOPPING, until the
// operation ends.
func (s *Server) deleteInstance(w http.ResponseWriter, project, zone, name string) {
	key := zone + "/" + name
	vm, ok := s.instances[key]
	resource := fmt.Sprintf("projects/%s/zones/%s/instances/%s", project, zone, name)
	switch {
	case !ok:
		notFound(w, resource)
		return
	case vm.GetStatus() == "STOPPING" || vm.GetStatus() == "PROVISIONING" && s.pendingOn(vm.GetSelfLink()):
		notReady(w, resource)
		return
	}
	vm.Status = ptr.To("STOPPING")
	writeProto(w, s.startOp(project, zone, "delete", vm.GetSelfLink(), nil, func(bool) {
		if s.instances[key] == vm {
			s.dropVM(key)
			if s.OnRemove != nil {
				s.OnRemove(vm)
			}
		}
	}))
}

// pendingOn reports whether an operation on target is running.
func (s *Server) pendingOn(target string) bool {
	for _, op := range s.running {
		if op.op.GetTargetLink() == target {
			return true
		}
	}
	return false
}

func (s *Server) insertInstance(w http.ResponseWriter, r *http.Request, project, zone string) {
	vm := &computepb.Instance{}
	if !readProto(w, r, vm) {
		return
	}
	if bad := s.checkInstance(project, zone, vm); bad != nil {
		bad.write(w)
		return
	}
	key := zone + "/" + vm.GetName()
	if _, ok := s.instances[key]; ok {
		writeError(w, http.StatusConflict, "alreadyExists", "", fmt.Sprintf("The resource 'projects/%s/zones/%s/instances/%s' already exists", project, zone, vm.GetName()))
		return
	}
	s.seq++
	vm.Id = ptr.To(uint64(1000 + s.seq))
	vm.Status = ptr.To("PROVISIONING")
	vm.CreationTimestamp = ptr.To(s.now().Format(time.RFC3339))
	vm.Zone = ptr.To(s.URL + "/compute/v1/projects/" + project + "/zones/" + zone)
	vm.SelfLink = ptr.To(s.URL + "/compute/v1/projects/" + project + "/zones/" + zone + "/instances/" + vm.GetName())
	vm.LabelFingerprint = ptr.To(fingerprint(vm.GetLabels()))
	// Each interface gets an address of its subnetwork, as on GCP (here
	// from 10.128.0.0/16, whatever the subnetwork).
	for _, ni := range vm.GetNetworkInterfaces() {
		if ni.NetworkIP == nil {
			ni.NetworkIP = ptr.To(fmt.Sprintf("10.128.%d.%d", (s.seq/250)%250, 2+s.seq%250))
		}
	}
	if s.OnInsert != nil {
		s.OnInsert(vm)
	}
	s.putVM(key, vm)
	failure := s.takeOpFailure(opInstancesInsert)
	if failure == nil {
		failure = s.instanceQuota(zone, vm)
	}
	writeProto(w, s.startOp(project, zone, "insert", vm.GetSelfLink(), failure, func(failed bool) {
		if !failed && s.BootAfter > 0 && s.instances[key] == vm && vm.GetStatus() == "PROVISIONING" {
			vm.Status = ptr.To("STAGING")
			if s.booting == nil {
				s.booting = map[string]time.Time{}
			}
			s.booting[key] = s.now().Add(s.BootAfter)
		}
		if failed && s.instances[key] == vm {
			s.dropVM(key)
			if s.OnRemove != nil {
				s.OnRemove(vm)
			}
		}
	}))
}

// fingerprint is a VM's label fingerprint: it changes with the labels.
func fingerprint(labels map[string]string) string {
	keys := slices.Sorted(maps.Keys(labels))
	h := fnv.New64a()
	for _, k := range keys {
		_, _ = h.Write([]byte(k + "=" + labels[k] + ";"))
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// setLabels replaces a VM's labels, if the caller read the labels it
// replaces: the fingerprint must match, as on GCP.
func (s *Server) setLabels(w http.ResponseWriter, r *http.Request, project, zone, name string) {
	req := &computepb.InstancesSetLabelsRequest{}
	if !readProto(w, r, req) {
		return
	}
	vm, ok := s.instances[zone+"/"+name]
	switch {
	case !ok:
		notFound(w, fmt.Sprintf("projects/%s/zones/%s/instances/%s", project, zone, name))
		return
	case req.GetLabelFingerprint() != fingerprint(vm.GetLabels()):
		writeError(w, http.StatusPreconditionFailed, reasonConditionNotMet, "", "Labels fingerprint either invalid or resource labels have changed")
		return
	}
	if bad := checkLabels(req.GetLabels()); bad != nil {
		bad.write(w)
		return
	}
	writeProto(w, s.startOp(project, zone, "setLabels", vm.GetSelfLink(), nil, func(bool) {
		vm.Labels = req.GetLabels()
		vm.LabelFingerprint = ptr.To(fingerprint(vm.GetLabels()))
	}))
}

// listFilter reads a list request's filter; one the API would refuse is
// answered as it answers it.
func listFilter(w http.ResponseWriter, r *http.Request) (*filterExpr, bool) {
	raw := r.URL.Query().Get("filter")
	f, err := parseFilter(raw)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid", "", fmt.Sprintf("Invalid value for field 'filter': '%s'. Invalid list filter expression: %v", raw, err))
		return nil, false
	}
	return f, true
}

// aggregatedList answers with the project's VMs the filter selects, by
// zone; a filter it cannot parse is refused, as the API refuses it.
func (s *Server) aggregatedList(w http.ResponseWriter, r *http.Request, project string) {
	f, ok := listFilter(w, r)
	if !ok {
		return
	}
	from, size, ok := pageBounds(w, r)
	if !ok {
		return
	}
	// Selecting stops one past the page: enough to know whether a next
	// page exists.
	var selected []string
	for _, k := range s.sortedKeys() {
		if len(selected) > from+size {
			break
		}
		if !s.unreachable[k[:strings.IndexByte(k, '/')]] && f.selects(s.instances[k]) {
			selected = append(selected, k)
		}
	}
	page, next, ok := cut(w, r, selected, from, size)
	if !ok {
		return
	}
	s.listed += len(page)
	out := &computepb.InstanceAggregatedList{Id: ptr.To("projects/" + project + "/aggregated/instances"), Items: map[string]*computepb.InstancesScopedList{}}
	for _, k := range page {
		zone := "zones/" + k[:strings.IndexByte(k, '/')]
		if out.Items[zone] == nil {
			out.Items[zone] = &computepb.InstancesScopedList{}
		}
		out.Items[zone].Instances = append(out.Items[zone].Instances, s.instances[k])
	}
	// As on GCP, every zone has its scope on every page: one without
	// results on this page says so in a warning, and one in an outage is
	// listed in unreachables when the caller opted in to partial
	// success, and otherwise as a scope warned UNREACHABLE.
	partial := r.URL.Query().Get("returnPartialSuccess") == "true"
	for _, z := range s.zones() {
		scope := "zones/" + z
		data := []*computepb.Data{{Key: ptr.To("scope"), Value: ptr.To(scope)}}
		switch {
		case s.unreachable[z] && partial:
			out.Unreachables = append(out.Unreachables, scope)
		case s.unreachable[z]:
			out.Items[scope] = &computepb.InstancesScopedList{Warning: &computepb.Warning{Code: ptr.To("UNREACHABLE"), Data: data,
				Message: ptr.To(fmt.Sprintf("Scope '%s' is unreachable.", scope))}}
		case out.Items[scope] == nil:
			out.Items[scope] = &computepb.InstancesScopedList{Warning: &computepb.Warning{Code: ptr.To("NO_RESULTS_ON_PAGE"), Data: data,
				Message: ptr.To(fmt.Sprintf("There are no results for scope '%s' on this page.", scope))}}
		}
	}
	if next != "" {
		out.NextPageToken = ptr.To(next)
	}
	writeProto(w, out)
}

// Zones are the zones every project has, beside those its VMs are in.
var Zones = []string{"europe-west1-b", "europe-west1-c", "europe-west1-d", "us-central1-a", "us-east1-b"}

// zones lists the project's zones: Zones, and any a VM is in or an outage
// was set for.
func (s *Server) zones() []string {
	set := map[string]bool{}
	for _, z := range Zones {
		set[z] = true
	}
	s.sortedKeys()
	for _, z := range s.zoned {
		set[z] = true
	}
	for z := range s.unreachable {
		set[z] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// putVM stores vm under key (zone/name).
func (s *Server) putVM(key string, vm *computepb.Instance) {
	if _, ok := s.instances[key]; !ok {
		s.sorted, s.zoned = nil, nil
	}
	s.instances[key] = vm
}

// dropVM forgets the VM under key.
func (s *Server) dropVM(key string) {
	if _, ok := s.instances[key]; ok {
		s.sorted, s.zoned = nil, nil
	}
	delete(s.instances, key)
}

// sortedKeys are the keys of instances in order (s.sorted), made again
// after a change, with the zones they are in (s.zoned).
func (s *Server) sortedKeys() []string {
	if s.sorted == nil {
		s.sorted = slices.Sorted(maps.Keys(s.instances))
		zones := map[string]bool{}
		for _, k := range s.sorted {
			zones[k[:strings.IndexByte(k, '/')]] = true
		}
		s.zoned = slices.Sorted(maps.Keys(zones))
	}
	return s.sorted
}

// paginate cuts keys into the page a list request asks for: maxResults
// (at most 500, the API's limit and default) from where pageToken says.
func paginate(w http.ResponseWriter, r *http.Request, keys []string) ([]string, string, bool) {
	from, size, ok := pageBounds(w, r)
	if !ok {
		return nil, "", false
	}
	return cut(w, r, keys, from, size)
}

// pageBounds are where a list request's page starts (pageToken) and how
// long it is (maxResults: at most 500, the API's limit and default).
func pageBounds(w http.ResponseWriter, r *http.Request) (from, size int, ok bool) {
	size = 500
	if v := r.URL.Query().Get("maxResults"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 500 {
			writeError(w, http.StatusBadRequest, "invalid", "", fmt.Sprintf("Invalid value for field 'maxResults': '%s'. Must be in the range [0, 500].", v))
			return 0, 0, false
		}
		if n > 0 {
			size = n
		}
	}
	if tok := r.URL.Query().Get("pageToken"); tok != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(tok, "page-"))
		if err != nil || !strings.HasPrefix(tok, "page-") || n < 0 {
			writeError(w, http.StatusBadRequest, "invalid", "", "Invalid value for field 'pageToken': '"+tok+"'.")
			return 0, 0, false
		}
		from = n
	}
	return from, size, true
}

// cut is the page of keys from from, size long, and the token of the
// next page if keys go on; a token past the keys is refused.
func cut(w http.ResponseWriter, r *http.Request, keys []string, from, size int) ([]string, string, bool) {
	if from > len(keys) {
		writeError(w, http.StatusBadRequest, "invalid", "", "Invalid value for field 'pageToken': '"+r.URL.Query().Get("pageToken")+"'.")
		return nil, "", false
	}
	to := min(from+size, len(keys))
	next := ""
	if to < len(keys) {
		next = "page-" + strconv.Itoa(to)
	}
	return keys[from:to], next, true
}

func (s *Server) insertFirewall(w http.ResponseWriter, r *http.Request, project string) {
	fw := &computepb.Firewall{}
	if !readProto(w, r, fw) {
		return
	}
	if bad := s.checkFirewall(project, fw); bad != nil {
		bad.write(w)
		return
	}
	key := project + "/" + fw.GetName()
	if _, ok := s.firewalls[key]; ok {
		writeError(w, http.StatusConflict, "alreadyExists", "", fmt.Sprintf("The resource 'projects/%s/global/firewalls/%s' already exists", project, fw.GetName()))
		return
	}
	fw.CreationTimestamp = ptr.To(s.now().Format(time.RFC3339))
	fw.SelfLink = ptr.To(fmt.Sprintf("%s/compute/v1/projects/%s/global/firewalls/%s", s.URL, project, fw.GetName()))
	failure := s.takeOpFailure(opFirewallsInsert)
	if limit, ok := s.quotas[QuotaFirewalls]; ok && failure == nil {
		n := 0
		for k := range s.firewalls {
			if strings.HasPrefix(k, project+"/") {
				n++
			}
		}
		if n >= limit {
			failure = &Failure{Code: http.StatusForbidden, Reason: codeQuota, Message: fmt.Sprintf("Quota 'FIREWALLS' exceeded.  Limit: %d.0 globally.", limit)}
		}
	}
	e := &firewall{fw: fw, pending: true}
	s.firewalls[key] = e
	writeProto(w, s.startOp(project, "", "insert", fw.GetSelfLink(), failure, func(failed bool) {
		e.pending = false
		if failed {
			delete(s.firewalls, key)
			return
		}
		e.ready = true
	}))
}

// listFirewalls answers with the project's rules the filter selects.
func (s *Server) listFirewalls(w http.ResponseWriter, r *http.Request, project string) {
	f, ok := listFilter(w, r)
	if !ok {
		return
	}
	var selected []string
	for _, k := range slices.Sorted(maps.Keys(s.firewalls)) {
		if fw := s.firewalls[k]; fw.ready && strings.HasPrefix(k, project+"/") && f.selects(fw.fw) {
			selected = append(selected, k)
		}
	}
	page, next, ok := paginate(w, r, selected)
	if !ok {
		return
	}
	out := &computepb.FirewallList{Id: ptr.To("projects/" + project + "/global/firewalls")}
	for _, k := range page {
		out.Items = append(out.Items, s.firewalls[k].fw)
	}
	if next != "" {
		out.NextPageToken = ptr.To(next)
	}
	writeProto(w, out)
}

func (s *Server) getFirewall(w http.ResponseWriter, project, name string) {
	fw, ok := s.firewalls[project+"/"+name]
	if !ok || !fw.ready {
		notFound(w, fmt.Sprintf("projects/%s/global/firewalls/%s", project, name))
		return
	}
	writeProto(w, fw.fw)
}

// updateFirewall replaces a rule once the operation ends; a rule with an
// operation running is not ready.
func (s *Server) updateFirewall(w http.ResponseWriter, r *http.Request, project, name string) {
	next := &computepb.Firewall{}
	if !readProto(w, r, next) {
		return
	}
	resource := fmt.Sprintf("projects/%s/global/firewalls/%s", project, name)
	e, ok := s.firewalls[project+"/"+name]
	switch {
	case !ok || !e.ready && !e.pending:
		notFound(w, resource)
		return
	case e.pending:
		notReady(w, resource)
		return
	case next.GetName() != name:
		writeError(w, http.StatusBadRequest, "invalid", "", fmt.Sprintf("Invalid value for field 'resource.name': '%s'. Must match the rule being updated.", next.GetName()))
		return
	}
	if bad := s.checkFirewall(project, next); bad != nil {
		bad.write(w)
		return
	}
	e.pending = true
	writeProto(w, s.startOp(project, "", "update", e.fw.GetSelfLink(), nil, func(bool) {
		e.pending = false
		next.CreationTimestamp, next.SelfLink = e.fw.CreationTimestamp, e.fw.SelfLink
		e.fw = next
	}))
}

// deleteFirewall removes a rule once the operation ends; until then it
// exists, and a new rule of its name is refused.
func (s *Server) deleteFirewall(w http.ResponseWriter, project, name string) {
	key := project + "/" + name
	e, ok := s.firewalls[key]
	resource := fmt.Sprintf("projects/%s/global/firewalls/%s", project, name)
	switch {
	case !ok || !e.ready && !e.pending:
		notFound(w, resource)
		return
	case e.pending:
		notReady(w, resource)
		return
	}
	e.pending = true
	writeProto(w, s.startOp(project, "", "delete", e.fw.GetSelfLink(), nil, func(bool) {
		if s.firewalls[key] == e {
			delete(s.firewalls, key)
		}
	}))
}

func readProto(w http.ResponseWriter, r *http.Request, m proto.Message) bool {
	b, err := io.ReadAll(r.Body)
	if err == nil {
		err = protojson.UnmarshalOptions{}.Unmarshal(b, m)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "parseError", "", "Parse Error: "+err.Error())
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

// domains are the error domains GCP answers reasons with.
var domains = map[string]string{
	reasonQuota: domainUsageLimits, reasonRateLimit: domainUsageLimits, "userRateLimitExceeded": domainUsageLimits,
	reasonNotConfigured: domainUsageLimits,
}

// GCP's error domains and the reason of organisation-policy refusals.
const (
	domainUsageLimits     = "usageLimits"
	domainGlobal          = "global"
	reasonConditionNotMet = "conditionNotMet"
)

// errorInfos are the google.rpc.ErrorInfo reasons (and their domain) GCP
// puts in an error body's details beside a legacy reason.
var errorInfos = map[string][2]string{
	reasonNotConfigured: {"SERVICE_DISABLED", domainGoogleAPIs},
	reasonRateLimit:     {"RATE_LIMIT_EXCEEDED", domainGoogleAPIs},
	reasonQuota:         {codeQuota, "compute." + domainGoogleAPIs},
	reasonForbidden:     {"IAM_PERMISSION_DENIED", "iam." + domainGoogleAPIs},
}

// requiredPermission finds the permission a "Required 'P' permission for
// 'R'" message names.
var requiredPermission = regexp.MustCompile(`^Required '([^']+)' permission for '([^']+)'`)

// writeError answers with GCP's JSON error body.
func writeError(w http.ResponseWriter, code int, reason, domain, msg string) {
	writeErrorInfo(w, code, reason, domain, "", msg)
}

// writeErrorInfo answers with GCP's JSON error body: the legacy errors[]
// item with reason and domain, and, in details, a google.rpc.ErrorInfo
// with info (or the one GCP gives with reason), whose metadata names the
// permission of an IAM refusal.
func writeErrorInfo(w http.ResponseWriter, code int, reason, domain, info, msg string) {
	body := map[string]any{"code": code, "message": msg}
	infoDomain := ""
	if info == "" {
		info, infoDomain = errorInfos[reason][0], errorInfos[reason][1]
	}
	if info != "" {
		if infoDomain == "" {
			infoDomain = domainGoogleAPIs
		}
		ei := map[string]any{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": info, "domain": infoDomain}
		if m := requiredPermission.FindStringSubmatch(msg); m != nil {
			ei["metadata"] = map[string]string{"permission": m[1], "resource": m[2]}
		}
		body["details"] = []any{ei}
	}
	if domain == "" {
		domain = domains[reason]
	}
	if domain == "" {
		domain = domainGlobal
	}
	item := map[string]any{"message": msg, "domain": domain, "reason": reason}
	if reason == reasonConditionNotMet {
		item["location"], item["locationType"] = "If-Match", "header"
	}
	body["errors"] = []any{item}
	w.Header().Set("Content-Type", "application/json; charset=UTF-8")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": body})
}
