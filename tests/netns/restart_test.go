package netns

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// Restarts that recover at once: an agent started again right after a SIGKILL (a supervisor
// that does not wait, or a node agent's container restarted while the old one is being torn
// down) and charon SIGKILLed under an IPsec pair.

const (
	// restartAfterKill is how soon after the old agent is stopped the new one starts.
	restartAfterKill = 30 * time.Millisecond
	// oldAgentLingers is how long the old agent still holds its TUN link and its DNS sockets
	// after the new one started. Where the kernel has no WireGuard the agent is two processes
	// (wireguard.RunIsolated: the one started, and its child in a mount namespace of its own,
	// which holds everything); a supervisor sees the first one gone while the child is still
	// exiting, the longer the more loaded the node (the soak met both leftovers 30 ms after the
	// kill). The test makes it certain: the old agent is stopped (SIGSTOP), the new one started,
	// and the old one SIGKILLed oldAgentLingers later.
	oldAgentLingers = 1500 * time.Millisecond
	// wgRestartOutage bounds the stop of a ping across a wireguard pair whose gateway agent is
	// killed and started again at once, counted from the moment the old agent stops: the new
	// agent replaces the old one's TUN link, retries its Init while the old one still holds the
	// UDP port, rebuilds the device with the same key and peers, and the first packet handshakes
	// again. Measured 2.48-2.68 s on a 2-CPU VM at load 2-17, about 1 s after the old agent died
	// (oldAgentLingers); the agent before these fixes gave up on wireguard (a leftover TUN link)
	// and then exited (DNS address in use): no recovery at all.
	wgRestartOutage = 10 * time.Second
	// charonRestartOutage bounds the stop of a ping across an ipsec pair when either end's
	// charon is SIGKILLed: the agent starts charon again (about 1 s: its supervisor polls every
	// 0.5 s and waits 0.5 s before a restart) and the restarted end initiates every connection
	// at once. Before, a restarted responder waited for the peer's dead peer detection:
	// 23-38 s.
	charonRestartOutage = 6 * time.Second
	// restartPing is the ping interval across the pair.
	restartPing = 50 * time.Millisecond
)

