//go:build bench

package bench

import (
	"fmt"
	"net/netip"
	"os"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/internal/benchresults"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// pings is how many echo requests one RTT measurement sends.
const pings = 20

// RTT is one ping series: every sample and its statistics, in milliseconds.
type RTT struct {
	Path     string    `json:"path"`
	From     string    `json:"from"`
	To       string    `json:"to"`
	Sent     int       `json:"sent"`
	Received int       `json:"received"`
	Samples  []float64 `json:"samplesMs"`
	MinMs    float64   `json:"minMs"`
	MedianMs float64   `json:"medianMs"`
	AvgMs    float64   `json:"avgMs"`
	MaxMs    float64   `json:"maxMs"`
}

// DriverResult is one cable driver's figures with the underlay anchor taken alongside them.
type DriverResult struct {
	Driver         string `json:"driver"`
	Implementation string `json:"implementation"`
	// Throughput pod to pod over the cable and, interleaved run by run, over the raw underlay.
	Throughput Series `json:"throughput"`
	Underlay   Series `json:"underlayAnchor"`
	// ThroughputRatio is the cable's median over the underlay anchor's median.
	ThroughputRatio float64 `json:"throughputRatio"`
	RTT             RTT     `json:"rtt"`
	UnderlayRTT     RTT     `json:"underlayRTT"`
	// RTTRatio is the cable's median RTT over the underlay's median RTT.
	RTTRatio float64 `json:"rttRatio"`
	// SwitchSeconds is how long the pair took, after `cablectl apply` returned, to be
	// connected over this driver on both ends.
	SwitchSeconds float64 `json:"switchSeconds"`
}

// DriversResult is what bench/results/drivers-<date>.json holds.
type DriversResult struct {
	Date            string         `json:"date"`
	Kernel          string         `json:"kernel"`
	CPUs            int            `json:"cpus"`
	Tool            string         `json:"tool"`
	DurationSeconds int            `json:"durationSeconds"`
	Repetitions     int            `json:"repetitions"`
	Pings           int            `json:"pings"`
	Drivers         []DriverResult `json:"drivers"`
	// UnderlayAll pools every underlay run of the whole bench (reps x drivers); its median is
	// the steadier anchor when one driver's own anchor runs were noisy.
	UnderlayAll Series `json:"underlayAll"`
	// PooledRatios is each driver's median throughput over UnderlayAll's median.
	PooledRatios map[string]float64 `json:"pooledThroughputRatios"`
	Notes        []string           `json:"notes"`
}

func benchPolicy(driver string) string {
	return fmt.Sprintf(`kind: ClusterConnectionPolicy
metadata:
  name: bench-pair
spec:
  clusterSelector:
    bench: "yes"
  topology: full-mesh
  cableDriver:
    name: %s
  priority: 5
`, driver)
}

var pingTimeRE = regexp.MustCompile(`time=([0-9.]+) ms`)

// rtt pings addr from namespace ns pings times, 200ms apart, and summarizes the replies.
func rtt(t *testing.T, m *harness.Mesh, path, ns string, from, to netip.Addr) RTT {
	t.Helper()
	r := harness.RunTimeout(m.Ctx, 60*time.Second, "ip", "netns", "exec", ns, "ping", "-n", "-c", strconv.Itoa(pings),
		"-i", "0.2", "-W", "1", to.String())
	res := RTT{Path: path, From: from.String(), To: to.String(), Sent: pings}
	for _, mm := range pingTimeRE.FindAllStringSubmatch(r.Stdout, -1) {
		v, _ := strconv.ParseFloat(mm[1], 64)
		res.Samples = append(res.Samples, v)
	}
	res.Received = len(res.Samples)
	if res.Received == 0 {
		t.Fatalf("ping %s: no replies: %s", path, r)
	}
	s := slices.Clone(res.Samples)
	slices.Sort(s)
	res.MinMs, res.MaxMs, res.MedianMs = s[0], s[len(s)-1], s[len(s)/2]
	var sum float64
	for _, v := range s {
		sum += v
	}
	res.AvgMs = sum / float64(len(s))
	return res
}

func implementation(driver string) string {
	switch driver {
	case harness.DriverWireGuard:
		return wgImplementation()
	case harness.DriverVXLAN:
		return "kernel VXLAN, unencrypted"
	case harness.DriverIPsec:
		if ok, _ := ipsec.KernelHasESP(); ok {
			return "strongSwan charon (IKEv2) with kernel xfrm ESP"
		}
		return "strongSwan charon (IKEv2) with kernel-libipsec: ESP in userspace inside charon on the TUN device ipsec0, " +
			"every packet crosses into charon and back (the kernel here has no ESP); slow by design"
	}
	return ""
}

// TestDrivers measures, in one run, pod-to-pod TCP throughput (iperf3, medians of three) and
// ping RTT over each cable driver, each interleaved run by run with the raw underlay between the
// same two gateways, and writes the ratios to bench/results/drivers-<date>.json and .md.
func TestDrivers(t *testing.T) {
	harness.RequireIPsec(t)
	m := harness.New(t)
	extra := harness.MultiDriverConfig()
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "bench=yes", extra)
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "bench=yes", extra)
	both := []*harness.Cluster{east, west}
	started := time.Now()
	for _, c := range both {
		c.StartAgent()
	}
	m.WaitWants(2*time.Minute, started, both, nil, harness.Connected(harness.DriverWireGuard))

	res := DriversResult{Tool: "iperf3, one TCP stream", DurationSeconds: int(duration.Seconds()), Repetitions: reps, Pings: pings}
	for _, d := range harness.Drivers {
		t0 := m.Apply(m.PolicyFile("bench-"+d+".yaml", benchPolicy(d)))
		conv := m.WaitWants(time.Minute, t0, both, nil, harness.Connected(d))
		dr := DriverResult{Driver: d, Implementation: implementation(d), SwitchSeconds: conv.ConnectedAfter("east", "west").Seconds()}
		dr.Throughput = Series{Path: "pod-to-pod over the " + d + " cable", From: east.PodIP.String(), To: west.PodIP.String()}
		dr.Underlay = Series{Path: "gateway-to-gateway over the raw underlay veth", From: east.GwUnderlay.String(), To: west.GwUnderlay.String()}
		// One warm-up ping so that the first RTT sample carries no handshake or ARP.
		m.Ping(east.PodNS, west.PodIP, 2, 200*time.Millisecond)
		dr.RTT = rtt(t, m, dr.Throughput.Path, east.PodNS, east.PodIP, west.PodIP)
		dr.UnderlayRTT = rtt(t, m, dr.Underlay.Path, east.GwNS, east.GwUnderlay, west.GwUnderlay)
		for i := 0; i < reps; i++ {
			c := iperf(t, m, fmt.Sprintf("%s-%d", d, i), east.PodNS, west.PodNS, west.PodIP)
			u := iperf(t, m, fmt.Sprintf("%s-ul-%d", d, i), east.GwNS, west.GwNS, west.GwUnderlay)
			t.Logf("%s rep %d: cable %.3f Gbit/s, underlay %.2f Gbit/s", d, i+1, c.BitsPerSecond/1e9, u.BitsPerSecond/1e9)
			dr.Throughput.Runs = append(dr.Throughput.Runs, c)
			dr.Underlay.Runs = append(dr.Underlay.Runs, u)
		}
		dr.Throughput.MedianBps, dr.Underlay.MedianBps = median(dr.Throughput.Runs), median(dr.Underlay.Runs)
		dr.Throughput.MedianGbps, dr.Underlay.MedianGbps = dr.Throughput.MedianBps/1e9, dr.Underlay.MedianBps/1e9
		if dr.Underlay.MedianBps == 0 || dr.UnderlayRTT.MedianMs == 0 {
			t.Fatalf("%s: the underlay anchor measured 0", d)
		}
		dr.ThroughputRatio = dr.Throughput.MedianBps / dr.Underlay.MedianBps
		dr.RTTRatio = dr.RTT.MedianMs / dr.UnderlayRTT.MedianMs
		t.Logf("%s: %.3f Gbit/s (ratio %.3f to the underlay's %.2f), RTT median %.3fms (underlay %.3fms, ratio %.2f)", d,
			dr.Throughput.MedianGbps, dr.ThroughputRatio, dr.Underlay.MedianGbps, dr.RTT.MedianMs, dr.UnderlayRTT.MedianMs, dr.RTTRatio)
		res.Drivers = append(res.Drivers, dr)
	}

	res.UnderlayAll = Series{Path: "gateway-to-gateway over the raw underlay veth, every run of the bench", From: east.GwUnderlay.String(), To: west.GwUnderlay.String()}
	for _, d := range res.Drivers {
		res.UnderlayAll.Runs = append(res.UnderlayAll.Runs, d.Underlay.Runs...)
	}
	res.UnderlayAll.MedianBps = median(res.UnderlayAll.Runs)
	res.UnderlayAll.MedianGbps = res.UnderlayAll.MedianBps / 1e9
	res.PooledRatios = map[string]float64{}
	for _, d := range res.Drivers {
		res.PooledRatios[d.Driver] = d.Throughput.MedianBps / res.UnderlayAll.MedianBps
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	res.Date = time.Now().UTC().Format(time.RFC3339)
	res.Kernel = strings.TrimSpace(string(kernel))
	res.CPUs = runtime.NumCPU()
	res.Notes = []string{
		"Cable figures are pod to pod (pod -> gateway -> cable -> gateway -> pod); the underlay anchor is gateway to gateway over the veth and bridge the cable runs on, measured run by run between the cable's runs.",
		"The pod-to-pod RTT includes two more veth hops than the underlay RTT; on this machine both are tens of microseconds, so RTT ratios exaggerate small absolute differences.",
		"All namespaces share the same 2 CPUs: a userspace datapath (wireguard-go, kernel-libipsec) competes with iperf3 itself for them.",
		"Connected after apply: from `cablectl apply` of the bench's policy returning until both agents report the pair connected over that driver (the pair starts on wireguard, the default, so wireguard's is a no-op).",
		"ipsec: " + implementation(harness.DriverIPsec) + ".",
	}
	writeDriverResults(t, res)
}

