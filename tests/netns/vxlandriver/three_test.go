package vxlandriver

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// TestVXLANDriverHubWithTwoRemotes runs three nodes on one bridged underlay: a is connected to b
// and c, which are not connected to each other. It checks what a two-node test cannot: two
// remotes sharing one VXLAN link (head-end replication to two destinations, counters marked as
// shared), a Disconnect that takes one remote off a shared link and leaves the other working,
// and two links with different VNIs side by side, each carrying this node's VTEP address.
func TestVXLANDriverHubWithTwoRemotes(t *testing.T) {
	nstest.RequireRoot(t, "creates network namespaces, a bridge, veth pairs and VXLAN links")
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "testpeer")
	buildTestpeer(t, bin)

	under := nsPrefix.Add(t, "3u")
	nodes := []*node{
		{Peer: nstest.Peer{NS: nsPrefix.Add(t, "3a")}, cluster: "a", underlay: "10.252.8.1", vtep: "240.252.8.1", pod: "10.253.11.1", podNet: "10.253.11.0/24"},
		{Peer: nstest.Peer{NS: nsPrefix.Add(t, "3b")}, cluster: "b", underlay: "10.252.8.2", vtep: "240.252.8.2", pod: "10.253.12.1", podNet: "10.253.12.0/24"},
		{Peer: nstest.Peer{NS: nsPrefix.Add(t, "3c")}, cluster: "c", underlay: "10.252.8.3", vtep: "240.252.8.3", pod: "10.253.13.1", podNet: "10.253.13.0/24"},
	}
	a, b, c := nodes[0], nodes[1], nodes[2]
	setupBridged(t, under, nodes)

	spec := func(r *node) Remote {
		return Remote{Cluster: r.cluster, Address: r.underlay, Port: 4789, Subnets: []string{r.podNet}}
	}
	remotes := map[*node][]Remote{a: {spec(b), spec(c)}, b: {spec(a)}, c: {spec(a)}}
	for _, n := range nodes {
		n.stateDir = filepath.Join(tmp, n.cluster, "state")
		n.StatusPath = filepath.Join(tmp, n.cluster, "status.json")
		// multi ends after a cleanup command, once it has written the status that says so.
		n.Env, n.ExitsWhenDone = peerEnv(), true
		rj, _ := json.Marshal(remotes[n])
		n.Args = []string{"netns", "exec", n.NS, bin, "multi", "-cluster", n.cluster, "-state-dir", n.stateDir,
			"-advertise", n.underlay, "-local-subnets", n.podNet, "-remotes", string(rj),
			"-control", controlPath(n), "-status", n.StatusPath}
		n.Start(t)
	}

	// a holds b and c on one link; both are connected, and the counters are said to be shared.
	st := waitMulti(t, a, "two connected connections", func(s MultiStatus) bool { return allConnected(s, "b", "c") })
	for _, cs := range st.Connections {
		if !strings.Contains(cs.Message, "shared with 1 other") {
			t.Errorf("a: connection %s message %q, want it to say the link's counters are shared", cs.Cluster, cs.Message)
		}
	}
	waitMulti(t, b, "connected to a", func(s MultiStatus) bool { return allConnected(s, "a") })
	waitMulti(t, c, "connected to a", func(s MultiStatus) bool { return allConnected(s, "a") })
	fdb := nstest.MustRun(t, "bridge", "-n", a.NS, "fdb", "show", "dev", "cbl-vx100")
	for _, r := range []*node{b, c} {
		if want := "00:00:00:00:00:00 dst " + r.underlay + " self permanent"; !strings.Contains(fdb, want) {
			t.Errorf("a: FDB of cbl-vx100:\n%s\nwant %q", fdb, want)
		}
	}
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, a.NS, c.pod)
	nstest.PingOK(t, b.NS, a.pod)
	nstest.PingOK(t, c.NS, a.pod)
	nstest.PingFails(t, b.NS, c.pod) // b and c have no connection: no path between them

	// a disconnects b: b's entries leave the shared link, c's stay and c keeps working.
	control(t, a, Command{Seq: 1, Action: "disconnect", Cluster: "b"})
	st = waitMulti(t, a, "only c left", func(s MultiStatus) bool { return s.LastSeq == 1 && allConnected(s, "c") })
	if st.Error != "" || st.Connections[0].Message != "" {
		t.Errorf("a after disconnecting b: error %q, c's message %q (the link is no longer shared)", st.Error, st.Connections[0].Message)
	}
	fdb = nstest.MustRun(t, "bridge", "-n", a.NS, "fdb", "show", "dev", "cbl-vx100")
	if strings.Contains(fdb, "dst "+b.underlay) || !strings.Contains(fdb, "dst "+c.underlay) {
		t.Errorf("a: FDB of cbl-vx100 after disconnecting b:\n%s\nwant entries to %s only", fdb, c.underlay)
	}
	if neigh := nstest.MustRun(t, "ip", "-n", a.NS, "neigh", "show", "dev", "cbl-vx100"); strings.Contains(neigh, b.vtep+" ") {
		t.Errorf("a: neighbor of b left after Disconnect:\n%s", neigh)
	}
	routes := nstest.MustRun(t, "ip", "-n", a.NS, "route", "show", "proto", "157")
	if strings.Contains(routes, b.podNet) || !strings.Contains(routes, c.podNet) {
		t.Errorf("a: routes after disconnecting b:\n%s\nwant only %s", routes, c.podNet)
	}
	nstest.PingOK(t, a.NS, c.pod)
	nstest.PingFails(t, a.NS, b.pod)

	// b again, then c moves to VNI 300 at both ends: a now has two links with one VTEP address.
	control(t, a, Command{Seq: 2, Action: "connect", Cluster: "b"})
	waitMulti(t, a, "b back", func(s MultiStatus) bool { return s.LastSeq == 2 && allConnected(s, "b", "c") })
	vni300 := map[string]string{"vni": "300"}
	control(t, a, Command{Seq: 3, Action: "connect", Cluster: "c", Options: vni300})
	control(t, c, Command{Seq: 1, Action: "connect", Cluster: "a", Options: vni300})
	st = waitMulti(t, a, "c on VNI 300", func(s MultiStatus) bool { return s.LastSeq == 3 && allConnected(s, "b", "c") })
	for _, cs := range st.Connections {
		if cs.Message != "" {
			t.Errorf("a: connection %s message %q, want none (each link has one connection now)", cs.Cluster, cs.Message)
		}
	}
	waitMulti(t, c, "a on VNI 300", func(s MultiStatus) bool { return s.LastSeq == 1 && allConnected(s, "a") })
	for _, link := range []string{"cbl-vx100", "cbl-vx300"} {
		addrs := nstest.MustRun(t, "ip", "-n", a.NS, "-4", "-o", "addr", "show", "dev", link)
		if !strings.Contains(addrs, "inet "+a.vtep+"/8") {
			t.Errorf("a: addresses of %s:\n%s\nwant %s/8", link, addrs, a.vtep)
		}
	}
	if fdb := nstest.MustRun(t, "bridge", "-n", a.NS, "fdb", "show", "dev", "cbl-vx100"); strings.Contains(fdb, "dst "+c.underlay) {
		t.Errorf("a: c's FDB entries still on cbl-vx100 after it moved to VNI 300:\n%s", fdb)
	}
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, a.NS, c.pod)
	nstest.PingOK(t, b.NS, a.pod)
	nstest.PingOK(t, c.NS, a.pod)

	// Cleanup everywhere leaves no VXLAN link and no route of ours.
	for _, n := range nodes {
		seq := readMulti(t, n).LastSeq + 1
		control(t, n, Command{Seq: seq, Action: "cleanup"})
		st := waitMulti(t, n, "cleaned up", func(s MultiStatus) bool { return s.LastSeq == seq && s.CleanedUp })
		if st.Error != "" {
			t.Errorf("%s: cleanup: %s", n.NS, st.Error)
		}
		if out := nstest.MustRun(t, "ip", "-n", n.NS, "-o", "link", "show"); strings.Contains(out, "cbl-vx") {
			t.Errorf("%s: cbl-vx links after Cleanup:\n%s", n.NS, out)
		}
		if routes := nstest.MustRun(t, "ip", "-n", n.NS, "route", "show", "proto", "157"); strings.TrimSpace(routes) != "" {
			t.Errorf("%s: routes with proto 157 after Cleanup:\n%s", n.NS, routes)
		}
	}
}