// TestAgentRestartRightAfterKill kills a gateway's agent and starts it again 30 ms later,
// before the old process is gone (it still holds its TUN link and DNS sockets for
// oldAgentLingers), and checks that the new agent comes up and stays up, becomes current,
// carries the wireguard pair again within wgRestartOutage of the kill, and that its DNS server
// answers.
func TestAgentRestartRightAfterKill(t *testing.T) {
	harness.RequireRoot(t)
	m, left, right := startWireGuardPair(t)
	pinger := m.StartTimedPinger("restart-ping", left.PodNS, right.PodIP, restartPing)
	waitReplies(t, pinger, 5)

	old := left.Agent
	killed := time.Now()
	if err := syscall.Kill(-old.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatalf("SIGSTOP agent: %v", err)
	}
	time.Sleep(restartAfterKill)
	left.StartAgent()
	restarted := time.Since(killed)
	time.Sleep(oldAgentLingers)
	if err := syscall.Kill(-old.Pid(), syscall.SIGKILL); err != nil {
		t.Fatalf("SIGKILL agent: %v", err)
	}
	if _, err := old.Wait(10 * time.Second); err != nil {
		t.Fatalf("killed agent: %v", err)
	}
	m.Logf("agent stopped; the new one started %s later, the old one SIGKILLed and gone %s after it was stopped",
		restarted.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))

	// The wireguard pair carries the ping again.
	var gap, resumed time.Duration
	if err := harness.WaitFor(wgRestartOutage+5*time.Second, 100*time.Millisecond, func() (bool, string) {
		g, r, ok := harness.Outage(harness.ReplyTimes(pinger), killed)
		gap, resumed = g, r
		return ok && r > 0, "no ping reply since the kill"
	}); err != nil {
		t.Fatalf("wireguard pair: %v\nnew agent's log:\n%s", err, left.Agent.LogTail(40))
	}
	m.Logf("wireguard pair: ping (every %s) stopped for %s; first reply %s after the old agent was stopped", restartPing, gap.Round(time.Millisecond), resumed.Round(time.Millisecond))
	if gap > wgRestartOutage {
		t.Errorf("wireguard pair down %s across the agent restart, want at most %s", gap.Round(time.Millisecond), wgRestartOutage)
	}

	// The new agent is current: connected to the broker at the revision the other agent has.
	if err := harness.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, string) {
		st, err := left.Status()
		if err != nil {
			return false, err.Error()
		}
		other, err := right.Status()
		if err != nil {
			return false, err.Error()
		}
		if !st.Broker.Connected || st.Broker.Revision < other.Broker.Revision {
			return false, fmt.Sprintf("connected %v, revision %d, the other agent's %d", st.Broker.Connected, st.Broker.Revision, other.Broker.Revision)
		}
		return true, ""
	}); err != nil {
		t.Errorf("restarted agent not current: %v", err)
	}
	st, err := left.Status()
	if err != nil {
		t.Fatal(err)
	}
	if d := st.Drivers; !driverRuns(d, harness.DriverWireGuard) {
		t.Errorf("wireguard does not run in the restarted agent: %+v", d)
	}

	// Its DNS server answers (the zone's SOA).
	var dig harness.DigResult
	if err := harness.WaitFor(20*time.Second, 200*time.Millisecond, func() (bool, string) {
		dig = m.Dig(left.PodNS, left.DNSAddr(), "clusterset.local", "SOA")
		return dig.Status == "NOERROR", "dig: " + strings.TrimSpace(dig.Raw)
	}); err != nil {
		t.Errorf("DNS of the restarted agent: %v", err)
	}
	time.Sleep(time.Second)
	if ok, code := left.Agent.Exited(); ok {
		t.Fatalf("the restarted agent exited (code %d):\n%s", code, left.Agent.LogTail(40))
	}
	// What the new agent met and did, for the log: its predecessor's TUN link, the DNS address
	// in use, the retries.
	b, err := os.ReadFile(left.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	log := string(b)
	if i := strings.LastIndex(log, "\n=== "); i >= 0 { // the harness's line before the new agent's
		log = log[i:]
	}
	for _, line := range strings.Split(log, "\n") {
		for _, key := range []string{"left by an earlier run", "address in use, retrying", "initialisation failed; retrying", "cable driver ready", "dns server listening"} {
			if strings.Contains(line, key) {
				m.Logf("new agent: %s", line)
				break
			}
		}
	}
}

// driverRuns reports whether the status' drivers list name as running.
// startWireGuardPair starts the agents of two clusters, left and right, with flags, and waits
// until their pair is connected over wireguard (the default driver).
func startWireGuardPair(t *testing.T, flags ...string) (m *harness.Mesh, left, right *harness.Cluster) {
	t.Helper()
	m = harness.New(t)
	left, right = m.AddCluster("left", "10.1.0.0/16"), m.AddCluster("right", "10.2.0.0/16")
	both := []*harness.Cluster{left, right}
	started := time.Now()
	for _, c := range both {
		c.StartAgent(flags...)
	}
	conv := m.WaitWants(2*time.Minute, started, both, nil, harness.Connected(harness.DriverWireGuard))
	m.Logf("connected over wireguard %s after the agents started", conv.ConnectedAfter("left", "right").Round(time.Millisecond))
	return m, left, right
}

func driverRuns(drivers []statusapi.DriverStatus, name string) bool {
	return slices.ContainsFunc(drivers, func(d statusapi.DriverStatus) bool { return d.Name == name && d.Running })
}

