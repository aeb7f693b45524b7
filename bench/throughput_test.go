//go:build bench

// Package bench measures Cablemesh against anchors taken in the same run. Run with `make bench`
// (bench/throughput.sh), as root; results go to bench/results/.
package bench

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/internal/benchresults"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

const (
	reps      = 3
	duration  = 10 * time.Second
	iperfPort = 5201
)

// Run is one iperf3 measurement.
type Run struct {
	BitsPerSecond float64 `json:"bitsPerSecond"`
	Retransmits   int     `json:"retransmits"`
}

// Series is the repetitions over one path and their median.
type Series struct {
	Path       string  `json:"path"`
	From       string  `json:"from"`
	To         string  `json:"to"`
	Runs       []Run   `json:"runs"`
	MedianBps  float64 `json:"medianBitsPerSecond"`
	MedianGbps float64 `json:"medianGbps"`
}

// Result is what bench/results/throughput-<date>.json holds.
type Result struct {
	Date                 string  `json:"date"`
	Kernel               string  `json:"kernel"`
	CPUs                 int     `json:"cpus"`
	Tool                 string  `json:"tool"`
	DurationSeconds      int     `json:"durationSeconds"`
	Repetitions          int     `json:"repetitions"`
	WireGuard            Series  `json:"wireguard"`
	Underlay             Series  `json:"underlay"`
	Ratio                float64 `json:"ratioWireGuardToUnderlay"`
	ConnectSeconds       float64 `json:"connectSeconds"`
	ConnectNote          string  `json:"connectNote"`
	WireGuardImplemented string  `json:"wireguardImplementation"`
}

func TestMain(m *testing.M) {
	if os.Geteuid() == 0 {
		// Leftovers of earlier crashed runs (bench or netns tests) go first.
		if removed, err := harness.SweepStale(context.Background()); err == nil && len(removed) > 0 {
			fmt.Fprintln(os.Stderr, "bench: removed leftovers of crashed runs:", removed)
		}
	}
	code := m.Run()
	harness.RemoveBuild()
	os.Exit(code)
}

