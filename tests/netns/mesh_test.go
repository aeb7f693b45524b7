package netns

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// ConnectTimeout bounds how long a fresh mesh may take until every pair is connected.
const ConnectTimeout = 90 * time.Second

var threeClusters = []string{"east=10.1.0.0/16", "west=10.2.0.0/16", "north=10.3.0.0/16"}

// TestThreeClusters builds the mesh of the issue and checks traffic and status between every
// ordered pair of clusters.
func TestThreeClusters(t *testing.T) {
	m := harness.New(t)
	clusters := m.AddClusters(threeClusters...)
	seen := m.WaitConnected(ConnectTimeout, clusters...)
	for _, c := range clusters {
		t.Logf("%s connected to both others %s after its agent started", c.Name, seen[c.Name].Sub(c.AgentStarted).Round(time.Millisecond))
		c.StartTCPServer()
	}

	before := map[string]harness.LinkStats{}
	for _, c := range clusters {
		s, err := c.WGStats()
		if err != nil {
			t.Fatalf("counters of %s in %s: %v", harness.WGInterface, c.GwNS, err)
		}
		before[c.Name] = s
	}

	t.Run("every pod reaches every other cluster's pod by ping and TCP", func(t *testing.T) {
		for _, from := range clusters {
			for _, to := range clusters {
				if from == to {
					continue
				}
				if ok, r := m.PingOK(from.PodNS, to.PodIP, 5); !ok {
					t.Errorf("ping %s pod -> %s pod (%s): %d/%d replies: %v\n%s", from.Name, to.Name, to.PodIP, r.Received, r.Transmitted, r.Err, r.Output)
				}
				if r := m.TCPCheck(from.PodNS, to.PodIP); r.Err != nil || strings.TrimSpace(r.Stdout) != "ok" {
					t.Errorf("tcp %s pod -> %s pod %s:%d: %s", from.Name, to.Name, to.PodIP, harness.TCPServerPort, r)
				}
			}
		}
	})

	t.Run("the traffic crossed every gateway's WireGuard device", func(t *testing.T) {
		// Every gateway sent and received at least 2 peers x (5 pings + a 1 KiB TCP echo) each way.
		const atLeastPackets = 2 * 5
		for _, c := range clusters {
			after, err := c.WGStats()
			if err != nil {
				t.Fatalf("counters of %s in %s: %v", harness.WGInterface, c.GwNS, err)
			}
			b := before[c.Name]
			t.Logf("%s %s: rx %d -> %d packets, tx %d -> %d packets", c.Name, harness.WGInterface, b.RxPackets, after.RxPackets, b.TxPackets, after.TxPackets)
			if after.RxPackets < b.RxPackets+atLeastPackets || after.TxPackets < b.TxPackets+atLeastPackets {
				t.Errorf("%s: %s counters grew by rx %d / tx %d packets, want >= %d each", c.Name, harness.WGInterface,
					after.RxPackets-b.RxPackets, after.TxPackets-b.TxPackets, atLeastPackets)
			}
		}
	})

	t.Run("cablectl status reports both other clusters connected with real counters", func(t *testing.T) {
		for _, c := range clusters {
			st, err := c.Status()
			if err != nil {
				t.Fatalf("status of %s: %v", c.Name, err)
			}
			if st.Cluster != c.Name || st.Node != c.Node {
				t.Errorf("%s: status names cluster %q node %q, want %q %q", c.Name, st.Cluster, st.Node, c.Name, c.Node)
			}
			if !st.Broker.Connected {
				t.Errorf("%s: broker.connected = false (error %q)", c.Name, st.Broker.Error)
			}
			if st.Broker.Revision == 0 {
				t.Errorf("%s: broker.revision = 0, want the revision it synced to", c.Name)
			}
			if len(st.Connections) != len(clusters)-1 {
				t.Errorf("%s: %d connections, want %d: %+v", c.Name, len(st.Connections), len(clusters)-1, st.Connections)
			}
			for _, o := range clusters {
				if o == c {
					continue
				}
				cn, ok := harness.Connection(st, o.Name)
				if !ok {
					t.Errorf("%s: no connection to %s", c.Name, o.Name)
					continue
				}
				wantEndpoint := fmt.Sprintf("%s:%d", o.GwUnderlay, harness.WGPort)
				switch {
				case cn.State != "connected":
					t.Errorf("%s -> %s: state %q (%s), want connected", c.Name, o.Name, cn.State, cn.Message)
				case cn.Driver != "wireguard":
					t.Errorf("%s -> %s: driver %q, want wireguard", c.Name, o.Name, cn.Driver)
				case cn.Endpoint != wantEndpoint:
					t.Errorf("%s -> %s: endpoint %q, want %q", c.Name, o.Name, cn.Endpoint, wantEndpoint)
				case cn.ClusterID == 0:
					t.Errorf("%s -> %s: clusterID 0, want the broker's ID", c.Name, o.Name)
				case cn.RxBytes == 0 || cn.TxBytes == 0:
					t.Errorf("%s -> %s: rxBytes %d txBytes %d, want both > 0", c.Name, o.Name, cn.RxBytes, cn.TxBytes)
				case cn.LastHandshake == nil || cn.LastHandshake.IsZero():
					t.Errorf("%s -> %s: no lastHandshake", c.Name, o.Name)
				case time.Since(*cn.LastHandshake) > 3*time.Minute:
					t.Errorf("%s -> %s: lastHandshake %s is stale", c.Name, o.Name, cn.LastHandshake)
				}
			}
			t.Logf("cablectl status on %s:\n%s", c.Name, c.StatusTable())
		}
	})
}
