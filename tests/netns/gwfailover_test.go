package netns

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// gatewayDeathBudget is the longest stall of the traffic across a pair when the gateway that
// carries it dies, with the default settings: the remote gateway's probes through the tunnel
// find it dead in 0.9-1.2s (health.DefaultPeriod x DefaultFailureThreshold) and move the pair to
// the cluster's next gateway; the workers' probes of their own gateways find it in the same time
// and route through that gateway.
const gatewayDeathBudget = 2 * time.Second

// gatewayDeathResult is what one gateway death measured.
type gatewayDeathResult struct {
	driver string
	// pingGap is the longest gap between two echo replies around the death, pingResumed when
	// the first reply after it came.
	pingGap, pingResumed time.Duration
	// stream is the TCP stream's result; survived says it ran to its end without an error.
	stream   harness.StreamResult
	survived bool
	// leaseAlive says the broker still listed the dead gateway when the traffic had resumed:
	// the probes moved the pair, not the lease.
	leaseAlive bool
}

// TestGatewayDeathFailsOverWithinTwoSeconds runs, per cable driver, east with two gateways
// (east-gw1, east-gw2) and a worker, west with one gateway, every agent with its default
// settings (the broker's 30s lease, the default probes), and across the pair a ping every 100ms
// and a TCP stream (16 KiB echoes every 10ms), worker pod -> west pod, through east-gw1 (the
// gateway west connects to: the lexically smallest). Then east-gw1 dies as a node does: its
// underlay link goes down and its agent is killed with SIGKILL. It asserts that the longest
// stall of the ping stays within 2s, that the TCP stream survives (the pair moves by a route and
// a peer change on each end; nothing is translated, so the connection's packets stay valid), that
// west's connection went to east-gw2 while the broker still listed east-gw1 (the probes moved
// it, not the lease), and logs the figures per driver.
func TestGatewayDeathFailsOverWithinTwoSeconds(t *testing.T) {
	var results []gatewayDeathResult
	for _, driver := range []string{harness.DriverWireGuard, harness.DriverVXLAN, harness.DriverIPsec} {
		t.Run(driver, func(t *testing.T) {
			if driver == harness.DriverIPsec {
				harness.RequireIPsec(t)
			}
			r := gatewayDeath(t, driver)
			results = append(results, r)
		})
	}
	if len(results) > 0 {
		var b strings.Builder
		fmt.Fprintf(&b, "gateway death with default settings (worker pod -> west pod through east-gw1, which dies):\n")
		fmt.Fprintf(&b, "| driver | ping: longest stall | ping: resumed after | TCP: longest stall | TCP survived | moved before the lease |\n|---|---|---|---|---|---|\n")
		for _, r := range results {
			fmt.Fprintf(&b, "| %s | %s | %s | %.0fms | %v | %v |\n", r.driver, r.pingGap.Round(time.Millisecond), r.pingResumed.Round(time.Millisecond),
				r.stream.MaxGapMs, r.survived, r.leaseAlive)
		}
		t.Log(b.String())
	}
}

