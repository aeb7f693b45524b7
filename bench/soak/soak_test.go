//go:build bench

// Package soak runs a mesh under faults for minutes: a benchmark, not a test of make test.
//
// Four clusters on two broker replicas sharing a three-member etcd cluster; a timed ping every
// 100 ms across every pair, pod to pod; a stream of policy writes (each pair's driver policy
// applied with another driver, or deleted so the default decides) and runtime service exports
// (exported and withdrawn through the agents); and a seeded fault injector that kills in turn a
// broker replica (SIGKILL, restart), an agent (SIGKILL, restart), charon in a gateway
// namespace, a gateway's underlay link (down a few seconds) and an etcd member (SIGKILL,
// restart). Every pair is connected under every policy of the stream, so every pair should be
// up the whole time. Knobs: CABLEMESH_SOAK_MINUTES (20), CABLEMESH_SOAK_SEED (the time).
package soak

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/internal/benchresults"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

const (
	pingEvery    = 100 * time.Millisecond
	writeEvery   = 3 * time.Second
	faultEvery   = 20 * time.Second
	linkDownFor  = 4 * time.Second
	settleBefore = 10 * time.Second
)

var drivers = []string{harness.DriverWireGuard, harness.DriverVXLAN, harness.DriverIPsec}

type pair struct{ a, b *harness.Cluster }

func (p pair) key() string { return p.a.Name + "-" + p.b.Name }

// PairResult is one pair's traffic over the run.
type PairResult struct {
	Pair       string  `json:"pair"`
	Replies    int     `json:"replies"`
	LongestGap float64 `json:"longestGapSeconds"`
	GapAt      string  `json:"gapEndedAt"`
}

// Fault is one injected fault.
type Fault struct {
	At     string  `json:"at"`
	Kind   string  `json:"kind"`
	Target string  `json:"target"`
	Back   float64 `json:"backAfterSeconds"`
	Note   string  `json:"note,omitempty"`
	// LongestGap is the longest stop of any pair's ping that began in this fault's window (from
	// its start to the next fault's), and GapPair that pair: what the fault cost the traffic.
	LongestGap float64 `json:"longestPairGapSeconds"`
	GapPair    string  `json:"gapPair,omitempty"`

	at time.Time
}

// Result is what bench/results/soak-<date>.json holds.
type Result struct {
	Date          string             `json:"date"`
	Command       string             `json:"command"`
	Minutes       float64            `json:"minutes"`
	Seed          int64              `json:"seed"`
	Kernel        string             `json:"kernel"`
	CPUs          int                `json:"cpus"`
	LoadBefore    string             `json:"loadBefore"`
	LoadAfter     string             `json:"loadAfter"`
	Clusters      int                `json:"clusters"`
	EtcdMembers   int                `json:"etcdMembers"`
	Replicas      int                `json:"replicas"`
	WritesAcked   int                `json:"writesAcknowledged"`
	WritesFailed  int                `json:"writesFailed"`
	WritesLost    []string           `json:"writesLost"`
	DuplicateIDs  []string           `json:"duplicateClusterIDs"`
	DuplicateVIPs []string           `json:"duplicateVIPs"`
	Pairs         []PairResult       `json:"pairs"`
	NotCurrent    map[string]float64 `json:"longestNotCurrentSeconds"`
	Faults        []Fault            `json:"faults"`
	Notes         []string           `json:"notes"`
}

func minutes(t *testing.T) float64 {
	s := os.Getenv("CABLEMESH_SOAK_MINUTES")
	if s == "" {
		return 20
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 {
		t.Fatalf("CABLEMESH_SOAK_MINUTES=%q: want a positive number of minutes", s)
	}
	return v
}

func seed(t *testing.T) int64 {
	s := os.Getenv("CABLEMESH_SOAK_SEED")
	if s == "" {
		return time.Now().UnixNano()
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("CABLEMESH_SOAK_SEED=%q: want an integer", s)
	}
	return v
}

func loadavg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return strings.TrimSpace(string(b))
}