func allConnected(s MultiStatus, clusters ...string) bool {
	if len(s.Connections) != len(clusters) {
		return false
	}
	for i, c := range s.Connections { // sorted by cluster
		if c.Cluster != clusters[i] || c.State != cable.StateConnected {
			return false
		}
	}
	return true
}

func controlPath(n *node) string { return filepath.Join(filepath.Dir(n.StatusPath), "control.json") }

// control writes cmd for n's testpeer and signals it to run it.
func control(t *testing.T, n *node, cmd Command) {
	t.Helper()
	data, _ := json.Marshal(cmd)
	tmp := controlPath(n) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, controlPath(n)); err != nil {
		t.Fatal(err)
	}
	n.Signal(t, syscall.SIGUSR1)
}

func readMulti(t *testing.T, n *node) MultiStatus { return nstest.ReadStatus[MultiStatus](t, &n.Peer) }

func waitMulti(t *testing.T, n *node, what string, ok func(MultiStatus) bool) MultiStatus {
	t.Helper()
	return nstest.WaitStatus(t, &n.Peer, what, 30*time.Second, ok)
}

// setupBridged makes the underlay: a bridge in namespace under, one veth from it to each node.
func setupBridged(t *testing.T, under string, nodes []*node) {
	t.Helper()
	nstest.MustRun(t, "ip", "-n", under, "link", "set", "lo", "up")
	nstest.MustRun(t, "ip", "-n", under, "link", "add", "cbtv-br", "type", "bridge")
	nstest.MustRun(t, "ip", "-n", under, "link", "set", "cbtv-br", "up")
	for _, n := range nodes {
		port, dev := "cbtv-u"+n.cluster, "cbtv-"+n.cluster
		nstest.Veth(t, under, port, "", n.NS, dev, n.underlay+"/24")
		nstest.MustRun(t, "ip", "-n", under, "link", "set", port, "master", "cbtv-br")
		nstest.MustRun(t, "ip", "-n", n.NS, "link", "set", "lo", "up")
		nstest.MustRun(t, "ip", "-n", n.NS, "addr", "add", n.pod+"/32", "dev", "lo")
	}
}