// gatewayDeath is TestGatewayDeathFailsOverWithinTwoSeconds over driver.
func gatewayDeath(t *testing.T, driver string) gatewayDeathResult {
	m := harness.New(t)
	extra := harness.SingleDriverConfig(driver)
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "pair=switch", extra)
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "pair=switch", extra)
	if driver != harness.DriverWireGuard {
		m.Apply(m.PolicyFile("gwfailover-"+driver+".yaml", pairPolicy(driver)))
	}
	gw2 := east.AddGateway("east-gw2", "cbl-wg1", "10.1.7.0/24")
	east.JoinAnother(gw2)
	gw2.WriteGatewayConfig(extra)
	started := time.Now()
	east.StartAgent()
	west.StartAgent()
	m.WaitWants(2*time.Minute, started, []*harness.Cluster{east, west}, nil, harness.Connected(driver))
	gw2.StartAgent()

	w := east.AddWorker("wk1", "10.1.5.0/24")
	w.RouteOnGateways(east, gw2)
	east.JoinAnother(w)
	w.WriteConfig("")
	w.StartAgent("--cleanup-on-exit")
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, c := range []*harness.Cluster{west, gw2} {
			r := harness.Run(m.Ctx, m.Bin.Cablectl, "status", "--socket", c.StatusSocket)
			t.Logf("---- cablectl status on %s:\n%s%s", c.Node, r.Stdout, r.Stderr)
			t.Logf("---- agent log of %s (tail):\n%s", c.Node, c.Agent.LogTail(60))
		}
		r := harness.Run(m.Ctx, m.Bin.Cablectl, "status", "--socket", w.StatusSocket)
		t.Logf("---- cablectl status on worker %s:\n%s%s", w.Node, r.Stdout, r.Stderr)
	})
	viaGw1 := harness.RouteEntry{Dst: west.PodCIDR.String(), Via: east.GwUnderlay.String(), Dev: "eth0"}
	viaGw2 := harness.RouteEntry{Dst: west.PodCIDR.String(), Via: gw2.GwUnderlay.String(), Dev: "eth0"}
	waitWorkerRoutes(t, m, w, 30*time.Second, viaGw1)
	waitWorkerProbesBoth(t, w)
	west.WaitProbedBy(east.Name, east.Node, driver, 30*time.Second)
	if ok, r := m.PingOK(w.PodNS, west.PodIP, 3); !ok {
		t.Fatalf("before the death: ping worker pod -> west pod %s over %s: %d/%d: %s", west.PodIP, driver, r.Received, r.Transmitted, r.Output)
	}

	west.StartTCPServer()
	stream := m.StartGapStream("gwfailover-stream-"+driver, w.PodNS, west.PodIP, 20*time.Second, 15*time.Second)
	pinger := m.StartTimedPinger("gwfailover-ping-"+driver, w.PodNS, west.PodIP, 100*time.Millisecond)
	if err := harness.WaitFor(10*time.Second, 200*time.Millisecond, func() (bool, string) {
		n := len(harness.ReplyTimes(pinger))
		return n >= 20, fmt.Sprintf("%d replies", n)
	}); err != nil {
		t.Fatalf("the continuous ping does not get through before the death: %v\n%s", err, pinger.LogTail(10))
	}

	died := east.KillNode()

	res := gatewayDeathResult{driver: driver}
	var ok bool
	err := harness.WaitFor(30*time.Second, 100*time.Millisecond, func() (bool, string) {
		replies := harness.ReplyTimes(pinger)
		res.pingGap, res.pingResumed, ok = harness.Outage(replies, died)
		return ok && time.Since(died) > res.pingResumed+time.Second, fmt.Sprintf("%d replies", len(replies))
	})
	res.leaseAlive = !brokerWithdrew(t, m, east.Name, east.Node)
	if err != nil {
		_, _ = pinger.Stop(5 * time.Second)
		t.Fatalf("ping worker pod -> west pod over %s never resumed after %s died: %v\n%s", driver, east.Node, err, pinger.LogTail(20))
	}
	st, serr := west.Status()
	row, _ := harness.ConnectionTo(st, east.Name)
	routes, rerr := m.Routes(w.NS, routeProto)

	stResult, code, rsErr := harness.ReadStream(stream, 40*time.Second)
	_, _ = pinger.Stop(5 * time.Second)
	res.stream = stResult
	res.survived = rsErr == nil && code == 0 && stResult.Error == ""
	t.Logf("gateway death over %s: %s died; ping: longest stall %s, resumed %s after the death; TCP stream: longest stall %.0fms, survived %v (exit %d, error %q, gaps %+v); broker still listed %s when traffic resumed: %v",
		driver, east.Node, res.pingGap.Round(time.Millisecond), res.pingResumed.Round(time.Millisecond), stResult.MaxGapMs, res.survived, code, stResult.Error, stResult.Gaps, east.Node, res.leaseAlive)

	if res.pingGap > gatewayDeathBudget {
		t.Errorf("over %s the ping stalled %s when the carrying gateway died, want at most %s", driver, res.pingGap.Round(time.Millisecond), gatewayDeathBudget)
	}
	if !res.survived {
		t.Errorf("over %s the TCP stream did not survive the death of the carrying gateway: exit %d, %v, error %q", driver, code, rsErr, stResult.Error)
	}
	if !res.leaseAlive {
		t.Errorf("the broker had withdrawn %s by the time traffic resumed: the lease, not the probes, may have moved the pair", east.Node)
	}
	if serr != nil || row.Node != gw2.Node {
		t.Errorf("west's connection to east goes to %q (status error %v), want %s", row.Node, serr, gw2.Node)
	}
	if rerr != nil || len(routes) != 1 || routes[0] != viaGw2 {
		t.Errorf("worker routes %v (%v), want [%v]", routes, rerr, viaGw2)
	}
	return res
}

// waitWorkerProbesBoth waits until worker w's probes answer from both gateways of its cluster.
func waitWorkerProbesBoth(t *testing.T, w *harness.Worker) {
	t.Helper()
	err := harness.WaitFor(20*time.Second, 200*time.Millisecond, func() (bool, string) {
		st, err := w.Status()
		if err != nil || st.Worker == nil {
			return false, fmt.Sprintf("err %v, worker section %+v", err, st.Worker)
		}
		healthy := 0
		for _, g := range st.Worker.Gateways {
			if g.Probing && g.Healthy && g.ProbesSent > 0 {
				healthy++
			}
		}
		return healthy == 2, fmt.Sprintf("%+v", st.Worker.Gateways)
	})
	if err != nil {
		t.Fatalf("worker %s never probed both gateways healthy: %v", w.Node, err)
	}
}
