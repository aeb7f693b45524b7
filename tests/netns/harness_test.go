package netns

import (
	"net/netip"
	"os"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// TestHarnessLeavesNothing checks the harness itself: the namespaces it wires reach each other
// as designed (no agent needed), and its teardown removes every namespace, process and file.
func TestHarnessLeavesNothing(t *testing.T) {
	harness.RequireRoot(t)
	var m *harness.Mesh
	t.Run("a mesh without agents is wired as designed", func(t *testing.T) {
		m = harness.New(t)
		east := m.NewCluster("east", "10.1.0.0/16")
		west := m.NewCluster("west", "10.2.0.0/16")
		for _, c := range []struct {
			what, ns, addr string
		}{
			{"east gateway reaches west gateway on the underlay", east.GwNS, west.GwUnderlay.String()},
			{"east gateway reaches the broker on the underlay", east.GwNS, m.BrokerAddr.String()},
			{"east pod reaches its gateway", east.PodNS, east.GwPodIP.String()},
		} {
			if ok, r := m.PingOK(c.ns, mustAddr(t, c.addr), 2); !ok {
				t.Errorf("%s: %d/%d: %s", c.what, r.Received, r.Transmitted, r.Output)
			}
		}
		// Without the cable, pods of different clusters must not reach each other.
		if ok, _ := m.PingOK(east.PodNS, west.PodIP, 1); ok {
			t.Errorf("east pod reaches west pod without any tunnel: the underlay leaks")
		}
		if r := m.JoinToken("east", "10.1.0.0/16"); r.Err != nil || !strings.HasPrefix(r.Stdout, "cmj1.") {
			t.Errorf("join-token: %s", r)
		}
		west.StartTCPServer()
		if r := m.TCPCheck(west.GwNS, west.PodIP); r.Err != nil {
			t.Errorf("tcpcheck west gw -> west pod: %s", r)
		}
	})
	if m == nil {
		t.Fatal("no mesh was built")
	}
	names, err := nstest.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, m.Prefix) {
			t.Errorf("namespace %s survived the teardown", n)
		}
	}
	if _, err := os.Stat(m.Dir); os.Getenv(harness.KeepEnv) != "1" && !os.IsNotExist(err) {
		t.Errorf("temp dir %s survived the teardown (%v)", m.Dir, err)
	}
	if m.Broker != nil {
		if exited, _ := m.Broker.Exited(); !exited {
			t.Errorf("broker pid %d survived the teardown", m.Broker.Pid())
		}
	}
	if _, err := os.Stat(harness.OwnerDir + "/" + m.Prefix); !os.IsNotExist(err) {
		t.Errorf("owner file of %s survived the teardown", m.Prefix)
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
