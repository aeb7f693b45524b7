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

.PHONY: all build deps test lint check-bpf unit-test netns-test vm-test demo demo-down bench bench-services bench-dns fuzz generate fmt vet clean

all: build

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ $(addprefix ./cmd/,$(BINARIES))

deps:
	./scripts/install-deps.sh

test: deps build lint check-bpf unit-test netns-test vm-test

# The committed eBPF objects must be what the C sources compile to: where clang is installed,
# rebuild them and fail on any difference.
check-bpf:
	@if command -v clang >/dev/null 2>&1; then \
		$(GO) generate ./bpf/ && git diff --exit-code --stat -- bpf/ || \
		{ echo "bpf/: the committed objects are not what the C sources compile to; run make generate and commit" >&2; exit 1; }; \
	else echo "check-bpf: clang not installed, committed eBPF objects not rebuilt"; fi

# Unit tests: everything except the end-to-end tests under tests/netns.
unit-test:
	pkgs=$$($(GO) list ./... | grep -v -e '/tests/netns' -e '/tests/vm$$'); $(GO) test -count=1 $$pkgs

# End-to-end tests with the real binaries in network namespaces (need root; they skip otherwise).
netns-test: build
	CABLEMESH_BIN=$(BIN) $(GO) test -v -count=1 -timeout $(NETNS_TIMEOUT) ./tests/netns/...

# The kernel datapaths (kernel WireGuard, kernel ESP) in a VM: see tests/vm.
vm-test: build
	CABLEMESH_BIN=$(BIN) CABLEMESH_VM_REQUIRED=1 $(GO) test -v -count=1 -timeout $(VM_TIMEOUT) ./tests/vm/...

demo: deps build
	./scripts/demo.sh

demo-down:
	./scripts/demo-down.sh

# Benchmarks (root): throughput and RTT over each cable driver vs the raw underlay, and the
# issue-2 WireGuard figure; results in bench/results/. BENCH_RUN='^TestDrivers$' runs one.
bench: deps build
	./bench/throughput.sh
	$(MAKE) bench-services
	$(MAKE) bench-dns

# Services (root): connect latency and request/response rate through a VIP vs the same backend
# directly, and failover time over 10 trials; results in bench/results/services-<date>.*.
bench-services: deps build
	BENCH_RUN='^TestServices$$' ./bench/throughput.sh

# The agent's DNS server against dnsmasq serving the same names, dnsperf as the load (no root).
bench-dns: deps
	$(GO) test -tags bench -run '^TestDNS$$' -v -count=1 -timeout 30m ./bench/dns/

# Fuzz the parsers of outside input for FUZZTIME each (not part of make test).
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz '^FuzzServeDNS$$' -fuzztime $(FUZZTIME) ./agent/dns/
	$(GO) test -run '^$$' -fuzz '^FuzzBuildZone$$' -fuzztime $(FUZZTIME) ./agent/dns/
	$(GO) test -run '^$$' -fuzz '^FuzzNormalize$$' -fuzztime $(FUZZTIME) ./mcs/
	$(GO) test -run '^$$' -fuzz '^FuzzPlanSync$$' -fuzztime $(FUZZTIME) ./bpf/

# Regenerates the protobuf Go code (needs protoc, protoc-gen-go and protoc-gen-go-grpc) and the
# eBPF objects with bpf2go (needs clang and llvm-strip; the objects are committed, so `go build`
# needs neither).
generate:
	$(GO) generate ./bpf/
	cd api/v1 && PATH="$$PATH:$$($(GO) env GOPATH)/bin" protoc --go_out=. --go_opt=paths=source_relative \
		--go-grpc_out=. --go-grpc_opt=paths=source_relative cablemesh.proto

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
