//go:build bench

package scale

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
	"github.com/cablemesh/cablemesh/cablectl"
	"github.com/cablemesh/cablemesh/internal/benchresults"
)

// Result is one run: one broker build, one store, one fleet size.
type Result struct {
	Label    string `json:"label"`
	Broker   string `json:"broker"`
	Agent    string `json:"agent"` // current, noreports, delayed, uncompressed or fixed (doc.go)
	Store    string `json:"store"`
	Clusters int    `json:"clusters"`
	Gateways int    `json:"gateways"`
	Agents   int    `json:"agents"`

	// Join: every agent joins at once with its cluster's token (a fresh fleet).
	JoinWallMs float64 `json:"joinWallMs"`
	JoinP50Ms  float64 `json:"joinP50Ms"`
	JoinP99Ms  float64 `json:"joinP99Ms"`
	JoinMaxMs  float64 `json:"joinMaxMs"`
	JoinErrors int64   `json:"joinErrors"`

	// Fleet start: every joined agent dials, watches and registers at once (t0); an agent is
	// current when it holds every endpoint and every cluster of the mesh.
	StartCurrentMs    float64 `json:"startCurrentMs"` // t0 → the last agent current
	StartCurrentP50Ms float64 `json:"startCurrentP50Ms"`
	StartCurrentP99Ms float64 `json:"startCurrentP99Ms"`
	StartNotCurrent   int     `json:"startNotCurrent"` // agents not current when the wait ended
	FirstRegP50Ms     float64 `json:"firstRegisterP50Ms"`
	FirstRegP99Ms     float64 `json:"firstRegisterP99Ms"`
	FirstRegMaxMs     float64 `json:"firstRegisterMaxMs"`
	FirstRegFailed    int     `json:"firstRegisterFailed"`
	// RegisteredP50Ms, ...: from the fleet start to each agent's first registration that
	// succeeded (its first-registration delay and any busy answers included).
	RegisteredP50Ms float64 `json:"registeredP50Ms"`
	RegisteredP99Ms float64 `json:"registeredP99Ms"`
	RegisteredMaxMs float64 `json:"registeredMaxMs"`

	// The first snapshot each agent received: bytes and time from opening the stream to its
	// last part.
	SnapshotBytesP50 int64   `json:"snapshotBytesP50"`
	SnapshotBytesMax int64   `json:"snapshotBytesMax"`
	SnapshotP50Ms    float64 `json:"snapshotP50Ms"`
	SnapshotP99Ms    float64 `json:"snapshotP99Ms"`
	SnapshotMaxMs    float64 `json:"snapshotMaxMs"`

	// Steady state: heartbeats per second (the most in one second after the first interval) and
	// their latency.
	HeartbeatsMaxPerSecond int     `json:"heartbeatsMaxPerSecond"`
	HeartbeatP99Ms         float64 `json:"heartbeatP99Ms"`
	HeartbeatMaxMs         float64 `json:"heartbeatMaxMs"`

	// Change propagation: from the write's call to each agent receiving it, over all
	// agents and changes.
	PolicyChangeP50Ms   float64 `json:"policyChangeP50Ms"`
	PolicyChangeP99Ms   float64 `json:"policyChangeP99Ms"`
	PolicyChangeMaxMs   float64 `json:"policyChangeMaxMs"`
	EndpointChangeP50Ms float64 `json:"endpointChangeP50Ms"`
	EndpointChangeP99Ms float64 `json:"endpointChangeP99Ms"`
	EndpointChangeMaxMs float64 `json:"endpointChangeMaxMs"`
	ChangesMissed       int     `json:"changesMissed"` // agent × change never received

	// Restart: the broker is stopped (SIGTERM) and started again; from the new process's start
	// to each agent's first message on its new stream.
	RestartDownMs       float64 `json:"restartDownMs"` // SIGTERM → new process serving
	ResumeP50Ms         float64 `json:"resumeP50Ms"`
	ResumeP99Ms         float64 `json:"resumeP99Ms"`
	ResumeMaxMs         float64 `json:"resumeMaxMs"`
	ResumeSnapshots     int     `json:"resumeSnapshots"` // resumed with a fresh snapshot, not deltas
	ResumeMissing       int     `json:"resumeMissing"`
	AfterRestartCurrent int     `json:"afterRestartCurrent"` // agents holding every endpoint after the restart

	// cablectl links --all after the steady state (agents that report): its time, the pairs it
	// listed and those both ends agree on (every pair, when every agent reported).
	LinksAllMs    float64 `json:"linksAllMs,omitempty"`
	LinksAllPairs int     `json:"linksAllPairs,omitempty"`
	LinksAllAgree int     `json:"linksAllAgree,omitempty"`

	// The calls of the whole run.
	Calls map[string]int64 `json:"calls"`

	// The broker process: peak RSS (sampled every 100 ms, and VmHWM) and CPU seconds per phase.
	PeakRSSMB      float64            `json:"peakRSSMB"`
	StartPeakRSSMB float64            `json:"startPeakRSSMB"`
	CPUSeconds     map[string]float64 `json:"cpuSeconds"`
	// IOMB is what the broker read and wrote through system calls (/proc/PID/io), in MB, per
	// phase: "startRead", "startWrite" (the fleet start), "steadyRead", "steadyWrite".
	IOMB         map[string]float64 `json:"ioMB"`
	LoadAvgStart float64            `json:"loadAvgStart"`
	// LoadAvgAfterStart is the 1-minute load average once the fleet is current: it covers the
	// fleet start (this bench's own load included), which the load at the start does not.
	LoadAvgAfterStart float64  `json:"loadAvgAfterStart"`
	Notes             []string `json:"notes,omitempty"`
}