// TestCharonKillUnderIPsecPair SIGKILLs charon on each end of an ipsec pair in turn (the
// responder first, whose restart waited for the peer's dead peer detection, then the initiator)
// under a ping every 50 ms, and checks the pair is back within charonRestartOutage each time.
func TestCharonKillUnderIPsecPair(t *testing.T) {
	harness.RequireRoot(t)
	harness.RequireIPsec(t)
	m, left, right := startSwitchPair(t, "wireguard (the default)")
	both := []*harness.Cluster{left, right}
	t0 := m.Apply(m.PolicyFile("switch-pair-ipsec.yaml", pairPolicy(harness.DriverIPsec)))
	conv := m.WaitWants(PolicyTimeout, t0, both, nil, harness.Connected(harness.DriverIPsec))
	m.Logf("on ipsec %s after the policy", conv.ConnectedAfter("left", "right").Round(time.Millisecond))
	pinger := m.StartTimedPinger("charon-ping", left.PodNS, right.PodIP, restartPing)
	waitReplies(t, pinger, 5)

	// The initiator is the end with the smaller underlay address.
	initiator, responder := left, right
	if right.GwUnderlay.Less(left.GwUnderlay) {
		initiator, responder = right, left
	}
	for _, c := range []struct {
		role string
		gw   *harness.Cluster
	}{{"responder", responder}, {"initiator", initiator}} {
		pids := charonPIDs(t, c.gw.GwNS)
		if len(pids) == 0 {
			t.Fatalf("no charon in %s's namespace", c.gw.Name)
		}
		killed := time.Now()
		for _, pid := range pids {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("SIGKILL charon %d: %v", pid, err)
			}
		}
		var gap, resumed time.Duration
		if err := harness.WaitFor(charonRestartOutage+40*time.Second, 100*time.Millisecond, func() (bool, string) {
			g, r, ok := harness.Outage(harness.ReplyTimes(pinger), killed)
			gap, resumed = g, r
			return ok && r > 0 && time.Since(killed) > time.Second, "no ping reply since the kill"
		}); err != nil {
			t.Fatalf("%s (%s) charon killed: %v\nagent log:\n%s", c.role, c.gw.Name, err, c.gw.Agent.LogTail(40))
		}
		m.Logf("%s (%s) charon %v SIGKILLed: ping (every %s) stopped for %s; first reply %s after the kill",
			c.role, c.gw.Name, pids, restartPing, gap.Round(time.Millisecond), resumed.Round(time.Millisecond))
		if gap > charonRestartOutage {
			t.Errorf("%s's charon killed: pair down %s, want at most %s", c.role, gap.Round(time.Millisecond), charonRestartOutage)
		}
		if newPIDs := charonPIDs(t, c.gw.GwNS); len(newPIDs) == 0 || slices.Equal(newPIDs, pids) {
			t.Errorf("%s: charon pids %v after the kill, before %v: not restarted", c.gw.Name, newPIDs, pids)
		}
		time.Sleep(2 * time.Second) // a steady pair before the next kill
	}
}

// waitReplies waits until pinger has logged n replies.
func waitReplies(t *testing.T, pinger *harness.Process, n int) {
	t.Helper()
	if err := harness.WaitFor(20*time.Second, 50*time.Millisecond, func() (bool, string) {
		got := len(harness.ReplyTimes(pinger))
		return got >= n, strconv.Itoa(got) + " replies"
	}); err != nil {
		t.Fatalf("ping across the pair before the fault: %v\n%s", err, pinger.Log())
	}
}

// charonPIDs are the live charon processes whose network namespace is the named one (pkill
// would match every namespace's; a killed one lingering as a zombie is left out).
func charonPIDs(t *testing.T, ns string) []int {
	t.Helper()
	want, err := os.Stat(filepath.Join("/run/netns", ns))
	if err != nil {
		t.Fatalf("namespace %s: %v", ns, err)
	}
	wantIno := want.Sys().(*syscall.Stat_t).Ino
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, err := os.ReadFile(filepath.Join("/proc", e.Name(), "comm"))
		if err != nil || strings.TrimSpace(string(comm)) != "charon" {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err != nil || zombie(string(stat)) {
			continue
		}
		st, err := os.Stat(filepath.Join("/proc", e.Name(), "ns", "net"))
		if err != nil || st.Sys().(*syscall.Stat_t).Ino != wantIno {
			continue
		}
		out = append(out, pid)
	}
	slices.Sort(out)
	return out
}

// zombie reports whether a /proc/<pid>/stat line is a zombie's (state Z after the command).
func zombie(stat string) bool {
	i := strings.LastIndexByte(stat, ')')
	return i >= 0 && len(stat) > i+2 && stat[i+2] == 'Z'
}
