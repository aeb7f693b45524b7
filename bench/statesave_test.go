//go:build bench

package bench

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/benchresults"
)

// The state-save benchmark: the agent's copy of a large mesh's broker state (clusters x gateways,
// default 255 x 20 = 5,100 gateway endpoints) receives K one-endpoint deltas per second, as a
// watch delivers them, and each is applied the way the agent applies it (clone, apply) and then
// persisted by one of three paths, each replaying the same deltas in the same run:
//   - none: no save at all (the anchor: what applying alone costs);
//   - per-delta: State.Save after every delta (temp file, fsync, rename), the agent before the
//     Saver;
//   - coalesced: brokerstate.Saver.Update after every delta (at most one write per second, and
//     the last state written at Close).
//
// Per path: the bytes and files written (each file one fsync), the bytes the kernel counted as
// written by this process (/proc/self/io write_bytes), the process CPU time (user + system, over
// the replay and the final Close) per delta, and the time the caller spent saving per delta.
//
//	go test -tags bench -run '^TestStateSave$' -v -count=1 ./bench/
//
// Knobs: CABLEMESH_STATESAVE_CLUSTERS (255), _GATEWAYS per cluster (20), _RATES deltas per
// second, comma-separated (2,10), _SECONDS per path and rate (10), _DIR where the state file is
// written (the system temp dir; put it on the disk the agent's state dir is on).

type stateSaveRun struct {
	Path           string  `json:"path"`
	Rate           int     `json:"ratePerSecond"`
	Deltas         int     `json:"deltas"`
	WallSeconds    float64 `json:"wallSeconds"`
	Files          uint64  `json:"filesWritten"` // each one fsync
	Bytes          uint64  `json:"bytesWritten"`
	DiskBytes      uint64  `json:"kernelWriteBytes"`
	CPUMs          float64 `json:"cpuMs"`
	CPUPerDeltaMs  float64 `json:"cpuPerDeltaMs"`
	SaveMeanMs     float64 `json:"saveMeanMsPerDelta"`
	SaveP99Ms      float64 `json:"saveP99MsPerDelta"`
	CloseMs        float64 `json:"closeMs"`
	LastRevisionOK bool    `json:"lastRevisionOnDisk"`
}

type stateSaveResult struct {
	Date         string         `json:"date"`
	Kernel       string         `json:"kernel"`
	CPUs         int            `json:"cpus"`
	Revision     string         `json:"revision"`
	Command      string         `json:"command"`
	Clusters     int            `json:"clusters"`
	Gateways     int            `json:"gateways"`
	FileBytes    int64          `json:"stateFileBytes"`
	Dir          string         `json:"dir"`
	LoadAvgStart string         `json:"loadAvgStart"`
	LoadAvgEnd   string         `json:"loadAvgEnd"`
	Runs         []stateSaveRun `json:"runs"`
}

func TestStateSave(t *testing.T) {
	clusters := benchresults.EnvInt("CABLEMESH_STATESAVE_CLUSTERS", 255)
	perCluster := benchresults.EnvInt("CABLEMESH_STATESAVE_GATEWAYS", 20)
	seconds := benchresults.EnvInt("CABLEMESH_STATESAVE_SECONDS", 10)
	rates, err := parseRates(os.Getenv("CABLEMESH_STATESAVE_RATES"))
	if err != nil {
		t.Fatal(err)
	}
	base := largeState(t, clusters, perCluster)
	res := stateSaveResult{
		Date: time.Now().UTC().Format(time.RFC3339), Kernel: benchresults.FirstLine("uname", "-r"), CPUs: runtime.NumCPU(),
		Revision: benchresults.FirstLine("git", "rev-parse", "--short", "HEAD"), Clusters: clusters, Gateways: clusters * perCluster,
		Command:      "go test -tags bench -run '^TestStateSave$' -v -count=1 ./bench/",
		LoadAvgStart: benchresults.LoadAvg(),
	}
	paths := []string{"none", "per-delta", "coalesced"}
	for i, rate := range rates {
		n := rate * seconds
		deltas := endpointDeltas(base, n)
		order := slices.Clone(paths)
		if i%2 == 1 {
			slices.Reverse(order)
		}
		for _, p := range order {
			dir, err := os.MkdirTemp(os.Getenv("CABLEMESH_STATESAVE_DIR"), "statesave-")
			if err != nil {
				t.Fatal(err)
			}
			res.Dir = filepath.Dir(dir)
			run := replayDeltas(t, p, dir, base, deltas, rate)
			if fi, err := os.Stat(filepath.Join(dir, brokerstate.FileName)); err == nil {
				res.FileBytes = fi.Size()
			}
			os.RemoveAll(dir)
			t.Logf("%s at %d/s: %d deltas, %d files, %d bytes, %.2f ms CPU per delta, save %.3f ms mean per delta",
				p, rate, run.Deltas, run.Files, run.Bytes, run.CPUPerDeltaMs, run.SaveMeanMs)
			res.Runs = append(res.Runs, run)
		}
	}
	res.LoadAvgEnd = benchresults.LoadAvg()
	for _, r := range res.Runs {
		if r.Path != "none" && !r.LastRevisionOK {
			t.Errorf("%s at %d/s: the file does not hold the last delta's revision", r.Path, r.Rate)
		}
	}
	benchresults.Save(t, "results", "statesave", res, stateSaveMarkdown(res))
}

