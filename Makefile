# Cablemesh. `make demo` and `make test` are the two commands for a fresh machine (as root).
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

GO ?= go
BIN := $(CURDIR)/bin
BINARIES := cable-broker cable-agent cablectl
# The netns tests build a mesh of several clusters; 40m is a ceiling, they take a few minutes.
NETNS_TIMEOUT ?= 40m
# The VM stage: boots Debian's stock kernel under qemu (KVM when it works, TCG otherwise) with this
# machine's userspace over 9p and runs the kernel-datapath netns tests
# (tests/netns/kernel_datapaths_test.go) inside. CABLEMESH_VM_REQUIRED=1: a missing qemu or guest
# kernel fails instead of skipping.
VM_TIMEOUT ?= 45m

.PHONY: all build deps deps-demo deps-test deps-bench test lint check-bpf unit-test netns-test vm-test k8s-test demo demo-down k8s-demo k8s-demo-down deps-k8s bench bench-services bench-dns bench-scale bench-xds bench-ingress bench-start bench-cables bench-counters bench-soak fuzz generate docs fmt vet clean

all: build

# VERSION is the build `cablectl version` and the status report (internal/version).
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo unknown)

build:
	@mkdir -p $(BIN)
	$(GO) build -ldflags "-X github.com/cablemesh/cablemesh/internal/version.Version=$(VERSION)" -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES))

# The external programs each stage runs are listed once, in scripts/deps.list (program, Debian
# package, stages); install-deps.sh installs a profile's missing ones and then fails naming any
# program still missing and its package. deps: everything (demo, test and bench).
deps:
	./scripts/install-deps.sh

deps-demo:
	./scripts/install-deps.sh demo

# The tests' set, and the VM stage's guest kernel (scripts/vm/install-kernel.sh).
deps-test:
	./scripts/install-deps.sh test

deps-bench:
	./scripts/install-deps.sh bench

test: deps-test build lint check-bpf unit-test netns-test vm-test k8s-test

# The committed eBPF objects must be what the C sources compile to: where clang is installed,
# rebuild them and fail on any difference.
check-bpf:
	@if command -v clang >/dev/null 2>&1; then \
		$(GO) generate ./bpf/ && git diff --exit-code --stat -- bpf/ || \
		{ echo "bpf/: the committed objects are not what the C sources compile to; run make generate and commit" >&2; exit 1; }; \
	else echo "check-bpf: clang not installed, committed eBPF objects not rebuilt"; fi

# Unit tests: everything except the end-to-end tests under tests/netns; then the Helm chart with
# Helm's own packages (tests/helm, a module of its own so nothing else depends on Helm).
unit-test:
	pkgs=$$($(GO) list ./... | grep -v -e '/tests/netns' -e '/tests/vm$$' -e '/tests/brokerchurn$$'); $(GO) test -count=1 $$pkgs
	cd tests/helm && $(GO) test -count=1 .

# End-to-end tests with the real binaries in network namespaces (need root; they skip otherwise),
# and those on loopback that need no root (tests/brokerchurn).
netns-test: build
	CABLEMESH_BIN=$(BIN) $(GO) test -v -count=1 -timeout $(NETNS_TIMEOUT) ./tests/netns/...
	CABLEMESH_BIN=$(abspath $(BIN)) $(GO) test -v -count=1 ./tests/brokerchurn/

# The kernel datapaths (kernel WireGuard, kernel ESP) in a VM: see tests/vm.
vm-test: build
	CABLEMESH_BIN=$(BIN) CABLEMESH_VM_REQUIRED=1 $(GO) test -v -count=1 -timeout $(VM_TIMEOUT) ./tests/vm/...