// Results is what bench/results/scale-<time>.json holds.
type Results struct {
	Date    string   `json:"date"`
	Kernel  string   `json:"kernel"`
	CPUs    int      `json:"cpus"`
	Command string   `json:"command"`
	Runs    []Result `json:"runs"`
}

type brokerBuild struct{ label, path, agent string }

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func envInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		t.Fatalf("%s=%q: want a whole number >= 0", name, v)
	}
	return n
}

// builds parses CABLEMESH_SCALE_BROKER: label=path[@agent],... or one path.
func builds(t *testing.T) []brokerBuild {
	agent := env("CABLEMESH_SCALE_AGENT", "current")
	spec := os.Getenv("CABLEMESH_SCALE_BROKER")
	if spec == "" {
		bin := os.Getenv("CABLEMESH_BIN")
		if bin == "" {
			bin = t.TempDir()
			cmd := exec.Command("go", "build", "-o", bin+"/", "../../cmd/cable-broker")
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("build cable-broker: %v\n%s", err, out)
			}
		}
		return []brokerBuild{{label: env("CABLEMESH_SCALE_LABEL", "current"), path: filepath.Join(bin, "cable-broker"), agent: agent}}
	}
	var out []brokerBuild
	for _, e := range strings.Split(spec, ",") {
		b := brokerBuild{label: env("CABLEMESH_SCALE_LABEL", "current"), agent: agent}
		if l, p, ok := strings.Cut(e, "="); ok {
			b.label, e = l, p
		}
		if p, a, ok := strings.Cut(e, "@"); ok {
			e, b.agent = p, a
		}
		b.path = e
		if !slices.Contains([]string{"current", "noreports", "delayed", "uncompressed", "fixed"}, b.agent) {
			t.Fatalf("CABLEMESH_SCALE_BROKER entry %q: agent %q is not current, noreports, delayed, uncompressed nor fixed", e, b.agent)
		}
		if _, err := os.Stat(b.path); err != nil {
			t.Fatalf("CABLEMESH_SCALE_BROKER entry %q: %v", e, err)
		}
		out = append(out, b)
	}
	return out
}

// TestScale runs the fleet against every broker build, store and fleet size asked for and
// writes the results. It asserts only what makes the figures meaningless when it fails (the
// fleet joined, every change was applied); the goals are reported, not asserted.
func TestScale(t *testing.T) {
	// The simulated fleet collects its garbage less often than Go's default: its GC is a cost of
	// the simulation (5,000 agents in one process, sharing the CPUs with the broker), not of the
	// broker, whose own GC is as an operator runs it.
	defer debug.SetGCPercent(debug.SetGCPercent(envInt(t, "CABLEMESH_SCALE_GOGC", 400)))
	var fleets [][2]int
	for _, f := range strings.Split(env("CABLEMESH_SCALE_FLEETS", "100x10,255x20"), ",") {
		c, g, ok := strings.Cut(f, "x")
		nc, err1 := strconv.Atoi(c)
		ng, err2 := strconv.Atoi(g)
		if !ok || err1 != nil || err2 != nil || nc < 1 || nc > 255 || ng < 1 || ng > 250 {
			t.Fatalf("CABLEMESH_SCALE_FLEETS entry %q: want CLUSTERSxGATEWAYS, 1..255 x 1..250", f)
		}
		fleets = append(fleets, [2]int{nc, ng})
	}
	stores := strings.Split(env("CABLEMESH_SCALE_STORES", "bolt,etcd"), ",")
	for _, s := range stores {
		if s != "bolt" && s != "etcd" {
			t.Fatalf("CABLEMESH_SCALE_STORES entry %q: want bolt or etcd", s)
		}
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err == nil && lim.Cur < lim.Max {
		lim.Cur = lim.Max
		_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim)
	}
	res := Results{Date: time.Now().UTC().Format(time.RFC3339), CPUs: runtime.NumCPU(), Kernel: kernel(),
		Command: "CABLEMESH_SCALE_FLEETS=" + env("CABLEMESH_SCALE_FLEETS", "100x10,255x20") + " CABLEMESH_SCALE_STORES=" + strings.Join(stores, ",") +
			" CABLEMESH_SCALE_BROKER=" + os.Getenv("CABLEMESH_SCALE_BROKER") + " go test -tags bench -run '^TestScale$' ./bench/scale/"}
	for _, fl := range fleets {
		for _, st := range stores {
			for _, b := range builds(t) {
				name := fmt.Sprintf("%s/%s/%dx%d", b.label, st, fl[0], fl[1])
				t.Run(name, func(t *testing.T) {
					r := runOne(t, b, st, fl[0], fl[1])
					res.Runs = append(res.Runs, r)
					t.Logf("%s: %s", name, summary(r))
				})
			}
		}
	}
	writeResults(t, res)
}

