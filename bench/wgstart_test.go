//go:build bench

package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// Start-up of a new WireGuard pair: how long after the second cluster's agent
// starts the first pod-to-pod ping is answered, over many fresh two-cluster meshes, without and
// with both CPUs kept busy.
//
//	CABLEMESH_WGSTART_RUNS   starts per phase (50)
//	CABLEMESH_WGSTART_LOAD   off | on | both (both): phases without and with busy loops on every CPU
//	CABLEMESH_WGSTART_DEBUG  1: agents log at debug level (wireguard-go's own log included)

// pingInterval is how often each pod pings the other while the pair comes up: the resolution of
// the measurement.
const pingInterval = 5 * time.Millisecond

// StartSample is one start of a two-cluster mesh.
type StartSample struct {
	// EastToWestMs and WestToEastMs are from the second (west) agent's start to the first echo
	// reply each way; BothMs is the later of the two: the pair carries traffic both ways.
	EastToWestMs float64 `json:"eastToWestMs"`
	WestToEastMs float64 `json:"westToEastMs"`
	BothMs       float64 `json:"bothMs"`
	// ConnectMs is from the second agent's start until the later of the two agents configured
	// the pair (their logs' first "peer configured", "peer deferred" line for the pair): agent
	// start-up and the broker. TunnelMs is BothMs - ConnectMs: what WireGuard itself took.
	ConnectMs float64 `json:"connectMs"`
	TunnelMs  float64 `json:"tunnelMs"`
	// Load1 is the 1-minute load average when the start began.
	Load1 float64 `json:"load1"`
}

// StartPhase is one series of starts.
type StartPhase struct {
	Name     string        `json:"name"`
	Load     string        `json:"load"`
	Samples  []StartSample `json:"samples"`
	MedianMs float64       `json:"medianMs"`
	P99Ms    float64       `json:"p99Ms"`
	WorstMs  float64       `json:"worstMs"`
	// The same of TunnelMs (from both ends configured to both replies).
	TunnelMedianMs float64 `json:"tunnelMedianMs"`
	TunnelP99Ms    float64 `json:"tunnelP99Ms"`
	TunnelWorstMs  float64 `json:"tunnelWorstMs"`
	// Over1s counts the starts whose pair took more than a second.
	Over1s int `json:"over1s"`
	// LoadAvg are /proc/loadavg's 1-minute figures at the phase's start and end; BusyCPU is the
	// share of all CPU time that was not idle over the phase (every process on the machine).
	LoadAvgStart float64 `json:"loadAvgStart"`
	LoadAvgEnd   float64 `json:"loadAvgEnd"`
	BusyCPU      float64 `json:"busyCPU"`
}

