package apis_test

import (
	"context"
	"strings"
	"testing"

	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/apis/egress/v1alpha1"
)

// object parses base and sets each path (dot-separated) to its YAML value;
// a nil value removes the field.
func object(t *testing.T, base string, set map[string]any) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(base), &u.Object); err != nil {
		t.Fatal(err)
	}
	for path, v := range set {
		fields := strings.Split(path, ".")
		if v == nil {
			unstructured.RemoveNestedField(u.Object, fields...)
			continue
		}
		if err := unstructured.SetNestedField(u.Object, v, fields...); err != nil {
			t.Fatalf("cannot set %s: %v", path, err)
		}
	}
	return u
}

func TestInvalidObjectsRejected(t *testing.T) {
	bed := sharedBed.Env(t)
	cases := map[string]struct {
		reason string
		base   string
		set    map[string]any
		// want are substrings the apiserver's message must hold: the field
		// and what to do.
		want []string
	}{
		"ProxyPortZero": {
			reason: "A port must be between 1 and 65535.",
			base:   validProxy, set: map[string]any{"spec.forProvider.port": int64(0)},
			want: []string{"spec.forProvider.port", "greater than or equal to 1"},
		},
		"ProxyPortTooHigh": {
			reason: "A port must be between 1 and 65535.",
			base:   validProxy, set: map[string]any{"spec.forProvider.port": int64(70000)},
			want: []string{"spec.forProvider.port", "less than or equal to 65535"},
		},
		"ProxyNoPlacement": {
			reason: "A Managed proxy needs a backend placement.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil},
			want: []string{"spec.forProvider", "exactly one backend placement"},
		},
		"ProxyTwoPlacements": {
			reason: "A Managed proxy has exactly one backend placement.",
			base:   validProxy, set: map[string]any{"spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b"}},
			want: []string{"spec.forProvider", "exactly one backend placement"},
		},
		"ManagedWithEndpoint": {
			reason: "An endpoint is only for External proxies.",
			base:   validProxy, set: map[string]any{"spec.forProvider.endpoint": map[string]any{"host": "h", "port": int64(1)}},
			want: []string{"spec.forProvider", "endpoint is only for mode External"},
		},
		"ExternalWithoutEndpoint": {
			reason: "An External proxy needs an endpoint.",
			base:   validProxy, set: map[string]any{"spec.forProvider.mode": "External", "spec.forProvider.local": nil},
			want: []string{"spec.forProvider", "endpoint is required when mode is External"},
		},
		"ExternalWithPlacement": {
			reason: "An External proxy takes no placement.",
			base:   validProxy, set: map[string]any{"spec.forProvider.mode": "External", "spec.forProvider.endpoint": map[string]any{"host": "h", "port": int64(1)}},
			want: []string{"spec.forProvider", "External proxy takes no backend placement"},
		},
		"UnknownMode": {
			reason: "Mode is Managed or External.",
			base:   validProxy, set: map[string]any{"spec.forProvider.mode": "Sometimes"},
			want: []string{"spec.forProvider.mode", `supported values: "Managed", "External"`},
		},
		"SuccessThresholdZero": {
			reason: "Thresholds are at least 1.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.successThreshold": int64(0)},
			want: []string{"spec.forProvider.healthCheck.successThreshold", "greater than or equal to 1"},
		},
		"FailureThresholdZero": {
			reason: "Thresholds are at least 1.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.failureThreshold": int64(0)},
			want: []string{"spec.forProvider.healthCheck.failureThreshold", "greater than or equal to 1"},
		},
		"TimeoutNotShorterThanInterval": {
			reason: "A probe must finish before the next one starts.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.interval": "10s", "spec.forProvider.healthCheck.timeout": "10s"},
			want: []string{"spec.forProvider.healthCheck", "timeout must be shorter than interval"},
		},
		"IntervalNotADuration": {
			reason: "Durations are Go-style strings.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.interval": "often"},
			want: []string{"spec.forProvider.healthCheck.interval", "should match"},
		},
		"ProbeURLNotHTTP": {
			reason: "The probe goes through an HTTP proxy, so its URL is http(s).",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.url": "ftp://example.com/ip"},
			want: []string{"spec.forProvider.healthCheck.url", "http:// or https:// URL"},
		},
		"ProbeURLRelative": {
			reason: "The probe URL is absolute.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.url": "/ip"},
			want: []string{"spec.forProvider.healthCheck.url", "http:// or https:// URL"},
		},
		"ProbeURLMissing": {
			reason: "There is no health without a probe URL.",
			base:   validProxy, set: map[string]any{"spec.forProvider.healthCheck.url": nil},
			want: []string{"spec.forProvider.healthCheck.url", "Required value"},
		},
		"MaxLeasesZero": {
			reason: "At least one crawler may hold a proxy.",
			base:   validProxy, set: map[string]any{"spec.forProvider.maxLeases": int64(0)},
			want: []string{"spec.forProvider.maxLeases", "greater than or equal to 1"},
		},
		"OpenProxy": {
			reason: "A managed proxy without credentials or source ranges would be open.",
			base:   validProxy, set: map[string]any{"spec.forProvider.authSecretRef": nil},
			want: []string{"spec.forProvider", "refusing an open proxy"},
		},
		"OpenToTheWorld": {
			reason: "0.0.0.0/0 without credentials is as open as no restriction.",
			base:   validProxy, set: map[string]any{"spec.forProvider.authSecretRef": nil, "spec.forProvider.allowedSourceRanges": []any{"0.0.0.0/0"}},
			want: []string{"spec.forProvider", "allowedSourceRanges: without authSecretRef every range must lie in private, loopback or CGNAT space"},
		},
		"OpenToHalvesOfTheWorld": {
			reason: "Two halves of the internet without credentials are as open as 0.0.0.0/0: the rule does arithmetic, not string comparison.",
			base:   validProxy, set: map[string]any{"spec.forProvider.authSecretRef": nil, "spec.forProvider.allowedSourceRanges": []any{"0.0.0.0/1", "128.0.0.0/1"}},
			want: []string{"spec.forProvider", "allowedSourceRanges: without authSecretRef every range must lie in private, loopback or CGNAT space"},
		},
		"OpenToPublicIPv6": {
			reason: "A public IPv6 client range needs credentials.",
			base:   validProxy, set: map[string]any{"spec.forProvider.authSecretRef": nil, "spec.forProvider.allowedSourceRanges": []any{"10.0.0.0/8", "2001:db8::/32"}},
			want: []string{"spec.forProvider", "allowedSourceRanges: without authSecretRef every range must lie in private, loopback or CGNAT space"},
		},
		"BadCIDR": {
			reason: "Source ranges are CIDRs.",
			base:   validProxy, set: map[string]any{"spec.forProvider.allowedSourceRanges": []any{"10.0.0.300/8"}},
			want: []string{"spec.forProvider.allowedSourceRanges[0]", "CIDR notation"},
		},
		"BadBindAddress": {
			reason: "A bind address is an IP.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local.bindAddress": "localhost"},
			want: []string{"spec.forProvider.local.bindAddress", "IPv4 or IPv6 address"},
		},
		"BadGCPZone": {
			reason: "A GCP zone looks like europe-west1-b.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "Europe West"}},
			want: []string{"spec.forProvider.gcp.zone", "should match"},
		},
		"GCPIPv6SourceRange": {
			reason: "A GCP firewall rule takes IPv4 ranges only.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b"}, "spec.forProvider.allowedSourceRanges": []any{"10.0.0.0/8", "fd00::/8"}},
			want: []string{"spec.forProvider", "GCP proxy's firewall rule takes IPv4 ranges only"},
		},
		"GCPPrivilegedPort": {
			reason: "A GCP proxy listens on 1024 or above.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b"}, "spec.forProvider.port": int64(443)},
			want: []string{"spec.forProvider", "port: a GCP proxy listens on 1024 or above"},
		},
		"GCPPrivateRangesAtExternalIP": {
			reason: "Clients in a VPC never reach the external IP from a private address.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b"}, "spec.forProvider.allowedSourceRanges": []any{"10.0.0.0/8", "100.64.0.0/10"}},
			want: []string{"spec.forProvider", "set gcp.publishedAddress: Internal"},
		},
		"GCPSubnetworkOfAnotherRegion": {
			reason: "A subnetwork is regional: it must be in the zone's region.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b", "subnetwork": "regions/us-central1/subnetworks/crawl"}},
			want: []string{"spec.forProvider.gcp", "subnetwork must be in the zone's region"},
		},
		"GCPSharedSubnetworkWithoutHostNetwork": {
			reason: "A host project's subnetwork needs the host project's network, where the rule is made.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b", "subnetwork": "projects/net-host-proj/regions/europe-west1/subnetworks/crawl"}},
			want: []string{"spec.forProvider.gcp", "Shared VPC"},
		},
		"GCPBadSubnetwork": {
			reason: "A subnetwork is regions/R/subnetworks/NAME.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b", "subnetwork": "crawl"}},
			want: []string{"spec.forProvider.gcp.subnetwork", "should match"},
		},
		"GCPBootDiskType": {
			reason: "Boot disk types are a closed list.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{"zone": "europe-west1-b", "bootDiskType": "local-ssd"}},
			want: []string{"spec.forProvider.gcp.bootDiskType", "Unsupported value"},
		},
		"CloudInitBoth": {
			reason: "User cloud-init comes inline or from a Secret, not both.",
			base:   validProxy, set: map[string]any{"spec.forProvider.local": nil, "spec.forProvider.gcp": map[string]any{
				"zone": "europe-west1-b", "cloudInit": map[string]any{"inline": "#!/bin/sh", "secretRef": map[string]any{"name": "s", "key": "k"}},
			}},
			want: []string{"spec.forProvider.gcp", "exactly one of inline or secretRef"},
		},
		"TenantSquidPath": {
			reason: "A tenant's ProviderConfig cannot choose the binary the provider runs on its host.",
			base:   validProviderConfig, set: map[string]any{"spec.local": map[string]any{"squidPath": "/tmp/evil"}},
			want: []string{"spec.local.squidPath, stateDir and portRange may be set only on a ClusterProviderConfig"},
		},
		"TenantStateDir": {
			reason: "A tenant's ProviderConfig cannot choose where the provider writes on its host.",
			base:   validProviderConfig, set: map[string]any{"spec.local": map[string]any{"stateDir": "/etc"}},
			want: []string{"may be set only on a ClusterProviderConfig"},
		},
		"TenantPortRange": {
			reason: "A tenant's ProviderConfig cannot choose the provider host's ports.",
			base:   validProviderConfig, set: map[string]any{"spec.local": map[string]any{"portRange": map[string]any{"from": int64(30000), "to": int64(30010)}}},
			want: []string{"may be set only on a ClusterProviderConfig"},
		},
		"TenantInjectedIdentityPods": {
			reason: "A tenant's ProviderConfig cannot borrow the provider's identity to make pods.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "Kubernetes", "spec.kubernetes": map[string]any{"credentials": map[string]any{"source": "InjectedIdentity"}}},
			want: []string{"spec.kubernetes.credentials.source must be Secret"},
		},
		"TenantDefaultIdentityPods": {
			reason: "Without credentials a kubernetes ProviderConfig would use the provider's identity.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "Kubernetes", "spec.kubernetes": map[string]any{"namespace": "x"}},
			want: []string{"spec.kubernetes.credentials.source must be Secret"},
		},
		"TenantInjectedIdentityGCP": {
			reason: "A tenant's ProviderConfig cannot borrow the provider's identity in any project.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "GCP", "spec.gcp": map[string]any{"project": "platform-proj", "credentials": map[string]any{"source": "InjectedIdentity"}}},
			want: []string{"spec.gcp.credentials.source must be Secret"},
		},
		"TenantInjectedIdentityAWS": {
			reason: "A tenant's ProviderConfig cannot borrow the provider's identity in any account.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "AWS", "spec.aws": map[string]any{"region": "us-east-1", "credentials": map[string]any{"source": "InjectedIdentity"}}},
			want: []string{"spec.aws.credentials.source must be Secret"},
		},
		"TenantLoopback": {
			reason: "A tenant's ProviderConfig cannot let its proxies reach the provider host's loopback.",
			base:   validProviderConfig, set: map[string]any{"spec.policy": map[string]any{"local": map[string]any{"allowLoopbackDestinations": true}}},
			want: []string{"spec.policy.local and spec.policy.allowedProxyNamespaces may be set only on a ClusterProviderConfig"},
		},
		"ProviderConfigUnknownBackend": {
			reason: "The backend is one of the four the provider has.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "Azure"},
			want: []string{"spec.backend", `supported values: "Local", "Kubernetes", "GCP", "AWS"`},
		},
		"ProviderConfigAWSWithoutSettings": {
			reason: "The AWS backend needs a region and credentials.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "AWS"},
			want: []string{"spec", "aws is required when backend is AWS"},
		},
		"ProxyTwoPlacementsWithAWS": {
			reason: "An AWS placement is one of exactly one.",
			base:   validProxy, set: map[string]any{"spec.forProvider.aws": map[string]any{"zone": "us-east-1a"}},
			want: []string{"a Managed proxy needs exactly one backend placement: set one of local, kubernetes, gcp or aws"},
		},
		"ProviderConfigMismatchedBlock": {
			reason: "Settings for another backend are a mistake, not ignored.",
			base:   validProviderConfig, set: map[string]any{"spec.gcp": map[string]any{"project": "my-project-1", "credentials": map[string]any{"source": "InjectedIdentity"}}},
			want: []string{"spec", "gcp is set but backend is not GCP"},
		},
		"ProviderConfigGCPWithoutSettings": {
			reason: "The GCP backend needs a project.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "GCP"},
			want: []string{"spec", "gcp is required when backend is GCP"},
		},
		"ProviderConfigSecretWithoutRef": {
			reason: "Secret credentials need a secretRef.",
			base:   validProviderConfig, set: map[string]any{"spec.backend": "GCP", "spec.gcp": map[string]any{"project": "my-project-1", "credentials": map[string]any{"source": "Secret"}}},
			want: []string{"spec.gcp.credentials", "secretRef is required when source is Secret"},
		},
		"ProviderConfigPortRangeReversed": {
			reason: "A port range runs upwards.",
			base:   validClusterProviderConfig, set: map[string]any{"spec.local": map[string]any{"portRange": map[string]any{"from": int64(40000), "to": int64(30000)}}},
			want: []string{"spec.local.portRange", "from must not be greater than to"},
		},
		"ProviderConfigRelativeSquidPath": {
			reason: "The Squid binary is an absolute path.",
			base:   validClusterProviderConfig, set: map[string]any{"spec.local": map[string]any{"squidPath": "squid"}},
			want: []string{"spec.local.squidPath", "absolute path"},
		},
		"PacingIntervalTooShort": {
			reason: "A pacing interval is between 100ms and 1h.",
			base:   validFleet, set: map[string]any{"spec.gateway": map[string]any{"pacing": []any{map[string]any{"domains": []any{"shop.example"}, "interval": "10ms"}}}},
			want: []string{"spec.gateway.pacing[0].interval", "between 100ms and 1h"},
		},
		"PacingDomainNotAName": {
			reason: "A pacing domain is a host name or *. and one.",
			base:   validFleet, set: map[string]any{"spec.gateway": map[string]any{"pacing": []any{map[string]any{"domains": []any{"shop.example/cart"}, "interval": "1s"}}}},
			want: []string{"spec.gateway.pacing[0].domains[0]", "should match"},
		},
		"RecyclingWithoutThreshold": {
			reason: "spec.recycling says when an address is burned.",
			base:   validFleet, set: map[string]any{"spec.recycling": map[string]any{"maxPerHour": int64(2)}},
			want: []string{"spec.recycling", "bannedByDomains or bannedTimes"},
		},
		"RecyclingUnbounded": {
			reason: "At most 10 recycles an hour.",
			base:   validFleet, set: map[string]any{"spec.recycling": map[string]any{"bannedByDomains": int64(2), "maxPerHour": int64(100)}},
			want: []string{"spec.recycling.maxPerHour", "less than or equal to 10"},
		},
		"RecyclingWindowTooLong": {
			reason: "Bans are kept 7 days: a longer window counts nothing more.",
			base:   validFleet, set: map[string]any{"spec.recycling": map[string]any{"bannedTimes": int64(3), "window": "200h"}},
			want: []string{"spec.recycling.window", "between 1m and 168h"},
		},
		"RecyclingWithoutSurge": {
			reason: "A recycle replaces through a surge proxy: without one nothing is ever recycled.",
			base:   validFleet, set: map[string]any{"spec.recycling": map[string]any{"bannedByDomains": int64(2)}, "spec.rotation": map[string]any{"maxSurge": int64(0), "maxUnavailable": int64(1)}},
			want: []string{"spec.rotation.maxSurge must be at least 1 with spec.recycling"},
		},
		"ReplaceBeyondLimitLocal": {
			reason: "A replaced local proxy leaves from the same address: replacing it draws nothing new.",
			base:   validFleet, set: map[string]any{"spec.diversity": map[string]any{"maxPerIPv4Prefix": int64(2), "replaceBeyondLimit": true}},
			want: []string{"spec.diversity.replaceBeyondLimit needs a backend that gives each proxy an address of its own"},
		},
		"DiversityCapZero": {
			reason: "A cap of zero proxies per network would flag every proxy.",
			base:   validFleet, set: map[string]any{"spec.diversity": map[string]any{"maxPerIPv4Prefix": int64(0)}},
			want: []string{"spec.diversity.maxPerIPv4Prefix", "greater than or equal to 1"},
		},
		"BanStatusNotAnError": {
			reason: "Only error answers ban.",
			base:   validFleet, set: map[string]any{"spec.gateway": map[string]any{"banStatusCodes": []any{int64(200)}}},
			want: []string{"spec.gateway.banStatusCodes[0]", "greater than or equal to 400"},
		},
		"UnknownRotation": {
			reason: "The rotation strategies are four.",
			base:   validFleet, set: map[string]any{"spec.gateway": map[string]any{"rotation": "fastest"}},
			want: []string{"spec.gateway.rotation", "leastRecentlyUsed"},
		},
		"FleetWithoutZones": {
			reason: "A fleet with replicas needs zones to spread over.",
			base:   validFleet, set: map[string]any{"spec.zones": nil},
			want: []string{"spec", "spec.zones must not be empty when spec.replicas > 0"},
		},
		"FleetOpenProxy": {
			reason: "A fleet of open proxies is refused.",
			base:   validFleet, set: map[string]any{"spec.proxy": map[string]any{"port": int64(3128)}},
			want: []string{"spec.proxy", "refusing an open proxy"},
		},
		"FleetOpenToHalvesOfTheWorld": {
			reason: "A fleet open to 0.0.0.0/1 and 128.0.0.0/1 without credentials is refused by arithmetic.",
			base:   validFleet, set: map[string]any{"spec.proxy": map[string]any{"allowedSourceRanges": []any{"0.0.0.0/1", "128.0.0.0/1"}}},
			want: []string{"spec.proxy", "without authSecretRef every range must lie in private, loopback or CGNAT space"},
		},
		"FleetGCPIPv6SourceRange": {
			reason: "A GCP fleet's firewall rules take IPv4 ranges only.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"gcp": map[string]any{}}, "spec.proxy": map[string]any{"authSecretRef": map[string]any{"name": "a"}, "allowedSourceRanges": []any{"2001:db8::/32"}}},
			want: []string{"spec", "GCP proxy's firewall rule takes IPv4 ranges only"},
		},
		"FleetGCPPrivilegedPort": {
			reason: "A GCP fleet's proxies listen on 1024 or above.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"gcp": map[string]any{}}, "spec.proxy": map[string]any{"authSecretRef": map[string]any{"name": "a"}, "port": int64(80)}},
			want: []string{"spec", "spec.proxy.port: a GCP proxy listens on 1024 or above"},
		},
		"FleetGCPPrivateRangesAtExternalIP": {
			reason: "A GCP fleet open to private networks only publishes its internal addresses.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"gcp": map[string]any{}}, "spec.proxy": map[string]any{"allowedSourceRanges": []any{"172.16.0.0/12"}}},
			want: []string{"spec", "set spec.placement.gcp.publishedAddress: Internal"},
		},
		"FleetSubnetworkOutsideZones": {
			reason: "A fleet's subnetwork must serve every zone it spreads over.",
			base:   validFleet, set: map[string]any{"spec.zones": []any{"europe-west1-b", "us-central1-a"}, "spec.placement": map[string]any{"gcp": map[string]any{"subnetwork": "regions/europe-west1/subnetworks/crawl"}}},
			want: []string{"spec", "subnetwork must be in the region of every zone"},
		},
		"FleetReplacesUnhealthyTooSoon": {
			reason: "A proxy needs time to boot: replacing unhealthy ones sooner than 1m would storm the backend.",
			base:   validFleet, set: map[string]any{"spec.rotation": map[string]any{"replaceUnhealthyAfter": "30s"}},
			want: []string{"spec.rotation.replaceUnhealthyAfter", "must be at least 1m"},
		},
		"FleetRotationStuck": {
			reason: "Replacement with neither surge nor unavailability could never progress.",
			base:   validFleet, set: map[string]any{"spec.rotation": map[string]any{"maxSurge": int64(0), "maxUnavailable": int64(0)}},
			want: []string{"spec.rotation", "cannot both be 0"},
		},
		"FleetTooBigForOneMessage": {
			reason: "A fleet whose Proxies would not fit Crossplane's message to the function with a 2x margin is refused.",
			base:   validFleet, set: map[string]any{"spec.replicas": int64(300), "spec.leases": map[string]any{"maxLeasesPerProxy": int64(10)}},
			want: []string{"must not exceed 2 MiB", "at most 242 replicas, or 120 proxies per pool, however many leases per proxy"},
		},
		"FleetTooManyReplicasForOneMessage": {
			reason: "With maxSurge 1 the bound is 242 replicas.",
			base:   validFleet, set: map[string]any{"spec.replicas": int64(243)},
			want: []string{"must not exceed 2 MiB"},
		},
		"FleetDefaultTTLAboveMax": {
			reason: "The default TTL cannot exceed the longest allowed.",
			base:   validFleet, set: map[string]any{"spec.leases": map[string]any{"defaultTTL": "2h", "maxTTL": "1h"}},
			want: []string{"spec.leases", "defaultTTL must not exceed spec.leases.maxTTL"},
		},
		"FleetTwoPlacements": {
			reason: "A fleet runs on one backend.",
			base:   validFleet, set: map[string]any{"spec.placement.kubernetes": map[string]any{}},
			want: []string{"spec.placement", "exactly one of local, kubernetes, gcp or aws"},
		},
		"FleetAWSUserDataInline": {
			reason: "A fleet's own user data would ride in every Proxy to the function: a Secret instead.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"aws": map[string]any{"userData": map[string]any{"inline": "#!/bin/sh"}}}},
			want: []string{"spec.placement", "userData.inline is not taken by a fleet"},
		},
		"FleetAWSPrivateOnly": {
			reason: "Private clients never reach an instance's public IP from a private address.",
			base:   validFleet, set: map[string]any{"spec.placement": map[string]any{"aws": map[string]any{}}, "spec.proxy.allowedSourceRanges": []any{"10.0.0.0/8"}},
			want: []string{"an AWS proxy open to private networks only"},
		},
	}

	ns := bed.Namespace(t)
	ctx := context.Background()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			u := object(t, tc.base, tc.set)
			u.SetNamespace(ns)
			err := bed.Client.Create(ctx, u)
			if err == nil {
				t.Fatalf("%s\nthe apiserver accepted %s", tc.reason, name)
			}
			if !kerrors.IsInvalid(err) {
				t.Fatalf("%s\nwant an Invalid error, got: %v", tc.reason, err)
			}
			t.Logf("rejected as expected: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%s\nthe message must contain %q; got: %v", tc.reason, w, err)
				}
			}
		})
	}

	// Nothing invalid was half-created.
	var proxies v1alpha1.ProxyList
	if err := bed.Client.List(ctx, &proxies, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	if len(proxies.Items) != 0 {
		t.Errorf("rejected Proxies must not exist; found %d", len(proxies.Items))
	}
}
