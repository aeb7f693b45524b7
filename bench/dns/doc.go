// Package dnsbench measures the agent's clusterset.local DNS server (agent/dns) against
// dnsmasq serving the same names from a configuration file and CoreDNS serving them from a
// zone file (its file plugin), in the same run, on loopback.
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
//	DNS_BENCH_ROUNDS         interleaved rounds per mode (default 1)
//	DNS_BENCH_RATES          queries per second of the fixed-rate modes, comma-separated
//	                         (default 2000,20000; DNS_BENCH_RATE, one rate, is still read)
//	CABLEMESH_COREDNS        the CoreDNS binary (make bench-dns sets it from
//	                         tests/k8s/coredns/build.sh; unset: no CoreDNS)
//	DNS_BENCH_LOADGEN        dnsperf or go (default dnsperf when installed)
//
// The agent's server runs in a child process (this test binary re-executed), so that it
// shares neither a process nor a Go scheduler with the load generator, as dnsmasq does not.
package dnsbench