func summary(r Result) string {
	return fmt.Sprintf("join %.0f ms; current %.0f ms (p99 %.0f, %d not); first register p99 %.0f ms, %d failed; snapshot %d B p99 %.0f ms; "+
		"heartbeats max %d/s; policy p99 %.0f ms, endpoint p99 %.0f ms, missed %d; resume p99 %.0f ms max %.0f ms; RSS peak %.0f MB",
		r.JoinWallMs, r.StartCurrentMs, r.StartCurrentP99Ms, r.StartNotCurrent, r.FirstRegP99Ms, r.FirstRegFailed, r.SnapshotBytesP50, r.SnapshotP99Ms,
		r.HeartbeatsMaxPerSecond, r.PolicyChangeP99Ms, r.EndpointChangeP99Ms, r.ChangesMissed, r.ResumeP99Ms, r.ResumeMaxMs, r.PeakRSSMB)
}

// brokerProc is one cable-broker process and its sampled RSS.
type brokerProc struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	peak int64 // kB, since the last resetPeak
	all  int64 // kB, whole life
	stop chan struct{}
}

func startBroker(t *testing.T, bin, dataDir, listen string, etcd []string, logPath string) *brokerProc {
	t.Helper()
	args := []string{"--data-dir", dataDir, "--listen", listen}
	if len(etcd) > 0 {
		args = append(args, "--etcd-endpoints", strings.Join(etcd, ","))
	}
	args = append(args, strings.Fields(os.Getenv("CABLEMESH_SCALE_BROKER_ARGS"))...)
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	p := &brokerProc{cmd: cmd, done: make(chan struct{}), stop: make(chan struct{})}
	go func() {
		cmd.Wait()
		logf.Close()
		close(p.done)
	}()
	go p.sample()
	return p
}

func (p *brokerProc) sample() {
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-tk.C:
		}
		rss, hwm := procStatus(p.cmd.Process.Pid)
		p.mu.Lock()
		p.peak = max(p.peak, rss)
		p.all = max(p.all, rss, hwm)
		p.mu.Unlock()
	}
}

func (p *brokerProc) takePeak() (phase, all int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	phase, all = p.peak, p.all
	p.peak = 0
	return
}

// cpu is the process's user+system CPU seconds so far.
func (p *brokerProc) cpu() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	sy, _ := strconv.ParseFloat(f[12], 64)
	return (u + sy) / 100 // USER_HZ
}

// io is the bytes the process read and wrote through system calls so far (/proc/PID/io rchar
// and wchar): its network traffic and its file writes (bbolt reads through mmap, not counted).
func (p *brokerProc) io() (read, written int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", p.cmd.Process.Pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(l, ":")
		n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		switch k {
		case "rchar":
			read = n
		case "wchar":
			written = n
		}
	}
	return read, written
}

// terminate stops the broker with SIGTERM (SIGKILL after 10 s) and waits for it.
func (p *brokerProc) terminate() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func procStatus(pid int) (rss, hwm int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v
		case "VmHWM:":
			hwm = v
		}
	}
	return
}

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// waitAdmin waits for the broker to write admin.yaml and answer an admin call.
func waitAdmin(t *testing.T, p *brokerProc, dataDir string, logPath string) (apiv1.AdminClient, *grpc.ClientConn) {
	t.Helper()
	cl, conn, err := serving(p, dataDir, logPath)
	if err != nil {
		t.Fatal(err)
	}
	return cl, conn
}

