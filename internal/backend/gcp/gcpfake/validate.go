package gcpfake

import (
	"fmt"
	"net/http"
	"net/netip"
	"regexp"
	"strings"

	"cloud.google.com/go/compute/apiv1/computepb"
)

// problem is a request the API refuses, with GCP's status, reason and
// message.
type problem struct {
	code   int
	reason string
	msg    string
}

func (p *problem) write(w http.ResponseWriter) { writeError(w, p.code, p.reason, "", p.msg) }

func invalid(field, value, why string) *problem {
	return &problem{code: http.StatusBadRequest, reason: "invalid", msg: fmt.Sprintf("Invalid value for field '%s': '%s'. %s", field, value, why)}
}

// iamDenied is an insert refused a permission on resource, as Compute
// Engine words it.
func iamDenied(permission, resource string) *problem {
	f := IAMDenied(permission, resource)
	return &problem{code: f.Code, reason: f.Reason, msg: f.Message}
}

func missing(resource string) *problem {
	return &problem{code: http.StatusNotFound, reason: "notFound", msg: fmt.Sprintf("The resource '%s' was not found", resource)}
}

// The forms of names and references GCP documents.
var (
	reName       = regexp.MustCompile(`^[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?$`)
	reLabelKey   = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,62}$`)
	reLabelValue = regexp.MustCompile(`^[a-z0-9_-]{0,63}$`)
	reMetaKey    = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,128}$`)
	reAPIPrefix  = regexp.MustCompile(`^https://(?:www|compute)\.googleapis\.com/compute/v1/`)
	reMachine    = regexp.MustCompile(`^(?:projects/([^/]+)/)?zones/([^/]+)/machineTypes/([^/]+)$`)
	reDiskType   = regexp.MustCompile(`^(?:projects/([^/]+)/)?zones/([^/]+)/diskTypes/([^/]+)$`)
	reImage      = regexp.MustCompile(`^(?:projects/([^/]+)/)?global/images/(family/)?([^/]+)$`)
	reNetwork    = regexp.MustCompile(`^(?:projects/([^/]+)/)?global/networks/([^/]+)$`)
	reSubnetwork = regexp.MustCompile(`^(?:projects/([^/]+)/)?regions/([^/]+)/subnetworks/([^/]+)$`)
)

const namePattern = "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'"

// MachineTypes are the machine types every fake zone offers.
var MachineTypes = []string{
	"e2-micro", "e2-small", "e2-medium", "e2-standard-2", "e2-standard-4", "n1-standard-1", "n2-standard-2",
	"t2d-standard-1", "c3-standard-4", "n4-standard-2",
}

// Images are the public images and families the fake knows.
var Images = []string{
	"projects/debian-cloud/global/images/family/debian-12", "projects/debian-cloud/global/images/family/debian-11",
	"projects/debian-cloud/global/images/debian-12-bookworm-v20241112", "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts",
	"projects/cos-cloud/global/images/family/cos-stable",
}

// DiskTypes are the boot disk types. The newer machine families refuse
// pd-standard (a disk of no stated type is one), and the older ones
// refuse Hyperdisk.
var (
	DiskTypes           = []string{"pd-standard", "pd-balanced", "pd-ssd", "hyperdisk-balanced"}
	pdStandardless      = []string{"c3-", "c3d-", "c4-", "c4a-", "c4d-", "n4-", "h3-"}
	hyperdiskIncapables = []string{"e2-", "n1-", "t2d-"}
)

// ref resolves a reference in one of GCP's forms, full URL included: its
// project (the request's when it has none) and its other parts.
func ref(re *regexp.Regexp, v, project string) ([]string, bool) {
	m := re.FindStringSubmatch(reAPIPrefix.ReplaceAllString(v, ""))
	if m == nil {
		return nil, false
	}
	if m[1] == "" {
		m[1] = project
	}
	return m, true
}

func regionOf(zone string) string {
	if i := strings.LastIndexByte(zone, '-'); i > 0 {
		return zone[:i]
	}
	return zone
}

func hasPrefix(v string, prefixes []string) bool {
	for _, p := range prefixes {
		if strings.HasPrefix(v, p) {
			return true
		}
	}
	return false
}

func contains(list []string, v string) bool {
	for _, x := range list {
		if x == v {
			return true
		}
	}
	return false
}

// network returns whether a network exists and is in auto mode.
func (s *Server) network(key string) (exists, auto bool) {
	if auto, ok := s.networks[key]; ok {
		return true, auto
	}
	return strings.HasSuffix(key, "/global/networks/default") && !s.removed[key], true
}

