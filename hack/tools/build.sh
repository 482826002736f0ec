#!/usr/bin/env bash
# Builds the pinned test-bed tools into bin/, only those that are missing.
# Each tool comes from source through the Go module proxy, but promtool,
# which Debian packages: no other prebuilt download.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${BIN_DIR:-$(cd "$here/../.." && pwd)/bin}
mkdir -p "$bin"
cd "$here"

build() { # name package
	local name=$1 pkg=$2 start=$SECONDS
	if [ -x "$bin/$name" ]; then
		return 0
	fi
	echo ">> building $name from $pkg (first build can take minutes)"
	CGO_ENABLED=0 go build -trimpath -ldflags="${LDFLAGS:-}" -o "$bin/$name.tmp" "$pkg"
	mv "$bin/$name.tmp" "$bin/$name"
	echo ">> built $name in $((SECONDS - start))s"
}

# debian_promtool puts promtool from Debian's prometheus package into bin/,
# without installing the package (no daemon, no service): downloaded and
# unpacked. Fails, changing nothing, where apt cannot fetch it.
debian_promtool() {
	[ -x "$bin/promtool" ] && return 0
	command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || return 1
	local tmp start=$SECONDS
	tmp=$(mktemp -d)
	if (cd "$tmp" && apt-get download -q prometheus >/dev/null 2>&1) &&
		dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x" && "$tmp/x/usr/bin/promtool" --version >/dev/null 2>&1; then
		mv "$tmp/x/usr/bin/promtool" "$bin/promtool"
		rm -rf "$tmp"
		echo ">> promtool from Debian's prometheus package in $((SECONDS - start))s"
		return 0
	fi
	rm -rf "$tmp"
	return 1
}

if [ $# -eq 0 ]; then
	set -- controller-gen etcd kube-apiserver crossplane kubectl promtool images
fi
for tool in "$@"; do
	case $tool in
	controller-gen) build controller-gen sigs.k8s.io/controller-tools/cmd/controller-gen ;;
	etcd) build etcd ./cmd/etcd ;;
	kube-apiserver) build kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver ;;
	crossplane) build crossplane github.com/crossplane/crossplane/v2/cmd/crank ;;
	kubectl) build kubectl k8s.io/kubernetes/cmd/kubectl ;;
	kube-controller-manager) build kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager ;;
	# The node and the rest of the control plane, for make cluster.
	kubelet) build kubelet k8s.io/kubernetes/cmd/kubelet ;;
	kube-scheduler) build kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler ;;
	kube-proxy) build kube-proxy k8s.io/kubernetes/cmd/kube-proxy ;;
	# The cluster DNS, from its own module (its k8s pins are not ours).
	coredns) (cd coredns && build coredns .) ;;
	# promtool tests cluster/monitoring's alerts: Debian's (prometheus
	# 2.42, which runs those tests) in seconds where apt can fetch it, else
	# built from its own module (6 to 10 minutes cold).
	promtool)
		debian_promtool || (cd promtool && build promtool github.com/prometheus/prometheus/cmd/promtool) ;;
	# Each supported image family's Squid packages, unpacked, which the
	# start-up script is tested against (cloudvm's TestScriptOnEachFamily).
	images) "$here/images/fetch.sh" "$bin/images" ;;
	crossplane-core)
		# Crossplane core for make run and make e2e, from its own module (see
		# core/tools.go), with the CRDs core init installs beside it.
		# Packages declare the Crossplane versions they work with, so core
		# must know its own, which releases stamp in at link time.
		(cd core && LDFLAGS="-X github.com/crossplane/crossplane-runtime/v2/pkg/version.version=v2.4.0" \
			build crossplane-core github.com/crossplane/crossplane/v2/cmd/crossplane)
		if [ ! -d "$bin/crossplane-crds" ]; then
			src=$(cd core && go list -m -f '{{.Dir}}' github.com/crossplane/crossplane/v2)/cluster/crds
			rm -rf "$bin/crossplane-crds.tmp" && cp -r "$src" "$bin/crossplane-crds.tmp"
			chmod -R u+w "$bin/crossplane-crds.tmp" && mv "$bin/crossplane-crds.tmp" "$bin/crossplane-crds"
		fi
		;;
	golangci-lint)
		# Not part of the test bed: built on demand by `make lint`, outside this
		# module because its dependencies would drag the tools' k8s pins.
		if [ ! -x "$bin/golangci-lint" ]; then
			echo ">> building golangci-lint"
			(cd / && GOBIN="$bin" GOFLAGS=-mod=mod go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0)
		fi
		;;
	*) echo "unknown tool $tool" >&2; exit 2 ;;
	esac
done
