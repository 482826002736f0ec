package v1alpha1

import (
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
)

// Defaults of an EC2 instance's placement.
const (
	// DefaultAWSInstanceType is an instance's type unless its Proxy says.
	DefaultAWSInstanceType = "t3.micro"
	// DefaultAWSImage is Debian 12's current AMI for amd64, as Debian
	// publishes it in every region's Systems Manager parameters: EC2
	// resolves it at launch.
	DefaultAWSImage = "resolve:ssm:/aws/service/debian/release/12/latest/amd64"
)

// AWSPlacement places a proxy on an EC2 instance with its own public IPv4
// address. The instance's region is its ProviderConfig's.
type AWSPlacement struct {
	// Zone is the availability zone the instance runs in, such as
	// us-east-1a: a zone of the ProviderConfig's region.
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[a-z]{2}(-[a-z]+)+-[0-9]+[a-z]$`
	Zone string `json:"zone"`

	AWSInstance `json:",inline"`
}

// AWSInstance is what a proxy's EC2 instance is made of, apart from its
// zone: a ProxyFleet sets it once and spreads its Proxies over zones.
type AWSInstance struct {
	// InstanceType of the instance.
	// +kubebuilder:default="t3.micro"
	// +kubebuilder:validation:MaxLength=64
	// +optional
	InstanceType string `json:"instanceType,omitempty"`

	// Image the instance boots: an AMI ID (ami-...), or resolve:ssm: and
	// a Systems Manager parameter naming one. The generated start-up
	// script supports Debian's and Ubuntu's images.
	// +kubebuilder:default="resolve:ssm:/aws/service/debian/release/12/latest/amd64"
	// +kubebuilder:validation:MaxLength=512
	// +optional
	Image string `json:"image,omitempty"`

	// Subnet the instance's interface attaches to (subnet-...), in the
	// zone; its VPC is where the fleet's security group is made. Unset:
	// the zone's default subnet of the region's default VPC.
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^subnet-[0-9a-f]{8,17}$`
	// +optional
	Subnet string `json:"subnet,omitempty"`

	// SecurityGroups the instance joins besides the fleet's own, which
	// opens the proxy port to the allowed source ranges.
	// +kubebuilder:validation:MaxItems=4
	// +kubebuilder:validation:items:Pattern=`^sg-[0-9a-f]{8,17}$`
	// +listType=set
	// +optional
	SecurityGroups []string `json:"securityGroups,omitempty"`

	// UserData replaces the generated Squid start-up script, for teams
	// with their own proxy image (cloud-init, which Debian's and Ubuntu's
	// AMIs run).
	// +optional
	UserData *CloudInit `json:"userData,omitempty"`
}

// AWSBackend configures EC2 instances.
type AWSBackend struct {
	// Region the instances run in, such as us-east-1.
	// +kubebuilder:validation:MaxLength=32
	// +kubebuilder:validation:Pattern=`^[a-z]{2}(-[a-z]+)+-[0-9]+$`
	Region string `json:"region"`

	// Credentials for the EC2 API.
	Credentials AWSCredentials `json:"credentials"`
}

// AWSCredentials say how to authenticate to the EC2 API.
// +kubebuilder:validation:XValidation:rule="self.source != 'Secret' || has(self.secretRef)",message="secretRef is required when source is Secret: name a Secret key holding an AWS shared credentials file ([default] with aws_access_key_id and aws_secret_access_key)"
type AWSCredentials struct {
	// Source of the credentials: an access key in a Secret, as an AWS
	// shared credentials file, or the provider's injected identity (the
	// SDK's default chain: IRSA, EKS Pod Identity).
	// +kubebuilder:validation:Enum=Secret;InjectedIdentity
	Source xpv2.CredentialsSource `json:"source"`

	xpv2.CommonCredentialSelectors `json:",inline"`
}

// AWSPolicy is what a Proxy's EC2 instance may ask for. The provider
// refuses a Proxy that asks for more, before anything is created.
type AWSPolicy struct {
	// AllowedSubnets instances may attach to (subnet-...). Empty: only the
	// zones' default subnets.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Pattern=`^subnet-[0-9a-f]{8,17}$`
	// +listType=set
	// +optional
	AllowedSubnets []string `json:"allowedSubnets,omitempty"`

	// AllowedSecurityGroups instances may join besides their fleet's own
	// (sg-...). Groups can open other ports, so none is allowed unless
	// listed. Empty: none.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:Pattern=`^sg-[0-9a-f]{8,17}$`
	// +listType=set
	// +optional
	AllowedSecurityGroups []string `json:"allowedSecurityGroups,omitempty"`

	// AllowedInstanceTypes instances may use. Empty: t3.micro, t3.small,
	// t3a.micro and t3a.small.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=64
	// +listType=set
	// +optional
	AllowedInstanceTypes []string `json:"allowedInstanceTypes,omitempty"`

	// AllowedImages instances may boot, as AMI IDs or resolve:ssm:
	// parameters. Empty: Debian 12's parameter only.
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=512
	// +listType=set
	// +optional
	AllowedImages []string `json:"allowedImages,omitempty"`

	// AllowUserData lets Proxies replace the generated start-up script
	// with their own (aws.userData).
	// +optional
	AllowUserData bool `json:"allowUserData,omitempty"`
}