func checkLabels(labels map[string]string) *problem {
	if len(labels) > 64 {
		return invalid("resource.labels", "", "Resource can have at most 64 labels.")
	}
	for k, v := range labels {
		if !reLabelKey.MatchString(k) {
			return invalid("resource.labels", "", fmt.Sprintf("Label key '%s' violates format constraints. The key must start with a lowercase character, can only contain lowercase letters, numeric characters, underscores and dashes. The key can be at most 63 characters long.", k))
		}
		if !reLabelValue.MatchString(v) {
			return invalid("resource.labels", "", fmt.Sprintf("Label value '%s' violates format constraints. The value can only contain lowercase letters, numeric characters, underscores and dashes. The value can be at most 63 characters long.", v))
		}
	}
	return nil
}

func checkTags(field string, tags []string) *problem {
	if len(tags) > 64 {
		return invalid(field, "", "At most 64 tags are allowed.")
	}
	for i, t := range tags {
		if !reName.MatchString(t) {
			return invalid(fmt.Sprintf("%s[%d]", field, i), t, namePattern)
		}
	}
	return nil
}

func checkMetadata(md *computepb.Metadata) *problem {
	total, seen := 0, map[string]bool{}
	for _, it := range md.GetItems() {
		k := it.GetKey()
		switch {
		case !reMetaKey.MatchString(k):
			return invalid("resource.metadata.items.key", k, "Must be a match of regex '[a-zA-Z0-9-_]{1,128}'")
		case seen[k]:
			return invalid("resource.metadata", "", fmt.Sprintf("Metadata has duplicate keys: '%s'.", k))
		case len(it.GetValue()) > 256*1024:
			return invalid("resource.metadata", "", fmt.Sprintf("Metadata has a value for key '%s' that exceeds the maximum allowed 262144 bytes.", k))
		}
		seen[k] = true
		total += len(k) + len(it.GetValue())
	}
	if total > 512*1024 {
		return invalid("resource.metadata", "", "Metadata has a total size that exceeds the maximum allowed 524288 bytes.")
	}
	return nil
}

// checkInstance refuses an instance Compute Engine would refuse.
func (s *Server) checkInstance(project, zone string, vm *computepb.Instance) *problem {
	if !reName.MatchString(vm.GetName()) {
		return invalid("resource.name", vm.GetName(), namePattern)
	}
	mt, ok := ref(reMachine, vm.GetMachineType(), project)
	switch {
	case !ok:
		return invalid("resource.machineType", vm.GetMachineType(), "Must be the URL to a Compute resource of the correct type")
	case mt[2] != zone:
		return invalid("resource.machineType", vm.GetMachineType(), fmt.Sprintf("Machine type zone '%s' does not match the instance zone '%s'.", mt[2], zone))
	case !contains(MachineTypes, mt[3]):
		return invalid("resource.machineType", vm.GetMachineType(), fmt.Sprintf("Machine type with name '%s' does not exist in zone '%s'.", mt[3], zone))
	}
	if p := checkLabels(vm.GetLabels()); p != nil {
		return p
	}
	if p := checkTags("resource.tags.items", vm.GetTags().GetItems()); p != nil {
		return p
	}
	if p := checkMetadata(vm.GetMetadata()); p != nil {
		return p
	}
	if p := s.checkDisks(project, zone, mt[3], vm); p != nil {
		return p
	}
	return s.checkNICs(project, zone, vm)
}

func (s *Server) checkDisks(project, zone, machine string, vm *computepb.Instance) *problem {
	boots := 0
	for i, d := range vm.GetDisks() {
		if !d.GetBoot() {
			continue
		}
		boots++
		ip := d.GetInitializeParams()
		img, ok := ref(reImage, ip.GetSourceImage(), project)
		if !ok {
			return invalid(fmt.Sprintf("resource.disks[%d].initializeParams.sourceImage", i), ip.GetSourceImage(), "Must be the URL to a Compute resource of the correct type")
		}
		path := fmt.Sprintf("projects/%s/global/images/%s%s", img[1], img[2], img[3])
		if !contains(Images, path) {
			return missing(path)
		}
		if ip.GetDiskType() == "" {
			if hasPrefix(machine, pdStandardless) {
				return invalid(fmt.Sprintf("resource.disks[%d].initializeParams.diskType", i), "", "[pd-standard] features are not compatible for creating instance.")
			}
			continue
		}
		dt, ok := ref(reDiskType, ip.GetDiskType(), project)
		switch {
		case !ok:
			return invalid(fmt.Sprintf("resource.disks[%d].initializeParams.diskType", i), ip.GetDiskType(), "Must be the URL to a Compute resource of the correct type")
		case dt[2] != zone || !contains(DiskTypes, dt[3]):
			return missing(fmt.Sprintf("projects/%s/zones/%s/diskTypes/%s", dt[1], dt[2], dt[3]))
		case dt[3] == "pd-standard" && hasPrefix(machine, pdStandardless),
			dt[3] == "hyperdisk-balanced" && hasPrefix(machine, hyperdiskIncapables):
			return invalid(fmt.Sprintf("resource.disks[%d].initializeParams.diskType", i), ip.GetDiskType(), fmt.Sprintf("[%s] features are not compatible for creating instance.", dt[3]))
		}
	}
	if boots != 1 {
		return invalid("resource.disks", "", "Exactly one boot disk must be specified.")
	}
	return nil
}

