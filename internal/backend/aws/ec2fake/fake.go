// Package ec2fake is an in-process fake of the parts of the EC2 Query API
// the aws backend uses: instances (RunInstances, DescribeInstances,
// TerminateInstances), tags (CreateTags), subnets (DescribeSubnets) and
// security groups (CreateSecurityGroup, DescribeSecurityGroups,
// AuthorizeSecurityGroupIngress, DeleteSecurityGroup). It answers with
// EC2's XML bodies and error bodies, so the real aws-sdk-go-v2 client runs
// against it unchanged.
//
// It is as strict as EC2 where the backend could go wrong: requests must
// be signed with the fake's access key and name API version 2016-11-15;
// RunInstances is idempotent by ClientToken (the same token with other
// parameters is IdempotentParameterMismatch, and a token stays bound to
// its instance after the instance is terminated); filters are EC2's
// (tag:KEY, tag-key, instance-state-name, client-token, vpc-id,
// group-name, availability-zone, default-for-az), lists are paged by
// MaxResults and NextToken, and MaxResults with InstanceIds is refused;
// instances go pending → running (with a public address) and
// shutting-down → terminated over time, and a terminated one stays listed;
// a group in use cannot be deleted (DependencyViolation), a group name is
// unique in its VPC, a rule cannot be added twice; and any action can be
// made to fail with an EC2 error code (capacity, limits, throttling,
// authorisation).
//
// Files: fake.go (the server, its state and the actions), xml.go (EC2's
// response shapes), sts.go (STS's DecodeAuthorizationMessage, for the
// encoded messages of UnauthorizedOperation).
package ec2fake

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/xml"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// AccessKey and SecretKey are the credentials the fake accepts.
const (
	AccessKey = "AKIDEGRESSFAKE000001"
	SecretKey = "egress-fake-secret"
	// Region is the fake's region; its zones are Region+"a", "b", "c",
	// each with a default subnet of the default VPC.
	Region = "us-east-1"
	// DefaultVPC is the region's default VPC.
	DefaultVPC = "vpc-0default0000000"
	// DebianAMI, UbuntuAMI and OtherAMI are images the fake knows, by
	// Debian's and Canonical's owner accounts and another's; Debian10AMI
	// and Ubuntu1804AMI are Debian's and Canonical's of releases the
	// generated script does not support.
	DebianAMI     = "ami-0deb12a0000000001"
	UbuntuAMI     = "ami-0ab2404a000000002"
	OtherAMI      = "ami-0ccc0000000000003"
	Debian10AMI   = "ami-0deb10a0000000004"
	Ubuntu1804AMI = "ami-0ab1804a000000005"
)

// Instance states, as EC2 names them.
const (
	statePending      = "pending"
	stateRunning      = "running"
	stateShuttingDown = "shutting-down"
	stateTerminated   = "terminated"
)

// debianRoot is the root device of Debian's AMIs.
const debianRoot = "/dev/xvda"

// image is what DescribeImages says of an AMI.
type image struct{ owner, root, name string }

var images = map[string]image{
	DebianAMI:     {owner: "136693071363", root: debianRoot, name: "debian-12-amd64-20261201-1234"},
	UbuntuAMI:     {owner: "099720109477", root: "/dev/sda1", name: "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20261201"},
	OtherAMI:      {owner: "123456789012", root: debianRoot, name: "someones-image"},
	Debian10AMI:   {owner: "136693071363", root: debianRoot, name: "debian-10-amd64-20240703-1797"},
	Ubuntu1804AMI: {owner: "099720109477", root: "/dev/sda1", name: "ubuntu/images/hvm-ssd/ubuntu-bionic-18.04-amd64-server-20230607"},
}

// Failure is a scripted error answer.
type Failure struct {
	// Code is EC2's error code, such as InsufficientInstanceCapacity.
	Code string
	// Message is EC2's message; empty makes one up.
	Message string
	// Status is the HTTP status; zero means 400 (503 for
	// RequestLimitExceeded and Unavailable, as EC2 answers them).
	Status int
	// Times is how many calls fail: zero means one, a negative number
	// all of them.
	Times int
}

// Instance is a fake instance; the fields are what the fake and tests
// read and write.
type Instance struct {
	ID, ImageID, Type, Zone, SubnetID, VPCID string
	PrivateIP, PublicIP                      string
	ClientToken                              string
	State                                    string
	StateReason                              string
	Spot                                     bool
	Groups                                   []string
	Tags                                     map[string]string
	Launched                                 time.Time
	UserData                                 string
	// FailLaunch, when set (by OnRun), ends the instance when it would
	// run, with this reason, as EC2 ends one it cannot launch
	// (Server.InsufficientInstanceCapacity, Client.VolumeLimitExceeded).
	FailLaunch string
	// Params are the RunInstances parameters it was made from, as sent.
	Params map[string]string
	// until is when its current state moves on (pending → running,
	// shutting-down → terminated), and gone when a terminated one stops
	// being listed.
	until, gone time.Time
}

