//go:build bench

package bench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// A new pair passes traffic at once: fresh two-cluster meshes, the second
// gateway's agent started, time until a pod-to-pod ping is answered both ways; builds side by
// side in one run, start by start. See bench/pairstart.md.
//
//	CABLEMESH_START_RUNS    starts per build (20)
//	CABLEMESH_START_BUILDS  LABEL=DIR,... directories holding cable-broker, cable-agent and
//	                        cablectl (e.g. before=/tmp/oldbin,after=bin); default: the current
//	                        build alone (CABLEMESH_BIN, or built), labelled current
//	CABLEMESH_START_DEBUG   1: agents log at debug level

// pairStartGoal is the goal for the current build on an idle machine.
const (
	pairStartGoalMedianMs = 300
	pairStartGoalWorstMs  = 500
)

// PairBuild is one build measured.
type PairBuild struct {
	Label string `json:"label"`
	Dir   string `json:"dir"`
	// Samples are in the order they ran (interleaved with the other builds').
	Samples  []PairSample `json:"samples"`
	MedianMs float64      `json:"medianMs"`
	P90Ms    float64      `json:"p90Ms"`
	WorstMs  float64      `json:"worstMs"`
	// Median of each step of the second agent's start (PairSample).
	JoinedMedianMs     float64 `json:"joinedMedianMs"`
	ReadyMedianMs      float64 `json:"readyMedianMs"`
	RegisteredMedianMs float64 `json:"registeredMedianMs"`
	ConnectMedianMs    float64 `json:"connectMedianMs"`
}

// PairSample is one start. Every time is from the second (west) agent's process start.
type PairSample struct {
	// BothMs: an echo reply has come back both ways between the two pods.
	BothMs float64 `json:"bothMs"`
	// JoinedMs: west's agent holds its certificate ("joined the broker" in its log).
	JoinedMs float64 `json:"joinedMs"`
	// ReadyMs: west's agent has its drivers, datapath and status socket up and dials the broker
	// ("agent ready").
	ReadyMs float64 `json:"readyMs"`
	// RegisteredMs: west's endpoint is registered ("endpoint registered").
	RegisteredMs float64 `json:"registeredMs"`
	// ConnectMs: both agents configured the pair (the later first "peer configured/deferred").
	ConnectMs float64 `json:"connectMs"`
	Load1     float64 `json:"load1"`
}

// PairStartResult is what bench/results/pairstart-<date>.json holds.
type PairStartResult struct {
	Date     string      `json:"date"`
	Kernel   string      `json:"kernel"`
	CPUs     int         `json:"cpus"`
	Revision string      `json:"revision"`
	Metric   string      `json:"metric"`
	Command  string      `json:"command"`
	Builds   []PairBuild `json:"builds"`
	// LoadAvg is /proc/loadavg's 1, 5 and 15-minute figures at the start and at the end.
	LoadAvgStart string   `json:"loadAvgStart"`
	LoadAvgEnd   string   `json:"loadAvgEnd"`
	Notes        []string `json:"notes"`
}

