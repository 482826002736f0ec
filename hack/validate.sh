#!/usr/bin/env bash
# Usage: hack/validate.sh [resource files...]
#
# Validates the examples (or the given files, such as rendered output) offline against the XRDs, the provider's CRDs and
# Crossplane's own CRDs with the real `crossplane beta validate`.
#
# crossplane beta validate always loads Crossplane's built-in schemas from the
# Crossplane image, which needs a registry. The same CRDs ship in the
# github.com/crossplane/crossplane/v2 module, so this script seeds the CLI's
# schema cache from the module proxy instead. It uses the CRDs of the core
# release the product runs on (v2.4.0, which knows XRD scale subresources),
# not those of the older release the CLI is built from.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

version=${CROSSPLANE_CORE_VERSION:-v2.4.0}
moddir=$(cd / && GOFLAGS=-mod=mod go mod download -json "github.com/crossplane/crossplane/v2@${version}" | sed -n 's/^\s*"Dir": "\(.*\)",$/\1/p')
image="xpkg.crossplane.io/crossplane/crossplane:${version}"
cache="$root/.cache/validate"
seed="$cache/xpkg.crossplane.io/crossplane/crossplane@${version}"
mkdir -p "$seed"
for f in "$moddir"/cluster/crds/*.yaml; do
	cat "$f"
	echo "---"
done >"$seed/package.yaml"

fleet="apis/fleet/definition.yaml,apis/fleet/legacy/definition.yaml,apis/fleet/pool/definition.yaml,apis/fleet/composition.yaml,apis/fleet/legacy/composition.yaml,apis/fleet/pool/composition.yaml"
extensions="$fleet,package/provider/crds,hack/validate/schemas"
# Core Kubernetes objects (apiVersion: v1) and the Lease fixtures of the
# render examples have no CRD to validate against; the apiserver integration
# test accepts those. Everything else must have a
# schema, or validation fails. The XRDs and Compositions are validated too,
# against Crossplane's own CRDs.
default_resources="$(grep -rL --include="*.yaml" "^apiVersion: v1$" examples | grep -v required-resources.yaml | sort | paste -sd, -),$fleet,cluster/provider-rbac/deploymentruntimeconfig.yaml"
resources=$default_resources
if [ $# -gt 0 ]; then
	resources=$(IFS=,; echo "$*")
fi

exec bin/crossplane beta validate --cache-dir "$cache" --crossplane-image "$image" \
	--error-on-missing-schemas "$extensions" "$resources"
