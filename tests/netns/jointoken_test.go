package netns

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestAJoinTokenIsOneTime runs a second agent with the join token of a
// running gateway: as another node it is refused because the token was already used, as the
// running gateway's own node name because that node holds a live certificate. Once the gateway's
// node is revoked (the cluster stays), a new token joins a node of that name again.
func TestAJoinTokenIsOneTime(t *testing.T) {
	m := harness.New(t)
	east := m.AddClusters("east=10.1.0.0/16")[0]
	err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
		_, err := os.Stat(filepath.Join(east.StateDir, "agent.crt"))
		return err == nil, "east's agent has not joined"
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, east.Agent.Log())
	}
	// The gateway registers only once its drivers are up, a moment after it joined:
	// wait for its endpoint, so that "kept its endpoint" below means kept, not not yet there.
	err = harness.WaitFor(30*time.Second, 100*time.Millisecond, func() (bool, string) {
		for _, cv := range clusterList(t, m) {
			if cv.Name == "east" && len(cv.Gateways) == 1 && cv.Gateways[0].Node == east.Node {
				return true, ""
			}
		}
		return false, "east's gateway has not registered"
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, east.Agent.Log())
	}
	token, err := os.ReadFile(east.TokenPath)
	if err != nil {
		t.Fatal(err)
	}

	// A second node of east, in namespaces of its own, with east's token.
	second := m.NewCluster("second", "10.9.0.0/16")
	second.Name, second.PodCIDR = "east", east.PodCIDR

	refused := func(t *testing.T, node string, want ...string) {
		t.Helper()
		second.Node = node
		second.WriteToken(strings.TrimSpace(string(token)))
		second.WriteConfig("")
		second.StartAgent()
		var log string
		err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			log = second.Agent.Log()
			exited, _ := second.Agent.Exited()
			return exited || containsAll(log, want...), "agent still running, log lacks " + strings.Join(want, ", ")
		})
		if err != nil {
			t.Errorf("%v\n%s", err, log)
		}
		if exited, code := second.Agent.Exited(); exited && code == 0 {
			t.Errorf("the refused agent exited 0")
		} else if !exited {
			second.StopAgent()
		}
		if !containsAll(second.Agent.Log(), want...) {
			t.Errorf("the agent's log does not say %q:\n%s", want, second.Agent.Log())
		}
		if _, err := os.Stat(filepath.Join(second.StateDir, "agent.crt")); err == nil {
			t.Errorf("the refused agent holds a certificate")
		}
		t.Logf("refused as: %s", lineWith(second.Agent.Log(), want[0]))
	}
	t.Run("a second node with the same token is refused", func(t *testing.T) {
		refused(t, "east-gw2", "join token already used")
	})
	t.Run("the running gateway's node name is refused whatever the token", func(t *testing.T) {
		r := m.JoinToken("east", east.PodCIDR.String())
		if r.Err != nil {
			t.Fatalf("join-token: %s", r)
		}
		token = []byte(r.Stdout)
		refused(t, east.Node, "already holds a live certificate", "revoke-node")
	})
	// The real gateway kept its endpoint.
	for _, cv := range clusterList(t, m) {
		if cv.Name == "east" && (len(cv.Gateways) != 1 || cv.Gateways[0].Node != east.Node) {
			t.Errorf("east's gateways are now %+v, want %s only", cv.Gateways, east.Node)
		}
	}

	t.Run("after revoke-node the name joins again with a new token", func(t *testing.T) {
		r := m.Cablectl("cluster", "revoke-node", "east", east.Node)
		if r.Err != nil || !strings.Contains(r.Stdout, "revoked") {
			t.Fatalf("revoke-node: %s", r)
		}
		east.StopAgent()
		if names := clusterNames(t, m); len(names) != 1 || names[0] != "east" {
			t.Errorf("clusters after revoke-node: %v, want east still there", names)
		}
		r = m.JoinToken("east", east.PodCIDR.String())
		if r.Err != nil {
			t.Fatalf("join-token: %s", r)
		}
		second.Node = east.Node
		second.WriteToken(strings.TrimSpace(r.Stdout))
		second.WriteConfig("")
		second.StartAgent()
		err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			_, err := os.Stat(filepath.Join(second.StateDir, "agent.crt"))
			return err == nil, "the new east-gw1 has not joined"
		})
		if err != nil {
			t.Fatalf("%v\n%s", err, second.Agent.Log())
		}
		r = m.Cablectl("cluster", "nodes", "east")
		if r.Err != nil || !strings.Contains(r.Stdout, "live") {
			t.Errorf("cluster nodes: %s", r)
		}
		t.Logf("cluster nodes east:\n%s", r.Stdout)
	})
}

// lineWith is the last line of log that contains sub (case-insensitive), for the test's log.
func lineWith(log, sub string) string {
	out := ""
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(strings.ToLower(l), strings.ToLower(sub)) {
			out = l
		}
	}
	return out
}
