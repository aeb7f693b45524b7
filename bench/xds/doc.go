// Package xdsbench measures the agent's xDS server (agent/xds): for 10, 100 and 1,000 exported
// services (10 ready endpoints each), the time from an export change (one endpoint of one
// service replaced) to the new snapshot ACKed by a client holding a wildcard state-of-the-world
// ADS stream of every type, as Envoy does; and the snapshot build time and memory at 1,000
// services x 10 endpoints.
//
// The anchor, in the same run and on the same stream: the same change pushed as a snapshot
// built by go-control-plane's own cache.NewSnapshot (one counter version, no content hash, no
// ValidateAll) through the same server, so the difference is what the agent's build adds.
//
//	go test -tags bench -run '^TestXDS$' -v -count=1 -timeout 30m ./bench/xds/
//
// It writes bench/results/xds-<UTC time>.json and .md. Environment:
//
//	CABLEMESH_BENCH_RESULTS  results directory (default bench/results)
//	XDS_BENCH_CHANGES        changes measured per size and mode (default 30)
package xdsbench
