//go:build bench

package bench

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/internal/benchresults"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// The services benchmark: three clusters on one machine, the pairs on the kernel VXLAN cable (so
// the tunnel is not what is measured). From a pod of north (in its gateway's cgroup, where the
// eBPF socket hooks apply):
//   - connect latency and TCP request/response rate to west's pod through the VIP of a service
//     only west exports, and to the same backend by its address, interleaved run by run;
//   - failover: web is exported by east and west; east's agent is killed and its gateway taken
//     off the underlay while north connects again and again through web's VIP; the failover
//     time is from the kill to the last connection that still went to east (every later one
//     reached west). Then east is restored and the trial repeated.

const (
	svcRuns        = 6    // interleaved runs per path
	svcConnects    = 1000 // connections per connect-latency run
	svcRRSeconds   = 3    // seconds per request/response run
	failoverTrials = 10
)

// ConnRun is one connect-latency run (tcpcheck connbench).
type ConnRun struct {
	Count  int     `json:"count"`
	Errors int     `json:"errors"`
	P50    float64 `json:"p50us"`
	P90    float64 `json:"p90us"`
	P99    float64 `json:"p99us"`
	Mean   float64 `json:"meanus"`
}

// RRRun is one request/response run (tcpcheck rrbench).
type RRRun struct {
	Transactions int     `json:"transactions"`
	Seconds      float64 `json:"seconds"`
	PerSecond    float64 `json:"perSecond"`
}

// PathResult is one path's runs and medians.
type PathResult struct {
	Path        string    `json:"path"`
	Address     string    `json:"address"`
	Connect     []ConnRun `json:"connectRuns"`
	RR          []RRRun   `json:"requestResponseRuns"`
	ConnectP50  float64   `json:"connectP50usMedian"`
	ConnectP99  float64   `json:"connectP99usMedian"`
	RRPerSecond float64   `json:"rrPerSecondMedian"`
}

// FailoverTrial is one failover measurement.
type FailoverTrial struct {
	Seconds float64 `json:"seconds"`
	// AbortedSeconds is when a connection held open to east was aborted, after the kill.
	AbortedSeconds float64 `json:"openConnectionAbortedSeconds"`
	After          int     `json:"connectionsToWestAfter"`
	// LastFailure is the last attempt that did not reach west: its error (or reply), and how long
	// it took.
	LastFailure   string `json:"lastFailure,omitempty"`
	LastFailureUs int64  `json:"lastFailureUs,omitempty"`
	// Failures counts the attempts after the kill that did not reach west.
	Failures int `json:"failures"`
}

// ServicesResult is what bench/results/services-<date>.json holds.
type ServicesResult struct {
	Date        string     `json:"date"`
	Kernel      string     `json:"kernel"`
	CPUs        int        `json:"cpus"`
	Cable       string     `json:"cable"`
	HealthCheck string     `json:"healthCheck"`
	VIP         PathResult `json:"vip"`
	Direct      PathResult `json:"direct"`
	// Ratios VIP / direct of the medians (connect latency: higher is slower; rate: lower is
	// slower).
	ConnectP50Ratio float64         `json:"connectP50Ratio"`
	RRRatio         float64         `json:"rrRatio"`
	Failover        []FailoverTrial `json:"failover"`
	FailoverMedian  float64         `json:"failoverMedianSeconds"`
	FailoverWorst   float64         `json:"failoverWorstSeconds"`
	AbortedMedian   float64         `json:"openConnectionAbortedMedianSeconds"`
	Command         string          `json:"command"`
	Notes           []string        `json:"notes"`
}

func medianOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func servicesConfig(n int, exports string) string {
	return fmt.Sprintf("cableDrivers: [wireguard, vxlan]\nvxlan: {port: %d, vni: %d}\n%s", harness.VXLANPort, harness.VXLANVNI, exports)
}

const benchVXLANPolicy = `kind: ClusterConnectionPolicy
metadata:
  name: bench-vxlan
spec:
  clusterSelector: {}
  topology: full-mesh
  connectionPolicy: connect
  cableDriver:
    name: vxlan
  priority: 5
`

