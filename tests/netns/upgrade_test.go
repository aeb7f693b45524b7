package netns

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// previousVersion is the release an upgrade starts from: main as the previous round of work
// left it (the last commit before the round that split the agent into components, added the
// xDS socket guard, the per-cluster export quota and the service export over the agent's
// socket). It must be on main's history, so every full clone can build it.
const previousVersion = "98843a3fa399c2677b6020adaa3170cbb06d85e4"

// upgradeMaxStall is the longest a TCP stream or a ping across a pair may stall at any step of a
// rolling upgrade.
const upgradeMaxStall = time.Second

// upgradePingEvery is the interval of the pings across every pair.
const upgradePingEvery = 100 * time.Millisecond

// upgradeSettle is how long each step of the upgrade lets traffic run after the mesh reports
// itself whole again, before the next step: a stall that shows late is still the step's.
const upgradeSettle = 3 * time.Second

// requireUpgrade skips the upgrade tests where they cannot run: without root, ipsec, etcd (the
// HA mesh checks it), the previous version's commit in the git history, or in the VM of tests/vm
// (no go toolchain use there, and it runs the kernel datapath tests only).
func requireUpgrade(t *testing.T) {
	t.Helper()
	harness.RequireRoot(t)
	if os.Getenv("CABLEMESH_VM") == "1" {
		t.Skip("skipping in the VM: the upgrade tests build the previous version with the go toolchain")
	}
	harness.RequireIPsec(t)
	harness.RequireCommit(t, previousVersion)
}

// previousBinaries builds (once per machine: cached by commit) the previous version's binaries.
func previousBinaries(t *testing.T) harness.Binaries {
	t.Helper()
	start := time.Now()
	old, err := harness.BuildVersion(context.Background(), previousVersion)
	if err != nil {
		t.Fatalf("previous version: %v", err)
	}
	t.Logf("previous version %s: binaries ready in %s (%s)", previousVersion[:12], time.Since(start).Round(time.Millisecond), old.Agent)
	return old
}

// upgradePair is one pair of the upgrade mesh and the driver its policy puts it on.
type upgradePair struct {
	a, b   *harness.Cluster
	driver string
	label  string // the label both ends carry, which the pair's policy selects
}

func (p upgradePair) String() string {
	return fmt.Sprintf("%s<->%s (%s)", p.a.Name, p.b.Name, p.driver)
}

// pairDriverPolicy connects the clusters labelled label=yes over driver.
func pairDriverPolicy(label, driver string) string {
	return fmt.Sprintf(`kind: ClusterConnectionPolicy
metadata:
  name: upgrade-%s
spec:
  clusterSelector:
    %s: "yes"
  topology: full-mesh
  connectionPolicy: connect
  cableDriver:
    name: %s
  priority: 5
`, label, label, driver)
}

// upgradeExports is the exports block of a cluster whose pod is podIP.
func upgradeExports(name, podIP string) string {
	return fmt.Sprintf(`exports:
- {name: web-%s, namespace: shop, ports: [{name: http, port: 80, protocol: TCP}], endpoints: [{ip: %s}]}
- {name: db-%s, namespace: shop, type: Headless, ports: [{name: pg, port: 5432, protocol: TCP}], endpoints: [{ip: %s, hostname: db-0}]}
`, name, podIP, name, podIP)
}

