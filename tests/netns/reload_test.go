package netns

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// reloadVXLANPort is x's VXLAN port after the reload.
const reloadVXLANPort = harness.VXLANPort + 1

// reloadExtra is x's agent config beyond the harness's: both drivers (vxlan on vxPort), one
// export or two, and the probe period.
func reloadExtra(vxPort int, period string, withAPI bool) string {
	s := fmt.Sprintf(`cableDrivers: [wireguard, vxlan]
vxlan: {port: %d, vni: %d}
healthCheck: {period: %s}
exports:
- {name: web, namespace: shop, ports: [{name: http, port: 80, protocol: TCP}], endpoints: [{ip: 10.41.0.10}]}
`, vxPort, harness.VXLANVNI, period)
	if withAPI {
		s += "- {name: api, namespace: shop, ports: [{name: http, port: 8080, protocol: TCP}], endpoints: [{ip: 10.41.0.11}]}\n"
	}
	return s
}

// replaceConfig rewrites path as a ConfigMap update does: a whole new file renamed over the old.
func replaceConfig(t *testing.T, path, text string) time.Time {
	t.Helper()
	tmp := path + ".next"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return at
}

// pairLogLines counts the lines of an agent log that connect or disconnect the pair with cluster.
func pairLogLines(log, cluster string) int {
	n := 0
	for _, l := range strings.Split(log, "\n") {
		if (strings.Contains(l, `msg=connected`) || strings.Contains(l, `msg=disconnected`)) && strings.Contains(l, " cluster="+cluster+" ") {
			n++
		}
	}
	return n
}

