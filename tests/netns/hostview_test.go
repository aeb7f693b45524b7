package netns

import (
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestHostViewReadsTheCables checks the harness's own reading of the host, on which the policy
// and driver tests rely: on a two-cluster mesh with the default policy (wireguard) it finds the
// WireGuard peer (through the UAPI socket in the agent's mount namespace) and the route on both
// ends and nothing of the other drivers, its checker accepts the truth and rejects claims that
// the pair runs vxlan, ipsec or has no cable, and the traffic checker fails a no-connect claim.
func TestHostViewReadsTheCables(t *testing.T) {
	m := harness.New(t)
	clusters := m.AddClusters("east=10.1.0.0/16", "west=10.2.0.0/16")
	east, west := clusters[0], clusters[1]
	wg := harness.Connected(harness.DriverWireGuard)
	m.WaitWants(ConnectTimeout, time.Now(), clusters, nil, wg)
	for _, c := range clusters {
		c.StartTCPServer()
	}

	var problems []string
	err := harness.WaitFor(20*time.Second, 250*time.Millisecond, func() (bool, string) {
		problems, _ = m.CheckHosts(clusters, nil, wg)
		return len(problems) == 0, strings.Join(problems, "\n")
	})
	if err != nil {
		t.Fatalf("the host view does not show the wireguard pair: %v", err)
	}
	for _, p := range [][2]*harness.Cluster{{east, west}, {west, east}} {
		h := p[0].Host()
		e := h.For(p[1])
		if !h.WGRead {
			t.Errorf("%s: WireGuard peers unreadable from the host: %s", p[0].Name, h.WGError)
		} else if len(h.WGPeers) != 1 || !e.WGPeer {
			t.Errorf("%s: WireGuard peers %+v, want exactly one, for %s", p[0].Name, h.WGPeers, p[1].Name)
		}
		if got := e.Drivers(); len(got) != 1 || got[0] != harness.DriverWireGuard {
			t.Errorf("%s -> %s: host evidence %s, want wireguard only\n%s", p[0].Name, p[1].Name, e, h.Dump())
		}
		t.Logf("%s -> %s: %s", p[0].Name, p[1].Name, e)
	}
	for _, wrong := range []harness.Want{harness.Connected(harness.DriverVXLAN), harness.Connected(harness.DriverIPsec), harness.NoConnect} {
		if p, _ := m.CheckHosts(clusters, nil, wrong); len(p) == 0 {
			t.Errorf("the host checker accepts %s for a wireguard pair", wrong)
		}
	}
	if p := m.CheckTraffic(clusters, nil, wg); len(p) != 0 {
		t.Errorf("traffic over the wireguard pair: %v", p)
	}
	if p := m.CheckTraffic(clusters, nil, harness.NoConnect); len(p) == 0 {
		t.Errorf("the traffic checker accepts no-connect for a connected pair")
	}
}
