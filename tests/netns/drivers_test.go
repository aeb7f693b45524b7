package netns

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// pairPolicy is the policy the driver tests move their one pair with: it covers the clusters
// labelled pair=switch and puts them on driver.
func pairPolicy(driver string) string {
	return fmt.Sprintf(`kind: ClusterConnectionPolicy
metadata:
  name: switch-pair
spec:
  clusterSelector:
    pair: switch
  topology: full-mesh
  connectionPolicy: connect
  cableDriver:
    name: %s
  priority: 5
`, driver)
}

// TransferBytes is the size of the pod-to-pod TCP transfer over each driver.
const TransferBytes = 4 << 20

// StreamStallLimit is the longest stall the stream across a driver switch survives (a longer
// one fails it).
const StreamStallLimit = 30 * time.Second

// switchResult is what one driver switch measured.
type switchResult struct {
	from, to           string
	applied, connected time.Duration
	hostClean          time.Duration
	stream             harness.StreamResult
}

// startSwitchPair starts two clusters, left and right, labelled pair=switch, whose gateways run
// all three drivers, and waits until the default policy connected them over wireguard; then
// each pod serves the TCP tests. over says what carries the pair, for the log.
func startSwitchPair(t *testing.T, over string) (m *harness.Mesh, left, right *harness.Cluster) {
	t.Helper()
	m = harness.New(t)
	extra := harness.MultiDriverConfig()
	left = m.AddLabelledCluster("left", "10.1.0.0/16", "pair=switch", extra)
	right = m.AddLabelledCluster("right", "10.2.0.0/16", "pair=switch", extra)
	both := []*harness.Cluster{left, right}
	started := time.Now()
	for _, c := range both {
		c.StartAgent()
	}
	conv := m.WaitWants(2*time.Minute, started, both, nil, harness.Connected(harness.DriverWireGuard))
	m.Logf("connected over %s %s after the agents started", over, conv.ConnectedAfter("left", "right").Round(time.Millisecond))
	for _, c := range both {
		c.StartTCPServer()
	}
	return m, left, right
}

// onePairDatapath is a datapath TestDriversOnOnePair moves its pair across the drivers on.
type onePairDatapath struct {
	name string
	// require skips the test where this host cannot run the datapath, saying why.
	require func(t *testing.T)
	// over names what first carries the pair, for the log.
	over string
	// checkOver checks the pair over driver: at the start (first, over wireguard) and after
	// each switch.
	checkOver func(t *testing.T, m *harness.Mesh, left, right *harness.Cluster, driver string, first bool)
	// done logs what the datapath adds to the switches' table; nil for nothing.
	done func(m *harness.Mesh)
}

// TestDriversOnOnePair runs two clusters whose gateways run all three drivers and moves their
// pair wireguard -> vxlan -> ipsec -> wireguard with a policy (`apply -f`, the last move with
// `connection-policy add` flags), while a TCP stream crosses it:
// per switch it reports the longest stall of the stream, checks the stream survived, and that
// nothing of the old cable is left on either host (no WireGuard peer, no VXLAN FDB entry or
// route, no SA, no route in table 220). It does so on two datapaths:
//
//   - any-datapath, whichever the host gives the agent: over each driver it runs the same
//     traffic test: ping, a 1400-byte ping with DF set, and a TCP transfer of a few MB pod to pod
//     both ways.
//   - kernel-datapaths (skipped on a kernel without WireGuard or ESP; it runs in the VM of
//     tests/vm): a kernel WireGuard device, and for ipsec kernel xfrm SAs installed by charon (no
//     kernel-libipsec). Over each driver it checks the route MTU derived for that datapath, DF
//     pings of exactly that size and one byte more, and the MSS a pod's SYN arrives with.
func TestDriversOnOnePair(t *testing.T) {
	for _, dp := range []onePairDatapath{
		{name: "any-datapath", require: requireAnyDatapath, over: "wireguard (the default)", checkOver: checkTrafficOver},
		{name: "kernel-datapaths", require: requireKernelDatapaths, over: "kernel wireguard", checkOver: checkKernelDatapath, done: logKernelESPCeiling},
	} {
		t.Run(dp.name, func(t *testing.T) {
			dp.require(t)
			harness.RequireIPsec(t)
			driversOnOnePair(t, dp)
		})
	}
}

// requireAnyDatapath skips unless the test runs as root, and in the VM of tests/vm, which runs
// the kernel-datapaths case only.
func requireAnyDatapath(t *testing.T) {
	t.Helper()
	harness.RequireRoot(t)
	if os.Getenv("CABLEMESH_VM") == "1" {
		t.Skip("skipping in the VM: it runs the kernel-datapaths case")
	}
}