// TestPairStart starts fresh two-cluster meshes with each build in turn and times the second
// agent's start to a ping answered both ways.
func TestPairStart(t *testing.T) {
	harness.RequireRoot(t)
	builds, err := pairBuilds(t, os.Getenv("CABLEMESH_START_BUILDS"))
	if err != nil {
		t.Fatal(err)
	}
	runs := envInt("CABLEMESH_START_RUNS", 20)
	res := PairStartResult{
		Kernel: kernelRelease(), CPUs: runtime.NumCPU(), Revision: gitRevision(), LoadAvgStart: loadAvgLine(),
		Metric: "from the start of the second cluster's agent (the first one up and registered) until an echo reply has " +
			"come back in both directions between the two pods (each pod pings the other every 5ms from before the start)",
		Command: "make bench-start (or: CABLEMESH_START_BUILDS=before=/tmp/oldbin,after=$PWD/bin go test -tags bench -run '^TestPairStart$' -v -count=1 -timeout 30m ./bench/)",
	}
	for i := range runs {
		// Alternate which build goes first, so neither always starts on the other's leftovers.
		order := slices.Clone(builds)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, b := range order {
			var s PairSample
			t.Run(fmt.Sprintf("%s-%02d", b.Label, i+1), func(t *testing.T) { s = onePairStart(t, b.bins) })
			if s.BothMs == 0 {
				t.Fatalf("start %d of build %s failed", i+1, b.Label)
			}
			b.res.Samples = append(b.res.Samples, s)
		}
	}
	res.LoadAvgEnd = loadAvgLine()
	for _, b := range builds {
		summarizePairBuild(&b.res)
		t.Logf("%s: median %.0fms p90 %.0fms worst %.0fms; steps (median): joined %.0fms, ready %.0fms, registered %.0fms, pair configured %.0fms",
			b.Label, b.res.MedianMs, b.res.P90Ms, b.res.WorstMs, b.res.JoinedMedianMs, b.res.ReadyMedianMs, b.res.RegisteredMedianMs, b.res.ConnectMedianMs)
		res.Builds = append(res.Builds, b.res)
	}
	res.Date = time.Now().UTC().Format(time.RFC3339)
	res.Notes = []string{
		"Each start is a fresh mesh of the build's own broker and agents: new namespaces, keys and state. The first agent is started and registered before the second starts.",
		"Priority: " + processPriority() + ".",
		"The builds run interleaved, start by start, alternating which goes first, so both see the same machine; the load average beside the figures is the machine's (other work included).",
		fmt.Sprintf("Goal for the current build on an idle machine: median under %d ms, worst under %d ms.", pairStartGoalMedianMs, pairStartGoalWorstMs),
	}
	writePairStartResults(t, res)
}

type pairBuild struct {
	Label string
	bins  harness.Binaries
	res   PairBuild
}

// pairBuilds parses LABEL=DIR,...; empty means the current build alone.
func pairBuilds(t *testing.T, spec string) ([]*pairBuild, error) {
	cur, err := harness.Build(t.Context())
	if err != nil {
		return nil, err
	}
	if strings.TrimSpace(spec) == "" {
		return []*pairBuild{{Label: "current", bins: cur, res: PairBuild{Label: "current", Dir: filepath.Dir(cur.Agent)}}}, nil
	}
	var out []*pairBuild
	for _, item := range strings.Split(spec, ",") {
		label, dir, ok := strings.Cut(strings.TrimSpace(item), "=")
		if !ok || label == "" || dir == "" {
			return nil, fmt.Errorf("CABLEMESH_START_BUILDS: %q is not LABEL=DIR", item)
		}
		b := cur // tcpcheck, unused here, from the current build
		for _, x := range []struct {
			name string
			dst  *string
		}{{"cable-broker", &b.Broker}, {"cable-agent", &b.Agent}, {"cablectl", &b.Cablectl}} {
			p := filepath.Join(dir, x.name)
			if st, err := os.Stat(p); err != nil || st.Mode()&0o111 == 0 {
				return nil, fmt.Errorf("CABLEMESH_START_BUILDS: build %s: no executable %s in %s", label, x.name, dir)
			}
			*x.dst = p
		}
		out = append(out, &pairBuild{Label: label, bins: b, res: PairBuild{Label: label, Dir: dir}})
	}
	return out, nil
}

// onePairStart is oneStart (wgstart_test.go) with the given build, and the steps of west's
// start read from its log.
func onePairStart(t *testing.T, bins harness.Binaries) PairSample {
	s := PairSample{Load1: loadAvg()}
	m := harness.NewWithBinaries(t, bins)
	r := startPairUntilReplies(t, m, "CABLEMESH_START_DEBUG", 10*time.Millisecond)
	east, west, start, tEW, tWE := r.east, r.west, r.start, r.eastToWest, r.westToEast
	s.BothMs = ms(maxTime(tEW, tWE).Sub(start))
	if tm := logLineTime(west.LogPath, "joined the broker"); !tm.IsZero() {
		s.JoinedMs = ms(tm.Sub(start))
	}
	if tm := logLineTime(west.LogPath, "agent ready"); !tm.IsZero() {
		s.ReadyMs = ms(tm.Sub(start))
	}
	if tm := logLineTime(west.LogPath, "endpoint registered"); !tm.IsZero() {
		s.RegisteredMs = ms(tm.Sub(start))
	}
	if ce, cw := peerConfigured(east.LogPath), peerConfigured(west.LogPath); !ce.IsZero() && !cw.IsZero() {
		s.ConnectMs = ms(maxTime(ce, cw).Sub(start))
	}
	t.Logf("both ways after %.0fms; west joined %.0fms, ready %.0fms, registered %.0fms, pair configured on both %.0fms (load %.2f)",
		s.BothMs, s.JoinedMs, s.ReadyMs, s.RegisteredMs, s.ConnectMs, s.Load1)
	if s.BothMs > pairStartGoalWorstMs {
		for _, c := range []*harness.Cluster{east, west} {
			t.Logf("---- slow start: %s agent log (last 40 lines):\n%s", c.Name, c.Agent.LogTail(40))
		}
	}
	return s
}