// addCluster adds a cluster whose agent names every replica and runs all three drivers, labelled
// p-<pair>=yes for each pair it belongs to (the pair's policy selects them).
func addCluster(t *testing.T, h *harness.HA, name, podCIDR, labels string) *harness.Cluster {
	t.Helper()
	c := h.NewCluster(name, podCIDR)
	r := h.JoinToken(name, podCIDR, "--labels", labels)
	if r.Err != nil {
		t.Fatalf("join token for %s: %s", name, r)
	}
	c.WriteToken(strings.TrimSpace(r.Stdout))
	single := "broker: " + h.BrokerAddress() + "\n"
	cfg := c.ConfigYAML(harness.MultiDriverConfig())
	if !strings.Contains(cfg, single) {
		t.Fatalf("agent config of %s has no %q line", name, strings.TrimSpace(single))
	}
	if err := os.WriteFile(c.ConfigPath, []byte(strings.Replace(cfg, single, "broker: "+h.BrokerList()+"\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

func pairPolicy(p pair, driver string) string {
	return fmt.Sprintf(`kind: ClusterConnectionPolicy
metadata:
  name: soak-%s
spec:
  clusterSelector:
    p-%s: "yes"
  topology: full-mesh
  connectionPolicy: connect
  cableDriver:
    name: %s
  priority: 5
`, p.key(), p.key(), driver)
}

// ledger is the acknowledged writes: per key the value of the last acknowledged write ("" for a
// delete), and the keys whose last write failed (either value may hold at the end).
type ledger struct {
	mu        sync.Mutex
	want      map[string]string
	uncertain map[string][]string
	acked     int
	failed    int
}

func (l *ledger) record(key, value, prev string, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ok {
		l.acked++
		l.want[key] = value
		delete(l.uncertain, key)
		return
	}
	l.failed++
	l.uncertain[key] = append(l.uncertain[key], value, prev)
}

// writer drives policy and export writes until stop closes.
func writer(h *harness.HA, rng *rand.Rand, pairs []pair, clusters []*harness.Cluster, pol, exp *ledger, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(writeEvery)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		if rng.Intn(2) == 0 {
			p := pairs[rng.Intn(len(pairs))]
			key := "soak-" + p.key()
			pol.mu.Lock()
			prev := pol.want[key]
			pol.mu.Unlock()
			driver := drivers[rng.Intn(len(drivers))]
			file := h.PolicyFile(key+".yaml", pairPolicy(p, driver))
			if rng.Intn(3) == 0 && prev != "" {
				r := h.Cablectl("delete", "-f", file)
				h.Logf("soak write: delete policy %s: ok=%v %s", key, r.Err == nil, strings.TrimSpace(r.Stdout+r.Stderr))
				pol.record(key, "", prev, r.Err == nil)
				continue
			}
			r := h.Cablectl("apply", "-f", file)
			h.Logf("soak write: apply policy %s driver %s: ok=%v %s", key, driver, r.Err == nil, strings.TrimSpace(r.Stdout+r.Stderr))
			pol.record(key, driver, prev, r.Err == nil)
			continue
		}
		c := clusters[rng.Intn(len(clusters))]
		svc := fmt.Sprintf("svc%d-%s", rng.Intn(3), c.Name)
		key := c.Name + "/" + svc
		exp.mu.Lock()
		prev := exp.want[key]
		exp.mu.Unlock()
		if prev != "" {
			r := harness.Run(h.Ctx, h.Bin.Cablectl, "service", "unexport", svc, "-n", "soak", "--socket", c.StatusSocket)
			h.Logf("soak write: unexport %s: ok=%v %s", key, r.Err == nil, strings.TrimSpace(r.Stdout+r.Stderr))
			exp.record(key, "", prev, r.Err == nil)
			continue
		}
		r := harness.Run(h.Ctx, h.Bin.Cablectl, "service", "export", svc, "-n", "soak", "--port", "http:80/TCP",
			"--endpoint", c.PodIP.String(), "--socket", c.StatusSocket)
		h.Logf("soak write: export %s: ok=%v %s", key, r.Err == nil, strings.TrimSpace(r.Stdout+r.Stderr))
		exp.record(key, "exported", prev, r.Err == nil)
	}
}

// currency samples every agent's broker revision each second and keeps, per agent, the longest
// time it was behind the newest revision any agent had (or disconnected from the broker).
type currency struct {
	mu      sync.Mutex
	behind  map[string]time.Time
	longest map[string]time.Duration
}

func sampleCurrency(h *harness.HA, clusters []*harness.Cluster, cur *currency, stop <-chan struct{}, done chan<- struct{}) {
	defer close(done)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		revs := map[string]uint64{}
		var newest uint64
		for _, c := range clusters {
			st, err := c.Status()
			if err != nil || !st.Broker.Connected {
				continue
			}
			revs[c.Name] = st.Broker.Revision
			newest = max(newest, st.Broker.Revision)
		}
		now := time.Now()
		cur.mu.Lock()
		for _, c := range clusters {
			rev, ok := revs[c.Name]
			if ok && rev >= newest {
				if since, was := cur.behind[c.Name]; was {
					cur.longest[c.Name] = max(cur.longest[c.Name], now.Sub(since))
					delete(cur.behind, c.Name)
				}
				continue
			}
			if _, was := cur.behind[c.Name]; !was {
				cur.behind[c.Name] = now
			}
		}
		cur.mu.Unlock()
	}
}

// charonPIDs are the charon processes whose network namespace is ns (pkill would match every
// namespace's).
func charonPIDs(ns string) []int {
	want, err := os.Stat("/run/netns/" + ns)
	if err != nil {
		return nil
	}
	wantIno := want.Sys().(*syscall.Stat_t).Ino
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "charon" {
			continue
		}
		st, err := os.Stat(filepath.Join("/proc", e.Name(), "ns", "net"))
		if err != nil || st.Sys().(*syscall.Stat_t).Ino != wantIno {
			continue
		}
		out = append(out, pid)
	}
	return out
}

func TestSoak(t *testing.T) {
	harness.RequireRoot(t)
	harness.RequireIPsec(t)
	dur := time.Duration(minutes(t) * float64(time.Minute))
	sd := seed(t)
	t.Logf("soak: %s, seed %d (CABLEMESH_SOAK_SEED=%d repeats the choices)", dur, sd, sd)
	res := Result{Date: time.Now().UTC().Format(time.RFC3339), Minutes: dur.Minutes(), Seed: sd, CPUs: runtime.NumCPU(),
		LoadBefore: loadavg(), EtcdMembers: 3, Replicas: 2, NotCurrent: map[string]float64{},
		Command: fmt.Sprintf("CABLEMESH_SOAK_MINUTES=%g CABLEMESH_SOAK_SEED=%d make bench-soak", dur.Minutes(), sd)}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		res.Kernel = strings.TrimSpace(string(b))
	}
	h := harness.NewHA(t, res.EtcdMembers, res.Replicas)
	names := []string{"a", "b", "c", "d"}
	var pairs []pair
	labels := map[string][]string{}
	for i := range names {
		for j := i + 1; j < len(names); j++ {
			k := names[i] + "-" + names[j]
			labels[names[i]] = append(labels[names[i]], "p-"+k+"=yes")
			labels[names[j]] = append(labels[names[j]], "p-"+k+"=yes")
		}
	}
	var clusters []*harness.Cluster
	for i, n := range names {
		clusters = append(clusters, addCluster(t, h, n, fmt.Sprintf("10.%d.0.0/16", i+1), strings.Join(labels[n], ",")))
	}
	res.Clusters = len(clusters)
	for i := range clusters {
		for j := i + 1; j < len(clusters); j++ {
			pairs = append(pairs, pair{clusters[i], clusters[j]})
		}
	}
	pol := &ledger{want: map[string]string{}, uncertain: map[string][]string{}}
	exp := &ledger{want: map[string]string{}, uncertain: map[string][]string{}}
	// Start with a spread of drivers so every driver (and charon) is in use from the start.
	for i, p := range pairs {
		d := drivers[i%len(drivers)]
		h.Apply(h.PolicyFile("soak-"+p.key()+".yaml", pairPolicy(p, d)))
		pol.record("soak-"+p.key(), d, "", true)
	}
	for _, c := range clusters {
		c.StartAgent()
	}
	h.WaitConnected(3*time.Minute, clusters...)
	t.Logf("cluster list:\n%s", h.Cablectl("cluster", "list", "-o", "json").Stdout)

	pingers := map[string]*harness.Process{}
	for _, p := range pairs {
		pingers[p.key()] = h.StartTimedPinger("soak-ping-"+p.key(), p.a.PodNS, p.b.PodIP, pingEvery)
	}
	time.Sleep(settleBefore)
	start := time.Now()

	rng := rand.New(rand.NewSource(sd))
	wrng := rand.New(rand.NewSource(sd + 1))
	stop := make(chan struct{})
	wdone, cdone := make(chan struct{}), make(chan struct{})
	cur := &currency{behind: map[string]time.Time{}, longest: map[string]time.Duration{}}
	go writer(h, wrng, pairs, clusters, pol, exp, stop, wdone)
	go sampleCurrency(h, clusters, cur, stop, cdone)
	stopped := false
	stopLoops := func() {
		if !stopped {
			stopped = true
			close(stop)
			<-wdone
			<-cdone
		}
	}
	defer stopLoops()

	kinds := []string{"broker", "agent", "charon", "link", "etcd"}
	for n := 0; time.Since(start)+faultEvery <= dur; n++ {
		time.Sleep(time.Duration(rng.Int63n(int64(faultEvery / 2))))
		f := inject(t, h, rng, clusters, kinds[n%len(kinds)])
		res.Faults = append(res.Faults, f)
		res.Notes = append(res.Notes, supervise(h, clusters)...)
		next := start.Add(time.Duration(n+1) * faultEvery)
		if d := time.Until(next); d > 0 {
			time.Sleep(d)
		}
	}
	if d := time.Until(start.Add(dur)); d > 0 {
		time.Sleep(d)
	}
	stopLoops()
	end := time.Now()

	// Let the mesh settle, then check every acknowledged write is there.
	for _, c := range clusters {
		if ok, _ := c.Agent.Exited(); ok {
			t.Errorf("agent %s exited during the soak:\n%s", c.Name, c.Agent.LogTail(30))
		}
	}
	time.Sleep(15 * time.Second)
	res.WritesAcked = pol.acked + exp.acked
	res.WritesFailed = pol.failed + exp.failed
	res.WritesLost = append(checkPolicies(t, h, pol), checkExports(t, h, exp)...)
	res.DuplicateIDs = duplicates(h.Cablectl("cluster", "list", "-o", "json").Stdout, isIDKey)
	res.DuplicateVIPs = duplicates(h.Cablectl("service", "list", "-o", "json").Stdout, isVIPKey)

	for _, p := range pairs {
		attributeGaps(res.Faults, p.key(), harness.ReplyTimes(pingers[p.key()]), end)
	}
	for _, p := range pairs {
		replies := harness.ReplyTimes(pingers[p.key()])
		pr := PairResult{Pair: p.key()}
		var last time.Time
		for _, r := range replies {
			if r.Before(start) {
				last = r
				continue
			}
			if r.After(end) {
				break
			}
			pr.Replies++
			if !last.IsZero() {
				if g := r.Sub(last).Seconds(); g > pr.LongestGap {
					pr.LongestGap, pr.GapAt = g, r.UTC().Format("15:04:05.000")
				}
			}
			last = r
		}
		if !last.IsZero() {
			if g := end.Sub(last).Seconds(); g > pr.LongestGap {
				pr.LongestGap, pr.GapAt = g, "still down at the end"
			}
		}
		res.Pairs = append(res.Pairs, pr)
	}
	cur.mu.Lock()
	for _, c := range clusters {
		d := cur.longest[c.Name]
		if since, ok := cur.behind[c.Name]; ok {
			d = max(d, end.Sub(since))
		}
		res.NotCurrent[c.Name] = d.Seconds()
	}
	cur.mu.Unlock()
	res.LoadAfter = loadavg()
	res.Notes = append(res.Notes,
		"Every pair is connected under every policy the stream writes (each pair's policy is connect with a driver, or deleted so the default, connect over wireguard, decides): every pair should be up the whole time.",
		"Not current: the agent's status broker revision below the newest any connected agent reports, or the agent not connected to a broker, sampled every second.",
		"A write that failed (cablectl error, e.g. while a replica or etcd member was down) is not acknowledged: either its value or the previous one may hold at the end.")
	writeResults(t, res)
	if len(res.WritesLost) > 0 || len(res.DuplicateIDs) > 0 || len(res.DuplicateVIPs) > 0 {
		t.Errorf("lost writes %v, duplicate cluster IDs %v, duplicate VIPs %v", res.WritesLost, res.DuplicateIDs, res.DuplicateVIPs)
	}
}

