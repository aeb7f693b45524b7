package netns

import (
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// handoverOutage bounds the stop of a ping across a wireguard-go pair while its gateway agent
// hands the node over to a new agent started beside it (a DaemonSet rolled with maxSurge): the
// old agent stops its loops and closes its device, the new one opens its device, restores the
// peers and handshakes. The agents' part of a pod replacement measured 250 ms in docs/helm.md.
const handoverOutage = 600 * time.Millisecond

// TestAgentHandsTheNodeOverToANewAgent starts a second agent for a gateway whose agent runs, as a
// DaemonSet's surge pod does, and checks: the old agent stops as on a restart and then idles
// (it neither exits, which would make the kubelet restart it beside the new one, nor cleans
// up); the wireguard pair stops for at most handoverOutage; the new agent serves status and
// DNS; and the old one, stopped at last with SIGTERM, exits 0 without touching the datapath.
func TestAgentHandsTheNodeOverToANewAgent(t *testing.T) {
	harness.RequireRoot(t)
	m, left, right := startWireGuardPair(t, "--cleanup-on-exit")
	pinger := m.StartTimedPinger("handover-ping", left.PodNS, right.PodIP, restartPing)
	waitReplies(t, pinger, 5)

	old := left.Agent
	handover := time.Now()
	left.StartAgent("--cleanup-on-exit")
	// The old agent answers the new one, stops, and idles.
	if err := harness.WaitFor(20*time.Second, 50*time.Millisecond, func() (bool, string) {
		return strings.Contains(old.Log(), "node handed over to the next agent; idle until stopped"), "old agent not handed over yet"
	}); err != nil {
		t.Fatalf("%v\nlog:\n%s", err, old.LogTail(60))
	}
	m.Logf("old agent idle %s after the new one started", time.Since(handover).Round(time.Millisecond))

	var gap, resumed time.Duration
	if err := harness.WaitFor(20*time.Second, 100*time.Millisecond, func() (bool, string) {
		g, r, ok := harness.Outage(harness.ReplyTimes(pinger), handover)
		gap, resumed = g, r
		return ok && time.Since(handover) > 3*time.Second, "waiting for replies after the hand-over"
	}); err != nil {
		t.Fatalf("wireguard pair after the hand-over: %v\nlog:\n%s", err, left.Agent.LogTail(60))
	}
	m.Logf("wireguard pair: ping (every %s) stopped for %s across the hand-over (longest gap ending %s after the new agent started)",
		restartPing, gap.Round(time.Millisecond), resumed.Round(time.Millisecond))
	if gap > handoverOutage {
		t.Errorf("wireguard pair down %s across the hand-over, want at most %s", gap.Round(time.Millisecond), handoverOutage)
	}
	if exited, code := old.Exited(); exited {
		t.Fatalf("the old agent exited (code %d) after handing over; it must idle until stopped", code)
	}
	if !strings.Contains(left.Agent.Log(), "the running agent handed the node over") {
		t.Errorf("the new agent's log does not say it took the node over:\n%s", left.Agent.LogTail(60))
	}

	// The new agent is the node's: status, the wireguard pair, DNS.
	st, err := left.Status()
	if err != nil {
		t.Fatalf("new agent's status: %v", err)
	}
	if !driverRuns(st.Drivers, harness.DriverWireGuard) {
		t.Errorf("wireguard does not run in the new agent: %+v", st.Drivers)
	}
	if err := harness.WaitFor(20*time.Second, 200*time.Millisecond, func() (bool, string) {
		dig := m.Dig(left.PodNS, left.DNSAddr(), "clusterset.local", "SOA")
		return dig.Status == "NOERROR", "dig: " + strings.TrimSpace(dig.Raw)
	}); err != nil {
		t.Errorf("DNS of the new agent: %v", err)
	}

	// The old agent, stopped at last, leaves the node alone: it exits 0, cleans nothing (it was
	// started with --cleanup-on-exit), and the pair does not stop.
	stopped := time.Now()
	code, err := old.Stop(15 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("old agent stopped with %d, %v; want exit 0\n%s", code, err, old.LogTail(20))
	}
	time.Sleep(2 * time.Second)
	if g, _, _ := harness.Outage(harness.ReplyTimes(pinger), stopped); g > 4*restartPing {
		t.Errorf("the pair stopped %s after the idle old agent was stopped: it touched the datapath", g.Round(time.Millisecond))
	}
	if strings.Contains(old.Log(), "cleaned up") {
		t.Errorf("the old agent cleaned up after handing over:\n%s", old.LogTail(30))
	}
	if exited, code := left.Agent.Exited(); exited {
		t.Fatalf("the new agent exited (code %d):\n%s", code, left.Agent.LogTail(40))
	}
}

// handoverIPsecOutage bounds the stop of a ping across an ipsec pair (kernel-libipsec: ESP in
// charon) while its gateway agent hands the node over to an agent in another PID namespace: the
// old agent ends its charon (the new one cannot adopt it), the new agent starts its own, which
// initiates the pair at once.
const handoverIPsecOutage = 3 * time.Second

// TestAgentHandsAnIPsecNodeOver hands a gateway with an ipsec pair over twice: to an agent in the
// same PID namespace, which adopts the running charon (its SAs carry on, the pid stays), and to
// one in another PID namespace (unshare --pid, as a DaemonSet's next pod), for which the old
// agent ends its charon so that the new one's can take UDP 500 and the TUN device.
func TestAgentHandsAnIPsecNodeOver(t *testing.T) {
	harness.RequireRoot(t)
	harness.RequireIPsec(t)
	m, left, right := startSwitchPair(t, "wireguard (the default)")
	both := []*harness.Cluster{left, right}
	t0 := m.Apply(m.PolicyFile("switch-pair-ipsec.yaml", pairPolicy(harness.DriverIPsec)))
	m.WaitWants(PolicyTimeout, t0, both, nil, harness.Connected(harness.DriverIPsec))
	pinger := m.StartTimedPinger("handover-ipsec-ping", left.PodNS, right.PodIP, restartPing)
	waitReplies(t, pinger, 5)

	for _, step := range []struct {
		name    string
		wrapper []string
		adopted bool
		outage  time.Duration
	}{
		{"same PID namespace: charon adopted", nil, true, handoverOutage},
		{"another PID namespace: charon ended and started again", []string{"unshare", "--pid", "--fork", "--mount-proc", "--kill-child"}, false, handoverIPsecOutage},
	} {
		before := charonPIDs(t, left.GwNS)
		if len(before) != 1 {
			t.Fatalf("%s: charon pids in %s before: %v, want one", step.name, left.GwNS, before)
		}
		old := left.Agent
		handover := time.Now()
		left.AgentWrapper = step.wrapper
		left.StartAgent()
		if err := harness.WaitFor(20*time.Second, 50*time.Millisecond, func() (bool, string) {
			return strings.Contains(old.Log(), "node handed over to the next agent; idle until stopped"), "old agent not handed over yet"
		}); err != nil {
			t.Fatalf("%s: %v\nlog:\n%s", step.name, err, old.LogTail(60))
		}
		var gap time.Duration
		if err := harness.WaitFor(30*time.Second, 100*time.Millisecond, func() (bool, string) {
			g, _, ok := harness.Outage(harness.ReplyTimes(pinger), handover)
			gap = g
			return ok && time.Since(handover) > step.outage+2*time.Second, "waiting for replies after the hand-over"
		}); err != nil {
			t.Fatalf("%s: ipsec pair after the hand-over: %v\nlog:\n%s", step.name, err, left.Agent.LogTail(60))
		}
		after := charonPIDs(t, left.GwNS)
		m.Logf("%s: ping (every %s) stopped for %s; charon pids %v -> %v", step.name, restartPing, gap.Round(time.Millisecond), before, after)
		if gap > step.outage {
			t.Errorf("%s: ipsec pair down %s across the hand-over, want at most %s", step.name, gap.Round(time.Millisecond), step.outage)
		}
		if adopted := len(after) == 1 && after[0] == before[0]; adopted != step.adopted || len(after) != 1 {
			t.Errorf("%s: charon pids %v -> %v: want one charon, adopted %v", step.name, before, after, step.adopted)
		}
		if code, err := old.Stop(15 * time.Second); err != nil || code != 0 {
			t.Fatalf("%s: old agent stopped with %d, %v; want exit 0", step.name, code, err)
		}
		m.WaitWants(30*time.Second, time.Now(), both, nil, harness.Connected(harness.DriverIPsec))
	}
}