// iperf runs one iperf3 test from namespace fromNS to server (whose iperf3 -s runs in toNS).
func iperf(t *testing.T, m *harness.Mesh, name, fromNS, toNS string, server netip.Addr) Run {
	t.Helper()
	srv, err := harness.StartProcess("iperf3-server-"+name, toNS, filepath.Join(m.Dir, "iperf3-server-"+name+".log"),
		"iperf3", "-s", "-1", "-p", fmt.Sprint(iperfPort))
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Stop(5 * time.Second)
	time.Sleep(300 * time.Millisecond)
	var r harness.Result
	for i := 0; i < 20; i++ { // the server may need a moment to listen
		r = harness.RunTimeout(m.Ctx, duration+60*time.Second, "ip", "netns", "exec", fromNS, "iperf3", "-c", server.String(),
			"-p", fmt.Sprint(iperfPort), "-t", fmt.Sprint(int(duration.Seconds())), "-P", "1", "-J")
		if r.Err == nil || !strings.Contains(r.Stdout+r.Stderr, "Connection refused") {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if r.Err != nil {
		t.Fatalf("iperf3 %s: %s", name, r)
	}
	run, err := parseIperf(r.Stdout)
	if err != nil {
		t.Fatalf("iperf3 %s: %v", name, err)
	}
	return run
}

func median(rs []Run) float64 {
	v := make([]float64, len(rs))
	for i, r := range rs {
		v[i] = r.BitsPerSecond
	}
	slices.Sort(v)
	return v[len(v)/2]
}

// TestThroughput measures pod-to-pod TCP throughput across the WireGuard cable and, as its anchor,
// gateway-to-gateway across the raw underlay veth the cable runs over, interleaved in one run.
func TestThroughput(t *testing.T) {
	m := harness.New(t)
	east := m.AddCluster("east", "10.1.0.0/16")
	west := m.AddCluster("west", "10.2.0.0/16")
	east.StartAgent()
	west.StartAgent()
	seen := m.WaitConnected(2*time.Minute, east, west)
	var connect time.Duration
	for _, c := range []*harness.Cluster{east, west} {
		if d := seen[c.Name].Sub(west.AgentStarted); d > connect {
			connect = d
		}
	}
	t.Logf("connected on both sides %s after the second agent started", connect.Round(time.Millisecond))

	wg := Series{Path: "pod-to-pod over the WireGuard cable", From: east.PodIP.String(), To: west.PodIP.String()}
	ul := Series{Path: "gateway-to-gateway over the raw underlay veth", From: east.GwUnderlay.String(), To: west.GwUnderlay.String()}
	for i := 0; i < reps; i++ {
		w := iperf(t, m, fmt.Sprintf("wg-%d", i), east.PodNS, west.PodNS, west.PodIP)
		u := iperf(t, m, fmt.Sprintf("ul-%d", i), east.GwNS, west.GwNS, west.GwUnderlay)
		t.Logf("rep %d: wireguard %.2f Gbit/s, underlay %.2f Gbit/s", i+1, w.BitsPerSecond/1e9, u.BitsPerSecond/1e9)
		wg.Runs = append(wg.Runs, w)
		ul.Runs = append(ul.Runs, u)
	}
	wg.MedianBps, ul.MedianBps = median(wg.Runs), median(ul.Runs)
	wg.MedianGbps, ul.MedianGbps = wg.MedianBps/1e9, ul.MedianBps/1e9
	if ul.MedianBps == 0 {
		t.Fatalf("underlay measured 0 bit/s")
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	now := time.Now().UTC()
	res := Result{
		Date: now.Format(time.RFC3339), Kernel: strings.TrimSpace(string(kernel)), CPUs: runtime.NumCPU(),
		Tool: "iperf3, one TCP stream", DurationSeconds: int(duration.Seconds()), Repetitions: reps,
		WireGuard: wg, Underlay: ul, Ratio: wg.MedianBps / ul.MedianBps,
		ConnectSeconds:       connect.Seconds(),
		ConnectNote:          "from the start of the second cluster's agent until both agents report the pair connected (WireGuard handshake done), pinging while waiting",
		WireGuardImplemented: wgImplementation(),
	}
	writeResults(t, res)
}

func wgImplementation() string {
	if _, err := os.Stat("/sys/module/wireguard"); err == nil {
		return "kernel"
	}
	return "wireguard-go in the agent (the kernel has no WireGuard module)"
}

func writeResults(t *testing.T, res Result) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# Throughput: WireGuard cable vs raw underlay (%s)\n\n", res.Date)
	fmt.Fprintf(&b, "Kernel %s, %d CPUs, %s, %ds per run, %d runs per path, interleaved. WireGuard: %s.\n\n",
		res.Kernel, res.CPUs, res.Tool, res.DurationSeconds, res.Repetitions, res.WireGuardImplemented)
	fmt.Fprintf(&b, "| path | from | to | runs (Gbit/s) | median (Gbit/s) |\n|---|---|---|---|---|\n")
	for _, s := range []Series{res.WireGuard, res.Underlay} {
		var runs []string
		for _, r := range s.Runs {
			runs = append(runs, fmt.Sprintf("%.2f", r.BitsPerSecond/1e9))
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %.2f |\n", s.Path, s.From, s.To, strings.Join(runs, ", "), s.MedianGbps)
	}
	fmt.Fprintf(&b, "\nRatio WireGuard / underlay (medians): **%.3f**\n\n", res.Ratio)
	fmt.Fprintf(&b, "Time for a new cluster to connect: **%.2fs** (%s).\n", res.ConnectSeconds, res.ConnectNote)
	benchresults.Save(t, "results", "throughput", res, b.String())
}
