package netns

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestFourthClusterJoins adds a cluster while a ping and a TCP stream run between two others:
// every agent adds the new cluster, and the existing tunnel loses nothing and is not rebuilt.
func TestFourthClusterJoins(t *testing.T) {
	m := harness.New(t)
	clusters := m.AddClusters(threeClusters...)
	east, west := clusters[0], clusters[1]
	m.WaitConnected(ConnectTimeout, clusters...)
	west.StartTCPServer()

	before, err := east.Status()
	if err != nil {
		t.Fatalf("status of east: %v", err)
	}
	eastWest, _ := harness.Connection(before, "west")

	// Traffic between east and west for the whole join: 5 pings a second and an echo stream.
	const window = 25 * time.Second
	pinger := m.StartPinger("ping-east-west", east.PodNS, west.PodIP, int(window/(200*time.Millisecond)), 200*time.Millisecond)
	stream := m.StartTCPStream("stream-east-west", east.PodNS, west.PodIP, window)
	time.Sleep(2 * time.Second)

	south := m.AddCluster("south", "10.4.0.0/16")
	south.StartAgent()
	all := append(clusters, south)
	seen := m.WaitConnected(ConnectTimeout, all...)
	var slowest time.Duration
	for _, c := range all {
		d := seen[c.Name].Sub(south.AgentStarted)
		if d < 0 {
			d = 0
		}
		if d > slowest {
			slowest = d
		}
		t.Logf("time from south's agent start until %s is connected to all others: %s", c.Name, d.Round(time.Millisecond))
	}
	t.Logf("time for a new cluster to connect on all sides: %s", slowest.Round(time.Millisecond))

	t.Run("south reaches every cluster and every cluster reaches south", func(t *testing.T) {
		for _, c := range clusters {
			if ok, r := m.PingOK(south.PodNS, c.PodIP, 3); !ok {
				t.Errorf("ping south -> %s: %d/%d: %s", c.Name, r.Received, r.Transmitted, r.Output)
			}
			if ok, r := m.PingOK(c.PodNS, south.PodIP, 3); !ok {
				t.Errorf("ping %s -> south: %d/%d: %s", c.Name, r.Received, r.Transmitted, r.Output)
			}
		}
	})

	t.Run("the east-west traffic during the join lost nothing", func(t *testing.T) {
		if _, err := pinger.Wait(window + 30*time.Second); err != nil {
			t.Fatalf("%v", err)
		}
		res, err := harness.ParsePing(pinger.Log())
		if err != nil {
			t.Fatalf("%v", err)
		}
		t.Logf("east -> west during the join: %d sent, %d received", res.Transmitted, res.Received)
		if res.Transmitted == 0 || res.Lost() != 0 {
			t.Errorf("east -> west lost %d of %d pings while south joined", res.Lost(), res.Transmitted)
		}
		code, err := stream.Wait(window + 30*time.Second)
		if err != nil || code != 0 {
			t.Errorf("TCP stream east -> west broke while south joined (exit %d, %v):\n%s", code, err, stream.Log())
		} else {
			var out struct{ Rounds, Bytes int }
			_ = json.Unmarshal([]byte(lastLine(stream.Log())), &out)
			t.Logf("TCP stream east -> west: %d echoes, %d bytes, unbroken", out.Rounds, out.Bytes)
		}
	})

	t.Run("the east-west peer was not rebuilt", func(t *testing.T) {
		after, err := east.Status()
		if err != nil {
			t.Fatalf("status of east: %v", err)
		}
		ew, ok := harness.Connection(after, "west")
		if !ok {
			t.Fatalf("east has no connection to west any more")
		}
		assertSamePeer(t, "east -> west", eastWest, ew)
	})
}

// assertSamePeer checks a connection was kept: same endpoint and ID, counters only grew (a
// re-created WireGuard peer starts from zero), and the handshake did not go back in time.
func assertSamePeer(t *testing.T, what string, before, after statusapi.Connection) {
	t.Helper()
	if after.Endpoint != before.Endpoint || after.ClusterID != before.ClusterID {
		t.Errorf("%s: endpoint/ID changed from %s/%d to %s/%d", what, before.Endpoint, before.ClusterID, after.Endpoint, after.ClusterID)
	}
	if after.State != "connected" {
		t.Errorf("%s: state %q (%s), want connected", what, after.State, after.Message)
	}
	if after.RxBytes < before.RxBytes || after.TxBytes < before.TxBytes {
		t.Errorf("%s: counters went back from rx %d tx %d to rx %d tx %d: the peer was re-created", what,
			before.RxBytes, before.TxBytes, after.RxBytes, after.TxBytes)
	}
	if before.LastHandshake != nil && after.LastHandshake != nil && after.LastHandshake.Before(*before.LastHandshake) {
		t.Errorf("%s: last handshake went back from %s to %s", what, before.LastHandshake, after.LastHandshake)
	}
}

func lastLine(s string) string {
	for len(s) > 0 && s[len(s)-1] == '\n' {
		s = s[:len(s)-1]
	}
	for i := len(s) - 1; i >= 0; i-- {
		if s[i] == '\n' {
			return s[i+1:]
		}
	}
	return s
}
