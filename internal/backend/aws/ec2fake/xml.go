package ec2fake

import (
	"encoding/xml"
	"sort"
)

// EC2's response shapes, as the Query API's XML names them: lists are
// members named item inside a ...Set element.

type xErrorResponse struct {
	XMLName   xml.Name `xml:"Response"`
	Errors    []xError `xml:"Errors>Error"`
	RequestID string   `xml:"RequestID"`
}

type xError struct {
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}

type xState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type xTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type xGroupRef struct {
	GroupID   string `xml:"groupId"`
	GroupName string `xml:"groupName,omitempty"`
}

type xStateReason struct {
	Code    string `xml:"code"`
	Message string `xml:"message"`
}

type xMetadataOptions struct {
	HTTPTokens   string `xml:"httpTokens,omitempty"`
	HopLimit     string `xml:"httpPutResponseHopLimit,omitempty"`
	HTTPEndpoint string `xml:"httpEndpoint,omitempty"`
}

type xInstance struct {
	InstanceID        string            `xml:"instanceId"`
	ImageID           string            `xml:"imageId"`
	State             xState            `xml:"instanceState"`
	PrivateIP         string            `xml:"privateIpAddress,omitempty"`
	PublicIP          string            `xml:"ipAddress,omitempty"`
	InstanceType      string            `xml:"instanceType"`
	LaunchTime        string            `xml:"launchTime"`
	Zone              string            `xml:"placement>availabilityZone"`
	SubnetID          string            `xml:"subnetId"`
	VPCID             string            `xml:"vpcId"`
	ClientToken       string            `xml:"clientToken,omitempty"`
	InstanceLifecycle string            `xml:"instanceLifecycle,omitempty"`
	Groups            []xGroupRef       `xml:"groupSet>item"`
	Tags              []xTag            `xml:"tagSet>item"`
	StateReason       *xStateReason     `xml:"stateReason,omitempty"`
	MetadataOptions   *xMetadataOptions `xml:"metadataOptions,omitempty"`
}

type xRunResponse struct {
	XMLName       xml.Name    `xml:"RunInstancesResponse"`
	ReservationID string      `xml:"reservationId"`
	OwnerID       string      `xml:"ownerId"`
	Instances     []xInstance `xml:"instancesSet>item"`
}

type xReservation struct {
	ReservationID string      `xml:"reservationId"`
	OwnerID       string      `xml:"ownerId"`
	Instances     []xInstance `xml:"instancesSet>item"`
}

type xDescribeInstancesResponse struct {
	XMLName      xml.Name       `xml:"DescribeInstancesResponse"`
	Reservations []xReservation `xml:"reservationSet>item"`
	NextToken    string         `xml:"nextToken,omitempty"`
}

type xStateChange struct {
	InstanceID string `xml:"instanceId"`
	Current    xState `xml:"currentState"`
	Previous   xState `xml:"previousState"`
}

type xTerminateResponse struct {
	XMLName xml.Name       `xml:"TerminateInstancesResponse"`
	Changes []xStateChange `xml:"instancesSet>item"`
}

type xReturn struct {
	XMLName xml.Name `xml:"Response"`
	Return  bool     `xml:"return"`
}

type xSubnet struct {
	SubnetID     string `xml:"subnetId"`
	VPCID        string `xml:"vpcId"`
	Zone         string `xml:"availabilityZone"`
	CIDR         string `xml:"cidrBlock"`
	DefaultForAz bool   `xml:"defaultForAz"`
	State        string `xml:"state"`
}

type xDescribeSubnetsResponse struct {
	XMLName xml.Name  `xml:"DescribeSubnetsResponse"`
	Subnets []xSubnet `xml:"subnetSet>item"`
}

type xImage struct {
	ImageID        string `xml:"imageId"`
	OwnerID        string `xml:"imageOwnerId"`
	RootDeviceName string `xml:"rootDeviceName"`
	Name           string `xml:"name"`
	State          string `xml:"imageState"`
}