// serving waits up to 60 s for the broker to answer its admin API.
func serving(p *brokerProc, dataDir string, logPath string) (apiv1.AdminClient, *grpc.ClientConn, error) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			b, _ := os.ReadFile(logPath)
			return nil, nil, fmt.Errorf("cable-broker exited: %s", tail(string(b), 20))
		default:
		}
		c, err := adminconfig.Load(filepath.Join(dataDir, "admin.yaml"))
		if err == nil {
			conn, err := adminconfig.Dial(context.Background(), c)
			if err == nil {
				cl := apiv1.NewAdminClient(conn)
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err = cl.ListClusters(ctx, &apiv1.ListClustersRequest{})
				cancel()
				if err == nil {
					return cl, conn, nil
				}
				conn.Close()
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil, nil, errors.New("cable-broker did not serve within 60s")
}

func tail(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

func runOne(t *testing.T, b brokerBuild, storeKind string, nClusters, gateways int) Result {
	r := Result{Label: b.label, Broker: b.path, Agent: b.agent, Store: storeKind, Clusters: nClusters, Gateways: gateways,
		Agents: nClusters * gateways, CPUSeconds: map[string]float64{}, IOMB: map[string]float64{}, LoadAvgStart: loadAvg()}
	steady := time.Duration(envInt(t, "CABLEMESH_SCALE_STEADY", 30)) * time.Second
	changes := envInt(t, "CABLEMESH_SCALE_CHANGES", 5)
	startTimeout := time.Duration(envInt(t, "CABLEMESH_SCALE_START_TIMEOUT", 240)) * time.Second

	dir := t.TempDir()
	dataDir := filepath.Join(dir, "broker")
	logPath := filepath.Join(dir, "broker.log")
	if d := os.Getenv("CABLEMESH_SCALE_LOGS"); d != "" {
		logPath = filepath.Join(d, fmt.Sprintf("broker-%s-%s-%dx%d.log", b.label, storeKind, nClusters, gateways))
		_ = os.Remove(logPath)
	}
	var etcdURLs []string
	if storeKind == "etcd" {
		etcdURLs = etcdtest.Start(t, 1).Endpoints()
	}
	listen := freePort(t)
	bp := startBroker(t, b.path, dataDir, listen, etcdURLs, logPath)
	t.Cleanup(func() {
		bp.terminate()
		if t.Failed() {
			lb, _ := os.ReadFile(logPath)
			t.Logf("broker log (tail):\n%s", tail(string(lb), 40))
		}
	})
	admin, aconn := waitAdmin(t, bp, dataDir, logPath)
	defer func() { aconn.Close() }()
	ctx := context.Background()

	// The mesh: one cluster per token, as many nodes per token as gateways.
	var clusters, tokenFiles []string
	for i := range nClusters {
		name := fmt.Sprintf("c%03d", i+1)
		cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		resp, err := admin.CreateJoinToken(cctx, &apiv1.CreateJoinTokenRequest{Cluster: name, PodCidrs: []string{podCIDR(i + 1)},
			ServiceCidrs: []string{serviceCIDR(i + 1)}, MaxNodes: uint32(gateways)})
		cancel()
		if err != nil {
			t.Fatalf("create join token of %s: %v", name, err)
		}
		p, err := writeTokenFile(dir, name, resp.Token)
		if err != nil {
			t.Fatal(err)
		}
		clusters = append(clusters, name)
		tokenFiles = append(tokenFiles, p)
	}
	f := newFleet(listen, clusters, gateways, tokenFiles, filepath.Join(dir, "agents"), b.agent != "fixed")
	f.zstd = b.agent == "current" || b.agent == "noreports" || b.agent == "delayed"
	f.firstDelay = b.agent == "delayed" || b.agent == "uncompressed"
	f.acceptBusy = b.agent == "current" || b.agent == "noreports"
	f.reports = b.agent == "current"
	bctx, cancelAll := context.WithCancel(ctx)
	defer cancelAll()

	// Join: every agent at once.
	t.Logf("%s: join", time.Now().Format(time.TimeOnly))
	cpu0 := bp.cpu()
	t0 := time.Now()
	if err := f.joinAll(bctx); err != nil {
		t.Fatalf("join: %v", err)
	}
	r.JoinWallMs = ms(time.Since(t0))
	var joins []float64
	for _, a := range f.agents {
		joins = append(joins, ms(a.joinDone.Sub(a.joinStart)))
	}
	r.JoinP50Ms, r.JoinP99Ms, r.JoinMaxMs = pct(joins, 50), pct(joins, 99), pct(joins, 100)
	r.JoinErrors = f.calls.joinErrors.Load()
	cpu1 := bp.cpu()
	r.CPUSeconds["join"] = cpu1 - cpu0
	bp.takePeak()

	// Fleet start: every agent dials, watches and registers at once.
	t.Logf("%s: fleet start", time.Now().Format(time.TimeOnly))
	rd1, wr1 := bp.io()
	f.start(bctx)
	defer f.stop()
	deadline := time.Now().Add(startTimeout)
	lastLog := time.Now()
	for time.Now().Before(deadline) && f.currentCount() < f.n() {
		time.Sleep(50 * time.Millisecond)
		if time.Since(lastLog) >= 2*time.Second {
			lastLog = time.Now()
			t.Logf("%s: %s", time.Since(f.t0).Round(time.Millisecond), f.progress())
		}
	}
	r.LoadAvgAfterStart = loadAvg()
	var cur, regs, registered, snapMs []float64
	var snapBytes []int64
	for _, a := range f.agents {
		if c := a.currentAt.Load(); c != 0 {
			cur = append(cur, ms(time.Unix(0, c).Sub(f.t0)))
		} else {
			r.StartNotCurrent++
		}
		if at := a.registeredAt.Load(); at != 0 {
			registered = append(registered, ms(time.Unix(0, at).Sub(f.t0)))
		}
		if d := a.firstRegDur.Load(); d != 0 {
			regs = append(regs, ms(time.Duration(d)))
			if !a.firstRegOK.Load() {
				r.FirstRegFailed++
			}
		}
		if s := a.snapDoneAt.Load(); s != 0 {
			snapMs = append(snapMs, ms(time.Unix(0, s).Sub(a.snapStart)))
			snapBytes = append(snapBytes, a.snapBytes.Load())
		}
	}
	r.StartCurrentMs, r.StartCurrentP50Ms, r.StartCurrentP99Ms = pct(cur, 100), pct(cur, 50), pct(cur, 99)
	if r.StartNotCurrent > 0 {
		r.StartCurrentMs = -1
		r.Notes = append(r.Notes, fmt.Sprintf("%d agents were not current after %s", r.StartNotCurrent, startTimeout))
	}
	r.FirstRegP50Ms, r.FirstRegP99Ms, r.FirstRegMaxMs = pct(regs, 50), pct(regs, 99), pct(regs, 100)
	r.RegisteredP50Ms, r.RegisteredP99Ms, r.RegisteredMaxMs = pct(registered, 50), pct(registered, 99), pct(registered, 100)
	r.SnapshotP50Ms, r.SnapshotP99Ms, r.SnapshotMaxMs = pct(snapMs, 50), pct(snapMs, 99), pct(snapMs, 100)
	slices.Sort(snapBytes)
	if len(snapBytes) > 0 {
		r.SnapshotBytesP50, r.SnapshotBytesMax = snapBytes[len(snapBytes)/2], snapBytes[len(snapBytes)-1]
	}
	cpu2 := bp.cpu()
	r.CPUSeconds["start"] = cpu2 - cpu1
	rd2, wr2 := bp.io()
	r.IOMB["startRead"], r.IOMB["startWrite"] = float64(rd2-rd1)/1e6, float64(wr2-wr1)/1e6
	sp, _ := bp.takePeak()
	r.StartPeakRSSMB = float64(sp) / 1024

	// Steady state: heartbeats go on; how they spread.
	t.Logf("%s: steady", time.Now().Format(time.TimeOnly))
	time.Sleep(steady)
	cpu3 := bp.cpu()
	r.CPUSeconds["steady"] = cpu3 - cpu2
	r.CPUSeconds["steadyPerSecond"] = (cpu3 - cpu2) / steady.Seconds()
	rd3, wr3 := bp.io()
	r.IOMB["steadyRead"], r.IOMB["steadyWrite"] = float64(rd3-rd2)/1e6, float64(wr3-wr2)/1e6
	from := int(heartbeatInterval/time.Second) + int(r.StartCurrentMs/1000) + 1
	to := int(time.Since(f.t0) / time.Second)
	if from >= to {
		r.HeartbeatsMaxPerSecond = -1 // no whole second of steady state after the first heartbeat interval
	}
	for s := from; s < to && s < len(f.beats.perSecond); s++ {
		r.HeartbeatsMaxPerSecond = max(r.HeartbeatsMaxPerSecond, int(f.beats.perSecond[s].Load()))
	}
	var beats []float64
	f.beats.mu.Lock()
	for _, s := range f.beats.latencies {
		beats = append(beats, ms(s.dur))
	}
	f.beats.mu.Unlock()
	r.HeartbeatP99Ms, r.HeartbeatMaxMs = pct(beats, 99), pct(beats, 100)

	// cablectl links --all: every link report, paged, paired.
	if f.reports {
		cctx, cancel := context.WithTimeout(ctx, 60*time.Second)
		lt := time.Now()
		all, err := cablectl.FetchLinksAll(cctx, admin)
		cancel()
		r.LinksAllMs = ms(time.Since(lt))
		if err != nil {
			r.Notes = append(r.Notes, fmt.Sprintf("links --all: %v", err))
		}
		for _, p := range all.Items {
			r.LinksAllPairs++
			if p.Agree && !p.Stale {
				r.LinksAllAgree++
			}
		}
	}

	// Changes: policies applied by the admin, endpoints changed by their agents.
	var pol, eps []float64
	for i := range changes {
		name := fmt.Sprintf("scale-probe-%d", i)
		js := fmt.Sprintf(`{"apiVersion":"cablemesh.io/v1alpha1","kind":"ClusterConnectionPolicy","metadata":{"name":%q},`+
			`"spec":{"clusterSelector":{"matchLabels":{"cablemesh.io/scale-probe":"%d"}},"priority":%d,"cableDriver":{"name":"vxlan"}}}`, name, i, 10+i)
		lat, missed := f.measure("policy", name, func() error {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := admin.ApplyPolicies(cctx, &apiv1.ApplyPoliciesRequest{Policies: []*apiv1.Policy{{Name: name, Json: []byte(js)}}})
			return err
		})
		pol = append(pol, lat...)
		r.ChangesMissed += missed
		a := f.agents[(i*37+11)%f.n()]
		lat, missed = f.measure("endpoint", a.cluster+"/"+a.node, func() error {
			ep := endpointOf(a.cluster, a.node, f.clIndexOf(a.cluster)+1, a.idx)
			ep.PrivateIp = a.ep.PrivateIp
			ep.CablePorts["wireguard"] = uint32(52000 + i)
			return a.registerUntilNotBusy(ctx, ep)
		})
		eps = append(eps, lat...)
		r.ChangesMissed += missed
	}
	r.PolicyChangeP50Ms, r.PolicyChangeP99Ms, r.PolicyChangeMaxMs = pct(pol, 50), pct(pol, 99), pct(pol, 100)
	r.EndpointChangeP50Ms, r.EndpointChangeP99Ms, r.EndpointChangeMaxMs = pct(eps, 50), pct(eps, 99), pct(eps, 100)
	cpu4 := bp.cpu()
	r.CPUSeconds["changes"] = cpu4 - cpu3

	// Restart: stop the broker, start it again on the same data, and wait for every agent's
	// first message on its new stream.
	_, all := bp.takePeak()
	r.PeakRSSMB = float64(all) / 1024
	f.epoch.Add(1)
	tStop := time.Now()
	bp.terminate()
	bp = startBroker(t, b.path, dataDir, listen, etcdURLs, logPath)
	tStart := time.Now()
	_, aconn2, err := serving(bp, dataDir, logPath)
	if err != nil {
		// The figures of the phases before stay: a broker that does not come back under the
		// load of its fleet reconnecting fails the run, but says so beside what it measured.
		t.Errorf("restart: %v", err)
		r.Notes = append(r.Notes, fmt.Sprintf("restart: %v; no restart figures", err))
		r.Calls = f.calls.snapshot()
		return r
	}
	aconn.Close()
	aconn = aconn2
	r.RestartDownMs = ms(time.Since(tStop))
	deadline = time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) && f.resumedCount() < f.n() {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(2 * time.Second) // the deltas after a resume
	var res []float64
	for _, a := range f.agents {
		at := a.resumedAt.Load()
		if at == 0 {
			r.ResumeMissing++
			continue
		}
		res = append(res, ms(time.Unix(0, at).Sub(tStart)))
		if a.resumedSnapshot.Load() {
			r.ResumeSnapshots++
		}
	}
	r.ResumeP50Ms, r.ResumeP99Ms, r.ResumeMaxMs = pct(res, 50), pct(res, 99), pct(res, 100)
	r.AfterRestartCurrent = f.holdingAll()
	r.CPUSeconds["restart"] = bp.cpu()
	_, all2 := bp.takePeak()
	r.PeakRSSMB = max(r.PeakRSSMB, float64(all2)/1024)
	r.Calls = f.calls.snapshot()
	for _, k := range f.calls.errorKinds() {
		r.Notes = append(r.Notes, "call errors (not deadlines): "+k)
	}

	// The goals are reported, not asserted (the machine is shared); what is asserted is that
	// nothing is lost: once the whole fleet was current, it is current again after the restart.
	if r.StartNotCurrent == 0 && r.AfterRestartCurrent != r.Agents {
		t.Errorf("after the restart %d of %d agents hold every endpoint", r.AfterRestartCurrent, r.Agents)
	}
	if r.StartNotCurrent > 0 {
		t.Logf("%d of %d agents were not current after %s: the fleet start goal is not met", r.StartNotCurrent, r.Agents, startTimeout)
	}
	return r
}

// measure makes one change and returns, for every agent that received it within 30 s, the time
// from the change's call to its receipt, and how many did not.
func (f *fleet) measure(kind, key string, change func() error) ([]float64, int) {
	p := &probe{kind: kind, key: []byte(key), recv: make([]atomic.Int64, f.n())}
	f.probe.Store(p)
	defer f.probe.Store(nil)
	// From the moment the change is made: its commit is part of what an agent waits for.
	p.start = time.Now()
	if err := change(); err != nil {
		return nil, f.n()
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		n := 0
		for i := range p.recv {
			if p.recv[i].Load() != 0 {
				n++
			}
		}
		if n == f.n() {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var out []float64
	missed := 0
	for i := range p.recv {
		at := p.recv[i].Load()
		if at == 0 {
			missed++
			continue
		}
		out = append(out, ms(time.Unix(0, at).Sub(p.start)))
	}
	return out, missed
}

func (f *fleet) clIndexOf(c string) int { return int(f.clIndex[c]) }

// progress says how far the fleet start is: agents registered, watching, with a snapshot,
// current; the broker's CPU is in the results.
func (f *fleet) progress() string {
	var reg, up, snap, cur int
	for _, a := range f.agents {
		if a.registered.Load() {
			reg++
		}
		if a.watchUp.Load() {
			up++
		}
		if a.snapDoneAt.Load() != 0 {
			snap++
		}
		if a.currentAt.Load() != 0 {
			cur++
		}
	}
	return fmt.Sprintf("registered %d, watching %d, snapshot %d, current %d (load %.1f)", reg, up, snap, cur, loadAvg())
}

func (f *fleet) currentCount() int {
	n := 0
	for _, a := range f.agents {
		if a.currentAt.Load() != 0 {
			n++
		}
	}
	return n
}

func (f *fleet) resumedCount() int {
	n := 0
	for _, a := range f.agents {
		if a.resumedAt.Load() != 0 {
			n++
		}
	}
	return n
}

// holdingAll counts the agents whose last message left them with every endpoint and cluster.
func (f *fleet) holdingAll() int {
	n := 0
	for _, a := range f.agents {
		if a.holdsAll.Load() {
			n++
		}
	}
	return n
}

func (c *callCounters) snapshot() map[string]int64 {
	return map[string]int64{
		"joins": c.joins.Load(), "joinErrors": c.joinErrors.Load(), "joinDeadlines": c.joinDeadlines.Load(),
		"registers": c.registers.Load(), "registerBusy": c.registerBusy.Load(), "registerBusyWaitMs": c.busyWaitMs.Load(), "registerBusyWaitMaxMs": c.busyWaitMaxMs.Load(), "registerErrors": c.registerErrors.Load(), "registerDeadlines": c.registerDeadlines.Load(),
		"heartbeats": c.heartbeats.Load(), "heartbeatErrors": c.heartbeatErrors.Load(), "heartbeatDeadlines": c.heartbeatDeadlines.Load(),
		"setExports": c.setExports.Load(), "setExportsErrors": c.setExportsErrors.Load(), "setExportsDeadlines": c.setExportsDeadlines.Load(),
		"watches": c.watches.Load(), "watchErrors": c.watchErrors.Load(), "watchSnapshots": c.watchSnapshots.Load(), "watchResumes": c.watchResumes.Load(),
		"linkReports": c.reports.Load(), "linkReportsDropped": c.reportsDropped.Load(), "linkReportErrors": c.reportErrors.Load(),
		"linkReportsUnimplemented": c.reportsUnimplemented.Load(), "linkReportBytes": c.reportBytes.Load(),
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// pct is the p-th percentile (nearest rank) of v; 100 is the maximum; 0 for no values.
func pct(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(float64(len(s))*p/100+0.999999) - 1
	return s[min(max(i, 0), len(s)-1)]
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

func kernel() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}

func writeResults(t *testing.T, res Results) {
	t.Helper()
	benchresults.Save(t, filepath.Join("..", "results"), "scale", res, markdown(res))
}

// markdown is the results as a table: one column per run, so before and after sit side by side.
func markdown(res Results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Broker scale: a fleet starting at once (issue 11, item 8)\n\n%s, Linux %s, %d CPUs (shared with other work).\n\n", res.Date, res.Kernel, res.CPUs)
	fmt.Fprintf(&b, "Command: `%s`\n\nSimulated agents in one process, real mTLS, against the cable-broker binary; etcd is one etcd-server member on tmpfs.\n"+
		"Times of the fleet start are from the moment every agent (already joined) dials, watches and registers at once; an agent is current when it holds every endpoint and cluster. "+
		"Change propagation is from the write's call to each agent's receipt. Resume is from the restarted broker's start to each agent's first message.\n\n", res.Command)
	rows := []struct {
		name string
		f    func(r Result) string
	}{
		{"build", func(r Result) string { return r.Label }},
		{"agents (heartbeats)", func(r Result) string { return r.Agent }},
		{"store", func(r Result) string { return r.Store }},
		{"fleet", func(r Result) string { return fmt.Sprintf("%d x %d = %d", r.Clusters, r.Gateways, r.Agents) }},
		{"join, all at once: wall / p50 / p99 ms", func(r Result) string {
			return fmt.Sprintf("%.0f / %.0f / %.0f", r.JoinWallMs, r.JoinP50Ms, r.JoinP99Ms)
		}},
		{"**fleet start: all current, ms**", func(r Result) string {
			if r.StartNotCurrent > 0 {
				return fmt.Sprintf("**%d not current**", r.StartNotCurrent)
			}
			return fmt.Sprintf("**%.0f**", r.StartCurrentMs)
		}},
		{"fleet start: current p50 / p99 ms", func(r Result) string { return fmt.Sprintf("%.0f / %.0f", r.StartCurrentP50Ms, r.StartCurrentP99Ms) }},
		{"first RegisterEndpoint p50 / p99 / max ms", func(r Result) string {
			return fmt.Sprintf("%.0f / %.0f / %.0f", r.FirstRegP50Ms, r.FirstRegP99Ms, r.FirstRegMaxMs)
		}},
		{"**calls that hit the 10 s deadline**", func(r Result) string {
			return fmt.Sprintf("**%d**", r.Calls["registerDeadlines"]+r.Calls["heartbeatDeadlines"]+r.Calls["setExportsDeadlines"]+r.Calls["joinDeadlines"])
		}},
		{"first RegisterEndpoint failed", func(r Result) string { return fmt.Sprint(r.FirstRegFailed) }},
		{"registered, from the fleet start p50 / p99 / max ms", func(r Result) string {
			return fmt.Sprintf("%.0f / %.0f / %.0f", r.RegisteredP50Ms, r.RegisteredP99Ms, r.RegisteredMaxMs)
		}},
		{"registrations answered busy (retried later)", func(r Result) string { return fmt.Sprint(r.Calls["registerBusy"]) }},
		{"busy answers: wait taken mean / max ms", func(r Result) string {
			if r.Calls["registerBusy"] == 0 {
				return "-"
			}
			return fmt.Sprintf("%d / %d", r.Calls["registerBusyWaitMs"]/r.Calls["registerBusy"], r.Calls["registerBusyWaitMaxMs"])
		}},
		{"snapshot bytes p50 / max", func(r Result) string { return fmt.Sprintf("%d / %d", r.SnapshotBytesP50, r.SnapshotBytesMax) }},
		{"snapshot time p50 / p99 / max ms", func(r Result) string {
			return fmt.Sprintf("%.0f / %.0f / %.0f", r.SnapshotP50Ms, r.SnapshotP99Ms, r.SnapshotMaxMs)
		}},
		{"heartbeats, most in one second", func(r Result) string {
			if r.HeartbeatsMaxPerSecond < 0 {
				return "n/a (steady state shorter than a heartbeat interval: CABLEMESH_SCALE_STEADY > 11)"
			}
			return fmt.Sprint(r.HeartbeatsMaxPerSecond)
		}},
		{"heartbeat p99 / max ms", func(r Result) string { return fmt.Sprintf("%.0f / %.0f", r.HeartbeatP99Ms, r.HeartbeatMaxMs) }},
		{"**policy change p50 / p99 / max ms**", func(r Result) string {
			return fmt.Sprintf("%.0f / **%.0f** / %.0f", r.PolicyChangeP50Ms, r.PolicyChangeP99Ms, r.PolicyChangeMaxMs)
		}},
		{"**endpoint change p50 / p99 / max ms**", func(r Result) string {
			return fmt.Sprintf("%.0f / **%.0f** / %.0f", r.EndpointChangeP50Ms, r.EndpointChangeP99Ms, r.EndpointChangeMaxMs)
		}},
		{"changes not received (agent x change)", func(r Result) string { return fmt.Sprint(r.ChangesMissed) }},
		{"restart: down ms (SIGTERM → serving)", func(r Result) string { return fmt.Sprintf("%.0f", r.RestartDownMs) }},
		{"**resume p50 / p99 / max ms**", func(r Result) string {
			return fmt.Sprintf("%.0f / %.0f / **%.0f**", r.ResumeP50Ms, r.ResumeP99Ms, r.ResumeMaxMs)
		}},
		{"resumed with a snapshot / missing", func(r Result) string { return fmt.Sprintf("%d / %d", r.ResumeSnapshots, r.ResumeMissing) }},
		{"agents holding every endpoint after the restart", func(r Result) string { return fmt.Sprint(r.AfterRestartCurrent) }},
		{"**broker peak RSS MB** (fleet start / whole run)", func(r Result) string {
			return fmt.Sprintf("%.0f / **%.0f**", r.StartPeakRSSMB, r.PeakRSSMB)
		}},
		{"broker CPU s: join / start / steady (per s) / changes", func(r Result) string {
			return fmt.Sprintf("%.1f / %.1f / %.1f (%.2f) / %.1f", r.CPUSeconds["join"], r.CPUSeconds["start"], r.CPUSeconds["steady"], r.CPUSeconds["steadyPerSecond"], r.CPUSeconds["changes"])
		}},
		{"broker I/O MB read / written: fleet start; steady", func(r Result) string {
			return fmt.Sprintf("%.1f / %.1f; %.1f / %.1f", r.IOMB["startRead"], r.IOMB["startWrite"], r.IOMB["steadyRead"], r.IOMB["steadyWrite"])
		}},
		{"link reports: calls / dropped (rate limit) / errors / unimplemented / MB sent", func(r Result) string {
			return fmt.Sprintf("%d / %d / %d / %d / %.1f", r.Calls["linkReports"], r.Calls["linkReportsDropped"], r.Calls["linkReportErrors"],
				r.Calls["linkReportsUnimplemented"], float64(r.Calls["linkReportBytes"])/1e6)
		}},
		{"links --all: ms / pairs / agreeing", func(r Result) string {
			if r.LinksAllPairs == 0 {
				return "-"
			}
			return fmt.Sprintf("%.0f / %d / %d", r.LinksAllMs, r.LinksAllPairs, r.LinksAllAgree)
		}},
		{"calls: registers / heartbeats / watches (snapshots)", func(r Result) string {
			return fmt.Sprintf("%d / %d / %d (%d)", r.Calls["registers"], r.Calls["heartbeats"], r.Calls["watches"], r.Calls["watchSnapshots"])
		}},
		{"errors: register / heartbeat / watch / setExports", func(r Result) string {
			return fmt.Sprintf("%d / %d / %d / %d", r.Calls["registerErrors"], r.Calls["heartbeatErrors"], r.Calls["watchErrors"], r.Calls["setExportsErrors"])
		}},
		{"load average at the start / after the fleet start", func(r Result) string {
			return fmt.Sprintf("%.2f / %.2f", r.LoadAvgStart, r.LoadAvgAfterStart)
		}},
	}
	b.WriteString("| |")
	for range res.Runs {
		b.WriteString(" |")
	}
	b.WriteString("\n|---|")
	for range res.Runs {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, row := range rows {
		fmt.Fprintf(&b, "| %s |", row.name)
		for _, r := range res.Runs {
			fmt.Fprintf(&b, " %s |", row.f(r))
		}
		b.WriteString("\n")
	}
	for _, r := range res.Runs {
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "\n- %s/%s/%dx%d: %s", r.Label, r.Store, r.Clusters, r.Gateways, n)
		}
	}
	b.WriteString("\n")
	return b.String()
}