# Real Kubernetes (tests/k8s, a Go module of its own; root): installs the k8s profile, builds the
# Kubernetes binaries once per machine into /var/cache/cablemesh/k8s (cold: about 14 minutes on 2
# idle cores, K8S_BUILD_JOBS packages at a time; then reused) and CoreDNS into
# /var/cache/cablemesh/coredns (tests/k8s/coredns/build.sh: about 3 minutes cold), and runs TestCluster and
# TestCrossCluster (two clusters, the broker, the agents as pods, traffic across the cable). The
# clusters live under K8S_TEST_DIR; whatever a failed or timed-out run left there is removed.
K8S_TIMEOUT ?= 40m
K8S_TEST_DIR ?= /tmp/cablemesh-k8s-test
k8s-test: build
	./scripts/install-deps.sh k8s
	K8S_BUILD_JOBS=$${K8S_BUILD_JOBS:-2} ./tests/k8s/build.sh >/dev/null
	./tests/k8s/coredns/build.sh image >/dev/null
	./tests/helm/build.sh >/dev/null
	rc=0; (cd tests/k8s && CABLEMESH_K8S=1 CABLEMESH_K8S_TEST_DIR=$(K8S_TEST_DIR) CABLEMESH_BIN=$(BIN) \
		$(GO) test -v -count=1 -timeout $(K8S_TIMEOUT) . ./cmd/...) || rc=$$?; \
		./scripts/k8s-test-cleanup.sh $(K8S_TEST_DIR); exit $$rc

# The demo installs only what it runs (a few small packages), not the tests' set; the install
# (disk and network) and the build (CPU) run at once.
demo:
	$(MAKE) --no-print-directory -j2 deps-demo build
	./scripts/demo.sh

demo-down:
	./scripts/demo-down.sh

# Two real Kubernetes clusters, east and west (upstream v1.37 built once into
# /var/cache/cablemesh/k8s by tests/k8s/build.sh: about 15 minutes cold on an idle 2-core machine),
# each with a control plane and two nodes in network namespaces, a broker, and the agent installed
# with `cablectl install kubernetes | kubectl apply -f -`; prints the kubeconfigs (root). Its test
# is the k8s-test stage of make test. See tests/k8s/README.md.
deps-k8s:
	./scripts/install-deps.sh k8s

k8s-demo: deps-k8s build
	./scripts/k8s-demo.sh

k8s-demo-down:
	./scripts/k8s-demo-down.sh

# Benchmarks (root): throughput and RTT over each cable driver vs the raw underlay, and the
# issue-2 WireGuard figure; results in bench/results/. BENCH_RUN='^TestDrivers$' runs one.
bench: deps-bench build
	./bench/throughput.sh
	$(MAKE) bench-services
	$(MAKE) bench-dns
	$(MAKE) bench-scale
	$(MAKE) bench-xds
	$(MAKE) bench-ingress
	$(MAKE) bench-cables
	$(MAKE) bench-counters

# Services (root): connect latency and request/response rate through a VIP vs the same backend
# directly, and failover time over 10 trials; results in bench/results/services-<date>.*.
bench-services: deps-bench build
	BENCH_RUN='^TestServices$$' ./bench/throughput.sh

# The agent's DNS server against dnsmasq and CoreDNS (tests/k8s/coredns/build.sh, cached in
# /var/cache/cablemesh/coredns) serving the same names, dnsperf as the load (no root).
bench-dns: deps-bench
	dir=$$(./tests/k8s/coredns/build.sh) && CABLEMESH_COREDNS=$$dir/coredns \
		$(GO) test -tags bench -run '^TestDNS$$' -v -count=1 -timeout 30m ./bench/dns/

# The broker under a fleet of simulated agents starting at once (no root): 1,000 and 5,000 agents,
# bbolt and etcd; results in bench/results/scale-<date>.*. Knobs: CABLEMESH_SCALE_* (bench/scale/doc.go).
bench-scale: deps-bench build
	CABLEMESH_BIN=$(abspath $(BIN)) $(GO) test -tags bench -run '^TestScale$$' -v -count=1 -timeout 120m ./bench/scale/

# The agent's xDS server: export change to client ACK at 10, 100 and 1,000 services against a
# prebuilt-snapshot anchor, and the snapshot build at 1,000 x 10; results in bench/results/xds-<date>.*.
bench-xds: deps-bench
	$(GO) test -tags bench -run '^TestXDS$$' -v -count=1 -timeout 30m ./bench/xds/

# The kernel ingress of gateway mode (root): pod-to-pod over a kernel VXLAN cable directly vs
# through both gateways' nftables SNAT/DNAT, iperf3 throughput and TCP connect p50/p99;
# results in bench/results/ingress-<date>.*. Knobs: INGRESS_BENCH_* (bench/ingress/doc.go).
bench-ingress: deps-bench
	$(GO) test -tags bench -run '^TestIngress$$' -v -count=1 -timeout 30m ./bench/ingress/