func writeDriverResults(t *testing.T, res DriversResult) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# Cable drivers vs raw underlay (%s)\n\n", res.Date)
	fmt.Fprintf(&b, "Kernel %s, %d CPUs. Throughput: %s, %ds per run, %d runs per path, each cable run followed by an underlay run; medians. RTT: %d pings 200ms apart; median.\n\n",
		res.Kernel, res.CPUs, res.Tool, res.DurationSeconds, res.Repetitions, res.Pings)
	fmt.Fprintf(&b, "| driver | runs (Gbit/s) | median (Gbit/s) | its underlay anchor median (Gbit/s) | throughput ratio | ratio to all underlay runs | RTT median / avg (ms) | underlay RTT median (ms) | RTT ratio | connected after apply (s) |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|\n")
	for _, d := range res.Drivers {
		var runs []string
		for _, r := range d.Throughput.Runs {
			runs = append(runs, fmt.Sprintf("%.3f", r.BitsPerSecond/1e9))
		}
		fmt.Fprintf(&b, "| %s | %s | %.3f | %.2f | **%.3f** | %.3f | %.3f / %.3f | %.3f | %.2f | %.2f |\n", d.Driver, strings.Join(runs, ", "),
			d.Throughput.MedianGbps, d.Underlay.MedianGbps, d.ThroughputRatio, res.PooledRatios[d.Driver], d.RTT.MedianMs, d.RTT.AvgMs,
			d.UnderlayRTT.MedianMs, d.RTTRatio, d.SwitchSeconds)
	}
	fmt.Fprintf(&b, "\nAll %d underlay runs: median %.2f Gbit/s.\n", len(res.UnderlayAll.Runs), res.UnderlayAll.MedianGbps)
	fmt.Fprintf(&b, "\nImplementations:\n\n")
	for _, d := range res.Drivers {
		fmt.Fprintf(&b, "- %s: %s\n", d.Driver, d.Implementation)
	}
	fmt.Fprintf(&b, "\nNotes:\n\n")
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	benchresults.Save(t, "results", "drivers", res, b.String())
}