func parseRates(s string) ([]int, error) {
	if s == "" {
		return []int{2, 10}, nil
	}
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("CABLEMESH_STATESAVE_RATES: %q is not a positive number of deltas per second", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// largeState is the agent's state of a mesh of clusters x perCluster gateways, the records
// filled as the broker fills them (a WireGuard key each, a pair PSK per cluster).
func largeState(t *testing.T, clusters, perCluster int) *brokerstate.State {
	t.Helper()
	resp := &apiv1.WatchResponse{Snapshot: true, Revision: 1_000_000}
	for c := range clusters {
		psk := make([]byte, 32)
		_, _ = rand.Read(psk)
		cl := &apiv1.Cluster{Name: fmt.Sprintf("c%03d", c), Id: uint32(c + 1), PodCidrs: []string{fmt.Sprintf("10.%d.0.0/16", c)},
			ServiceCidrs: []string{fmt.Sprintf("172.%d.%d.0/24", 16+c/256, c%256)}, PairPsk: psk, Revision: uint64(c + 1)}
		resp.Events = append(resp.Events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: "cluster", Key: cl.Name, Revision: cl.Revision,
			Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: cl}}})
		for g := range perCluster {
			ep := gatewayEndpoint(c, g, uint64(1000+c*perCluster+g))
			resp.Events = append(resp.Events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: "endpoint", Key: ep.Cluster + "/" + ep.Node, Revision: ep.Revision,
				Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: ep}}})
		}
	}
	st := brokerstate.New()
	if err := st.Apply(resp); err != nil {
		t.Fatal(err)
	}
	return st
}

func gatewayEndpoint(c, g int, rev uint64) *apiv1.Endpoint {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	i := c*20 + g
	ep := &apiv1.Endpoint{Cluster: fmt.Sprintf("c%03d", c), Node: fmt.Sprintf("gw%02d", g), PrivateIp: fmt.Sprintf("100.64.%d.%d", i/250, i%250+1),
		Subnets: []string{fmt.Sprintf("10.%d.0.0/17", c), fmt.Sprintf("10.%d.128.0/17", c)}, Drivers: []string{"wireguard"},
		CablePorts: map[string]uint32{"wireguard": 51820}, HealthCheckIp: fmt.Sprintf("10.%d.0.1", c), Revision: rev,
		LeaseSeconds: 30, LeaseExpires: timestamppb.New(time.Unix(1_800_000_000+int64(rev), 0))}
	ep.SetAttributes("wireguard", map[string]string{"publicKey": base64.StdEncoding.EncodeToString(key)})
	return ep
}

// endpointDeltas are n watch messages of one endpoint each (a gateway re-registered with a new
// key), round the mesh's gateways, at increasing revisions.
func endpointDeltas(base *brokerstate.State, n int) []*apiv1.WatchResponse {
	keys := slices.Sorted(func(yield func(string) bool) {
		for k := range base.Endpoints {
			if !yield(k) {
				return
			}
		}
	})
	out := make([]*apiv1.WatchResponse, n)
	for i := range n {
		old := base.Endpoints[keys[i%len(keys)]]
		var c, g int
		fmt.Sscanf(old.GetCluster()+" "+old.GetNode(), "c%d gw%d", &c, &g)
		rev := base.Revision + uint64(i) + 1
		ep := gatewayEndpoint(c, g, rev)
		out[i] = &apiv1.WatchResponse{Revision: rev, Events: []*apiv1.Event{{Type: apiv1.Event_UPSERT, Kind: "endpoint",
			Key: ep.Cluster + "/" + ep.Node, Revision: rev, Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: ep}}}}}
	}
	return out
}