// Group is a fake security group.
type Group struct {
	ID, Name, Description, VPCID string
	Tags                         map[string]string
	// Ingress are its rules, as "tcp:FROM-TO:CIDR".
	Ingress []string
}

// Server is a running fake EC2 endpoint.
type Server struct {
	*httptest.Server

	mu        sync.Mutex
	instances map[string]*Instance
	tokens    map[string]*Instance // client token -> its instance, kept past its listing
	groups    map[string]*Group
	subnets   map[string]subnet
	failures  map[string]*Failure
	calls     map[string]int
	params    map[string][]map[string]string
	seq       int
	// PendingFor and TerminatingFor are how long an instance stays
	// pending and shutting-down; TerminatedListed how long a terminated
	// one is still listed.
	PendingFor, TerminatingFor, TerminatedListed time.Duration
	// OnRun, when set, is called with a new instance (under the fake's
	// lock), for a test to start what the instance would run, or to
	// choose its public address.
	OnRun func(i *Instance)
	// OnTerminate, when set, is called when an instance is terminated.
	OnTerminate func(i *Instance)
	// Now is the fake's clock; nil means time.Now.
	Now func() time.Time
	// MaxPage, when above zero, caps the items of a page below what
	// MaxResults asks, as EC2 may.
	MaxPage int
	// HideNewFor keeps a new instance out of DescribeInstances for that
	// long, as EC2's eventual consistency does.
	HideNewFor time.Duration
	// OnChange, when set, is called (outside the fake's lock) after a
	// change an action made and before its answer: a test plays another
	// client acting meanwhile.
	OnChange func(action string)
	// DenyDecode makes STS refuse DecodeAuthorizationMessage (the caller
	// lacks sts:DecodeAuthorizationMessage).
	DenyDecode bool
	// encoded are the authorization failure messages handed out, and
	// what each decodes to.
	encoded map[string]string
	// AnswerAfter delays the answer to a call that changes something
	// (RunInstances, TerminateInstances, the security group calls,
	// CreateTags) by this long after the change is made, as EC2's
	// answers take a while: a client killed meanwhile made the change
	// without learning of it.
	AnswerAfter time.Duration
}

// changes are the actions AnswerAfter delays.
var changes = map[string]bool{
	"RunInstances": true, "TerminateInstances": true, "CreateTags": true, "DeleteTags": true,
	"CreateSecurityGroup": true, "AuthorizeSecurityGroupIngress": true, "DeleteSecurityGroup": true,
}

type subnet struct{ id, vpc, zone, cidr string }

// Start runs a fake on loopback until the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := New()
	t.Cleanup(s.Close)
	return s
}

// New runs a fake on loopback until Close: for a caller with no test to
// tie it to (a TestMain that hands its URL to a provider it starts).
func New() *Server {
	s := &Server{
		instances: map[string]*Instance{}, tokens: map[string]*Instance{}, groups: map[string]*Group{},
		subnets: map[string]subnet{}, failures: map[string]*Failure{}, calls: map[string]int{}, params: map[string][]map[string]string{},
		PendingFor: 200 * time.Millisecond, TerminatingFor: 200 * time.Millisecond, TerminatedListed: time.Hour,
	}
	for i, z := range []string{"a", "b", "c"} {
		id := fmt.Sprintf("subnet-0default%07d", i)
		s.subnets[id] = subnet{id: id, vpc: DefaultVPC, zone: Region + z, cidr: fmt.Sprintf("172.31.%d.0/20", 16*i)}
	}
	s.Server = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// AddSubnet adds a subnet of vpc in zone (not a default one).
func (s *Server) AddSubnet(id, vpc, zone string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.subnets[id] = subnet{id: id, vpc: vpc, zone: zone, cidr: "10.20.0.0/24"}
}

// Fail makes the next calls of action fail with f.
func (s *Server) Fail(action string, f Failure) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failures[action] = &f
}

// Calls returns how often action was called.
func (s *Server) Calls(action string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[action]
}

// Params returns the parameters of each call of action, in the order
// they came: a test tells calls of one action apart by them (a listing
// from one name's lookup).
func (s *Server) Params(action string) []map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]map[string]string, len(s.params[action]))
	for i, p := range s.params[action] {
		out[i] = maps.Clone(p)
	}
	return out
}

// Instances returns copies of the instances the fake knows, terminated
// ones that are still listed included, by ID.
func (s *Server) Instances() []Instance {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advanceLocked()
	var out []Instance
	for _, id := range sortedKeys(s.instances) {
		out = append(out, *s.instances[id])
	}
	return out
}