// addHACluster adds a cluster to an HA mesh with labels and extra agent config, its agent
// config naming every broker replica; the agent is not started.
func addHACluster(t *testing.T, h *harness.HA, name, podCIDR, labels, extra string) *harness.Cluster {
	t.Helper()
	c := h.NewCluster(name, podCIDR)
	r := h.JoinToken(name, podCIDR, "--labels", labels)
	if r.Err != nil {
		t.Fatalf("join token for %s: %s", name, r)
	}
	c.WriteToken(strings.TrimSpace(r.Stdout))
	single := "broker: " + h.BrokerAddress() + "\n"
	cfg := c.ConfigYAML(extra + upgradeExports(name, c.PodIP.String()))
	if !strings.Contains(cfg, single) {
		t.Fatalf("agent config of %s has no %q line to replace", name, strings.TrimSpace(single))
	}
	if err := os.WriteFile(c.ConfigPath, []byte(strings.Replace(cfg, single, "broker: "+h.BrokerList()+"\n", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	return c
}

// upgradeStep is one step of the rolling upgrade: what was upgraded and when.
type upgradeStep struct {
	name       string
	start, end time.Time
	// whole is how long after the step's start the mesh reported every pair connected again.
	whole time.Duration
}

// pairTraffic is the traffic across one pair: a TCP stream and a timed ping, pod to pod.
type pairTraffic struct {
	pair   upgradePair
	stream *harness.Process
	ping   *harness.Process
}

// TestUpgradeRolling upgrades a running mesh from the previous version (previousVersion, built
// from git) to the working tree's, as an operator does: the broker replicas on etcd one at a
// time, then the gateways' agents one node at a time, while a TCP stream and a ping cross each
// of three pairs, one per cable driver (a policy per pair). It checks, per driver and per step:
// no TCP connection reset, no stall of the stream or the ping of upgradeMaxStall or more; and
// across the whole upgrade: every policy and export is still there, each WireGuard peer keeps
// its public key, the IPsec SAs are the same ones (charon and its SAs outlive the agent), the
// VXLAN links are the same links. The new binaries start on the old ones' files (the brokers'
// etcd data, the agents' state dirs, the bpffs pins), so the persisted formats are covered.
// Version skew is checked on the way: old agents with new brokers (after the broker steps) and
// new agents with old ones (the pairs of a new and an old agent).
func TestUpgradeRolling(t *testing.T) {
	requireUpgrade(t)
	testStart := time.Now()
	old := previousBinaries(t)
	h := harness.NewHAOn(t, 1, 2, old.Broker)
	extra := harness.MultiDriverConfig()
	a := addHACluster(t, h, "a", "10.1.0.0/16", "pwg=yes,pipsec=yes", extra)
	b := addHACluster(t, h, "b", "10.2.0.0/16", "pwg=yes,pvx=yes", extra)
	c := addHACluster(t, h, "c", "10.3.0.0/16", "pvx=yes,pipsec=yes", extra)
	all := []*harness.Cluster{a, b, c}
	pairs := []upgradePair{
		{a, b, harness.DriverWireGuard, "pwg"},
		{b, c, harness.DriverVXLAN, "pvx"},
		{c, a, harness.DriverIPsec, "pipsec"},
	}
	wants := harness.Wants{}
	for _, p := range pairs {
		wants[harness.PairKey(p.a.Name, p.b.Name)] = harness.Connected(p.driver)
		h.Apply(h.PolicyFile("upgrade-"+p.label+".yaml", pairDriverPolicy(p.label, p.driver)))
	}
	for _, cl := range all {
		cl.AgentBin = old.Agent
		cl.StartAgent()
	}
	h.WaitWants(2*time.Minute, time.Now(), all, wants, harness.Connected(harness.DriverWireGuard))
	newVersion := currentVersion(t, h.Mesh)
	oldVersion := previousVersion[:12]
	waitVersions(t, h.Mesh, all, oldVersion, oldVersion)

	before := meshRecords(t, h.Mesh)
	for what, names := range map[string][]string{
		"connection policies": {"upgrade-pwg", "upgrade-pvx", "upgrade-pipsec"},
		"services":            {"web-a", "db-a", "web-b", "db-b", "web-c", "db-c"},
	} {
		for _, n := range names {
			if !strings.Contains(before[what], `"`+n+`"`) {
				t.Fatalf("%s before the upgrade lack %s: %s", what, n, before[what])
			}
		}
	}
	keysBefore := wgPeerKeys(t, pairs)
	sasBefore := ipsecSPIs(t, h.Mesh, pairs)
	vxBefore := vxlanLinks(pairs)

	var traffic []pairTraffic
	for _, cl := range all {
		cl.StartTCPServer()
	}
	for _, p := range pairs {
		name := fmt.Sprintf("upgrade-%s-%s", p.a.Name, p.b.Name)
		traffic = append(traffic, pairTraffic{pair: p,
			stream: h.StartGapStream(name+"-stream", p.a.PodNS, p.b.PodIP, 20*time.Minute, StreamStallLimit),
			ping:   h.StartTimedPinger(name+"-ping", p.a.PodNS, p.b.PodIP, upgradePingEvery)})
	}
	steps := []upgradeStep{{name: "before the upgrade", start: time.Now()}}
	time.Sleep(upgradeSettle)
	for _, tr := range traffic {
		if ok, code := tr.stream.Exited(); ok {
			t.Fatalf("%s: the stream ended (exit %d) before the upgrade:\n%s", tr.pair, code, tr.stream.Log())
		}
	}
	step := func(name string, upgrade func()) {
		steps[len(steps)-1].end = time.Now()
		s := upgradeStep{name: name, start: time.Now()}
		upgrade()
		h.WaitWants(PolicyTimeout, s.start, all, wants, harness.Connected(harness.DriverWireGuard))
		s.whole = time.Since(s.start)
		h.Logf("upgrade step %q: the mesh whole again %s after its start", name, s.whole.Round(time.Millisecond))
		steps = append(steps, s)
		time.Sleep(upgradeSettle)
	}
	for _, r := range h.Replicas {
		step(fmt.Sprintf("broker replica %d", r.Index+1), func() {
			if _, err := r.Proc.Stop(10 * time.Second); err != nil {
				t.Errorf("stop broker replica %d: %v", r.Index+1, err)
			}
			r.Bin = ""
			h.StartReplica(r)
		})
	}
	t.Run("old agents with the new brokers", func(t *testing.T) {
		waitVersions(t, h.Mesh, all, oldVersion, newVersion)
	})
	// Until the last step, some pairs join a new agent and an old one: the step's wait for the
	// whole mesh checks they connect.
	for _, cl := range all {
		step("agent "+cl.Name, func() {
			cl.StopAgent()
			cl.AgentBin = ""
			cl.StartAgent()
		})
	}
	steps[len(steps)-1].end = time.Now()
	waitVersions(t, h.Mesh, all, newVersion, newVersion)

	results := stopTraffic(t, traffic)
	checkUpgradeTraffic(t, h.Mesh, traffic, results, steps)

	after := meshRecords(t, h.Mesh)
	for what, b := range before {
		if after[what] != b {
			t.Errorf("%s changed across the upgrade:\nbefore: %s\nafter:  %s", what, b, after[what])
		}
	}
	keysAfter := wgPeerKeys(t, pairs)
	for k, v := range keysBefore {
		if keysAfter[k] != v {
			t.Errorf("re-keyed: %s: WireGuard public key %s -> %s", k, v, keysAfter[k])
		}
	}
	sasAfter := ipsecSPIs(t, h.Mesh, pairs)
	for k, v := range sasBefore {
		if !slices.Equal(sasAfter[k], v) {
			t.Errorf("re-keyed: %s: IPsec SAs re-established across the upgrade: SPIs %v -> %v", k, v, sasAfter[k])
		}
	}
	vxAfter := vxlanLinks(pairs)
	for k, v := range vxBefore {
		if vxAfter[k] != v {
			t.Errorf("%s: the VXLAN link was re-created across the upgrade: ifindex %d -> %d", k, v, vxAfter[k])
		}
	}
	h.Logf("re-keys: WireGuard public keys %d/%d kept, IPsec SAs %d/%d kept, VXLAN links %d/%d kept",
		countSame(keysBefore, keysAfter), len(keysBefore), countSameSlices(sasBefore, sasAfter), len(sasBefore), countSame(vxBefore, vxAfter), len(vxBefore))
	h.Logf("upgrade test ran %s (load %s)", time.Since(testStart).Round(time.Second), loadAverage())
}

// TestUpgradeVersionSkew runs one pair of a new agent and an old one (previousVersion) on the
// previous version's broker (the embedded store), then upgrades the broker: both directions of
// skew, a new agent with an old broker and an old agent with a new broker, must connect the
// pair, carry traffic and report the right versions.
func TestUpgradeVersionSkew(t *testing.T) {
	requireUpgrade(t)
	old := previousBinaries(t)
	cur, err := harness.Build(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	bins := old
	bins.Cablectl = cur.Cablectl
	m := harness.NewWithBinaries(t, bins)
	x := m.AddLabelledCluster("x", "10.1.0.0/16", "", harness.MultiDriverConfig())
	y := m.AddLabelledCluster("y", "10.2.0.0/16", "", harness.MultiDriverConfig())
	x.AgentBin, y.AgentBin = cur.Agent, old.Agent
	both := []*harness.Cluster{x, y}
	for _, c := range both {
		c.StartAgent()
	}
	newVersion, oldVersion := currentVersion(t, m), previousVersion[:12]
	for _, c := range both {
		c.StartTCPServer()
	}
	check := func(t *testing.T, brokerVersion string) {
		t.Helper()
		m.WaitWants(2*time.Minute, time.Now(), both, nil, harness.Connected(harness.DriverWireGuard))
		waitVersion(t, m, x, newVersion, brokerVersion)
		waitVersion(t, m, y, oldVersion, brokerVersion)
		for _, p := range [][2]*harness.Cluster{{x, y}, {y, x}} {
			if ok, r := m.PingOK(p[0].PodNS, p[1].PodIP, 3); !ok {
				t.Errorf("ping %s pod -> %s pod: %d/%d: %s", p[0].Name, p[1].Name, r.Received, r.Transmitted, r.Output)
			}
			if r := m.TCPCheck(p[0].PodNS, p[1].PodIP); r.Err != nil {
				t.Errorf("tcp %s pod -> %s pod: %s", p[0].Name, p[1].Name, r)
			}
		}
	}
	t.Run("a new agent with an old broker", func(t *testing.T) { check(t, oldVersion) })
	m.StopBroker()
	m.Bin.Broker = cur.Broker
	m.StartBroker()
	t.Run("an old agent with a new broker", func(t *testing.T) { check(t, newVersion) })
}

// currentVersion is the working tree's version string, as its cablectl reports it.
func currentVersion(t *testing.T, m *harness.Mesh) string {
	t.Helper()
	r := harness.Run(m.Ctx, m.Bin.Cablectl, "version", "--client", "-o", "json")
	var v struct {
		Client string `json:"client"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil || v.Client == "" {
		t.Fatalf("cablectl version: %s (%v)", r, err)
	}
	if v.Client == previousVersion[:12] {
		t.Fatalf("the working tree's build calls itself %s, the previous version's name", v.Client)
	}
	return v.Client
}

// waitVersion waits until c's agent reports itself as agentVersion, connected to a broker that
// reports itself as brokerVersion (learnt on its next heartbeat after a broker upgrade).
func waitVersion(t *testing.T, m *harness.Mesh, c *harness.Cluster, agentVersion, brokerVersion string) {
	t.Helper()
	err := harness.WaitFor(45*time.Second, 250*time.Millisecond, func() (bool, string) {
		st, err := c.Status()
		if err != nil {
			return false, err.Error()
		}
		desc := fmt.Sprintf("agent %s, broker %s (connected %v, error %q)", st.Version, st.Broker.Version, st.Broker.Connected, st.Broker.Error)
		return st.Version == agentVersion && st.Broker.Version == brokerVersion && st.Broker.Connected, desc
	})
	if err != nil {
		t.Errorf("%s: want agent %s with broker %s: %v", c.Name, agentVersion, brokerVersion, err)
		return
	}
	m.Logf("%s: agent %s, broker %s, connected", c.Name, agentVersion, brokerVersion)
}

func waitVersions(t *testing.T, m *harness.Mesh, cs []*harness.Cluster, agentVersion, brokerVersion string) {
	t.Helper()
	for _, c := range cs {
		waitVersion(t, m, c, agentVersion, brokerVersion)
	}
}

// meshRecords are the broker's policies and exports as cablectl lists them, by what they are.
func meshRecords(t *testing.T, m *harness.Mesh) map[string]string {
	t.Helper()
	out := map[string]string{}
	for what, args := range map[string][]string{
		"connection policies": {"connection-policy", "list", "-o", "json"},
		"services":            {"service", "list", "-o", "json"},
	} {
		r := m.Cablectl(args...)
		if r.Err != nil {
			t.Fatalf("cablectl %s: %s", strings.Join(args, " "), r)
		}
		out[what] = canonicalJSON(t, r.Stdout)
	}
	return out
}

// canonicalJSON re-encodes a JSON document with sorted keys and no spacing.
func canonicalJSON(t *testing.T, s string) string {
	t.Helper()
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// wgPeerKeys are, for each end of every WireGuard pair, the public key it holds for the other
// end's gateway, keyed "a's peer b".
func wgPeerKeys(t *testing.T, pairs []upgradePair) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, p := range pairs {
		if p.driver != harness.DriverWireGuard {
			continue
		}
		for _, e := range [][2]*harness.Cluster{{p.a, p.b}, {p.b, p.a}} {
			out[fmt.Sprintf("%s's peer %s", e[0].Name, e[1].Name)] = wgPeerOf(t, e[0], e[1]).PublicKey
		}
	}
	return out
}

// spiRE matches the SPIs in `swanctl --list-sas`: IKE SPIs (16 hex digits, _i or _r) and
// CHILD_SA SPIs ("in  c1234567," / "out c89abcde,").
var spiRE = regexp.MustCompile(`\b([0-9a-f]{16})_[ir]\b|\b(?:in|out)\s+([0-9a-f]{8})\b`)

// ipsecSPIs are, for each end of every IPsec pair, the SPIs of its SAs, sorted.
func ipsecSPIs(t *testing.T, m *harness.Mesh, pairs []upgradePair) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, p := range pairs {
		if p.driver != harness.DriverIPsec {
			continue
		}
		for _, c := range []*harness.Cluster{p.a, p.b} {
			hv := c.Host()
			var spis []string
			for _, mm := range spiRE.FindAllStringSubmatch(hv.SAs, -1) {
				spis = append(spis, mm[1]+mm[2])
			}
			sort.Strings(spis)
			if len(spis) == 0 {
				t.Errorf("%s: no IPsec SA to compare (%s): %s", c.Name, hv.SAsError, hv.SAs)
			}
			out[c.Name+" ipsec"] = spis
		}
	}
	return out
}

// vxlanLinks are the ifindex of the VXLAN link on each end of every VXLAN pair.
func vxlanLinks(pairs []upgradePair) map[string]int {
	out := map[string]int{}
	for _, p := range pairs {
		if p.driver != harness.DriverVXLAN {
			continue
		}
		for _, c := range []*harness.Cluster{p.a, p.b} {
			_, idx := linkKind(c, fmt.Sprintf("%s%d", harness.VXLANLinkPrefix, harness.VXLANVNI))
			out[c.Name+" vxlan"] = idx
		}
	}
	return out
}

// trafficResult is what one pair's traffic measured over the whole upgrade.
type trafficResult struct {
	stream     harness.StreamResult
	streamCode int
	streamErr  error
	replies    []time.Time
}

// stopTraffic ends every stream (SIGTERM: it prints its result) and pinger.
func stopTraffic(t *testing.T, traffic []pairTraffic) []trafficResult {
	t.Helper()
	var out []trafficResult
	for _, tr := range traffic {
		var res trafficResult
		if ok, _ := tr.stream.Exited(); !ok {
			if _, err := tr.stream.Stop(30 * time.Second); err != nil {
				t.Errorf("%s: stop the stream: %v", tr.pair, err)
			}
		}
		res.stream, res.streamCode, res.streamErr = harness.ReadStream(tr.stream, 10*time.Second)
		if _, err := tr.ping.Stop(5 * time.Second); err != nil {
			t.Errorf("%s: stop the ping: %v", tr.pair, err)
		}
		res.replies = harness.ReplyTimes(tr.ping)
		out = append(out, res)
	}
	return out
}

// checkUpgradeTraffic attributes every stall of each pair's stream and ping to the step it began
// in, logs the table per driver and step, and fails on a reset or a stall of upgradeMaxStall.
func checkUpgradeTraffic(t *testing.T, m *harness.Mesh, traffic []pairTraffic, results []trafficResult, steps []upgradeStep) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "rolling upgrade %s -> working tree: longest stall per driver and step (TCP stream of 16 KiB echoes every 10ms / ping every %s, pod to pod)\n", previousVersion[:12], upgradePingEvery)
	fmt.Fprintf(&b, "| step | whole again after |")
	for _, tr := range traffic {
		fmt.Fprintf(&b, " %s stream | %s ping |", tr.pair.driver, tr.pair.driver)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|---|", len(traffic)) + "\n")
	for _, s := range steps {
		fmt.Fprintf(&b, "| %s | %s |", s.name, s.whole.Round(time.Millisecond))
		for i, tr := range traffic {
			res := results[i]
			streamGap := streamStallIn(tr.stream.Started(), res.stream, s)
			pingGap := pingStallIn(res.replies, s)
			fmt.Fprintf(&b, " %s | %s |", streamStall(streamGap), pingGap.Round(time.Millisecond))
			if streamGap >= upgradeMaxStall {
				t.Errorf("%s: the TCP stream stalled %s at step %q (limit %s)", tr.pair, streamGap.Round(time.Millisecond), s.name, upgradeMaxStall)
			}
			if pingGap >= upgradeMaxStall {
				t.Errorf("%s: the ping stalled %s at step %q (limit %s)", tr.pair, pingGap.Round(time.Millisecond), s.name, upgradeMaxStall)
			}
		}
		b.WriteString("\n")
	}
	for i, tr := range traffic {
		res := results[i]
		resets := 0
		switch {
		case res.streamErr != nil:
			t.Errorf("%s: %v", tr.pair, res.streamErr)
		case res.streamCode != 0 || res.stream.Error != "":
			resets = 1
			t.Errorf("%s: the TCP stream broke during the upgrade (exit %d): %s", tr.pair, res.streamCode, res.stream.Error)
		}
		fmt.Fprintf(&b, "%s: stream %d echoes, longest stall %.0fms, connection resets %d; ping %d replies\n",
			tr.pair, res.stream.Rounds, res.stream.MaxGapMs, resets, len(res.replies))
	}
	m.Logf("%s", b.String())
}

// streamGapReport is the shortest stall a gap stream reports (StartGapStream's -gap-report).
const streamGapReport = 100 * time.Millisecond

// streamStall prints a stream's longest stall in a step; one it did not report is shorter than
// streamGapReport.
func streamStall(d time.Duration) string {
	if d == 0 {
		return "<" + streamGapReport.String()
	}
	return d.Round(time.Millisecond).String()
}

// streamStallIn is the longest stall of a stream that began within step s (a stall is reported
// at its end: AtMs after the stream's start, Ms long).
func streamStallIn(started time.Time, res harness.StreamResult, s upgradeStep) time.Duration {
	var longest time.Duration
	for _, g := range res.Gaps {
		d := time.Duration(g.Ms * float64(time.Millisecond))
		begin := started.Add(time.Duration(g.AtMs * float64(time.Millisecond))).Add(-d)
		if !begin.Before(s.start) && begin.Before(s.end) && d > longest {
			longest = d
		}
	}
	return longest
}

// pingStallIn is the longest time without a reply, beyond the ping's own interval, that began
// within step s.
func pingStallIn(replies []time.Time, s upgradeStep) time.Duration {
	var longest time.Duration
	for i := 1; i < len(replies); i++ {
		begin := replies[i-1]
		if begin.Before(s.start) || !begin.Before(s.end) {
			continue
		}
		if d := replies[i].Sub(begin) - upgradePingEvery; d > longest {
			longest = d
		}
	}
	return longest
}

func countSame[K comparable, V comparable](a, b map[K]V) int {
	n := 0
	for k, v := range a {
		if w, ok := b[k]; ok && w == v {
			n++
		}
	}
	return n
}

func countSameSlices(a, b map[string][]string) int {
	n := 0
	for k, v := range a {
		if slices.Equal(b[k], v) {
			n++
		}
	}
	return n
}

// loadAverage is the machine's 1, 5 and 15 minute load, for the log of a timing test.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
