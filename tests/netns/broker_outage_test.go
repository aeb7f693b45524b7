package netns

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestBrokerOutage checks the promise of Kuma's multicluster design: without the broker, tunnels keep carrying
// traffic, an agent restarted meanwhile comes back from its cached state, and when the broker
// returns (same data dir) every agent resyncs.
func TestBrokerOutage(t *testing.T) {
	m := harness.New(t)
	clusters := m.AddClusters(threeClusters...)
	east, west, north := clusters[0], clusters[1], clusters[2]
	m.WaitConnected(ConnectTimeout, clusters...)

	revBefore := map[string]uint64{}
	for _, c := range clusters {
		st, err := c.Status()
		if err != nil {
			t.Fatalf("status of %s: %v", c.Name, err)
		}
		revBefore[c.Name] = st.Broker.Revision
	}

	m.StopBroker()

	t.Run("agents notice the broker is gone", func(t *testing.T) {
		for _, c := range clusters {
			err := harness.WaitFor(60*time.Second, 500*time.Millisecond, func() (bool, string) {
				st, err := c.Status()
				if err != nil {
					return false, err.Error()
				}
				return !st.Broker.Connected, "broker.connected still true"
			})
			if err != nil {
				t.Errorf("%s: %v", c.Name, err)
			}
		}
	})

	t.Run("traffic keeps flowing without the broker", func(t *testing.T) {
		for _, from := range clusters {
			for _, to := range clusters {
				if from != to {
					if ok, r := m.PingOK(from.PodNS, to.PodIP, 5); !ok {
						t.Errorf("ping %s -> %s with the broker down: %d/%d: %s", from.Name, to.Name, r.Received, r.Transmitted, r.Output)
					}
				}
			}
		}
	})

	t.Run("an agent restarted while the broker is down comes back from its cache", func(t *testing.T) {
		east.StopAgent()
		east.StartAgent()
		start := time.Now()
		err := harness.WaitFor(60*time.Second, 250*time.Millisecond, func() (bool, string) {
			if ok, code := east.Agent.Exited(); ok {
				t.Fatalf("east's agent exited with code %d while the broker is down:\n%s", code, east.Agent.LogTail(40))
			}
			for _, o := range []*harness.Cluster{west, north} {
				if ok, _ := m.PingOK(east.PodNS, o.PodIP, 1); !ok {
					return false, "no reply from " + o.Name
				}
			}
			return true, ""
		})
		if err != nil {
			t.Fatalf("east pod -> west/north after the restart: %v", err)
		}
		t.Logf("east's restarted agent carried traffic again after %s (broker down)", time.Since(start).Round(time.Millisecond))
		st, err := east.Status()
		if err != nil {
			t.Fatalf("status of east: %v", err)
		}
		if st.Broker.Connected {
			t.Errorf("east reports broker.connected = true while the broker is down")
		}
		if !st.Broker.Cached {
			t.Errorf("east reports broker.cached = false, want true: it runs on its cached state")
		}
		if ok, desc := harness.ConnectedTo(st, "west", "north"); !ok {
			t.Errorf("east from cache: %s", desc)
		}
		for _, o := range []*harness.Cluster{west, north} {
			if ok, r := m.PingOK(o.PodNS, east.PodIP, 5); !ok {
				t.Errorf("ping %s -> east after east's restart: %d/%d: %s", o.Name, r.Received, r.Transmitted, r.Output)
			}
		}
	})

	t.Run("agents resync when the broker comes back with the same data dir", func(t *testing.T) {
		m.StartBroker()
		for _, c := range clusters {
			var last uint64
			err := harness.WaitFor(90*time.Second, 500*time.Millisecond, func() (bool, string) {
				st, err := c.Status()
				if err != nil {
					return false, err.Error()
				}
				last = st.Broker.Revision
				ok := st.Broker.Connected && !st.Broker.Cached && st.Broker.Revision >= revBefore[c.Name]
				return ok, "broker " + st.Broker.Address + " connected=" + boolStr(st.Broker.Connected) + " cached=" + boolStr(st.Broker.Cached) + " error=" + st.Broker.Error
			})
			if err != nil {
				t.Errorf("%s did not resync: %v", c.Name, err)
				continue
			}
			t.Logf("%s resynced: revision %d -> %d", c.Name, revBefore[c.Name], last)
		}
		// The watch streams are live again: a change made at the broker now reaches every
		// agent, whose revision advances to the broker's.
		if r := m.Cablectl("cluster", "label", "east", "resynced=yes"); r.Err != nil {
			t.Fatalf("label east: %s", r)
		}
		brokerRev := brokerRevision(t, m)
		for _, c := range clusters {
			err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
				st, err := c.Status()
				if err != nil {
					return false, err.Error()
				}
				return st.Broker.Revision >= brokerRev, fmt.Sprintf("revision %d, broker at %d", st.Broker.Revision, brokerRev)
			})
			if err != nil {
				t.Errorf("%s did not follow the broker after the resync: %v", c.Name, err)
			} else if brokerRev <= revBefore[c.Name] {
				t.Errorf("broker revision %d did not advance past %s's %d", brokerRev, c.Name, revBefore[c.Name])
			}
		}
		m.WaitConnected(ConnectTimeout, clusters...)
		for _, from := range clusters {
			for _, to := range clusters {
				if from != to {
					if ok, r := m.PingOK(from.PodNS, to.PodIP, 3); !ok {
						t.Errorf("ping %s -> %s after the resync: %d/%d: %s", from.Name, to.Name, r.Received, r.Transmitted, r.Output)
					}
				}
			}
		}
	})
}

func boolStr(b bool) string {
	if b {
		return "true"
	}
	return "false"
}

// brokerRevision is the broker's current revision from `cablectl cluster list -o json`.
func brokerRevision(t *testing.T, m *harness.Mesh) uint64 {
	t.Helper()
	r := m.Cablectl("cluster", "list", "-o", "json")
	if r.Err != nil {
		t.Fatalf("cluster list: %s", r)
	}
	var doc struct {
		Revision uint64 `json:"revision"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &doc); err != nil {
		t.Fatalf("decode cluster list: %v", err)
	}
	return doc.Revision
}