func (s *Server) checkNICs(project, zone string, vm *computepb.Instance) *problem {
	if len(vm.GetNetworkInterfaces()) == 0 {
		return invalid("resource.networkInterfaces", "", "At least one network interface is required.")
	}
	for i, ni := range vm.GetNetworkInterfaces() {
		field := fmt.Sprintf("resource.networkInterfaces[%d]", i)
		var netKey string
		if ni.GetNetwork() != "" {
			n, ok := ref(reNetwork, ni.GetNetwork(), project)
			if !ok {
				return invalid(field+".network", ni.GetNetwork(), "Must be the URL to a Compute resource of the correct type")
			}
			netKey = fmt.Sprintf("projects/%s/global/networks/%s", n[1], n[2])
			if exists, _ := s.network(netKey); !exists {
				return missing(netKey)
			}
		}
		if ni.GetSubnetwork() == "" {
			if netKey == "" {
				netKey = fmt.Sprintf("projects/%s/global/networks/default", project)
				if exists, _ := s.network(netKey); !exists {
					return missing(netKey)
				}
			}
			if _, auto := s.network(netKey); !auto {
				return invalid(field+".subnetwork", "", "Subnetwork should be specified for custom subnetmode network")
			}
			continue
		}
		sn, ok := ref(reSubnetwork, ni.GetSubnetwork(), project)
		if !ok {
			return invalid(field+".subnetwork", ni.GetSubnetwork(), "Must be the URL to a Compute resource of the correct type")
		}
		snKey := fmt.Sprintf("projects/%s/regions/%s/subnetworks/%s", sn[1], sn[2], sn[3])
		owner, exists := s.subnetworks[snKey]
		switch {
		case !exists:
			return missing(snKey)
		case sn[2] != regionOf(zone):
			return invalid(field+".subnetwork", ni.GetSubnetwork(), fmt.Sprintf("Subnetwork region '%s' does not match the instance region '%s'.", sn[2], regionOf(zone)))
		case netKey != "" && owner != netKey:
			return invalid(field+".network", ni.GetNetwork(), fmt.Sprintf("The subnetwork '%s' does not belong to the network.", snKey))
		case s.denied["compute.subnetworks.use "+snKey]:
			return iamDenied("compute.subnetworks.use", snKey)
		case len(ni.GetAccessConfigs()) > 0 && s.denied["compute.subnetworks.useExternalIp "+snKey]:
			return iamDenied("compute.subnetworks.useExternalIp", snKey)
		}
	}
	return nil
}

// checkFirewall refuses a rule Compute Engine would refuse.
func (s *Server) checkFirewall(project string, fw *computepb.Firewall) *problem {
	if !reName.MatchString(fw.GetName()) {
		return invalid("resource.name", fw.GetName(), namePattern)
	}
	n, ok := ref(reNetwork, fw.GetNetwork(), project)
	if fw.GetNetwork() == "" {
		n, ok = []string{"", project, "default"}, true
	}
	if !ok {
		return invalid("resource.network", fw.GetNetwork(), "Must be the URL to a Compute resource of the correct type")
	}
	netKey := fmt.Sprintf("projects/%s/global/networks/%s", n[1], n[2])
	if n[1] != project {
		return invalid("resource.network", fw.GetNetwork(), fmt.Sprintf("A firewall rule of project '%s' cannot apply to network '%s' of another project.", project, netKey))
	}
	if exists, _ := s.network(netKey); !exists {
		return missing(netKey)
	}
	v4, v6 := false, false
	for i, r := range fw.GetSourceRanges() {
		pfx, err := netip.ParsePrefix(r)
		if err != nil || pfx != pfx.Masked() {
			return invalid(fmt.Sprintf("resource.sourceRanges[%d]", i), r, "Must be a CIDR address range that is contained in the network.")
		}
		v4, v6 = v4 || pfx.Addr().Is4(), v6 || !pfx.Addr().Is4()
	}
	if v4 && v6 {
		return invalid("resource.sourceRanges", strings.Join(fw.GetSourceRanges(), ","), "IPv4 and IPv6 ranges cannot be mixed in one firewall rule.")
	}
	if fw.GetDirection() != "" && fw.GetDirection() != "INGRESS" && fw.GetDirection() != "EGRESS" {
		return invalid("resource.direction", fw.GetDirection(), "Must be INGRESS or EGRESS.")
	}
	for i, a := range fw.GetAllowed() {
		if !contains([]string{"tcp", "udp", "icmp", "all"}, a.GetIPProtocol()) {
			return invalid(fmt.Sprintf("resource.allowed[%d].IPProtocol", i), a.GetIPProtocol(), "Must be a protocol name or number.")
		}
	}
	return checkTags("resource.targetTags", fw.GetTargetTags())
}