func TestServices(t *testing.T) {
	m := harness.New(t)
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "", servicesConfig(1,
		"exports:\n- {name: web, namespace: bench, ports: [{name: http, port: 80}], endpoints: [{ip: 10.1.0.10}]}\n"))
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "", servicesConfig(2,
		"exports:\n- {name: web, namespace: bench, ports: [{name: http, port: 80}], endpoints: [{ip: 10.2.0.10}]}\n"+
			"- {name: one, namespace: bench, ports: [{name: http, port: 80}], endpoints: [{ip: 10.2.0.10}]}\n"))
	north := m.AddLabelledCluster("north", "10.3.0.0/16", "", servicesConfig(3, ""))
	m.Apply(m.PolicyFile("vxlan.yaml", benchVXLANPolicy))
	for _, c := range []*harness.Cluster{east, west, north} {
		c.StartAgent()
	}
	east.StartServer("hello", 80, "web east")
	west.StartServer("hello", 80, "web west")
	m.WaitConnected(90*time.Second, east, west, north)
	one := waitBackends(t, north, "one", "west")
	web := waitBackends(t, north, "web", "east", "west")

	res := ServicesResult{Date: time.Now().UTC().Format(time.RFC3339), Kernel: kernel(), CPUs: runtime.NumCPU(),
		Cable: "vxlan (kernel) between every pair", HealthCheck: "the shipped defaults: period 300ms, timeout 300ms, failureThreshold 3",
		Command: "sudo make bench (or: CABLEMESH_BIN=bin go test -tags bench -run '^TestServices$' -v -count=1 ./bench/)"}
	vip := netip.AddrPortFrom(one, 80)
	direct := netip.MustParseAddrPort("10.2.0.10:80")
	res.VIP = PathResult{Path: "through the VIP (eBPF socket LB)", Address: vip.String()}
	res.Direct = PathResult{Path: "the same backend by its pod address", Address: direct.String()}
	for i := 0; i < svcRuns; i++ {
		for _, p := range []*PathResult{&res.VIP, &res.Direct} {
			var c ConnRun
			mustJSON(t, north.PodRun(2*time.Minute, m.Bin.TCPCheck, "connbench", "-addr", p.Address, "-count", fmt.Sprint(svcConnects), "-timeout", "2s"), &c)
			p.Connect = append(p.Connect, c)
			var r RRRun
			mustJSON(t, north.PodRun(time.Minute, m.Bin.TCPCheck, "rrbench", "-addr", p.Address, "-duration", fmt.Sprintf("%ds", svcRRSeconds), "-timeout", "2s"), &r)
			p.RR = append(p.RR, r)
		}
	}
	for _, p := range []*PathResult{&res.VIP, &res.Direct} {
		var p50, p99, rr []float64
		for _, c := range p.Connect {
			p50, p99 = append(p50, c.P50), append(p99, c.P99)
		}
		for _, r := range p.RR {
			rr = append(rr, r.PerSecond)
		}
		p.ConnectP50, p.ConnectP99, p.RRPerSecond = medianOf(p50), medianOf(p99), medianOf(rr)
	}
	res.ConnectP50Ratio = res.VIP.ConnectP50 / res.Direct.ConnectP50
	res.RRRatio = res.VIP.RRPerSecond / res.Direct.RRPerSecond

	for i := 0; i < failoverTrials; i++ {
		tr := failoverTrial(t, m, east, north, netip.AddrPortFrom(web, 80), i)
		m.Logf("failover trial %d: %.3fs (open connection aborted after %.3fs)", i+1, tr.Seconds, tr.AbortedSeconds)
		res.Failover = append(res.Failover, tr)
	}
	var fo, ab []float64
	for _, tr := range res.Failover {
		fo, ab = append(fo, tr.Seconds), append(ab, tr.AbortedSeconds)
		res.FailoverWorst = max(res.FailoverWorst, tr.Seconds)
	}
	res.FailoverMedian, res.AbortedMedian = medianOf(fo), medianOf(ab)
	res.Notes = append(res.Notes,
		"Connect latency is connect() as Go's net.Dial returns (the SYN/SYN-ACK round trip through the VXLAN cable plus, through the VIP, the cgroup connect4 hook's map look-ups); request/response is one TCP connection sending a line and reading its echo.",
		"Failover: SIGKILL of east's agent and its gateway's underlay link set down, while north's pod connects through web's VIP with a 300ms connect timeout, back to back; the time is from the kill to the end of the last attempt that did not reach west (every attempt after it did, for the rest of the 6s). A connection held open to east is aborted (ECONNABORTED) by the socket destroy when east's backends leave the maps.")
	writeServicesResults(t, res)
}

func mustJSON(t *testing.T, r harness.Result, v any) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if r.Err != nil || json.Unmarshal([]byte(lines[len(lines)-1]), v) != nil {
		t.Fatalf("%s", r)
	}
}

// waitBackends waits until north's maps hold bench/name with backends of exactly clusters, and
// returns its VIP.
func waitBackends(t *testing.T, c *harness.Cluster, name string, clusters ...string) netip.Addr {
	t.Helper()
	var vip netip.Addr
	err := harness.WaitFor(90*time.Second, 200*time.Millisecond, func() (bool, string) {
		st, err := c.Status()
		if err != nil || st.Services == nil {
			return false, fmt.Sprint(err)
		}
		for _, imp := range st.Services.Imports {
			if imp.Namespace != "bench" || imp.Name != name || len(imp.VIPs) == 0 {
				continue
			}
			var got []string
			for _, ic := range imp.Clusters {
				if len(ic.Backends) > 0 {
					got = append(got, ic.Cluster)
				}
			}
			vip = netip.MustParseAddr(imp.VIPs[0])
			return slices.Equal(got, clusters), fmt.Sprintf("%+v", imp)
		}
		return false, fmt.Sprintf("%+v", st.Services)
	})
	if err != nil {
		t.Fatalf("bench/%s at %s: %v", name, c.Name, err)
	}
	return vip
}