// driversOnOnePair is the scenario of TestDriversOnOnePair on one datapath.
func driversOnOnePair(t *testing.T, dp onePairDatapath) {
	m, left, right := startSwitchPair(t, dp.over)
	dp.checkOver(t, m, left, right, harness.DriverWireGuard, true)
	var switches []switchResult
	from := harness.DriverWireGuard
	for _, to := range []string{harness.DriverVXLAN, harness.DriverIPsec, harness.DriverWireGuard} {
		switches = append(switches, switchUnderLoad(t, m, left, right, from, to))
		if t.Failed() {
			t.Fatalf("stopping after the switch %s -> %s failed", from, to)
		}
		dp.checkOver(t, m, left, right, to, false)
		if t.Failed() {
			t.Fatalf("stopping after the checks over %s failed", to)
		}
		from = to
	}
	logSwitches(m, switches)
	if dp.done != nil {
		dp.done(m)
	}
}

// checkTrafficOver runs trafficOver at the start and after each switch but the last: the pair
// is back on wireguard then, which the start tested.
func checkTrafficOver(t *testing.T, m *harness.Mesh, left, right *harness.Cluster, driver string, first bool) {
	t.Helper()
	if first || driver != harness.DriverWireGuard {
		trafficOver(t, m, left, right, driver)
	}
}

// logSwitches logs the table of what each driver switch measured.
func logSwitches(m *harness.Mesh, switches []switchResult) {
	var b strings.Builder
	fmt.Fprintf(&b, "driver switches under a TCP stream (left pod -> right pod, 16 KiB echoes every 10ms):\n")
	fmt.Fprintf(&b, "| switch | status applied | connected | old cable gone | longest stall | gaps > 100ms |\n|---|---|---|---|---|---|\n")
	for _, s := range switches {
		var gaps []string
		for _, g := range s.stream.Gaps {
			gaps = append(gaps, fmt.Sprintf("%.0fms", g.Ms))
		}
		fmt.Fprintf(&b, "| %s -> %s | %s | %s | %s | %.0fms | %s |\n", s.from, s.to, s.applied.Round(time.Millisecond),
			s.connected.Round(time.Millisecond), s.hostClean.Round(time.Millisecond), s.stream.MaxGapMs, strings.Join(gaps, " "))
	}
	m.Logf("%s", b.String())
}

// switchUnderLoad moves the pair from one driver to another with a TCP stream running across it.
func switchUnderLoad(t *testing.T, m *harness.Mesh, left, right *harness.Cluster, from, to string) switchResult {
	t.Helper()
	both := []*harness.Cluster{left, right}
	res := switchResult{from: from, to: to}
	const streamFor = 20 * time.Second
	name := fmt.Sprintf("stream-%s-to-%s", from, to)
	stream := m.StartGapStream(name, left.PodNS, right.PodIP, streamFor, StreamStallLimit)
	time.Sleep(2 * time.Second)
	if ok, code := stream.Exited(); ok {
		t.Fatalf("%s -> %s: the stream ended (exit %d) before the switch:\n%s", from, to, code, stream.Log())
	}
	var t0 time.Time
	if to == harness.DriverWireGuard {
		// The same policy through the flags of `connection-policy add` (which replaces a policy
		// of that name), so that both ways of writing a policy are driven end to end.
		args := []string{"connection-policy", "add", "--name", "switch-pair", "--cluster-selector", "pair=switch",
			"--topology", "full-mesh", "--connection-policy", "connect", "--cable-driver", to, "--priority", "5"}
		r := m.Cablectl(args...)
		if r.Err != nil {
			t.Fatalf("cablectl %s: %s", strings.Join(args, " "), r)
		}
		t0 = time.Now()
		m.Logf("cablectl %s: %s", strings.Join(args, " "), strings.TrimSpace(r.Stdout))
	} else {
		t0 = m.Apply(m.PolicyFile("switch-pair-"+to+".yaml", pairPolicy(to)))
	}
	conv := m.WaitWants(PolicyTimeout, t0, both, nil, harness.Connected(to))
	res.applied, res.connected = conv.AppliedAfter("left", "right"), conv.ConnectedAfter("left", "right")
	m.Logf("switch %s -> %s: slowest `cablectl status` call while waiting: %s", from, to, conv.SlowestStatus.Round(time.Millisecond))
	res.hostClean = waitHostsClean(m, both, nil, harness.Connected(to)).Sub(t0)
	if to == harness.DriverWireGuard {
		// When the first handshake completed tells a lost first initiation (WireGuard retries
		// after 5s) from a slow route change. The UAPI gives whole seconds.
		for _, c := range both {
			for _, p := range c.Host().WGPeers {
				m.Logf("switch %s -> %s: %s's WireGuard peer %s: last handshake %s after `cablectl apply` (whole seconds)",
					from, to, c.Name, p.Endpoint, p.LastHandshake.Sub(t0.Truncate(time.Second)))
			}
		}
	}
	sr, code, err := harness.ReadStream(stream, streamFor+StreamStallLimit+10*time.Second)
	res.stream = sr
	switch {
	case err != nil:
		t.Errorf("%s -> %s: %v", from, to, err)
	case code != 0:
		t.Errorf("%s -> %s: the TCP stream across the switch broke (exit %d): %s\n%s", from, to, code, sr.Error, stream.Log())
	case sr.Rounds < 100:
		t.Errorf("%s -> %s: the stream made only %d echoes in %s", from, to, sr.Rounds, streamFor)
	}
	m.Logf("switch %s -> %s: applied %s, connected %s, old cable gone %s after `cablectl apply`; stream: %d echoes, longest stall %.0fms, gaps %+v",
		from, to, res.applied.Round(time.Millisecond), res.connected.Round(time.Millisecond), res.hostClean.Round(time.Millisecond),
		sr.Rounds, sr.MaxGapMs, sr.Gaps)
	return res
}