// StartResult is what bench/results/wgstart-<date>.json holds.
type StartResult struct {
	Date     string       `json:"date"`
	Kernel   string       `json:"kernel"`
	CPUs     int          `json:"cpus"`
	Build    string       `json:"build"`
	Metric   string       `json:"metric"`
	Command  string       `json:"command"`
	Phases   []StartPhase `json:"phases"`
	Notes    []string     `json:"notes"`
	Revision string       `json:"revision"`
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestWireGuardStart starts fresh two-cluster meshes and times, from the second agent's start,
// the first answered pod-to-pod ping each way.
func TestWireGuardStart(t *testing.T) {
	harness.RequireRoot(t)
	runs := envInt("CABLEMESH_WGSTART_RUNS", 50)
	var loads []bool
	switch os.Getenv("CABLEMESH_WGSTART_LOAD") {
	case "off":
		loads = []bool{false}
	case "on":
		loads = []bool{true}
	default:
		loads = []bool{false, true}
	}
	res := StartResult{
		Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Build: os.Getenv("CABLEMESH_WGSTART_BUILD"),
		Revision: gitRevision(),
		Metric: "from the start of the second cluster's agent (the first one up and registered) until an echo reply has " +
			"come back in both directions between the two pods (each pod pings the other every 5ms from before the start)",
		Command: "CABLEMESH_BIN=<dir> BENCH_RUN='^TestWireGuardStart$' ./bench/throughput.sh (or: go test -tags bench -run '^TestWireGuardStart$' -v -count=1 -timeout 60m ./bench/)",
	}
	for _, loaded := range loads {
		ph := StartPhase{Name: "idle", Load: "none added (other work on the machine as measured)"}
		if loaded {
			ph.Name = "busy"
			ph.Load = fmt.Sprintf("%d busy loops (sh `while :; do :; done`), one pinned to each CPU with taskset, same priority as the agents", runtime.NumCPU())
			stop := busyLoops(t)
			time.Sleep(2 * time.Second)
			defer stop()
			runPhase(t, &ph, runs)
			stop()
		} else {
			runPhase(t, &ph, runs)
		}
		res.Phases = append(res.Phases, ph)
	}
	res.Date = time.Now().UTC().Format(time.RFC3339)
	res.Notes = []string{
		"Each start is a fresh mesh: new namespaces, broker, keys and state. The first agent is started and registered with the broker before the second starts; " +
			"the second learns the first from its watch snapshot while the first learns the second from the broker's event, so both configure the peer at about the same moment.",
		"Busy CPU is the non-idle share of all CPUs over the phase from /proc/stat, including the load of other work on the machine.",
		"Tunnel part: from the later of the two agents' first Connect of the pair (agent log, millisecond resolution) to the later first reply; the rest is the agents' start-up and the broker's round trips.",
	}
	writeStartResults(t, res)
}

func runPhase(t *testing.T, ph *StartPhase, runs int) {
	t.Helper()
	ph.LoadAvgStart = loadAvg()
	idle0, total0 := cpuTimes()
	for i := 0; i < runs; i++ {
		var s StartSample
		t.Run(fmt.Sprintf("%s-%02d", ph.Name, i+1), func(t *testing.T) { s = oneStart(t) })
		if s.BothMs == 0 {
			t.Fatalf("start %d of phase %s failed", i+1, ph.Name)
		}
		ph.Samples = append(ph.Samples, s)
	}
	idle1, total1 := cpuTimes()
	ph.LoadAvgEnd = loadAvg()
	if total1 > total0 {
		ph.BusyCPU = 1 - float64(idle1-idle0)/float64(total1-total0)
	}
	var both, tunnel []float64
	for _, s := range ph.Samples {
		both = append(both, s.BothMs)
		tunnel = append(tunnel, s.TunnelMs)
		if s.BothMs > 1000 {
			ph.Over1s++
		}
	}
	slices.Sort(both)
	slices.Sort(tunnel)
	ph.MedianMs, ph.P99Ms, ph.WorstMs = percentile(both, 0.5), percentile(both, 0.99), both[len(both)-1]
	ph.TunnelMedianMs, ph.TunnelP99Ms, ph.TunnelWorstMs = percentile(tunnel, 0.5), percentile(tunnel, 0.99), tunnel[len(tunnel)-1]
	t.Logf("phase %s: median %.0fms p99 %.0fms worst %.0fms, %d of %d over 1s; tunnel part median %.0fms p99 %.0fms worst %.0fms",
		ph.Name, ph.MedianMs, ph.P99Ms, ph.WorstMs, ph.Over1s, len(both), ph.TunnelMedianMs, ph.TunnelP99Ms, ph.TunnelWorstMs)
}

// percentile is the nearest-rank percentile of sorted v.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(v)))) - 1
	return v[max(0, min(i, len(v)-1))]
}

// oneStart builds a two-cluster mesh, starts east and waits until it is registered, starts the
// pingers, starts west, and returns when both pods have had a reply.
func oneStart(t *testing.T) StartSample {
	s := StartSample{Load1: loadAvg()}
	m := harness.New(t)
	r := startPairUntilReplies(t, m, "CABLEMESH_WGSTART_DEBUG", 20*time.Millisecond)
	east, west, start, tEW, tWE := r.east, r.west, r.start, r.eastToWest, r.westToEast
	s.EastToWestMs = ms(tEW.Sub(start))
	s.WestToEastMs = ms(tWE.Sub(start))
	s.BothMs = max(s.EastToWestMs, s.WestToEastMs)
	if ce, cw := peerConfigured(east.LogPath), peerConfigured(west.LogPath); !ce.IsZero() && !cw.IsZero() {
		s.ConnectMs = ms(maxTime(ce, cw).Sub(start))
		s.TunnelMs = s.BothMs - s.ConnectMs
	}
	t.Logf("first reply east->west %.1fms, west->east %.1fms after west's agent started; pair configured on both after %.0fms, tunnel %.0fms (load %.2f)",
		s.EastToWestMs, s.WestToEastMs, s.ConnectMs, s.TunnelMs, s.Load1)
	if s.BothMs > 1000 {
		// Keep the evidence of a slow start in the test log.
		for _, c := range []*harness.Cluster{east, west} {
			t.Logf("---- slow start: %s agent log (last 60 lines):\n%s", c.Name, c.Agent.LogTail(60))
		}
	}
	return s
}