// Groups returns copies of the security groups, by ID.
func (s *Server) Groups() []Group {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Group
	for _, id := range sortedKeys(s.groups) {
		out = append(out, *s.groups[id])
	}
	return out
}

// Interrupt ends an instance as a spot interruption or a host failure
// would: shutting-down, then terminated, with reason.
func (s *Server) Interrupt(id, reason string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := s.instances[id]
	if i == nil || i.State == stateTerminated {
		return false
	}
	s.terminateLocked(i, reason)
	return true
}

// Tag sets tags of an instance, as another client's CreateTags would.
func (s *Server) Tag(id string, tags map[string]string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.instances[id]; i != nil {
		for k, v := range tags {
			i.Tags[k] = v
		}
	}
}

// SetPublicIP gives an instance its public address (empty: none).
func (s *Server) SetPublicIP(id, ip string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.instances[id]; i != nil {
		i.PublicIP = ip
	}
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func (s *Server) now() time.Time {
	if s.Now != nil {
		return s.Now()
	}
	return time.Now()
}

func (s *Server) newID(prefix string) string {
	b := make([]byte, 9)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)[:17]
}

// advanceLocked moves instances on by the clock.
func (s *Server) advanceLocked() {
	now := s.now()
	for id, i := range s.instances {
		switch {
		case i.State == statePending && !now.Before(i.until) && i.FailLaunch != "":
			s.terminateLocked(i, i.FailLaunch)
		case i.State == statePending && !now.Before(i.until):
			i.State = stateRunning
			if i.PublicIP == "" && i.Params["NetworkInterface.1.AssociatePublicIpAddress"] == "true" {
				s.seq++
				i.PublicIP = fmt.Sprintf("198.51.100.%d", s.seq%250+1)
			}
		case i.State == stateShuttingDown && !now.Before(i.until):
			i.State, i.PublicIP, i.gone = stateTerminated, "", now.Add(s.TerminatedListed)
		case i.State == stateTerminated && !now.Before(i.gone):
			delete(s.instances, id)
		}
	}
}

func (s *Server) terminateLocked(i *Instance, reason string) {
	i.State, i.until = stateShuttingDown, s.now().Add(s.TerminatingFor)
	i.StateReason = reason
	if s.OnTerminate != nil {
		s.OnTerminate(i)
	}
}

// apiError is an EC2 error answer.
type apiError struct {
	status        int
	code, message string
}

func fail(code, format string, a ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, code: code, message: fmt.Sprintf(format, a...)}
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.ParseForm() != nil {
		writeError(w, fail("InvalidAction", "the EC2 Query API takes a form POST"))
		return
	}
	auth := r.Header.Get("Authorization")
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential="+AccessKey+"/") {
		writeError(w, &apiError{status: http.StatusUnauthorized, code: "AuthFailure", message: "AWS was not able to validate the provided access credentials"})
		return
	}
	if strings.Contains(auth, "/sts/aws4_request") {
		p := map[string]string{}
		for k, v := range r.PostForm {
			p[k] = v[0]
		}
		s.serveSTS(w, auth, p)
		return
	}
	if !strings.Contains(auth, "/"+Region+"/ec2/aws4_request") {
		writeError(w, &apiError{status: http.StatusUnauthorized, code: "AuthFailure", message: "credential should be scoped to a valid region, " + Region})
		return
	}
	f := r.PostForm
	action := f.Get("Action")
	if v := f.Get("Version"); v != "2016-11-15" {
		writeError(w, fail("InvalidParameterValue", "unsupported API version %q", v))
		return
	}
	p := map[string]string{}
	for k, v := range f {
		p[k] = v[0]
	}
	out, err, delay := s.call(action, p)
	if err != nil {
		writeError(w, err)
		return
	}
	if s.OnChange != nil && changes[action] {
		s.OnChange(action)
	}
	time.Sleep(delay)
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(out)
}

// call makes one call of action: its answer or error, and how long the
// answer waits after the change was made.
func (s *Server) call(action string, p map[string]string) (any, *apiError, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[action]++
	s.params[action] = append(s.params[action], maps.Clone(p))
	s.advanceLocked()
	if e := s.scriptedLocked(action); e != nil {
		return nil, e, 0
	}
	handle, ok := s.actions()[action]
	if !ok {
		return nil, fail("InvalidAction", "The action %s is not valid for this web service.", action), 0
	}
	out, err := handle(p)
	if err != nil || !changes[action] {
		return out, err, 0
	}
	return out, nil, s.AnswerAfter
}

