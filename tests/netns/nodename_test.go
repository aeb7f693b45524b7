package netns

import (
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestNodeNamesFollowTheBrokersRule checks that the agent applies the broker's node-name rule
// (a DNS subdomain) itself: a node name the broker would refuse at join, whether written in the
// config or taken from the host name, stops the agent with exit code 2 before it creates
// anything, saying which name, where it came from and what to do; a host name in capitals is
// lower-cased, as the kubelet does, and the gateway joins under that name.
func TestNodeNamesFollowTheBrokersRule(t *testing.T) {
	m := harness.New(t)

	refused := func(t *testing.T, c *harness.Cluster, want ...string) {
		t.Helper()
		c.WriteToken("cmj1.unused.unused") // never read: the config is refused first
		c.WriteConfig("")
		linksBefore := m.Links(c.GwNS)
		c.StartAgent()
		code, err := c.Agent.Wait(20 * time.Second)
		if err != nil {
			t.Fatalf("agent kept running: %v\n%s", err, c.Agent.Log())
		}
		log := c.Agent.Log()
		if code != 2 {
			t.Errorf("agent exited %d, want 2 (bad config)", code)
		}
		for _, w := range want {
			if !strings.Contains(log, w) {
				t.Errorf("agent's error does not say %q:\n%s", w, log)
			}
		}
		t.Logf("refused as: %s", strings.TrimSpace(lastLine(log)))
		if after := m.Links(c.GwNS); !slices.Equal(linksBefore, after) {
			t.Errorf("links in %s changed from %v to %v", c.GwNS, linksBefore, after)
		}
		if _, err := os.Stat(c.StatusSocket); err == nil {
			t.Errorf("agent created its status socket %s", c.StatusSocket)
		}
		if entries, _ := os.ReadDir(c.StateDir); len(entries) > 0 {
			t.Errorf("agent wrote %d files into its state dir", len(entries))
		}
		for _, cv := range clusterList(t, m) {
			if cv.Name == c.Name {
				t.Errorf("the broker knows cluster %s: %+v", c.Name, cv)
			}
		}
	}

	t.Run("a node name GW_1 in the config is refused before anything is created", func(t *testing.T) {
		c := m.NewCluster("badnode", "10.7.0.0/16")
		c.Node = "GW_1"
		refused(t, c, `node: "GW_1", set in the agent config, is not a valid node name`, "DNS subdomain")
	})

	t.Run("a host name GW_1 with no node in the config is refused, asking for node", func(t *testing.T) {
		c := m.NewCluster("badhost", "10.8.0.0/16")
		c.Node, c.Hostname = "", "GW_1"
		refused(t, c, `node: "gw_1", defaulted from the host name "GW_1", is not a valid node name`, "set node: in the agent config")
	})

	t.Run("a host name Host-A with no node in the config joins as host-a", func(t *testing.T) {
		c := m.AddCluster("hosta", "10.9.0.0/16")
		c.Node, c.Hostname = "", "Host-A"
		c.WriteConfig("")
		c.StartAgent()
		var gateways []string
		err := harness.WaitFor(ConnectTimeout, 500*time.Millisecond, func() (bool, string) {
			if exited, code := c.Agent.Exited(); exited {
				t.Fatalf("agent exited with code %d:\n%s", code, c.Agent.Log())
			}
			gateways = nil
			for _, cv := range clusterList(t, m) {
				if cv.Name == c.Name {
					for _, g := range cv.Gateways {
						gateways = append(gateways, g.Node)
					}
				}
			}
			return len(gateways) > 0, "the broker lists no gateway of hosta"
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, c.Agent.Log())
		}
		if !slices.Equal(gateways, []string{"host-a"}) {
			t.Errorf("the broker lists hosta's gateways as %q, want [host-a]", gateways)
		}
		st, err := c.Status()
		if err != nil {
			t.Fatal(err)
		}
		if st.Node != "host-a" || !st.Broker.Connected {
			t.Errorf("status: node %q, broker connected %v; want host-a, connected", st.Node, st.Broker.Connected)
		}
	})
}