// pairRun is one start of a two-cluster mesh: the clusters, when west's agent started, and when
// each pod first had a reply from the other.
type pairRun struct {
	east, west             *harness.Cluster
	start                  time.Time
	eastToWest, westToEast time.Time
}

// startPairUntilReplies adds east and west to m, starts east and waits until it is registered,
// starts a fast pinger in each pod towards the other, starts west, and returns once both pods
// have had a reply (polling every poll). debugEnv=1 turns the agents' debug logs on.
func startPairUntilReplies(t *testing.T, m *harness.Mesh, debugEnv string, poll time.Duration) pairRun {
	t.Helper()
	east := m.AddCluster("east", "10.1.0.0/16")
	west := m.AddCluster("west", "10.2.0.0/16")
	if os.Getenv(debugEnv) == "1" {
		east.WriteConfig("logLevel: debug\n")
		west.WriteConfig("logLevel: debug\n")
	}
	east.StartAgent()
	if err := harness.WaitFor(time.Minute, 20*time.Millisecond, func() (bool, string) {
		r := m.Cablectl("cluster", "list", "-o", "json")
		return gatewayRegistered(r.Stdout, "east"), r.Stdout + r.Stderr
	}); err != nil {
		t.Fatalf("east never registered: %v\n%s", err, east.Agent.LogTail(40))
	}
	ew := startFastPinger(t, m, "ping-east-west", east.PodNS, west.PodIP)
	we := startFastPinger(t, m, "ping-west-east", west.PodNS, east.PodIP)
	time.Sleep(50 * time.Millisecond)
	west.StartAgent()
	r := pairRun{east: east, west: west, start: west.AgentStarted}
	err := harness.WaitFor(40*time.Second, poll, func() (bool, string) {
		if r.eastToWest.IsZero() {
			r.eastToWest = firstReply(ew.LogPath)
		}
		if r.westToEast.IsZero() {
			r.westToEast = firstReply(we.LogPath)
		}
		return !r.eastToWest.IsZero() && !r.westToEast.IsZero(), fmt.Sprintf("east->west %v, west->east %v", r.eastToWest, r.westToEast)
	})
	ew.Stop(5 * time.Second)
	we.Stop(5 * time.Second)
	if err != nil {
		t.Fatalf("pods never answered: %v\n%s", err, west.Agent.LogTail(40))
	}
	return r
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

var configuredRE = regexp.MustCompile(`^time=(\S+) level=INFO msg="peer (configured|deferred)`)

// peerConfigured is the time of the first "peer configured" or "peer deferred" line in an agent
// log (its wireguard driver's Connect of the pair); zero if none.
func peerConfigured(path string) time.Time {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		if mm := configuredRE.FindStringSubmatch(sc.Text()); mm != nil {
			t, err := time.Parse(time.RFC3339Nano, mm[1])
			if err == nil {
				return t
			}
		}
	}
	return time.Time{}
}

