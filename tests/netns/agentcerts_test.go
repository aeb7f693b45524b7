package netns

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestAgentsRenewThroughACARotation: while traffic flows between
// two clusters, `cablectl ca rotate --overlap` makes every agent store the new CA bundle and renew
// its certificate from the new CA at once, over its current identity, without a restart and
// without touching its tunnels; after `cablectl ca rotate --finish` (the old CA is no longer
// trusted) the agents still reach the broker, also over new connections to a restarted broker
// that now serves with the new CA.
func TestAgentsRenewThroughACARotation(t *testing.T) {
	m := harness.New(t)
	clusters := m.AddClusters("east=10.1.0.0/16", "west=10.2.0.0/16")
	east, west := clusters[0], clusters[1]
	m.WaitConnected(ConnectTimeout, clusters...)

	type before struct {
		pid, link, connects int
		serial              string
	}
	was := map[string]before{}
	for _, c := range clusters {
		cert, err := c.AgentCert()
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		was[c.Name] = before{pid: c.Agent.Pid(), link: m.LinkIndex(c.GwNS, c.WGInterface), connects: reconcileLines(c.Agent.Log()), serial: cert.SerialNumber.Text(16)}
	}
	west.StartTCPServer()
	// Traffic through the tunnel during the rotation and its finish: 20 s of pings 200 ms apart
	// and of TCP echoes on one connection.
	pinger := m.StartPinger("ping-east-west", east.PodNS, west.PodIP, 100, 200*time.Millisecond)
	stream := m.StartTCPStream("tcp-east-west", east.PodNS, west.PodIP, 20*time.Second)

	r := m.Cablectl("ca", "rotate", "--overlap", "1h")
	if r.Err != nil {
		t.Fatalf("ca rotate: %s", r)
	}
	t.Logf("ca rotate:\n%s", r.Stdout)
	rotated := time.Now()

	t.Run("every agent stores both CAs and renews from the new CA at once", func(t *testing.T) {
		for _, c := range clusters {
			var desc string
			err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
				cas, err := c.AgentCAs()
				if err != nil {
					return false, err.Error()
				}
				cert, err := c.AgentCert()
				if err != nil {
					return false, err.Error()
				}
				issuedByNew := len(cas) == 2 && cert.CheckSignatureFrom(cas[1]) == nil
				desc = fmt.Sprintf("ca.crt holds %d CAs; agent.crt serial %s (was %s), issued by the new CA: %v", len(cas), cert.SerialNumber.Text(16), was[c.Name].serial, issuedByNew)
				return issuedByNew && cert.SerialNumber.Text(16) != was[c.Name].serial, desc
			})
			if err != nil {
				t.Errorf("%s: %v\n%s", c.Name, err, c.Agent.LogTail(30))
				continue
			}
			t.Logf("%s after %s: %s", c.Name, time.Since(rotated).Round(time.Millisecond), desc)
			t.Logf("%s: %s", c.Name, lineWith(c.Agent.Log(), "agent certificate renewed"))
		}
	})

	// A change at the broker reaches both agents: their watches go on, over the renewed
	// certificates.
	changeReachesAgents(t, m, clusters, "rotation=started")

	r = m.Cablectl("ca", "rotate", "--finish")
	if r.Err != nil {
		t.Fatalf("ca rotate --finish: %s", r)
	}
	t.Logf("ca rotate --finish:\n%s", r.Stdout)

	t.Run("after the finish the agents trust the new CA only and still reach the broker", func(t *testing.T) {
		for _, c := range clusters {
			err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
				cas, err := c.AgentCAs()
				if err != nil {
					return false, err.Error()
				}
				return len(cas) == 1, fmt.Sprintf("ca.crt holds %d CAs", len(cas))
			})
			if err != nil {
				t.Errorf("%s: %v", c.Name, err)
			}
		}
		changeReachesAgents(t, m, clusters, "rotation=finished")
		// New connections: the broker restarts and serves with the new CA; the agents verify it
		// with the bundle they stored and present their renewed certificates.
		m.StopBroker()
		m.StartBroker()
		changeReachesAgents(t, m, clusters, "rotation=restarted")
		for _, c := range clusters {
			err := harness.WaitFor(30*time.Second, 500*time.Millisecond, func() (bool, string) {
				st, err := c.Status()
				if err != nil {
					return false, err.Error()
				}
				return st.Broker.Connected && st.Broker.Error == "", fmt.Sprintf("connected=%v error=%q", st.Broker.Connected, st.Broker.Error)
			})
			if err != nil {
				t.Errorf("%s after the broker's restart: %v", c.Name, err)
			}
		}
	})

	t.Run("no agent restarted and no tunnel was touched", func(t *testing.T) {
		for _, c := range clusters {
			if exited, code := c.Agent.Exited(); exited || c.Agent.Pid() != was[c.Name].pid {
				t.Errorf("%s's agent exited (%v, code %d) or changed pid", c.Name, exited, code)
			}
			if idx := m.LinkIndex(c.GwNS, c.WGInterface); idx != was[c.Name].link {
				t.Errorf("%s's %s has index %d, was %d: the link was recreated", c.Name, c.WGInterface, idx, was[c.Name].link)
			}
			if n := reconcileLines(c.Agent.Log()); n != was[c.Name].connects {
				t.Errorf("%s's agent connected or disconnected pairs during the rotation (%d reconcile lines, were %d):\n%s", c.Name, n, was[c.Name].connects, c.Agent.LogTail(40))
			}
			st, err := c.Status()
			if err != nil {
				t.Errorf("%s: %v", c.Name, err)
				continue
			}
			if st.Broker.CertificateNotAfter == nil {
				t.Errorf("%s's status has no broker.certificateNotAfter", c.Name)
			}
			t.Logf("%s: %s", c.Name, lineWith(c.StatusTable(), "Certificate:"))
		}
		if code, err := stream.Wait(60 * time.Second); err != nil || code != 0 {
			t.Errorf("the TCP stream east -> west failed during the rotation (exit %d, %v):\n%s", code, err, stream.LogTail(20))
		}
		t.Logf("tcp stream: %s", strings.TrimSpace(stream.LogTail(3)))
		if _, err := pinger.Wait(60 * time.Second); err != nil {
			t.Errorf("ping east -> west: %v", err)
		}
		if res, err := harness.ParsePing(pinger.Log()); err != nil {
			t.Errorf("ping east -> west: %v", err)
		} else {
			if res.Lost() > 0 {
				t.Errorf("ping east -> west lost %d of %d echoes during the rotation", res.Lost(), res.Transmitted)
			}
			t.Logf("ping east -> west during the rotation: %d/%d answered", res.Received, res.Transmitted)
		}
		if ok, res := m.PingOK(east.PodNS, west.PodIP, 5); !ok {
			t.Errorf("ping east -> west after the broker's restart: %d/%d", res.Received, res.Transmitted)
		}
	})
}

// reconcileLines counts the agent log's lines that connect or disconnect a pair.
func reconcileLines(log string) int {
	n := 0
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, "msg=connected ") || strings.Contains(l, "msg=disconnected ") || strings.Contains(l, `msg="pair moved"`) {
			n++
		}
	}
	return n
}

// changeReachesAgents labels the first cluster and waits until every agent applied the revision.
func changeReachesAgents(t *testing.T, m *harness.Mesh, clusters []*harness.Cluster, label string) {
	t.Helper()
	r := m.Cablectl("cluster", "label", clusters[0].Name, label)
	if r.Err != nil {
		t.Fatalf("cluster label %s: %s", label, r)
	}
	want := brokerRevision(t, m)
	for _, c := range clusters {
		err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			st, err := c.Status()
			if err != nil {
				return false, err.Error()
			}
			return st.Broker.Revision >= want && st.Broker.Connected, fmt.Sprintf("revision %d (want %d), connected %v, error %q", st.Broker.Revision, want, st.Broker.Connected, st.Broker.Error)
		})
		if err != nil {
			t.Errorf("%s did not get the change %s: %v", c.Name, label, err)
		}
	}
}
