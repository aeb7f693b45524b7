// Package ingressbench measures the kernel ingress of gateway mode (agent/ingress/nftables)
// against its anchor, direct pod-to-pod routing over the same cable, in the same run.
//
// Two "clusters", each a gateway namespace and a pod namespace, the gateways joined by a kernel
// VXLAN cable over a veth underlay:
//
//	podA 10.10.0.2 ── gwA ══ vxlan over veth ══ gwB ── podB 10.20.0.2
//	                  mesh 242.0.0.1              mesh 242.0.0.2, ingress ports → podB
//
// (a) direct: podA → 10.20.0.2 (routes to the remote pod CIDR over the cable, as a direct-mode
// pair); (b) ingress: podA → 242.0.0.2:ingress port (SNAT to 242.0.0.1 on gwA, DNAT to podB on
// gwB). Both gateways hold the ingress table in both cases, so conntrack runs on both paths: the
// difference is the translation itself. Figures: iperf3 throughput (one TCP stream) and TCP
// connect latency p50/p99 (tcpcheck connbench: thousands of connects, each closed with a reset).
//
// Run it as root (make bench-ingress):
//
//	go test -tags bench -run '^TestIngress$' -v -count=1 -timeout 30m ./bench/ingress/
//
// It writes bench/results/ingress-<UTC time>.json and .md. Environment:
//
//	CABLEMESH_BIN             directory holding ingressnft and tcpcheck (else they are built)
//	CABLEMESH_BENCH_RESULTS   results directory (default bench/results)
//	INGRESS_BENCH_SECONDS     length of one iperf3 run (default 4)
//	INGRESS_BENCH_ROUNDS      interleaved rounds per path (default 5)
//	INGRESS_BENCH_CONNECTS    connects per latency run (default 2000)
package ingressbench
