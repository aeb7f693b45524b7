// Package dnsbench measures the agent's clusterset.local DNS server (agent/dns) against
// dnsmasq serving the same names from a configuration file, in the same run, on loopback.
//
// Run it (dnsmasq and dnsperf from Debian's packages; without dnsperf a Go load generator
// is used):
//
//	go test -tags bench -run '^TestDNS$' -v -count=1 -timeout 30m ./bench/dns/
//
// It writes bench/results/dns-<UTC time>.json and .md. Environment:
//
//	CABLEMESH_BENCH_RESULTS  results directory (default bench/results)
//	DNS_BENCH_SECONDS        length of one run (default 10)
//	DNS_BENCH_ROUNDS         interleaved rounds per mode (default 3)
//	DNS_BENCH_RATE           queries per second of the fixed-rate mode (default 5000)
//	DNS_BENCH_LOADGEN        dnsperf or go (default dnsperf when installed)
//
// The agent's server runs in a child process (this test binary re-executed), so that it
// shares neither a process nor a Go scheduler with the load generator, as dnsmasq does not.
package dnsbench