// gapSlack is how long before a fault the last reply of the gap it caused may come (the reply
// to the ping sent just before).
const gapSlack = 2 * pingEvery

// attributeGaps charges each gap between two replies of pair to the fault in whose window (its
// start to the next fault's, or end) the gap began, keeping per fault the longest.
func attributeGaps(faults []Fault, pair string, replies []time.Time, end time.Time) {
	for i := range faults {
		from := faults[i].at.Add(-gapSlack)
		until := end
		if i+1 < len(faults) {
			until = faults[i+1].at.Add(-gapSlack)
		}
		for j := 1; j < len(replies); j++ {
			began := replies[j-1]
			if began.Before(from) || !began.Before(until) {
				continue
			}
			if g := replies[j].Sub(began).Seconds(); g > faults[i].LongestGap {
				faults[i].LongestGap, faults[i].GapPair = g, pair
			}
		}
	}
}

// supervise restarts, as a service manager would, every agent that exited, and returns what it
// saw: an exit is a defect of its own (the log says why), not a fault the soak injected.
func supervise(h *harness.HA, clusters []*harness.Cluster) []string {
	var out []string
	for _, c := range clusters {
		ok, code := c.Agent.Exited()
		if !ok {
			continue
		}
		sockets := harness.Run(h.Ctx, "ip", "netns", "exec", c.GwNS, "ss", "-ulpnH")
		links := harness.Run(h.Ctx, "ip", "-n", c.GwNS, "-d", "link", "show", "cbl-wg0")
		h.Logf("soak: agent %s exited (code %d); its namespace's UDP sockets:\n%s\ncbl-wg0: %s\nlog tail:\n%s",
			c.Name, code, sockets.Stdout, strings.TrimSpace(links.Stdout+links.Stderr), c.Agent.LogTail(12))
		lines := strings.Split(strings.TrimSpace(c.Agent.LogTail(1)), "\n")
		out = append(out, fmt.Sprintf("%s: agent %s exited (code %d) and was started again: %s",
			time.Now().UTC().Format("15:04:05"), c.Name, code, lines[len(lines)-1]))
		c.StartAgent()
	}
	return out
}