// actions are the fake's actions by name.
func (s *Server) actions() map[string]func(map[string]string) (any, *apiError) {
	return map[string]func(map[string]string) (any, *apiError){
		"RunInstances": s.runInstances, "DescribeInstances": s.describeInstances, "TerminateInstances": s.terminateInstances,
		"CreateTags": s.createTags, "DeleteTags": s.deleteTags, "DescribeSubnets": s.describeSubnets, "DescribeImages": s.describeImages,
		"CreateSecurityGroup": s.createSecurityGroup, "DescribeSecurityGroups": s.describeSecurityGroups,
		"AuthorizeSecurityGroupIngress": s.authorizeIngress, "DeleteSecurityGroup": s.deleteSecurityGroup,
	}
}

// scriptedLocked is the failure scripted for action's call, if any.
func (s *Server) scriptedLocked(action string) *apiError {
	fl := s.failures[action]
	if fl == nil {
		return nil
	}
	if fl.Times <= 1 && fl.Times >= 0 {
		delete(s.failures, action)
	} else if fl.Times > 1 {
		fl.Times--
	}
	e := &apiError{status: fl.Status, code: fl.Code, message: fl.Message}
	if e.status == 0 {
		e.status = http.StatusBadRequest
		if fl.Code == "RequestLimitExceeded" || fl.Code == "Unavailable" {
			e.status = http.StatusServiceUnavailable
		}
	}
	if e.message == "" {
		e.message = "scripted failure " + fl.Code
	}
	return e
}

func writeError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(e.status)
	_ = xml.NewEncoder(w).Encode(xErrorResponse{Errors: []xError{{Code: e.code, Message: e.message}}, RequestID: requestID})
}

// list collects prefix.1, prefix.2, ... of p.
func list(p map[string]string, prefix string) []string {
	var out []string
	for n := 1; ; n++ {
		v, ok := p[prefix+"."+strconv.Itoa(n)]
		if !ok {
			return out
		}
		out = append(out, v)
	}
}

// filters reads Filter.N.Name and Filter.N.Value.M.
func filters(p map[string]string) (map[string][]string, *apiError) {
	out := map[string][]string{}
	for n := 1; ; n++ {
		name, ok := p["Filter."+strconv.Itoa(n)+".Name"]
		if !ok {
			return out, nil
		}
		vals := list(p, "Filter."+strconv.Itoa(n)+".Value")
		if len(vals) == 0 {
			return nil, fail("InvalidParameterValue", "The filter '%s' has no values", name)
		}
		out[name] = append(out[name], vals...)
	}
}

// tagsMatch applies the tag:KEY and tag-key filters to tags.
func tagsMatch(f map[string][]string, tags map[string]string) bool {
	for name, vals := range f {
		switch {
		case strings.HasPrefix(name, "tag:"):
			if v, ok := tags[strings.TrimPrefix(name, "tag:")]; !ok || !slices.Contains(vals, v) {
				return false
			}
		case name == "tag-key":
			if !slices.ContainsFunc(vals, func(k string) bool { _, ok := tags[k]; return ok }) {
				return false
			}
		}
	}
	return true
}

// page cuts keys by MaxResults (lo..1000, at most MaxPage) and NextToken.
func (s *Server) page(p map[string]string, keys []string, lo int) ([]string, string, *apiError) {
	start := 0
	if t := p["NextToken"]; t != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(t, "page-"))
		if err != nil || !strings.HasPrefix(t, "page-") || n < 0 || n > len(keys) {
			return nil, "", fail("InvalidParameterValue", "invalid NextToken %q", t)
		}
		start = n
	}
	size := len(keys)
	if m := p["MaxResults"]; m != "" {
		n, err := strconv.Atoi(m)
		if err != nil || n < lo || n > 1000 {
			return nil, "", fail("InvalidParameterValue", "MaxResults must be between %d and 1000", lo)
		}
		size = n
	}
	if s.MaxPage > 0 {
		size = min(size, s.MaxPage)
	}
	end := min(start+size, len(keys))
	next := ""
	if end < len(keys) {
		next = "page-" + strconv.Itoa(end)
	}
	return keys[start:end], next, nil
}

var knownFilters = map[string]bool{"instance-state-name": true, "client-token": true, "instance-id": true, "tag-key": true, "vpc-id": true, "group-name": true, "group-id": true, "availability-zone": true, "default-for-az": true, "subnet-id": true}

func checkFilters(f map[string][]string) *apiError {
	for name := range f {
		if !knownFilters[name] && !strings.HasPrefix(name, "tag:") {
			return fail("InvalidParameterValue", "The filter '%s' is invalid", name)
		}
	}
	return nil
}

var instanceTypes = map[string]int{"t3.micro": 2, "t3.small": 2, "t3.medium": 2, "t3a.micro": 2, "t4g.micro": 2, "t3.large": 2, "c7i.large": 2, "m7i.large": 2}