# A new pair's first packets (root): 20 fresh two-cluster starts each of the previous build
# (built from git, CABLEMESH_START_PREVIOUS_REV) and this one, interleaved; bench/pairstart.md.
bench-start: deps-bench build
	./bench/pairstart.sh

# The cables against hand-made equivalents (root): iproute2 VXLAN, standalone wireguard-go + wg
# and a hand-written swanctl config for charon (kernel-libipsec) beside the vxlan, ipsec and
# wireguard cables and plain routing, on the same topology, every path interleaved in each round,
# one stream and four; ratios in bench/results/cables-<date>.*. wireguard-go is built from go.mod's
# module version into bin/. Knobs: CABLEMESH_CABLES_* (bench/cables_test.go).
bench-cables: deps-bench build
	$(GO) build -o $(BIN)/wireguard-go golang.zx2c4.com/wireguard
	BENCH_RUN='^TestCables$$' ./bench/throughput.sh

# The tcx counter program's cost per packet (root): BPF_PROG_TEST_RUN against a no-op anchor, on
# its per-CPU cache's hit and miss paths; CABLEMESH_COUNTERS_BASELINE=<an older counters_bpfel.o>
# adds that build's program. Results in bench/results/counters-<date>.*.
bench-counters: deps-bench
	$(GO) test -tags bench -run '^TestCounterProgram$$' -v -count=1 -timeout 10m ./bench/

# A mesh under faults for CABLEMESH_SOAK_MINUTES (20) minutes, seeded by CABLEMESH_SOAK_SEED: four
# clusters, two broker replicas on three etcd members, pings on every pair, policy and export writes,
# killed brokers, agents, charon, etcd members and downed underlay links (root); bench/results/soak-<date>.*.
bench-soak: deps-bench build
	CABLEMESH_BIN=$(abspath $(BIN)) $(GO) test -tags bench -run '^TestSoak$$' -v -count=1 -timeout 120m ./bench/soak/

# Fuzz every fuzz target of the module (scripts/fuzz.sh finds them) for FUZZTIME each (not part
# of make test).
FUZZTIME ?= 60s
fuzz:
	GO=$(GO) FUZZTIME=$(FUZZTIME) scripts/fuzz.sh

# Regenerates the protobuf Go code (needs protoc, protoc-gen-go and protoc-gen-go-grpc) and the
# eBPF objects with bpf2go (needs clang and llvm-strip; the objects are committed, so `go build`
# needs neither).
generate:
	$(GO) generate ./bpf/
	cd api/v1 && PATH="$$PATH:$$($(GO) env GOPATH)/bin" protoc --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative cablemesh.proto

# Regenerates cablectl's reference, docs/cablectl/ (one page per command), from its cobra command
# tree; a unit test (cmd/cablectl-docs) fails when the committed pages are not what this writes.
docs:
	$(GO) run ./cmd/cablectl-docs -dir docs/cablectl

# Universal hosts (as root, or with DESTDIR for packaging): the binaries into
# $(DESTDIR)/usr/local/bin, the systemd units of deploy/systemd into $(DESTDIR)/etc/systemd/system
# and a config skeleton into $(DESTDIR)/etc/cablemesh/agent.yaml, never over an existing one.
.PHONY: install image
install: build
	DESTDIR='$(DESTDIR)' ./scripts/install.sh '$(BIN)'

# OCI images of cable-agent, cable-broker and cablectl, the names deploy/ uses: static binaries
# on an empty base, built offline with buildah (scripts/image.sh). Not part of make test.
# IMAGE_ARCHIVE_DIR=DIR also writes them as OCI archives (kind load image-archive, ctr import).
IMAGE_REPO ?= cablemesh
IMAGE_TAG ?= v0.1.0
image:
	IMAGE_REPO='$(IMAGE_REPO)' IMAGE_TAG='$(IMAGE_TAG)' IMAGE_ARCHIVE_DIR='$(IMAGE_ARCHIVE_DIR)' GO='$(GO)' ./scripts/image.sh

fmt:
	gofmt -l -w $$(git ls-files '*.go')

vet:
	$(GO) vet ./...

# go vet and staticcheck (pinned in go.mod as a tool) must both be clean.
lint: vet
	$(GO) vet -tags bench ./bench/...
	$(GO) tool staticcheck ./...
	$(GO) tool staticcheck -tags bench ./bench/...

clean:
	rm -rf $(BIN)
