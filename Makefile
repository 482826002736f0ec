# Entry points. `make test` is what CI runs (see .ci/run and README.md).
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := help

BIN := $(CURDIR)/bin
GO_TEST_FLAGS ?= -race -count=1 -timeout 25m
export KUBEBUILDER_ASSETS := $(BIN)

.PHONY: help
help: ## Show the targets.
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

.PHONY: tools
tools: ## Build the pinned test-bed tools into bin/ (only those missing).
	@hack/tools/build.sh

.PHONY: generate
generate: tools ## Regenerate deepcopy code, CRDs and the ProxyFleet XRDs.
	cd apis && $(BIN)/controller-gen object:headerFile=../hack/boilerplate.go.txt paths=./...
	cd apis && $(BIN)/controller-gen crd:crdVersions=v1 paths=./egress/... output:crd:artifacts:config=../package/provider/crds
	@# The ProxyFleet CRD is only an intermediate: Crossplane serves fleets
	@# from the XRDs genxrd writes from its schema.
	@rm -rf .cache/fleet-crd
	cd apis && $(BIN)/controller-gen crd:crdVersions=v1,allowDangerousTypes=true paths=./fleet/... output:crd:artifacts:config=../.cache/fleet-crd
	go run ./hack/genxrd -crd .cache/fleet-crd/crawl.example.com_proxyfleets.yaml -pool-crd .cache/fleet-crd/crawl.example.com_proxypools.yaml -dir apis/fleet

.PHONY: check-generate
check-generate: generate ## Fail when regeneration changes a checked-in file.
	@if [ -n "$$(git status --porcelain -- apis package)" ]; then \
		git status --porcelain -- apis package; git --no-pager diff -- apis package | head -50; \
		echo "generated files are stale: run make generate and commit"; exit 1; fi
	@echo "generated files are up to date"

# go vet type-checks against its dependencies compiled, so it vets with the
# tests' -race: the packages it compiles are the ones go test -race needs
# next, instead of a second, uninstrumented build of every dependency. The
# tool module (etcd's main) is vetted with the flags hack/tools/build.sh
# builds etcd with, for the same reason.
.PHONY: vet
vet: ## go vet every package.
	go vet -race ./...
	go vet -race -tags e2e ./e2e
	go vet -race -tags e2ecluster ./e2e/cluster
	go vet -race -tags scale ./e2e/scale
	cd hack/tools && CGO_ENABLED=0 go vet -trimpath ./...

.PHONY: test
test: tools ## Build tools, vet, then run unit and integration tests (real kube-apiserver + etcd) under the race detector.
	@# The packages the tests build; make lint vets the e2e, cluster and
	@# scale tags and the tool module too (5 to 6 minutes more on an empty
	@# build cache, for code make test does not run).
	go vet -race ./...
	@mkdir -p .cache
	go test $(GO_TEST_FLAGS) -json ./... 2>&1 | go run ./hack/testsummary

.PHONY: bench
bench: tools ## Run the benchmarks recorded in BENCHMARKS.md (minutes; not part of make test).
	go test ./internal/function -run '^$$' -bench . -benchmem
	go test ./internal/lease -run '^$$' -bench BenchmarkLeaseThroughput -benchtime 1x
	go test ./internal/controller/proxy -run '^$$' -bench BenchmarkProbeFleet -benchtime 1x -timeout 20m

.PHONY: lint
lint: vet ## gofmt, go vet, and golangci-lint (built from the module proxy when missing).
	@unformatted=$$(gofmt -l apis cmd internal hack package cluster e2e 2>/dev/null); \
		if [ -n "$$unformatted" ]; then echo "not gofmt-formatted:"; echo "$$unformatted"; exit 1; fi
	@hack/tools/build.sh golangci-lint
	$(BIN)/golangci-lint run --build-tags e2e,e2ecluster,scale ./...

.PHONY: validate
validate: tools ## Validate the examples offline with crossplane beta validate.
	hack/validate.sh

.PHONY: render
render: tools ## Render the example fleet with crossplane render and the function as a local process.
	hack/render.sh

.PHONY: statuspage
statuspage: tools ## Screenshot egress-discovery's status page in headless Chromium (apt-get install chromium) into _output/status.png.
	go run ./hack/statuspage -o _output/status.png

.PHONY: packages
packages: tools ## Build the runtime images and the provider, function and configuration packages into _output/.
	hack/packages.sh _output

.PHONY: binaries
binaries: ## Build provider-egressproxy, function-proxyfleet, egress-discovery and egressctl into bin/.
	go build -o $(BIN)/provider-egressproxy ./cmd/provider
	go build -o $(BIN)/function-proxyfleet ./cmd/function
	go build -o $(BIN)/egress-discovery ./cmd/discovery
	go build -o $(BIN)/egressctl ./cmd/egressctl
	go build -o $(BIN)/egress-run ./hack/run