// replayDeltas applies the deltas to a copy of base at rate per second, as the agent's apply does
// (clone the state, apply the message to the clone), and saves each new state by path.
func replayDeltas(t *testing.T, path, dir string, base *brokerstate.State, deltas []*apiv1.WatchResponse, rate int) stateSaveRun {
	t.Helper()
	run := stateSaveRun{Path: path, Rate: rate, Deltas: len(deltas)}
	saver := brokerstate.NewSaver(dir, brokerstate.DefaultSaveInterval, slog.Default())
	var files, bytes uint64
	save := func(st *brokerstate.State) {
		switch path {
		case "per-delta":
			if err := st.Save(dir, time.Now()); err != nil {
				t.Fatal(err)
			}
			fi, err := os.Stat(filepath.Join(dir, brokerstate.FileName))
			if err != nil {
				t.Fatal(err)
			}
			files++
			bytes += uint64(fi.Size())
		case "coalesced":
			saver.Update(st)
		}
	}
	cur := base.Clone()
	period := time.Second / time.Duration(rate)
	saveTimes := make([]float64, 0, len(deltas))
	runtime.GC()
	cpu0, io0, start := processCPU(), processWriteBytes(), time.Now()
	for i, d := range deltas {
		if wait := time.Until(start.Add(time.Duration(i) * period)); wait > 0 {
			time.Sleep(wait)
		}
		next := cur.Clone()
		if err := next.Apply(d); err != nil {
			t.Fatal(err)
		}
		cur = next
		t0 := time.Now()
		save(next)
		saveTimes = append(saveTimes, float64(time.Since(t0))/float64(time.Millisecond))
	}
	t0 := time.Now()
	if err := saver.Close(); err != nil {
		t.Fatal(err)
	}
	run.CloseMs = float64(time.Since(t0)) / float64(time.Millisecond)
	run.WallSeconds = time.Since(start).Seconds()
	run.CPUMs = float64(processCPU()-cpu0) / float64(time.Millisecond)
	run.DiskBytes = processWriteBytes() - io0
	if path == "coalesced" {
		st := saver.Stats()
		files, bytes = st.Writes, st.Bytes
	}
	run.Files, run.Bytes = files, bytes
	run.CPUPerDeltaMs = run.CPUMs / float64(len(deltas))
	var sum float64
	for _, v := range saveTimes {
		sum += v
	}
	run.SaveMeanMs = sum / float64(len(saveTimes))
	slices.Sort(saveTimes)
	run.SaveP99Ms = saveTimes[min(len(saveTimes)-1, len(saveTimes)*99/100)]
	if st, err := brokerstate.Load(dir); err == nil && st != nil {
		run.LastRevisionOK = st.Revision == cur.Revision
	}
	return run
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// processWriteBytes is what the kernel counts this process as having caused to be written to
// storage (0 where /proc/self/io is not readable).
func processWriteBytes() uint64 {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes: "); ok {
			n, _ := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

func stateSaveMarkdown(res stateSaveResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Saving the agent's broker state, per delta and coalesced (%s)\n\n", res.Date)
	fmt.Fprintf(&b, "Kernel %s, %d CPUs, revision %s. Load average (1/5/15 min) %s at the start, %s at the end.\n\n", res.Kernel, res.CPUs, res.Revision, res.LoadAvgStart, res.LoadAvgEnd)
	fmt.Fprintf(&b, "%d clusters, %d gateways: a state file of %d bytes, written under %s.\n\nCommand: `%s`\n\n", res.Clusters, res.Gateways, res.FileBytes, res.Dir, res.Command)
	b.WriteString("| path | deltas/s | deltas | files (fsyncs) | bytes written | bytes/delta | kernel write_bytes | CPU ms/delta | save ms/delta mean | p99 | Close ms | wall s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range res.Runs {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %.0f | %d | %.2f | %.3f | %.3f | %.1f | %.1f |\n", r.Path, r.Rate, r.Deltas, r.Files, r.Bytes,
			float64(r.Bytes)/float64(r.Deltas), r.DiskBytes, r.CPUPerDeltaMs, r.SaveMeanMs, r.SaveP99Ms, r.CloseMs, r.WallSeconds)
	}
	b.WriteString("\nnone is the anchor: the clone and apply every path does. CPU is the whole process's (user + system), so the saver's own goroutine is counted.\n")
	return b.String()
}
