#!/usr/bin/env bash
# Renders an example fleet with the real `crossplane render`, running
# function-proxyfleet as a local process (Development runtime).
# Usage: hack/render.sh [xr.yaml [composition.yaml [extra render flags...]]]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
xr=${1:-examples/local/proxyfleet.yaml}
composition=${2:-apis/fleet/composition.yaml}
shift $(( $# > 2 ? 2 : $# ))

bin=$(mktemp -d)/function
trap 'kill $pid 2>/dev/null || true; rm -rf "$(dirname "$bin")"' EXIT
go build -o "$bin" ./cmd/function
"$bin" --insecure --address 127.0.0.1:9443 --metrics-address 127.0.0.1:0 2>/dev/null &
pid=$!
for _ in $(seq 50); do
	(echo >/dev/tcp/127.0.0.1/9443) 2>/dev/null && break
	sleep 0.1
done
bin/crossplane render "$xr" "$composition" examples/functions.yaml "$@"