// gatewayRegistered reports whether `cablectl cluster list -o json` shows a gateway for cluster.
func gatewayRegistered(out, cluster string) bool {
	var list struct {
		Clusters []struct {
			Name     string            `json:"name"`
			Gateways []json.RawMessage `json:"gateways"`
		} `json:"clusters"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return false
	}
	for _, c := range list.Clusters {
		if c.Name == cluster && len(c.Gateways) > 0 {
			return true
		}
	}
	return false
}

// startFastPinger pings addr from ns every pingInterval, printing each reply's arrival time.
func startFastPinger(t *testing.T, m *harness.Mesh, name, ns string, addr netip.Addr) *harness.Process {
	t.Helper()
	p, err := harness.StartProcess(name, ns, filepath.Join(m.Dir, name+".log"), "ping", "-D", "-n",
		"-i", fmt.Sprintf("%.3f", pingInterval.Seconds()), "-W", "2", "-c", "12000", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop(5 * time.Second) })
	return p
}

var replyRE = regexp.MustCompile(`^\[(\d+)\.(\d+)\] \d+ bytes from`)

// firstReply is the arrival time of the first echo reply in a `ping -D` log; zero if none yet.
func firstReply(path string) time.Time {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if mm := replyRE.FindStringSubmatch(sc.Text()); mm != nil {
			sec, _ := strconv.ParseInt(mm[1], 10, 64)
			frac := mm[2]
			for len(frac) < 9 {
				frac += "0"
			}
			nsec, _ := strconv.ParseInt(frac[:9], 10, 64)
			return time.Unix(sec, nsec)
		}
	}
	return time.Time{}
}

// busyLoops keeps every CPU busy with one shell loop pinned to it; stop ends them (idempotent).
func busyLoops(t *testing.T) (stop func()) {
	t.Helper()
	dir := t.TempDir()
	var procs []*harness.Process
	for cpu := 0; cpu < runtime.NumCPU(); cpu++ {
		p, err := harness.StartProcess(fmt.Sprintf("busy-%d", cpu), "", filepath.Join(dir, fmt.Sprintf("busy-%d.log", cpu)),
			"taskset", "-c", strconv.Itoa(cpu), "sh", "-c", "while :; do :; done")
		if err != nil {
			t.Fatal(err)
		}
		procs = append(procs, p)
	}
	return func() {
		for _, p := range procs {
			p.Stop(5 * time.Second)
		}
	}
}

func loadAvg() float64 {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// cpuTimes are the idle (idle + iowait) and total jiffies of all CPUs from /proc/stat.
func cpuTimes() (idle, total uint64) {
	b, _ := os.ReadFile("/proc/stat")
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	for i, v := range f[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		total += n
		if i == 3 || i == 4 {
			idle += n
		}
	}
	return idle, total
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func gitRevision() string {
	r := harness.Run(context.Background(), "git", "describe", "--always", "--dirty")
	return strings.TrimSpace(r.Stdout)
}

func writeStartResults(t *testing.T, res StartResult) {
	t.Helper()
	r := startReport{
		Title:   fmt.Sprintf("WireGuard: a new pair's first packets (%s)", res.Date),
		Machine: fmt.Sprintf("Kernel %s, %d CPUs, wireguard-go in the agent. Build: %s (%s).", res.Kernel, res.CPUs, res.Build, res.Revision),
		Metric:  res.Metric,
		Command: res.Command,
		Table:   "| phase | load | starts | median (ms) | p99 (ms) | worst (ms) | over 1 s | tunnel part: median / p99 / worst (ms) | load avg start/end | busy CPU |\n|---|---|---|---|---|---|---|---|---|---|",
		Notes:   res.Notes,
	}
	for _, p := range res.Phases {
		r.Rows = append(r.Rows, fmt.Sprintf("| %s | %s | %d | %.0f | %.0f | %.0f | %d | %.0f / %.0f / %.0f | %.2f / %.2f | %.0f%% |", p.Name, p.Load, len(p.Samples),
			p.MedianMs, p.P99Ms, p.WorstMs, p.Over1s, p.TunnelMedianMs, p.TunnelP99Ms, p.TunnelWorstMs, p.LoadAvgStart, p.LoadAvgEnd, 100*p.BusyCPU))
	}
	for _, p := range res.Phases {
		r.Series = append(r.Series,
			startSeries{p.Name, "every start in order (ms)", formatEach(p.Samples, "%.0f", func(s StartSample) float64 { return s.BothMs })},
			startSeries{p.Name, "tunnel part of each (ms)", formatEach(p.Samples, "%.0f", func(s StartSample) float64 { return s.TunnelMs })})
	}
	writeStartReport(t, "wgstart", res, r)
}
