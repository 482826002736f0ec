#!/usr/bin/env bash
# Builds the three Crossplane packages offline with the real
# `crossplane xpkg build`: provider-egressproxy and function-proxyfleet, each
# embedding its runtime image built by cluster/images (no container engine),
# and the Configuration from the top-level crossplane.yaml. The
# egress-discovery image tarball is left beside them in images/.
#
# Usage: hack/packages.sh [output dir, default _output]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=$(mkdir -p "${1:-$root/_output}" && cd "${1:-$root/_output}" && pwd)
xp="$root/bin/crossplane"
[ -x "$xp" ] || { echo "bin/crossplane is missing: run make tools" >&2; exit 1; }
cd "$root"

go run ./cluster/images -o "$out/images" provider function discovery

"$xp" xpkg build --package-root=package/provider --examples-root=examples \
	--embed-runtime-image-tarball="$out/images/provider.tar" \
	--package-file="$out/provider-egressproxy.xpkg"
"$xp" xpkg build --package-root=package/function --examples-root=examples \
	--embed-runtime-image-tarball="$out/images/function.tar" \
	--package-file="$out/function-proxyfleet.xpkg"

# The Configuration's package root would be the whole repository, which holds
# far more YAML than the package may carry (provider CRDs, manifests). Stage
# exactly its metadata, XRDs and Compositions instead.
stage="$out/configuration-root"
rm -rf "$stage"
mkdir -p "$stage/namespaced" "$stage/legacy" "$stage/pool"
cp crossplane.yaml "$stage/"
cp apis/fleet/definition.yaml apis/fleet/composition.yaml "$stage/namespaced/"
cp apis/fleet/legacy/definition.yaml apis/fleet/legacy/composition.yaml "$stage/legacy/"
cp apis/fleet/pool/definition.yaml apis/fleet/pool/composition.yaml "$stage/pool/"
"$xp" xpkg build --package-root="$stage" --examples-root=examples \
	--package-file="$out/configuration-proxyfleet.xpkg"
# The CLI re-encodes the XRDs through Go types that lack subresources, which
# would leave installed fleets without /scale: put the files back as written.
go run ./hack/xpkgraw -package "$out/configuration-proxyfleet.xpkg" -root "$stage"
rm -rf "$stage"

ls -l "$out"/*.xpkg