// inject makes one fault of kind on a target chosen with rng and returns once it is undone.
func inject(t *testing.T, h *harness.HA, rng *rand.Rand, clusters []*harness.Cluster, kind string) Fault {
	t.Helper()
	at := time.Now()
	f := Fault{At: at.UTC().Format("15:04:05.000"), Kind: kind, at: at}
	switch kind {
	case "broker":
		r := h.Replicas[rng.Intn(len(h.Replicas))]
		f.Target = fmt.Sprintf("replica %d", r.Index+1)
		h.Kill(r.Proc)
		time.Sleep(time.Duration(1+rng.Intn(4)) * time.Second)
		h.StartReplica(r)
	case "agent":
		c := clusters[rng.Intn(len(clusters))]
		f.Target = "agent " + c.Name
		h.Kill(c.Agent)
		time.Sleep(time.Duration(rng.Intn(3)) * time.Second)
		c.StartAgent()
	case "charon":
		c := clusters[rng.Intn(len(clusters))]
		f.Target = "charon in " + c.Name
		pids := charonPIDs(c.GwNS)
		if len(pids) == 0 {
			f.Note = "no charon in the namespace (no ipsec pair there now)"
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		f.Note = fmt.Sprintf("killed pid %v", pids)
		if err := harness.WaitFor(60*time.Second, 200*time.Millisecond, func() (bool, string) {
			// A new pid: the killed one may linger as a zombie until reaped.
			for _, pid := range charonPIDs(c.GwNS) {
				if !slices.Contains(pids, pid) {
					return true, ""
				}
			}
			return false, "no new charon yet"
		}); err != nil {
			f.Note += "; not restarted within 60 s"
			t.Errorf("charon of %s not restarted within 60 s:\n%s", c.Name, c.Agent.LogTail(30))
		}
	case "link":
		c := clusters[rng.Intn(len(clusters))]
		f.Target = "eth0 of " + c.Name
		down := linkDownFor + time.Duration(rng.Intn(3))*time.Second
		harness.Run(h.Ctx, "ip", "-n", c.GwNS, "link", "set", "eth0", "down")
		time.Sleep(down)
		if r := harness.Run(h.Ctx, "ip", "-n", c.GwNS, "link", "set", "eth0", "up"); r.Err != nil {
			t.Errorf("eth0 of %s back up: %s", c.Name, r)
		}
		if r := harness.Run(h.Ctx, "ip", "-n", c.GwNS, "-4", "addr", "show", "dev", "eth0"); !strings.Contains(r.Stdout, c.GwUnderlay.String()) {
			f.Note = "underlay address gone after link up: " + strings.TrimSpace(r.Stdout)
		}
	case "etcd":
		e := h.Etcd[rng.Intn(len(h.Etcd))]
		f.Target = e.Name
		h.Kill(e.Proc)
		time.Sleep(time.Duration(2+rng.Intn(4)) * time.Second)
		h.StartEtcd(e)
	}
	f.Back = time.Since(at).Seconds()
	h.Logf("soak fault: %s %s (%s) back after %.1fs", kind, f.Target, f.Note, f.Back)
	return f
}

func checkPolicies(t *testing.T, h *harness.HA, l *ledger) []string {
	r := h.Cablectl("connection-policy", "export")
	if r.Err != nil {
		t.Errorf("connection-policy export: %s", r)
		return []string{"policies unreadable: " + r.String()}
	}
	have := map[string]string{}
	for _, doc := range strings.Split(r.Stdout, "\n---") {
		name, driver := field(doc, "name:", 0), field(doc, "name:", 1)
		if strings.HasPrefix(name, "soak-") {
			have[name] = driver
		}
	}
	var lost []string
	l.mu.Lock()
	defer l.mu.Unlock()
	keys := map[string]bool{}
	for k := range l.want {
		keys[k] = true
	}
	for k := range l.uncertain {
		keys[k] = true
	}
	for k := range keys {
		if alts, ok := l.uncertain[k]; ok {
			if !slices.Contains(alts, have[k]) {
				lost = append(lost, fmt.Sprintf("policy %s is %q, neither of %q", k, have[k], alts))
			}
			continue
		}
		if have[k] != l.want[k] {
			lost = append(lost, fmt.Sprintf("policy %s: acknowledged %q, broker has %q", k, l.want[k], have[k]))
		}
	}
	sort.Strings(lost)
	return lost
}

// field returns the value after the (n+1)th occurrence of key in doc.
func field(doc, key string, n int) string {
	parts := strings.Split(doc, key)
	if len(parts) <= n+1 {
		return ""
	}
	return strings.Trim(strings.TrimSpace(strings.SplitN(parts[n+1], "\n", 2)[0]), `"`)
}

func checkExports(t *testing.T, h *harness.HA, l *ledger) []string {
	var out string
	err := harness.WaitFor(60*time.Second, time.Second, func() (bool, string) {
		r := h.Cablectl("service", "list", "-o", "json")
		out = r.Stdout
		return r.Err == nil, r.String()
	})
	if err != nil {
		return []string{"service list unreadable: " + err.Error()}
	}
	var lost []string
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, v := range l.want {
		if _, unsure := l.uncertain[k]; unsure {
			continue
		}
		svc := strings.SplitN(k, "/", 2)[1]
		present := strings.Contains(out, `"`+svc+`"`)
		if (v != "") != present {
			lost = append(lost, fmt.Sprintf("export %s: acknowledged %q, present at the broker %v", k, v, present))
		}
	}
	sort.Strings(lost)
	return lost
}

func isIDKey(k string) bool {
	k = strings.ToLower(k)
	return k == "id" || k == "clusterid"
}

func isVIPKey(k string) bool {
	k = strings.ToLower(k)
	return k == "vip" || k == "vips" || k == "clustersetip" || k == "clustersetips"
}

// duplicates walks a JSON document and returns the values of the keys keep accepts that belong
// to more than one named object (an object's identity is its namespace/name fields): a VIP listed
// twice for the same service is not a duplicate, one listed for two services is.
func duplicates(doc string, keep func(string) bool) []string {
	var v any
	if json.Unmarshal([]byte(doc), &v) != nil {
		return []string{"unreadable: " + doc}
	}
	owners := map[string]map[string]bool{}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			id := fmt.Sprintf("%v/%v", x["namespace"], x["name"])
			for k, e := range x {
				if !keep(k) {
					walk(e)
					continue
				}
				vals := []any{e}
				if l, ok := e.([]any); ok {
					vals = l
				}
				for _, z := range vals {
					s := fmt.Sprint(z)
					if z == nil || s == "" || s == "0" {
						continue
					}
					if owners[s] == nil {
						owners[s] = map[string]bool{}
					}
					owners[s][id] = true
				}
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(v)
	var out []string
	for val, ids := range owners {
		if len(ids) > 1 {
			out = append(out, fmt.Sprintf("%s (%d owners)", val, len(ids)))
		}
	}
	sort.Strings(out)
	return out
}

func writeResults(t *testing.T, res Result) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# Soak under faults (%s)\n\n", res.Date)
	fmt.Fprintf(&b, "Kernel %s, %d CPUs, load before %s, after %s (the machine is shared).\n\n", res.Kernel, res.CPUs, res.LoadBefore, res.LoadAfter)
	fmt.Fprintf(&b, "Command: `%s`\n\n", res.Command)
	fmt.Fprintf(&b, "%d clusters, %d broker replicas on %d etcd members, %.1f minutes, seed %d; a policy or export write every %s, a fault every %s.\n\n",
		res.Clusters, res.Replicas, res.EtcdMembers, res.Minutes, res.Seed, writeEvery, faultEvery)
	fmt.Fprintf(&b, "## Writes\n\nAcknowledged %d, failed (not acknowledged) %d, **lost %d** (goal 0).\n\n", res.WritesAcked, res.WritesFailed, len(res.WritesLost))
	for _, l := range res.WritesLost {
		fmt.Fprintf(&b, "- lost: %s\n", l)
	}
	fmt.Fprintf(&b, "Duplicate cluster IDs: **%d**; duplicate VIPs: **%d** (goal 0). %v %v\n\n", len(res.DuplicateIDs), len(res.DuplicateVIPs), res.DuplicateIDs, res.DuplicateVIPs)
	fmt.Fprintf(&b, "## Pairs (ping every %s pod to pod; each should be up the whole time)\n\n| pair | replies | longest gap (s) | gap ended at (UTC) |\n|---|---|---|---|\n", pingEvery)
	for _, p := range res.Pairs {
		fmt.Fprintf(&b, "| %s | %d | %.2f | %s |\n", p.Pair, p.Replies, p.LongestGap, p.GapAt)
	}
	fmt.Fprintf(&b, "\n## Agents: longest time not current (s)\n\n| agent | seconds |\n|---|---|\n")
	var names []string
	for n := range res.NotCurrent {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(&b, "| %s | %.0f |\n", n, res.NotCurrent[n])
	}
	fmt.Fprintf(&b, "\n## Per kind of fault: the longest pair outage it caused\n\n| kind | faults | longest pair gap (s) | pair | fault at (UTC) |\n|---|---|---|---|---|\n")
	for _, k := range []string{"broker", "agent", "charon", "link", "etcd"} {
		n, worst := 0, Fault{}
		for _, f := range res.Faults {
			if f.Kind != k {
				continue
			}
			n++
			if f.LongestGap >= worst.LongestGap {
				worst = f
			}
		}
		fmt.Fprintf(&b, "| %s | %d | %.2f | %s | %s |\n", k, n, worst.LongestGap, worst.GapPair, worst.At)
	}
	fmt.Fprintf(&b, "\n## Faults (%d)\n\n| at (UTC) | kind | target | undone after (s) | longest pair gap begun before the next fault (s) | pair | note |\n|---|---|---|---|---|---|---|\n", len(res.Faults))
	for _, f := range res.Faults {
		fmt.Fprintf(&b, "| %s | %s | %s | %.1f | %.2f | %s | %s |\n", f.At, f.Kind, f.Target, f.Back, f.LongestGap, f.GapPair, f.Note)
	}
	b.WriteString("\n")
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	benchresults.Save(t, "../results", "soak", res, b.String())
}