type xDescribeImagesResponse struct {
	XMLName xml.Name `xml:"DescribeImagesResponse"`
	Images  []xImage `xml:"imagesSet>item"`
}

type xCreateGroupResponse struct {
	XMLName xml.Name `xml:"CreateSecurityGroupResponse"`
	GroupID string   `xml:"groupId"`
}

type xIPRange struct {
	CidrIP string `xml:"cidrIp"`
}

type xPermission struct {
	Protocol string     `xml:"ipProtocol"`
	FromPort string     `xml:"fromPort"`
	ToPort   string     `xml:"toPort"`
	Ranges   []xIPRange `xml:"ipRanges>item"`
}

type xGroup struct {
	GroupID     string        `xml:"groupId"`
	GroupName   string        `xml:"groupName"`
	Description string        `xml:"groupDescription"`
	VPCID       string        `xml:"vpcId"`
	OwnerID     string        `xml:"ownerId"`
	Ingress     []xPermission `xml:"ipPermissions>item"`
	Tags        []xTag        `xml:"tagSet>item"`
}

type xDescribeGroupsResponse struct {
	XMLName   xml.Name `xml:"DescribeSecurityGroupsResponse"`
	Groups    []xGroup `xml:"securityGroupInfo>item"`
	NextToken string   `xml:"nextToken,omitempty"`
}

func xTags(m map[string]string) []xTag {
	var out []xTag
	for k, v := range m {
		out = append(out, xTag{k, v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out
}

func (s *Server) toX(i *Instance) xInstance {
	x := xInstance{
		InstanceID: i.ID, ImageID: i.ImageID, State: xState{Code: stateCode[i.State], Name: i.State},
		PrivateIP: i.PrivateIP, PublicIP: i.PublicIP, InstanceType: i.Type,
		LaunchTime: i.Launched.Format("2006-01-02T15:04:05.000Z"), Zone: i.Zone, SubnetID: i.SubnetID, VPCID: i.VPCID,
		ClientToken: i.ClientToken, Tags: xTags(i.Tags),
		MetadataOptions: &xMetadataOptions{HTTPTokens: i.Params["MetadataOptions.HttpTokens"], HopLimit: i.Params["MetadataOptions.HttpPutResponseHopLimit"], HTTPEndpoint: i.Params["MetadataOptions.HttpEndpoint"]},
	}
	if x.MetadataOptions.HTTPTokens == "" {
		// EC2's default: tokens optional, IMDSv1 open.
		x.MetadataOptions.HTTPTokens = "optional"
	}
	if i.Spot {
		x.InstanceLifecycle = "spot"
	}
	for _, g := range i.Groups {
		ref := xGroupRef{GroupID: g}
		if gr := s.groups[g]; gr != nil {
			ref.GroupName = gr.Name
		}
		x.Groups = append(x.Groups, ref)
	}
	if i.StateReason != "" {
		x.StateReason = &xStateReason{Code: i.StateReason, Message: i.StateReason}
	}
	return x
}

func toXGroup(g *Group) xGroup {
	x := xGroup{GroupID: g.ID, GroupName: g.Name, Description: g.Description, VPCID: g.VPCID, OwnerID: "123456789012", Tags: xTags(g.Tags)}
	for _, r := range g.Ingress {
		// tcp:FROM-TO:CIDR
		var from, to, cidr string
		rest := r[len("tcp:"):]
		for j := range rest {
			if rest[j] == '-' {
				from = rest[:j]
				rest = rest[j+1:]
				break
			}
		}
		for j := range rest {
			if rest[j] == ':' {
				to, cidr = rest[:j], rest[j+1:]
				break
			}
		}
		x.Ingress = append(x.Ingress, xPermission{Protocol: "tcp", FromPort: from, ToPort: to, Ranges: []xIPRange{{cidr}}})
	}
	return x
}