var logTimeRE = regexp.MustCompile(`^time=(\S+) `)

// logLineTime is the time of the first line of an agent log whose message starts with msg; zero
// if none.
func logLineTime(path, msg string) time.Time {
	f, err := os.Open(path)
	if err != nil {
		return time.Time{}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, ` msg="`+msg) {
			continue
		}
		if mm := logTimeRE.FindStringSubmatch(line); mm != nil {
			if t, err := time.Parse(time.RFC3339Nano, mm[1]); err == nil {
				return t
			}
		}
	}
	return time.Time{}
}

func summarizePairBuild(b *PairBuild) {
	var both, joined, ready, reg, conn []float64
	for _, s := range b.Samples {
		both = append(both, s.BothMs)
		joined = append(joined, s.JoinedMs)
		ready = append(ready, s.ReadyMs)
		reg = append(reg, s.RegisteredMs)
		conn = append(conn, s.ConnectMs)
	}
	for _, v := range [][]float64{both, joined, ready, reg, conn} {
		slices.Sort(v)
	}
	b.MedianMs, b.P90Ms, b.WorstMs = percentile(both, 0.5), percentile(both, 0.9), both[len(both)-1]
	b.JoinedMedianMs, b.ReadyMedianMs = percentile(joined, 0.5), percentile(ready, 0.5)
	b.RegisteredMedianMs, b.ConnectMedianMs = percentile(reg, 0.5), percentile(conn, 0.5)
}

func loadAvgLine() string {
	b, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

func writePairStartResults(t *testing.T, res PairStartResult) {
	t.Helper()
	r := startReport{
		Title: fmt.Sprintf("A new pair's first packets, builds side by side (%s)", res.Date),
		Machine: fmt.Sprintf("Kernel %s, %d CPUs, revision %s. Load average (1/5/15 min) %s at the start, %s at the end.",
			res.Kernel, res.CPUs, res.Revision, res.LoadAvgStart, res.LoadAvgEnd),
		Metric:  res.Metric,
		Command: res.Command,
		Table:   "| build | starts | median (ms) | p90 (ms) | worst (ms) | steps, median (ms): joined / agent ready / registered / pair configured | dir |\n|---|---|---|---|---|---|---|",
		Notes:   res.Notes,
	}
	for _, p := range res.Builds {
		r.Rows = append(r.Rows, fmt.Sprintf("| %s | %d | %.0f | %.0f | %.0f | %.0f / %.0f / %.0f / %.0f | `%s` |", p.Label, len(p.Samples),
			p.MedianMs, p.P90Ms, p.WorstMs, p.JoinedMedianMs, p.ReadyMedianMs, p.RegisteredMedianMs, p.ConnectMedianMs, p.Dir))
	}
	for _, p := range res.Builds {
		r.Series = append(r.Series,
			startSeries{p.Label, "every start in order (ms)", formatEach(p.Samples, "%.0f", func(s PairSample) float64 { return s.BothMs })},
			startSeries{p.Label, "1-minute load average at each start", formatEach(p.Samples, "%.1f", func(s PairSample) float64 { return s.Load1 })})
	}
	writeStartReport(t, "pairstart", res, r)
}

// processPriority says the nice value this bench (and so every process it starts) runs at: a
// run under `nice -n -10` on a shared machine keeps the other work from preempting the mesh.
func processPriority() string {
	b, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return "unknown"
	}
	// Field 19 is the nice value; the command (field 2) may hold spaces, so count from its ')'.
	_, rest, ok := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if !ok || len(f) < 17 {
		return "unknown"
	}
	return "nice " + f[16]
}
