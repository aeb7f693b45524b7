package vxlandriver

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// multiStatus mirrors testpeer's MultiStatus.
type multiStatus struct {
	PID         int                      `json:"pid"`
	LastSeq     int                      `json:"lastSeq"`
	Connections []cable.ConnectionStatus `json:"connections"`
	CleanedUp   bool                     `json:"cleanedUp"`
	Error       string                   `json:"error"`
}

type remoteSpec struct {
	Cluster string            `json:"cluster"`
	Address string            `json:"address"`
	Port    uint16            `json:"port"`
	Subnets []string          `json:"subnets"`
	Options map[string]string `json:"options,omitempty"`
}

type command struct {
	Seq     int               `json:"seq"`
	Action  string            `json:"action"`
	Cluster string            `json:"cluster"`
	Options map[string]string `json:"options,omitempty"`
}

// TestVXLANDriverHubWithTwoRemotes runs three nodes on one bridged underlay: a is connected to b
// and c, which are not connected to each other. It checks what a two-node test cannot: two
// remotes sharing one VXLAN link (head-end replication to two destinations, counters marked as
// shared), a Disconnect that takes one remote off a shared link and leaves the other working,
// and two links with different VNIs side by side, each carrying this node's VTEP address.
func TestVXLANDriverHubWithTwoRemotes(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, a bridge, veth pairs and VXLAN links")
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "testpeer")
	buildTestpeer(t, bin)

	pid := os.Getpid()
	under := fmt.Sprintf("%s%d-3u", nsPrefix, pid)
	nodes := []*node{
		{ns: fmt.Sprintf("%s%d-3a", nsPrefix, pid), cluster: "a", underlay: "10.252.8.1", vtep: "240.252.8.1", pod: "10.253.11.1", podNet: "10.253.11.0/24"},
		{ns: fmt.Sprintf("%s%d-3b", nsPrefix, pid), cluster: "b", underlay: "10.252.8.2", vtep: "240.252.8.2", pod: "10.253.12.1", podNet: "10.253.12.0/24"},
		{ns: fmt.Sprintf("%s%d-3c", nsPrefix, pid), cluster: "c", underlay: "10.252.8.3", vtep: "240.252.8.3", pod: "10.253.13.1", podNet: "10.253.13.0/24"},
	}
	a, b, c := nodes[0], nodes[1], nodes[2]
	setupBridged(t, under, nodes)

	spec := func(r *node) remoteSpec {
		return remoteSpec{Cluster: r.cluster, Address: r.underlay, Port: 4789, Subnets: []string{r.podNet}}
	}
	remotes := map[*node][]remoteSpec{a: {spec(b), spec(c)}, b: {spec(a)}, c: {spec(a)}}
	for _, n := range nodes {
		n.stateDir = filepath.Join(tmp, n.cluster, "state")
		n.statusPath = filepath.Join(tmp, n.cluster, "status.json")
		if err := os.MkdirAll(filepath.Dir(n.statusPath), 0o755); err != nil {
			t.Fatal(err)
		}
		rj, _ := json.Marshal(remotes[n])
		n.args = []string{"netns", "exec", n.ns, bin, "multi", "-cluster", n.cluster, "-state-dir", n.stateDir,
			"-advertise", n.underlay, "-local-subnets", n.podNet, "-remotes", string(rj),
			"-control", controlPath(n), "-status", n.statusPath}
		start(t, n)
	}

	// a holds b and c on one link; both are connected, and the counters are said to be shared.
	st := waitMulti(t, a, "two connected connections", func(s multiStatus) bool { return allConnected(s, "b", "c") })
	for _, cs := range st.Connections {
		if !strings.Contains(cs.Message, "shared with 1 other") {
			t.Errorf("a: connection %s message %q, want it to say the link's counters are shared", cs.Cluster, cs.Message)
		}
	}
	waitMulti(t, b, "connected to a", func(s multiStatus) bool { return allConnected(s, "a") })
	waitMulti(t, c, "connected to a", func(s multiStatus) bool { return allConnected(s, "a") })
	fdb := mustRun(t, "bridge", "-n", a.ns, "fdb", "show", "dev", "cbl-vx100")
	for _, r := range []*node{b, c} {
		if want := "00:00:00:00:00:00 dst " + r.underlay + " self permanent"; !strings.Contains(fdb, want) {
			t.Errorf("a: FDB of cbl-vx100:\n%s\nwant %q", fdb, want)
		}
	}
	pingOK(t, a.ns, b.pod)
	pingOK(t, a.ns, c.pod)
	pingOK(t, b.ns, a.pod)
	pingOK(t, c.ns, a.pod)
	pingFails(t, b.ns, c.pod) // b and c have no connection: no path between them

	// a disconnects b: b's entries leave the shared link, c's stay and c keeps working.
	control(t, a, command{Seq: 1, Action: "disconnect", Cluster: "b"})
	st = waitMulti(t, a, "only c left", func(s multiStatus) bool { return s.LastSeq == 1 && allConnected(s, "c") })
	if st.Error != "" || st.Connections[0].Message != "" {
		t.Errorf("a after disconnecting b: error %q, c's message %q (the link is no longer shared)", st.Error, st.Connections[0].Message)
	}
	fdb = mustRun(t, "bridge", "-n", a.ns, "fdb", "show", "dev", "cbl-vx100")
	if strings.Contains(fdb, "dst "+b.underlay) || !strings.Contains(fdb, "dst "+c.underlay) {
		t.Errorf("a: FDB of cbl-vx100 after disconnecting b:\n%s\nwant entries to %s only", fdb, c.underlay)
	}
	if neigh := mustRun(t, "ip", "-n", a.ns, "neigh", "show", "dev", "cbl-vx100"); strings.Contains(neigh, b.vtep+" ") {
		t.Errorf("a: neighbor of b left after Disconnect:\n%s", neigh)
	}
	routes := mustRun(t, "ip", "-n", a.ns, "route", "show", "proto", "157")
	if strings.Contains(routes, b.podNet) || !strings.Contains(routes, c.podNet) {
		t.Errorf("a: routes after disconnecting b:\n%s\nwant only %s", routes, c.podNet)
	}
	pingOK(t, a.ns, c.pod)
	pingFails(t, a.ns, b.pod)

	// b again, then c moves to VNI 300 at both ends: a now has two links with one VTEP address.
	control(t, a, command{Seq: 2, Action: "connect", Cluster: "b"})
	waitMulti(t, a, "b back", func(s multiStatus) bool { return s.LastSeq == 2 && allConnected(s, "b", "c") })
	vni300 := map[string]string{"vni": "300"}
	control(t, a, command{Seq: 3, Action: "connect", Cluster: "c", Options: vni300})
	control(t, c, command{Seq: 1, Action: "connect", Cluster: "a", Options: vni300})
	st = waitMulti(t, a, "c on VNI 300", func(s multiStatus) bool { return s.LastSeq == 3 && allConnected(s, "b", "c") })
	for _, cs := range st.Connections {
		if cs.Message != "" {
			t.Errorf("a: connection %s message %q, want none (each link has one connection now)", cs.Cluster, cs.Message)
		}
	}
	waitMulti(t, c, "a on VNI 300", func(s multiStatus) bool { return s.LastSeq == 1 && allConnected(s, "a") })
	for _, link := range []string{"cbl-vx100", "cbl-vx300"} {
		addrs := mustRun(t, "ip", "-n", a.ns, "-4", "-o", "addr", "show", "dev", link)
		if !strings.Contains(addrs, "inet "+a.vtep+"/8") {
			t.Errorf("a: addresses of %s:\n%s\nwant %s/8", link, addrs, a.vtep)
		}
	}
	if fdb := mustRun(t, "bridge", "-n", a.ns, "fdb", "show", "dev", "cbl-vx100"); strings.Contains(fdb, "dst "+c.underlay) {
		t.Errorf("a: c's FDB entries still on cbl-vx100 after it moved to VNI 300:\n%s", fdb)
	}
	pingOK(t, a.ns, b.pod)
	pingOK(t, a.ns, c.pod)
	pingOK(t, b.ns, a.pod)
	pingOK(t, c.ns, a.pod)

	// Cleanup everywhere leaves no VXLAN link and no route of ours.
	for _, n := range nodes {
		seq := readMulti(t, n).LastSeq + 1
		control(t, n, command{Seq: seq, Action: "cleanup"})
		st := waitMulti(t, n, "cleaned up", func(s multiStatus) bool { return s.LastSeq == seq && s.CleanedUp })
		if st.Error != "" {
			t.Errorf("%s: cleanup: %s", n.ns, st.Error)
		}
		if out := mustRun(t, "ip", "-n", n.ns, "-o", "link", "show"); strings.Contains(out, "cbl-vx") {
			t.Errorf("%s: cbl-vx links after Cleanup:\n%s", n.ns, out)
		}
		if routes := mustRun(t, "ip", "-n", n.ns, "route", "show", "proto", "157"); strings.TrimSpace(routes) != "" {
			t.Errorf("%s: routes with proto 157 after Cleanup:\n%s", n.ns, routes)
		}
	}
}