// trafficOver runs the same traffic test over whichever driver carries the pair now, both ways:
// ping, 1400-byte DF pings, a TCPTransfer of TransferBytes, and a health RTT in the status.
func trafficOver(t *testing.T, m *harness.Mesh, left, right *harness.Cluster, driver string) {
	since := time.Now()
	t.Helper()
	for _, p := range [][2]*harness.Cluster{{left, right}, {right, left}} {
		from, to := p[0], p[1]
		if ok, r := m.PingOK(from.PodNS, to.PodIP, 5); !ok {
			t.Errorf("%s: ping %s pod -> %s pod: %d/%d replies: %v %s", driver, from.Name, to.Name, r.Received, r.Transmitted, r.Err, r.Output)
		}
		if r := m.PingDF(from.PodNS, to.PodIP, 1400, 3); r.Err != nil || r.Received != 3 {
			t.Errorf("%s: 1400-byte DF ping (ping -M do -s 1372) %s pod -> %s pod: %d/%d replies: %v %s", driver, from.Name, to.Name, r.Received, r.Transmitted, r.Err, r.Output)
		}
		tr, err := m.TCPTransfer(from.PodNS, to.PodIP, TransferBytes)
		if err != nil {
			t.Errorf("%s: TCP transfer of %d bytes %s pod -> %s pod and back: %v", driver, TransferBytes, from.Name, to.Name, err)
		} else {
			m.Logf("%s: TCP %d bytes %s pod -> %s pod and back intact in %dms (%.1f MB/s each way)", driver, tr.Bytes, from.Name, to.Name,
				tr.Ms, float64(tr.Bytes)/1e6/(float64(max(tr.Ms, 1))/1000))
		}
	}
	// The health probes run through whichever cable carries the pair: an RTT must show up.
	for _, c := range []*harness.Cluster{left, right} {
		other := right
		if c == right {
			other = left
		}
		var last string
		err := harness.WaitFor(15*time.Second, 500*time.Millisecond, func() (bool, string) {
			st, err := c.Status()
			if err != nil {
				return false, err.Error()
			}
			cn, ok := harness.Connection(st, other.Name)
			if !ok {
				return false, "no connection"
			}
			last = fmt.Sprintf("driver %s state %s mtu %d rtt %+v", cn.Driver, cn.State, cn.MTU, cn.RTT)
			if cn.Health != nil {
				last += fmt.Sprintf(" probes sent %d failed %d last success %v", cn.Health.ProbesSent, cn.Health.ProbesFailed, cn.Health.LastSuccess)
			}
			// A probe answered after the traffic test began went through this driver's cable.
			fresh := cn.Health != nil && cn.Health.LastSuccess != nil && cn.Health.LastSuccess.After(since)
			return cn.Driver == driver && cn.State == "connected" && cn.RTT != nil && cn.RTT.LastMs > 0 && fresh, last
		})
		if err != nil {
			t.Errorf("%s: %s -> %s has no health RTT over the cable: %v", driver, c.Name, other.Name, err)
		} else {
			m.Logf("%s: status of %s -> %s: %s", driver, c.Name, other.Name, last)
		}
	}
}