func (s *Server) runInstances(p map[string]string) (any, *apiError) {
	if p["MinCount"] != "1" || p["MaxCount"] != "1" {
		return nil, fail("InvalidParameterValue", "the backend runs one instance a request: MinCount and MaxCount 1")
	}
	token := p["ClientToken"]
	if len(token) > 64 {
		return nil, fail("InvalidParameterValue", "Value (%s) for parameter clientToken is invalid. Length exceeds maximum of 64 ASCII characters", token)
	}
	if i, ok := s.tokens[token]; token != "" && ok {
		// EC2 keeps a token bound to its instance for a day or more
		// after the instance was terminated and stopped being listed.
		if !sameRun(i.Params, p) {
			return nil, fail("IdempotentParameterMismatch", "Arguments on this idempotent request are inconsistent with arguments used in previous request(s).")
		}
		return xRunResponse{ReservationID: "r-" + i.ID[2:], OwnerID: "123456789012", Instances: []xInstance{s.toX(i)}}, nil
	}
	if _, ok := instanceTypes[p["InstanceType"]]; !ok {
		return nil, fail("InvalidParameterValue", "Invalid value '%s' for InstanceType.", p["InstanceType"])
	}
	image := p["ImageId"]
	if !strings.HasPrefix(image, "resolve:ssm:") {
		if !strings.HasPrefix(image, "ami-") {
			return nil, fail("InvalidAMIID.Malformed", "Invalid id: \"%s\" (expecting \"ami-...\")", image)
		}
		if _, ok := images[image]; !ok {
			return nil, fail("InvalidAMIID.NotFound", "The image id '[%s]' does not exist", image)
		}
	}
	sn, groups, err := s.runPlacement(p)
	if err != nil {
		return nil, err
	}
	if len(p["UserData"]) > 16384*4/3+4 {
		return nil, fail("InvalidParameterValue", "User data is limited to 16384 bytes")
	}
	tags, err := runTags(p)
	if err != nil {
		return nil, err
	}
	sid := sn.id
	i := &Instance{
		ID: s.newID("i"), ImageID: image, Type: p["InstanceType"], Zone: sn.zone, SubnetID: sid, VPCID: sn.vpc,
		ClientToken: token, State: statePending, Groups: groups, Tags: tags, Launched: s.now().UTC(), UserData: p["UserData"],
		Params: p, until: s.now().Add(s.PendingFor), Spot: p["InstanceMarketOptions.MarketType"] == "spot",
	}
	s.seq++
	i.PrivateIP = fmt.Sprintf("172.31.%d.%d", s.seq/250%250, s.seq%250+1)
	if s.OnRun != nil {
		s.OnRun(i)
	}
	s.instances[i.ID] = i
	if token != "" {
		s.tokens[token] = i
	}
	return xRunResponse{ReservationID: "r-" + i.ID[2:], OwnerID: "123456789012", Instances: []xInstance{s.toX(i)}}, nil
}

// runPlacement is the subnet and security groups a RunInstances asks for,
// checked: the subnet exists (in the zone asked for), the groups in its
// VPC.
func (s *Server) runPlacement(p map[string]string) (subnet, []string, *apiError) {
	sid := p["NetworkInterface.1.SubnetId"]
	if sid == "" {
		sid = p["SubnetId"]
	}
	sn, ok := s.subnets[sid]
	if !ok {
		return subnet{}, nil, fail("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", sid)
	}
	if z := p["Placement.AvailabilityZone"]; z != "" && z != sn.zone {
		return subnet{}, nil, fail("InvalidParameterValue", "subnet %s is in %s, not %s", sid, sn.zone, z)
	}
	groups := list(p, "NetworkInterface.1.SecurityGroupId")
	if len(groups) == 0 {
		groups = list(p, "SecurityGroupId")
	}
	for _, g := range groups {
		if gr := s.groups[g]; gr == nil || gr.VPCID != sn.vpc {
			return subnet{}, nil, fail("InvalidGroup.NotFound", "The security group '%s' does not exist in VPC '%s'", g, sn.vpc)
		}
	}
	return sn, groups, nil
}

// runTags are the instance's tags of a RunInstances' TagSpecifications,
// checked as EC2 does.
func runTags(p map[string]string) (map[string]string, *apiError) {
	tags := map[string]string{}
	for n := 1; ; n++ {
		pre := "TagSpecification." + strconv.Itoa(n)
		rt, ok := p[pre+".ResourceType"]
		if !ok {
			break
		}
		if rt != "instance" && rt != "volume" && rt != "network-interface" {
			return nil, fail("InvalidParameterValue", "'%s' is not a valid taggable resource type for this operation.", rt)
		}
		for m := 1; ; m++ {
			k, ok := p[pre+".Tag."+strconv.Itoa(m)+".Key"]
			if !ok {
				break
			}
			if rt == "instance" {
				tags[k] = p[pre+".Tag."+strconv.Itoa(m)+".Value"]
			}
		}
	}
	return tags, checkTags(tags)
}