func failoverTrial(t *testing.T, m *harness.Mesh, east, north *harness.Cluster, web netip.AddrPort, i int) FailoverTrial {
	t.Helper()
	var held *harness.Process
	for j := 0; j < 30 && held == nil; j++ {
		p := north.StartPod(fmt.Sprintf("hold-%d-%d", i, j), m.Bin.TCPCheck, "hold", "-addr", web.String(), "-timeout", "2s")
		if err := harness.WaitFor(5*time.Second, 20*time.Millisecond, func() (bool, string) { return len(harness.ReadHellos(p)) > 0, p.Log() }); err != nil {
			t.Fatal(err)
		}
		if harness.ReadHellos(p)[0].Reply == "web east" {
			held = p
		} else {
			_, _ = p.Stop(time.Second)
		}
	}
	if held == nil {
		t.Fatal("no connection landed on east")
	}
	asks := north.StartPod(fmt.Sprintf("asks-%d", i), m.Bin.TCPCheck, "asks", "-addr", web.String(), "-timeout", "300ms", "-duration", "6s")
	time.Sleep(time.Second)
	killed := time.Now()
	_ = syscall.Kill(east.Agent.Pid(), syscall.SIGKILL)
	if _, err := harness.MustRun(m.Ctx, "ip", "-n", east.GwNS, "link", "set", "eth0", "down"); err != nil {
		t.Fatal(err)
	}
	if _, err := asks.Wait(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	var lastFail time.Time
	after := 0
	var tr FailoverTrial
	for _, h := range harness.ReadHellos(asks) {
		at := time.Unix(0, h.At)
		if at.Before(killed) {
			continue
		}
		if h.Error != "" || h.Reply != "web west" {
			lastFail, after = at, 0
			tr.Failures++
			tr.LastFailure, tr.LastFailureUs = h.Error+h.Reply, h.Micro
		} else {
			after++
		}
	}
	tr.After = after
	if !lastFail.IsZero() {
		tr.Seconds = lastFail.Sub(killed).Seconds()
	}
	if hs := harness.ReadHellos(held); len(hs) > 1 && hs[1].Errno == int(syscall.ECONNABORTED) {
		tr.AbortedSeconds = time.Unix(0, hs[1].At).Sub(killed).Seconds()
	} else {
		t.Errorf("trial %d: the connection held to east was not aborted: %+v", i, hs)
	}
	_, _ = held.Stop(time.Second)
	// Restore east and wait until north uses it again.
	if _, err := harness.MustRun(m.Ctx, "ip", "-n", east.GwNS, "link", "set", "eth0", "up"); err != nil {
		t.Fatal(err)
	}
	east.StartAgent()
	waitBackends(t, north, "web", "east", "west")
	return tr
}

func writeServicesResults(t *testing.T, res ServicesResult) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# Services: eBPF socket load balancing and failover (%s)\n\n", res.Date)
	fmt.Fprintf(&b, "Kernel %s, %d CPUs, %s; health probes: %s.\n\n", res.Kernel, res.CPUs, res.Cable, res.HealthCheck)
	fmt.Fprintf(&b, "Command: `%s`\n\n", res.Command)
	fmt.Fprintf(&b, "## VIP vs direct (%d interleaved runs per path; %d connections per connect run, %ds per request/response run)\n\n", svcRuns, svcConnects, svcRRSeconds)
	fmt.Fprintf(&b, "| path | address | connect p50 (µs, median of runs) | connect p99 (µs) | request/response per s (median) |\n|---|---|---|---|---|\n")
	for _, p := range []PathResult{res.VIP, res.Direct} {
		fmt.Fprintf(&b, "| %s | %s | %.0f | %.0f | %.0f |\n", p.Path, p.Address, p.ConnectP50, p.ConnectP99, p.RRPerSecond)
	}
	fmt.Fprintf(&b, "\nRatios VIP / direct: connect p50 **%.3f**, request/response rate **%.3f**.\n\n", res.ConnectP50Ratio, res.RRRatio)
	fmt.Fprintf(&b, "## Failover (%d trials)\n\n| trial | failover (s) | open connection aborted after (s) | failed attempts | last failed attempt |\n|---|---|---|---|---|\n", len(res.Failover))
	for i, tr := range res.Failover {
		fmt.Fprintf(&b, "| %d | %.3f | %.3f | %d | %s (%.0f ms) |\n", i+1, tr.Seconds, tr.AbortedSeconds, tr.Failures, tr.LastFailure, float64(tr.LastFailureUs)/1000)
	}
	fmt.Fprintf(&b, "\nFailover median **%.3fs**, worst **%.3fs**; open connections aborted after %.3fs (median).\n\n", res.FailoverMedian, res.FailoverWorst, res.AbortedMedian)
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	benchresults.Save(t, "results", "services", res, b.String())
}

// kernel is the running kernel's release.
func kernel() string {
	b, err := os.ReadFile("/proc/sys/kernel/osrelease")
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(b))
}