.PHONY: run-deps
run-deps: tools packages binaries
	@hack/tools/build.sh crossplane-core kube-controller-manager

.PHONY: run
run: run-deps ## Run everything on this machine with real Crossplane until Ctrl-C (state in .local/).
	$(BIN)/egress-run

CLUSTER_TOOLS := kubelet kube-scheduler kube-proxy kube-controller-manager coredns crossplane-core

.PHONY: cluster-images
cluster-images: tools packages ## Build the images make cluster adds (pause, CoreDNS, Crossplane core, Squid from Debian's packages) into _output/images/.
	@hack/tools/build.sh $(CLUSTER_TOOLS)
	go run ./cluster/images -o _output/images pause coredns crossplane squid

.PHONY: cluster-deps
cluster-deps: tools packages binaries cluster-images

.PHONY: cluster
cluster: cluster-deps ## Run a one-node cluster (kubelet + containerd) with Crossplane installing the packages, until Ctrl-C (as root; state in .local/cluster/).
	go build -o $(BIN)/egress-cluster ./hack/cluster
	$(BIN)/egress-cluster

.PHONY: e2e-cluster
e2e-cluster: cluster-deps ## Bring up make cluster in a fresh state folder and check the product on it: Squid pods, discovery via the node, a legacy claim, nothing left (as root).
	go test -tags e2ecluster -count=1 -timeout 40m -json ./e2e/cluster 2>&1 | go run ./hack/testsummary -v

.PHONY: cluster-down
cluster-down: ## Stop make cluster and clear what a killed one left (processes, mounts, iptables rules, the bridge).
	go build -o $(BIN)/egress-cluster ./hack/cluster
	$(BIN)/egress-cluster --down

# FAULTS_ACQUISITIONS is how many acquisitions the combined discovery
# fault scenario makes; CI runs it with a short default.
FAULTS_ACQUISITIONS ?= 100000
FAULTS_PROVIDER_KILLS ?= 100

.PHONY: faults
faults: tools ## Run the long fault scenarios (not in CI): discovery under combined faults, lease takeovers and the checker's mutation test 3 times each, the provider killed 100 times per backend.
	FAULTS_ACQUISITIONS=$(FAULTS_ACQUISITIONS) go test ./internal/discovery -run '^TestFaultsCombined$$' -count 1 -timeout 90m -v
	go test ./internal/lease -run '^(TestExclusiveUnderTakeovers|TestCheckerCatchesUnguardedTakeover)$$' -count 3 -timeout 30m -v
	FAULTS_PROVIDER_KILLS=$(FAULTS_PROVIDER_KILLS) go test ./internal/controller/proxy -run '^TestProviderKilledMidOperation$$' -count 1 -timeout 60m -v

# FUZZ_TARGETS are package:Target pairs; FUZZTIME is their total, shared
# out evenly. A failing input is kept under the package's testdata/fuzz, a
# regression test from then on.
FUZZTIME ?= 600
FUZZ_TARGETS ?= ./internal/discovery/fuzz:FuzzServer ./internal/discovery/fuzz:FuzzDecodeAcquire ./internal/discovery/fuzz:FuzzParseID ./internal/ownership:FuzzLabelValue ./internal/function/fuzz:FuzzFunction ./internal/squid:FuzzRenderParses

.PHONY: fuzz
fuzz: tools ## Fuzz every target for FUZZTIME seconds in all (default 600), failing on the first crash.
	@n=$(words $(FUZZ_TARGETS)); each=$$(( $(FUZZTIME) / n )); \
	for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; target=$${t##*:}; \
		echo "fuzzing $$target in $$pkg for $${each}s"; \
		go test $$pkg -run '^$$' -fuzz "^$$target\$$" -fuzztime $${each}s || exit 1; \
	done

# SCALE_SIZES, SCALE_STEADY, SCALE_INTERVAL and SCALE_ROLLOUT_MAX tune
# make scale (e2e/scale says how); the table goes to _output/scale.md.
.PHONY: scale
scale: run-deps ## Measure the product at 100, 1000 and 10000 proxies on real Crossplane with stand-in VMs (not in CI; BENCHMARKS.md).
	go test -tags scale -count=1 -timeout 120m -json -run '^TestScale$$' ./e2e/scale 2>&1 | go run ./hack/testsummary -v

.PHONY: e2e
e2e: run-deps ## Bring everything up in a fresh state folder and check the product end to end.
	go test -tags e2e -count=1 -timeout 30m -json ./e2e 2>&1 | go run ./hack/testsummary -v