// sameRun compares two RunInstances requests as EC2's idempotency does:
// every parameter but the signature's.
func sameRun(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func checkTags(tags map[string]string) *apiError {
	if len(tags) > 50 {
		return fail("TagLimitExceeded", "The maximum number of tags (50) was exceeded")
	}
	for k, v := range tags {
		if k == "" || len(k) > 128 || len(v) > 256 || strings.HasPrefix(strings.ToLower(k), "aws:") {
			return fail("InvalidParameterValue", "Tag key %q or value %q is invalid", k, v)
		}
	}
	return nil
}

func (s *Server) describeInstances(p map[string]string) (any, *apiError) {
	now := s.now()
	ids := list(p, "InstanceId")
	if len(ids) > 0 && p["MaxResults"] != "" {
		return nil, fail("InvalidParameterCombination", "The parameter instancesSet cannot be used with the parameter maxResults")
	}
	f, err := filters(p)
	if err != nil {
		return nil, err
	}
	if err := checkFilters(f); err != nil {
		return nil, err
	}
	for _, id := range ids {
		if s.instances[id] == nil {
			return nil, fail("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	var keys []string
	for _, id := range sortedKeys(s.instances) {
		if i := s.instances[id]; (len(ids) == 0 || slices.Contains(ids, id)) && !now.Before(i.Launched.Add(s.HideNewFor)) && selects(f, i) {
			keys = append(keys, id)
		}
	}
	pg, next, err := s.page(p, keys, 5)
	if err != nil {
		return nil, err
	}
	out := xDescribeInstancesResponse{NextToken: next}
	for _, id := range pg {
		i := s.instances[id]
		out.Reservations = append(out.Reservations, xReservation{ReservationID: "r-" + id[2:], OwnerID: "123456789012", Instances: []xInstance{s.toX(i)}})
	}
	return out, nil
}

// selects applies DescribeInstances' filters to i.
func selects(f map[string][]string, i *Instance) bool {
	in := func(name, v string) bool { return f[name] == nil || slices.Contains(f[name], v) }
	return tagsMatch(f, i.Tags) && in("instance-state-name", i.State) && in("client-token", i.ClientToken) &&
		in("instance-id", i.ID) && in("availability-zone", i.Zone)
}

func (s *Server) terminateInstances(p map[string]string) (any, *apiError) {
	ids := list(p, "InstanceId")
	if len(ids) == 0 {
		return nil, fail("MissingParameter", "The request must contain the parameter InstanceId")
	}
	for _, id := range ids {
		if s.instances[id] == nil {
			return nil, fail("InvalidInstanceID.NotFound", "The instance ID '%s' does not exist", id)
		}
	}
	out := xTerminateResponse{}
	for _, id := range ids {
		i := s.instances[id]
		prev := xState{Code: stateCode[i.State], Name: i.State}
		if i.State != stateTerminated && i.State != stateShuttingDown {
			s.terminateLocked(i, "Client.UserInitiatedShutdown: User initiated shutdown")
		}
		out.Changes = append(out.Changes, xStateChange{InstanceID: id, Previous: prev, Current: xState{Code: stateCode[i.State], Name: i.State}})
	}
	return out, nil
}

func (s *Server) createTags(p map[string]string) (any, *apiError) {
	ids := list(p, "ResourceId")
	tags := map[string]string{}
	for m := 1; ; m++ {
		k, ok := p["Tag."+strconv.Itoa(m)+".Key"]
		if !ok {
			break
		}
		tags[k] = p["Tag."+strconv.Itoa(m)+".Value"]
	}
	if len(ids) == 0 || len(tags) == 0 {
		return nil, fail("MissingParameter", "CreateTags needs ResourceId and Tag")
	}
	for _, id := range ids {
		var have map[string]string
		switch {
		case s.instances[id] != nil:
			have = s.instances[id].Tags
		case s.groups[id] != nil:
			have = s.groups[id].Tags
		default:
			return nil, fail("InvalidID", "The ID '%s' is not valid", id)
		}
		merged := map[string]string{}
		for k, v := range have {
			merged[k] = v
		}
		for k, v := range tags {
			merged[k] = v
		}
		if err := checkTags(merged); err != nil {
			return nil, err
		}
	}
	for _, id := range ids {
		var have map[string]string
		if s.instances[id] != nil {
			have = s.instances[id].Tags
		} else {
			have = s.groups[id].Tags
		}
		for k, v := range tags {
			have[k] = v
		}
	}
	return xReturn{Return: true}, nil
}

// deleteTags removes tags, as EC2 does: a tag given with a value goes only
// when its value is that one; a key a resource lacks is no error.
func (s *Server) deleteTags(p map[string]string) (any, *apiError) {
	ids := list(p, "ResourceId")
	if len(ids) == 0 {
		return nil, fail("MissingParameter", "DeleteTags needs ResourceId")
	}
	var tags []map[string]string
	for m := 1; ; m++ {
		k, ok := p["Tag."+strconv.Itoa(m)+".Key"]
		if !ok {
			break
		}
		t := map[string]string{"key": k}
		if v, ok := p["Tag."+strconv.Itoa(m)+".Value"]; ok {
			t["value"] = v
		}
		tags = append(tags, t)
	}
	have := make([]map[string]string, 0, len(ids))
	for _, id := range ids {
		switch {
		case s.instances[id] != nil:
			have = append(have, s.instances[id].Tags)
		case s.groups[id] != nil:
			have = append(have, s.groups[id].Tags)
		default:
			return nil, fail("InvalidID", "The ID '%s' is not valid", id)
		}
	}
	for _, h := range have {
		for _, t := range tags {
			if v, ok := t["value"]; !ok || h[t["key"]] == v {
				delete(h, t["key"])
			}
		}
	}
	return xReturn{Return: true}, nil
}

func (s *Server) describeSubnets(p map[string]string) (any, *apiError) {
	f, err := filters(p)
	if err != nil {
		return nil, err
	}
	if err := checkFilters(f); err != nil {
		return nil, err
	}
	ids := list(p, "SubnetId")
	out := xDescribeSubnetsResponse{}
	for _, id := range sortedKeys(s.subnets) {
		sn := s.subnets[id]
		def := strconv.FormatBool(strings.HasPrefix(id, "subnet-0default"))
		if (len(ids) > 0 && !slices.Contains(ids, id)) ||
			(f["availability-zone"] != nil && !slices.Contains(f["availability-zone"], sn.zone)) ||
			(f["default-for-az"] != nil && !slices.Contains(f["default-for-az"], def)) ||
			(f["vpc-id"] != nil && !slices.Contains(f["vpc-id"], sn.vpc)) ||
			(f["subnet-id"] != nil && !slices.Contains(f["subnet-id"], id)) {
			continue
		}
		out.Subnets = append(out.Subnets, xSubnet{SubnetID: id, VPCID: sn.vpc, Zone: sn.zone, CIDR: sn.cidr, DefaultForAz: def == "true", State: "available"})
	}
	for _, id := range ids {
		if _, ok := s.subnets[id]; !ok {
			return nil, fail("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", id)
		}
	}
	return out, nil
}

func (s *Server) describeImages(p map[string]string) (any, *apiError) {
	ids := list(p, "ImageId")
	out := xDescribeImagesResponse{}
	for _, id := range ids {
		im, ok := images[id]
		if !ok {
			return nil, fail("InvalidAMIID.NotFound", "The image id '[%s]' does not exist", id)
		}
		out.Images = append(out.Images, xImage{ImageID: id, OwnerID: im.owner, RootDeviceName: im.root, Name: im.name, State: "available"})
	}
	return out, nil
}

func (s *Server) createSecurityGroup(p map[string]string) (any, *apiError) {
	name, vpc := p["GroupName"], p["VpcId"]
	if name == "" || p["GroupDescription"] == "" || len(name) > 255 || len(p["GroupDescription"]) > 255 || strings.HasPrefix(name, "sg-") {
		return nil, fail("InvalidParameterValue", "Invalid security group name or description: %q", name)
	}
	known := false
	for _, sn := range s.subnets {
		known = known || sn.vpc == vpc
	}
	if !known {
		return nil, fail("InvalidVpcID.NotFound", "The vpc ID '%s' does not exist", vpc)
	}
	for _, g := range s.groups {
		if g.Name == name && g.VPCID == vpc {
			return nil, fail("InvalidGroup.Duplicate", "The security group '%s' already exists for VPC '%s'", name, vpc)
		}
	}
	tags := map[string]string{}
	for n := 1; ; n++ {
		pre := "TagSpecification." + strconv.Itoa(n)
		if _, ok := p[pre+".ResourceType"]; !ok {
			break
		}
		if p[pre+".ResourceType"] != "security-group" {
			return nil, fail("InvalidParameterValue", "'%s' is not a valid taggable resource type for this operation.", p[pre+".ResourceType"])
		}
		for m := 1; ; m++ {
			k, ok := p[pre+".Tag."+strconv.Itoa(m)+".Key"]
			if !ok {
				break
			}
			tags[k] = p[pre+".Tag."+strconv.Itoa(m)+".Value"]
		}
	}
	if err := checkTags(tags); err != nil {
		return nil, err
	}
	g := &Group{ID: s.newID("sg"), Name: name, Description: p["GroupDescription"], VPCID: vpc, Tags: tags}
	s.groups[g.ID] = g
	return xCreateGroupResponse{GroupID: g.ID}, nil
}

func (s *Server) describeSecurityGroups(p map[string]string) (any, *apiError) {
	f, err := filters(p)
	if err != nil {
		return nil, err
	}
	if err := checkFilters(f); err != nil {
		return nil, err
	}
	ids := list(p, "GroupId")
	for _, id := range ids {
		if s.groups[id] == nil {
			return nil, fail("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
		}
	}
	var keys []string
	for _, id := range sortedKeys(s.groups) {
		g := s.groups[id]
		if (len(ids) > 0 && !slices.Contains(ids, id)) || !tagsMatch(f, g.Tags) ||
			(f["group-name"] != nil && !slices.Contains(f["group-name"], g.Name)) ||
			(f["vpc-id"] != nil && !slices.Contains(f["vpc-id"], g.VPCID)) ||
			(f["group-id"] != nil && !slices.Contains(f["group-id"], id)) {
			continue
		}
		keys = append(keys, id)
	}
	pg, next, err := s.page(p, keys, 5)
	if err != nil {
		return nil, err
	}
	out := xDescribeGroupsResponse{NextToken: next}
	for _, id := range pg {
		out.Groups = append(out.Groups, toXGroup(s.groups[id]))
	}
	return out, nil
}

func (s *Server) authorizeIngress(p map[string]string) (any, *apiError) {
	g := s.groups[p["GroupId"]]
	if g == nil {
		return nil, fail("InvalidGroup.NotFound", "The security group '%s' does not exist", p["GroupId"])
	}
	var add []string
	for n := 1; ; n++ {
		pre := "IpPermissions." + strconv.Itoa(n)
		proto, ok := p[pre+".IpProtocol"]
		if !ok {
			break
		}
		if proto != "tcp" {
			return nil, fail("InvalidParameterValue", "the backend opens tcp only, not %q", proto)
		}
		from, to := p[pre+".FromPort"], p[pre+".ToPort"]
		cidrs := []string{}
		for m := 1; ; m++ {
			c, ok := p[pre+".IpRanges."+strconv.Itoa(m)+".CidrIp"]
			if !ok {
				break
			}
			if !validCIDR4(c) {
				return nil, fail("InvalidParameterValue", "CIDR block %s is malformed", c)
			}
			cidrs = append(cidrs, c)
		}
		for _, c := range cidrs {
			add = append(add, "tcp:"+from+"-"+to+":"+c)
		}
	}
	if len(add) == 0 {
		return nil, fail("MissingParameter", "no IpPermissions")
	}
	for _, r := range add {
		if slices.Contains(g.Ingress, r) {
			return nil, fail("InvalidPermission.Duplicate", "the specified rule \"peer: %s\" already exists", r)
		}
	}
	if len(g.Ingress)+len(add) > 60 {
		return nil, fail("RulesPerSecurityGroupLimitExceeded", "The maximum number of rules per security group has been reached.")
	}
	g.Ingress = append(g.Ingress, add...)
	return xReturn{Return: true}, nil
}

// validCIDR4 is an IPv4 CIDR with no host bits set, as EC2 takes it.
func validCIDR4(c string) bool {
	var a, b, cc, d, bits int
	if n, err := fmt.Sscanf(c, "%d.%d.%d.%d/%d", &a, &b, &cc, &d, &bits); n != 5 || err != nil {
		return false
	}
	if fmt.Sprintf("%d.%d.%d.%d/%d", a, b, cc, d, bits) != c || bits < 0 || bits > 32 {
		return false
	}
	ip := uint32(a)<<24 | uint32(b)<<16 | uint32(cc)<<8 | uint32(d)
	return bits == 32 || ip&(1<<(32-bits)-1) == 0
}

func (s *Server) deleteSecurityGroup(p map[string]string) (any, *apiError) {
	g := s.groups[p["GroupId"]]
	if g == nil {
		return nil, fail("InvalidGroup.NotFound", "The security group '%s' does not exist", p["GroupId"])
	}
	for _, i := range s.instances {
		if i.State != stateTerminated && slices.Contains(i.Groups, g.ID) {
			return nil, fail("DependencyViolation", "resource %s has a dependent object", g.ID)
		}
	}
	delete(s.groups, g.ID)
	return xReturn{Return: true}, nil
}

var stateCode = map[string]int{statePending: 0, stateRunning: 16, stateShuttingDown: 32, stateTerminated: 48, "stopping": 64, "stopped": 80}

// SetState puts an instance in state (stopping, stopped, running...), as
// a user in the console would.
func (s *Server) SetState(id, state string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i := s.instances[id]; i != nil {
		i.State = state
	}
}
