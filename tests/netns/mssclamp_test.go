package netns

import (
	"testing"

	"github.com/cablemesh/cablemesh/cable/mss"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestMSSClampFollowsTheDriversLinks runs two clusters whose east gateway names its WireGuard
// link wg-east (west keeps the default cbl-wg0): the agent clamps the TCP MSS on the links its
// drivers report, whatever they are called. Both are read from the kernel, not the agent: each
// gateway's nftables rules match its WireGuard link in the forward and output chains, and a SYN
// a pod sends to the other cluster's pod arrives with an MSS no larger than the tunnel route's
// MTU minus 40. Unclamped it would carry the pod's own 1460 (its link's MTU is 1500). Stopping
// east's agent, run with --cleanup-on-exit, removes the clamp and every link it covered.
func TestMSSClampFollowsTheDriversLinks(t *testing.T) {
	m := harness.New(t)
	east := m.AddCluster("east", "10.1.0.0/16")
	east.WGInterface = "wg-east"
	east.WriteConfig("")
	west := m.AddCluster("west", "10.2.0.0/16")
	east.StartAgent("--cleanup-on-exit")
	west.StartAgent()
	m.WaitConnected(ConnectTimeout, east, west)

	for _, tc := range []struct {
		name     string
		from, to *harness.Cluster
	}{
		{"SYNs leaving east through its custom-named link wg-east are clamped", east, west},
		{"SYNs leaving west through the default link cbl-wg0 are clamped", west, east},
	} {
		t.Run(tc.name, func(t *testing.T) {
			link := tc.from.WGInterface
			chains, ok, err := harness.MSSClamp(tc.from.GwNS)
			if err != nil || !ok {
				t.Fatalf("no MSS clamp table in %s: %v", tc.from.GwNS, err)
			}
			for _, ch := range []string{mss.ChainForward, mss.ChainOutput} {
				if !harness.CoversLink(chains[ch], link) {
					t.Errorf("%s: chain %s clamps %q, none of which is %s", tc.from.GwNS, ch, chains[ch], link)
				}
			}
			t.Logf("%s clamps %v", tc.from.GwNS, chains)

			dev, mtu, err := m.RouteMTU(tc.from.GwNS, tc.to.PodIP)
			if err != nil {
				t.Fatal(err)
			}
			if dev != link || mtu >= 1500 {
				t.Fatalf("%s routes %s via %s with MTU %d, want %s below the pod's 1500: the test would show nothing", tc.from.GwNS, tc.to.PodIP, dev, mtu, link)
			}
			got, err := m.AcceptedMSS(tc.from.PodNS, tc.to.PodNS, tc.to.PodIP)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s pod -> %s pod: route MTU %d on %s, MSS at the server %d", tc.from.Name, tc.to.Name, mtu, dev, got)
			if got > mtu-40 {
				t.Errorf("the server in %s sees MSS %d, want at most %d (route MTU %d - 40): the SYN was not clamped on %s",
					tc.to.Name, got, mtu-40, mtu, link)
			}
		})
	}

	t.Run("stopping east's agent with --cleanup-on-exit removes the clamp and the links it covered", func(t *testing.T) {
		before, _, err := harness.MSSClamp(east.GwNS)
		if err != nil {
			t.Fatal(err)
		}
		if code := east.StopAgent(); code != 0 {
			t.Errorf("east's agent exited %d, want 0", code)
		}
		if chains, ok, err := harness.MSSClamp(east.GwNS); ok || err != nil {
			t.Errorf("after --cleanup-on-exit the clamp is still there: %v (%v)", chains, err)
		}
		for _, l := range m.Links(east.GwNS) {
			if harness.CoversLink(before[mss.ChainForward], l) {
				t.Errorf("after --cleanup-on-exit link %s is still in %s", l, east.GwNS)
			}
		}
	})
}
