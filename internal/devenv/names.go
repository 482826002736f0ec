package devenv

// Programs the environments run, by file name (under bin/, or on PATH for
// Debian's): also the names of their logs and ports.
const (
	binEtcd          = "etcd"
	binAPIServer     = "kube-apiserver"
	binKCM           = "kube-controller-manager"
	binScheduler     = "kube-scheduler"
	binKubelet       = "kubelet"
	binKubeProxy     = "kube-proxy"
	binCrossplane    = "crossplane"
	binContainerd    = "containerd"
	binIptables      = "iptables"
	binConntrack     = "conntrack"
	binDiscovery     = "egress-discovery"
	binProvider      = "provider-egressproxy"
	binFunction      = "function-proxyfleet"
	condTrue         = "True"
	caFile           = "ca.crt"
	localhost        = "localhost"
	groupMasters     = "system:masters"
	clusterName      = "egress-cluster"
	providerRuntime  = binProvider // the DeploymentRuntimeConfig and ServiceAccount of cluster/provider-rbac
	imageConfigMatch = "prefix"
)

// delegatedServing are the flags kube-controller-manager and
// kube-scheduler share: their health and metrics port on loopback, with
// delegated authentication that needs no lookup of the cluster's
// authentication ConfigMap, and no leader election (one replica).
var delegatedServing = []string{"--authentication-skip-lookup", "--leader-elect=false", "--bind-address=127.0.0.1"}