func TestConfigReloadWithoutRestart(t *testing.T) {
	m := harness.New(t)
	start := time.Now()
	x := m.AddLabelledCluster("x", "10.41.0.0/16", "vxpair=yes", reloadExtra(harness.VXLANPort, "1s", false))
	y := m.AddLabelledCluster("y", "10.42.0.0/16", "vxpair=yes", "cableDrivers: [wireguard, vxlan]\n"+
		fmt.Sprintf("vxlan: {port: %d, vni: %d}\n", harness.VXLANPort, harness.VXLANVNI))
	z := m.AddLabelledCluster("z", "10.43.0.0/16", "", "cableDrivers: [wireguard, vxlan]\n"+
		fmt.Sprintf("vxlan: {port: %d, vni: %d}\n", harness.VXLANPort, harness.VXLANVNI))
	m.Apply(m.PolicyFile("vxlan.yaml", vxlanPairPolicy)) // x-y over vxlan; z's pairs on the default, wireguard
	for _, c := range []*harness.Cluster{x, y, z} {
		c.StartAgent("--cleanup-on-exit")
	}
	m.WaitConnected(90*time.Second, x, y, z)
	st, err := x.Status()
	if err != nil {
		t.Fatal(err)
	}
	if c, _ := harness.Connection(st, "y"); c.Driver != "vxlan" {
		t.Fatalf("x-y runs over %q, want vxlan:\n%s", c.Driver, x.StatusTable())
	}
	if c, _ := harness.Connection(st, "z"); c.Driver != "wireguard" {
		t.Fatalf("x-z runs over %q, want wireguard:\n%s", c.Driver, x.StatusTable())
	}
	if st.Config == nil || st.Config.Revision != 1 || st.Config.Path != x.ConfigPath {
		t.Fatalf("x's status config at start = %+v", st.Config)
	}
	startRev := st.Config.Revision

	// The x-z tunnel before: its device, its counters, the pair's connect lines in both logs.
	wgIndex := m.LinkIndex(x.GwNS, x.WGInterface)
	zIndex := m.LinkIndex(z.GwNS, z.WGInterface)
	wgBefore, err := x.WGStats()
	if err != nil {
		t.Fatal(err)
	}
	xzLines, zxLines := pairLogLines(x.Agent.Log(), "z"), pairLogLines(z.Agent.Log(), "x")
	zPeer, ok := peerFor(x, z)
	if !ok {
		t.Fatalf("x has no wireguard peer for z:\n%s", x.Host().Dump())
	}
	if xzLines == 0 || zxLines == 0 {
		// The pair was connected: no line would make the "not reconnected" check below vacuous.
		t.Fatalf("no connect line for the x-z pair in the logs (x %d, z %d): the log format changed", xzLines, zxLines)
	}
	z.StartTCPServer()
	// Traffic across x-z during the whole reload: 12 s of pings 100 ms apart, and a TCP stream.
	pinger := m.StartPinger("ping-x-z", x.PodNS, z.PodIP, 120, 100*time.Millisecond)
	stream := m.StartTCPStream("tcp-x-z", x.PodNS, z.PodIP, 10*time.Second)
	time.Sleep(time.Second)
	// x's wireguard counters every 50 ms through the reload: a recreated device or peer would
	// show as a drop between two samples.
	var samples []harness.LinkStats
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if st, err := x.WGStats(); err == nil {
				samples = append(samples, st)
			}
			select {
			case <-stopSampling:
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	defer func() {
		select {
		case <-stopSampling:
		default:
			close(stopSampling)
		}
		<-sampled
	}()

	renamed := replaceConfig(t, x.ConfigPath, x.ConfigYAML(reloadExtra(reloadVXLANPort, "2s", true)))
	var applied time.Duration
	err = harness.WaitFor(30*time.Second, 20*time.Millisecond, func() (bool, string) {
		st, err := x.Status()
		if err != nil {
			return false, err.Error()
		}
		if st.Config != nil && st.Config.Revision == startRev+1 {
			applied = time.Since(renamed)
			return true, ""
		}
		return false, fmt.Sprintf("%+v", st.Config)
	})
	if err != nil {
		t.Fatalf("x's new config not in force: %v\n%s", err, x.Agent.LogTail(30))
	}
	t.Logf("rename -> revision %d in force (status): %s", startRev+1, applied.Round(time.Millisecond))

	t.Run("y sees x's new vxlan port and the x-y tunnel carries traffic again", func(t *testing.T) {
		var tunnelBack time.Duration
		err := harness.WaitFor(30*time.Second, 100*time.Millisecond, func() (bool, string) {
			st, err := y.Status()
			if err != nil {
				return false, err.Error()
			}
			c, ok := harness.Connection(st, "x")
			if !ok || !strings.HasSuffix(c.Endpoint, fmt.Sprintf(":%d", reloadVXLANPort)) || c.State != "connected" {
				return false, fmt.Sprintf("y's connection to x: %+v", c)
			}
			if ok, res := m.PingOK(y.PodNS, x.PodIP, 1); !ok {
				return false, "ping y -> x: " + res.Output
			}
			tunnelBack = time.Since(renamed)
			return true, ""
		})
		if err != nil {
			t.Fatalf("%v\nx:\n%s\ny:\n%s", err, x.StatusTable(), y.StatusTable())
		}
		t.Logf("rename -> x-y pinging again over vxlan port %d: %s", reloadVXLANPort, tunnelBack.Round(time.Millisecond))
		if ok, res := m.PingOK(x.PodNS, y.PodIP, 5); !ok {
			t.Errorf("ping x -> y after the reload: %d/%d", res.Received, res.Transmitted)
		}
	})

	t.Run("the new export is imported by y", func(t *testing.T) {
		waitImport(t, m, y, "shop", "api", "x")
	})

	t.Run("the probe period in force is the new one", func(t *testing.T) {
		err := harness.WaitFor(15*time.Second, 200*time.Millisecond, func() (bool, string) {
			st, err := x.Status()
			if err != nil {
				return false, err.Error()
			}
			c, _ := harness.Connection(st, "z")
			if c.Health == nil || c.Health.PeriodMs != 2000 {
				return false, fmt.Sprintf("x's probes of z: %+v", c.Health)
			}
			return true, ""
		})
		if err != nil {
			t.Error(err)
		}
	})

	t.Run("the x-z wireguard tunnel was not disturbed", func(t *testing.T) {
		if code, err := stream.Wait(60 * time.Second); err != nil || code != 0 {
			t.Errorf("the TCP stream x -> z failed during the reload (exit %d, %v):\n%s", code, err, stream.LogTail(20))
		}
		if _, err := pinger.Wait(60 * time.Second); err != nil {
			t.Errorf("ping x -> z: %v", err)
		}
		if res, err := harness.ParsePing(pinger.Log()); err != nil {
			t.Errorf("ping x -> z: %v", err)
		} else {
			if res.Lost() > 0 {
				t.Errorf("ping x -> z lost %d of %d echoes during the reload", res.Lost(), res.Transmitted)
			}
			t.Logf("ping x -> z during the reload: %d/%d answered", res.Received, res.Transmitted)
		}
		if got := m.LinkIndex(x.GwNS, x.WGInterface); got != wgIndex {
			t.Errorf("x's wireguard device was recreated: ifindex %d, was %d", got, wgIndex)
		}
		if got := m.LinkIndex(z.GwNS, z.WGInterface); got != zIndex {
			t.Errorf("z's wireguard device was recreated: ifindex %d, was %d", got, zIndex)
		}
		close(stopSampling)
		<-sampled
		after, err := x.WGStats()
		if err != nil {
			t.Fatal(err)
		}
		samples = append([]harness.LinkStats{wgBefore}, append(samples, after)...)
		for i := 1; i < len(samples); i++ {
			if samples[i].RxPackets < samples[i-1].RxPackets || samples[i].RxBytes < samples[i-1].RxBytes {
				t.Errorf("x's wireguard counters went back (device or peer recreated) between samples %d and %d: rx %d packets, were %d",
					i-1, i, samples[i].RxPackets, samples[i-1].RxPackets)
			}
		}
		if len(samples) < 20 {
			t.Errorf("only %d counter samples during the reload", len(samples))
		}
		t.Logf("x's wireguard device: ifindex %d before and after; rx packets %d -> %d over %d samples, never lower",
			wgIndex, wgBefore.RxPackets, after.RxPackets, len(samples))
		// A peer set up again would start its counters from zero. Its last handshake is no
		// witness: a pair that has just connected may handshake again within seconds (the first
		// handshake's nudges, WireGuard's 5 s retry), whatever the reload does (CI saw 5 s apart).
		if p, ok := peerFor(x, z); !ok || p.PublicKey != zPeer.PublicKey || p.Endpoint != zPeer.Endpoint || p.RxBytes < zPeer.RxBytes || p.TxBytes < zPeer.TxBytes {
			t.Errorf("x's wireguard peer for z changed during the reload: %+v, was %+v", p, zPeer)
		}
		if n := pairLogLines(x.Agent.Log(), "z"); n != xzLines {
			t.Errorf("x connected or disconnected z during the reload (%d lines, were %d):\n%s", n, xzLines, x.Agent.LogTail(40))
		}
		if n := pairLogLines(z.Agent.Log(), "x"); n != zxLines {
			t.Errorf("z connected or disconnected x during the reload (%d lines, were %d):\n%s", n, zxLines, z.Agent.LogTail(40))
		}
	})

	t.Run("a cluster rename is refused and the running state kept", func(t *testing.T) {
		before, _ := x.Status()
		wgNow, _ := x.WGStats()
		refused := strings.Replace(x.ConfigYAML(reloadExtra(reloadVXLANPort+1, "2s", true)), "cluster: x\n", "cluster: renamed\n", 1)
		if !strings.Contains(refused, "cluster: renamed") {
			t.Fatalf("the test did not rename the cluster:\n%s", refused)
		}
		replaceConfig(t, x.ConfigPath, refused)
		var st statusapi.Status
		err := harness.WaitFor(15*time.Second, 100*time.Millisecond, func() (bool, string) {
			var err error
			if st, err = x.Status(); err != nil {
				return false, err.Error()
			}
			return st.Config != nil && len(st.Config.Refused) > 0, fmt.Sprintf("%+v", st.Config)
		})
		if err != nil {
			t.Fatal(err)
		}
		r := st.Config.Refused[0]
		if len(st.Config.Refused) != 1 || r.Field != "cluster" || !strings.Contains(r.Message, `"x"`) || !strings.Contains(r.Message, `"renamed"`) {
			t.Errorf("refusal = %+v", st.Config.Refused)
		}
		if st.Config.Revision != before.Config.Revision || st.Config.Hash != before.Config.Hash {
			t.Errorf("a refused config changed the revision: %+v, was %+v", st.Config, before.Config)
		}
		if !strings.Contains(x.StatusTable(), "newer file refused: cluster") {
			t.Errorf("the status table does not show the refusal:\n%s", x.StatusTable())
		}
		if ok, desc := harness.ConnectedTo(st, "y", "z"); !ok {
			t.Errorf("x after the refused change: %s", desc)
		}
		if c, _ := harness.Connection(st, "y"); !strings.HasSuffix(c.Endpoint, fmt.Sprintf(":%d", harness.VXLANPort)) {
			t.Logf("x's connection to y: %+v", c)
		}
		ys, _ := y.Status()
		if c, _ := harness.Connection(ys, "x"); !strings.HasSuffix(c.Endpoint, fmt.Sprintf(":%d", reloadVXLANPort)) {
			t.Errorf("the refused file's vxlan port reached y: %s", c.Endpoint)
		}
		for _, p := range []struct {
			from *harness.Cluster
			to   *harness.Cluster
		}{{x, y}, {x, z}} {
			if ok, res := m.PingOK(p.from.PodNS, p.to.PodIP, 3); !ok {
				t.Errorf("ping %s -> %s after the refused change: %d/%d", p.from.Name, p.to.Name, res.Received, res.Transmitted)
			}
		}
		if got := m.LinkIndex(x.GwNS, x.WGInterface); got != wgIndex {
			t.Errorf("x's wireguard device was recreated: ifindex %d, was %d", got, wgIndex)
		}
		if after, _ := x.WGStats(); after.RxPackets < wgNow.RxPackets {
			t.Errorf("x's wireguard counters went back after the refused change")
		}
		if !strings.Contains(x.Agent.Log(), "CONFIG CHANGE REFUSED") {
			t.Error("x's agent did not log the refusal")
		}
	})
	t.Logf("whole test: %s", time.Since(start).Round(time.Second))
}

// peerFor is from's wireguard peer whose allowed IPs hold to's pod CIDR.
func peerFor(from, to *harness.Cluster) (harness.WGPeer, bool) {
	for _, p := range from.Host().WGPeers {
		for _, a := range p.AllowedIPs {
			if a == to.PodCIDR.String() {
				return p, true
			}
		}
	}
	return harness.WGPeer{}, false
}