func allConnected(s multiStatus, clusters ...string) bool {
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

func controlPath(n *node) string { return filepath.Join(filepath.Dir(n.statusPath), "control.json") }

// control writes cmd for n's testpeer and signals it to run it.
func control(t *testing.T, n *node, cmd command) {
	t.Helper()
	data, _ := json.Marshal(cmd)
	tmp := controlPath(n) + ".tmp"
	if err := os.WriteFile(tmp, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, controlPath(n)); err != nil {
		t.Fatal(err)
	}
	signal(t, n, syscall.SIGUSR1)
}

func readMulti(t *testing.T, n *node) multiStatus {
	t.Helper()
	var st multiStatus
	data, err := os.ReadFile(n.statusPath)
	if err != nil {
		t.Fatalf("%s: read status: %v", n.ns, err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("%s: decode status %s: %v", n.ns, data, err)
	}
	return st
}

func waitMulti(t *testing.T, n *node, what string, ok func(multiStatus) bool) multiStatus {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last multiStatus
	for time.Now().Before(deadline) {
		select {
		case err := <-n.exited:
			n.exited <- err
			if ok(last) {
				return last
			}
			if data, rerr := os.ReadFile(n.statusPath); rerr == nil && json.Unmarshal(data, &last) == nil && ok(last) {
				return last
			}
			t.Fatalf("%s: testpeer exited (%v) while waiting for %s; last status %+v", n.ns, err, what, last)
		default:
		}
		if data, err := os.ReadFile(n.statusPath); err == nil {
			if json.Unmarshal(data, &last) == nil && ok(last) {
				return last
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%s: no %s within 30s; last status %+v", n.ns, what, last)
	return last
}

// setupBridged makes the underlay: a bridge in namespace under, one veth from it to each node.
func setupBridged(t *testing.T, under string, nodes []*node) {
	t.Helper()
	sweepStale(t)
	all := []string{under}
	for _, n := range nodes {
		all = append(all, n.ns)
	}
	t.Cleanup(func() {
		for _, ns := range all {
			if out, err := run(t, "ip", "netns", "del", ns); err != nil {
				t.Logf("delete netns %s: %v %s", ns, err, out)
			}
		}
	})
	for _, ns := range all {
		mustRun(t, "ip", "netns", "add", ns)
		mustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	mustRun(t, "ip", "-n", under, "link", "add", "cbtv-br", "type", "bridge")
	mustRun(t, "ip", "-n", under, "link", "set", "cbtv-br", "up")
	for _, n := range nodes {
		port, dev := "cbtv-u"+n.cluster, "cbtv-"+n.cluster
		mustRun(t, "ip", "-n", under, "link", "add", port, "type", "veth", "peer", "name", dev, "netns", n.ns)
		mustRun(t, "ip", "-n", under, "link", "set", port, "master", "cbtv-br", "up")
		mustRun(t, "ip", "-n", n.ns, "addr", "add", n.underlay+"/24", "dev", dev)
		mustRun(t, "ip", "-n", n.ns, "link", "set", dev, "up")
		mustRun(t, "ip", "-n", n.ns, "addr", "add", n.pod+"/32", "dev", "lo")
	}
}
