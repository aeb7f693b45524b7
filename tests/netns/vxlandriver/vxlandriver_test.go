// Package vxlandriver tests the vxlan cable driver end to end: two node namespaces joined by a
// veth (the underlay), each with a "pod" address behind it, one testpeer process per namespace.
// Node a listens on the default port 4789 and node b on 4790, so each sends to the other's port
// through the FDB entry's destination port.
package vxlandriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/vxlan"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

const (
	// Namespaces are cbtv<pid>-a, cbtv<pid>-b, ... (see nstest).
	nsPrefix = nstest.Prefix("cbtv")
	// altOptions is the policy change of the test: another VNI, a port both ends use, and a
	// smaller MTU for the pair.
	altOptions = "vni=200,port=4791,mtu=1400"
)

// node is one side of the test mesh.
type node struct {
	nstest.Peer
	cluster, underlay, vtep, mac, pod, podNet string
	port                                      int
	stateDir                                  string
}

func TestVXLANDriverBetweenTwoNamespaces(t *testing.T) {
	nstest.RequireRoot(t, "creates network namespaces, veth pairs and VXLAN links", "ip", "ping", "bridge")
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "testpeer")
	buildTestpeer(t, bin)

	a := &node{cluster: "a", underlay: "10.252.0.1", vtep: "240.252.0.1", mac: "02:cb:f0:fc:00:01",
		pod: "10.253.1.1", podNet: "10.253.1.0/24", port: 4789}
	b := &node{cluster: "b", underlay: "10.252.0.2", vtep: "240.252.0.2", mac: "02:cb:f0:fc:00:02",
		pod: "10.253.2.1", podNet: "10.253.2.0/24", port: 4790}
	a.NS, b.NS = nsPrefix.Pair(t, nstest.Node{Underlay: a.underlay, Pod: a.pod}, nstest.Node{Underlay: b.underlay, Pod: b.pod})
	a.Env, b.Env = peerEnv(), peerEnv()
	other := map[*node]*node{a: b, b: a}
	for _, n := range []*node{a, b} {
		n.stateDir = filepath.Join(tmp, n.cluster, "state")
		n.StatusPath = filepath.Join(tmp, n.cluster, "status.json")
		r := other[n]
		n.Args = []string{"netns", "exec", n.NS, bin, "peer",
			"-cluster", n.cluster, "-node", "gw", "-state-dir", n.stateDir, "-advertise", n.underlay,
			"-local-subnets", n.podNet, "-status", n.StatusPath, "-settings", "port=" + strconv.Itoa(n.port),
			"-alt-options", altOptions,
			"-remote-cluster", r.cluster, "-remote-address", r.underlay, "-remote-port", strconv.Itoa(r.port),
			"-remote-subnets", r.podNet}
	}
	a.Start(t)
	b.Start(t)

	// The first Connect builds everything, the second changes nothing; the host shows a VXLAN
	// link with the right VNI, port, source and MAC, the FDB entries, the neighbor and the route.
	for _, n := range []*node{a, b} {
		r := other[n]
		st := waitStatus(t, n, "a connected connection", connectedTo(r.cluster))
		if st.VTEP != n.vtep || st.MTU != 1450 || int(st.Port) != n.port {
			t.Errorf("%s: VTEP %s MTU %d port %d, want %s 1450 %d", n.NS, st.VTEP, st.MTU, st.Port, n.vtep, n.port)
		}
		f := st.AfterFirstConnect
		if f.LinkChanges == 0 || f.AddrChanges != 1 || f.FDBChanges != 2 || f.NeighChanges != 1 || f.RouteChanges != 1 {
			t.Errorf("%s: first Connect stats %+v, want a link, 1 address, 2 FDB entries, 1 neighbor, 1 route", n.NS, f)
		}
		if st.AfterSecondConnect != f {
			t.Errorf("%s: second Connect changed the host: stats %+v then %+v", n.NS, f, st.AfterSecondConnect)
		}
		c := st.Connections[0]
		wantEndpoint := fmt.Sprintf("%s:%d", r.underlay, r.port)
		if c.Node != "gw" || c.MTU != 1450 || c.Endpoint != wantEndpoint || c.Message != "" || len(c.Subnets) != 1 || c.Subnets[0].String() != r.podNet {
			t.Errorf("%s: connection %+v, want node gw MTU 1450 endpoint %s subnets [%s]", n.NS, c, wantEndpoint, r.podNet)
		}
		checkHost(t, n, r, "cbl-vx100", 100, n.port, r.port, 1450, 1450)
	}

	// Traffic between the pod addresses, both ways, sourced by the gateways themselves (route src).
	before := waitStatus(t, a, "any status", func(Status) bool { return true }).Connections[0]
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)
	after := waitStatus(t, a, "grown device counters", func(s Status) bool {
		return len(s.Connections) == 1 && s.Connections[0].RxBytes > before.RxBytes+3*84 && s.Connections[0].TxBytes > before.TxBytes+3*84
	}).Connections[0]
	t.Logf("a: rx %d -> %d, tx %d -> %d", before.RxBytes, after.RxBytes, before.TxBytes, after.TxBytes)

	// MTU: 1400 and 1450 bytes with DF cross; 1451 is refused at the source, not lost on the way.
	checkDFPings(t, a, b, 1450)

	// A few MB of TCP arrive intact (the MSS is clamped on the routes).
	tcpTransfer(t, bin, a, b, 8<<20, 7301)
	tcpTransfer(t, bin, b, a, 4<<20, 7302)

	// Disconnect removes FDB, neighbor, routes and (the last connection of it) the link; traffic stops.
	a.Signal(t, syscall.SIGHUP)
	waitStatus(t, a, "no connection after Disconnect", func(s Status) bool { return s.Disconnected && len(s.Connections) == 0 })
	if routes := nstest.MustRun(t, "ip", "-n", a.NS, "route", "show", "proto", "157"); strings.TrimSpace(routes) != "" {
		t.Errorf("routes left after Disconnect:\n%s", routes)
	}
	if out := nstest.MustRun(t, "ip", "-n", a.NS, "-o", "link", "show", "type", "vxlan"); strings.TrimSpace(out) != "" {
		t.Errorf("VXLAN link left after the last Disconnect:\n%s", out)
	}
	if fdb := nstest.MustRun(t, "bridge", "-n", a.NS, "fdb", "show"); strings.Contains(fdb, "dst "+b.underlay) {
		t.Errorf("FDB entries towards %s left after Disconnect:\n%s", b.underlay, fdb)
	}
	nstest.PingFails(t, a.NS, b.pod)
	nstest.PingFails(t, b.NS, a.pod)
	// b still has its side, and says so truthfully: connected on its host (VXLAN has no handshake).
	if st := readStatus(t, b); len(st.Connections) != 1 || st.Connections[0].State != cable.StateConnected {
		t.Errorf("b: %+v", st.Connections)
	}

	// Connect again: everything comes back.
	a.Signal(t, syscall.SIGUSR1)
	waitStatus(t, a, "connected again", func(s Status) bool { return !s.Disconnected && connectedTo("b")(s) })
	nstest.PingOK(t, a.NS, b.pod)

	// A policy change: both ends move the pair to VNI 200 on port 4791 with MTU 1400. The old link
	// goes away, the new one carries the pair, and 1400 bytes with DF cross while 1401 do not.
	for _, n := range []*node{a, b} {
		n.Signal(t, syscall.SIGWINCH)
	}
	const altLink = "cbl-vx200p4791"
	for _, n := range []*node{a, b} {
		r := other[n]
		st := waitStatus(t, n, "connected with the new options", func(s Status) bool { return s.Options == altOptions && connectedTo(r.cluster)(s) })
		if c := st.Connections[0]; c.MTU != 1400 || c.Endpoint != r.underlay+":4791" {
			t.Errorf("%s: connection after the policy change %+v, want MTU 1400 endpoint port 4791", n.NS, c)
		}
		if _, err := nstest.Run("ip", "-n", n.NS, "link", "show", "cbl-vx100"); err == nil {
			t.Errorf("%s: cbl-vx100 still exists after the pair moved to %s", n.NS, altLink)
		}
		// The link keeps the node MTU; the pair's smaller MTU is on its routes.
		checkHost(t, n, r, altLink, 200, 4791, 4791, 1450, 1400)
	}
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)
	checkDFPings(t, a, b, 1400)
	tcpTransfer(t, bin, a, b, 4<<20, 7303)

	// An FDB entry on our link that no cluster owns is reported, not hidden.
	const stray = "10.252.0.99"
	nstest.MustRun(t, "bridge", "-n", b.NS, "fdb", "append", "00:00:00:00:00:00", "dev", altLink, "dst", stray, "self", "permanent")
	st := waitStatus(t, b, "the stray FDB entry reported", func(s Status) bool { return len(s.Connections) == 2 })
	if c := st.Connections[0]; c.Cluster != "" || c.State != cable.StateError || !strings.Contains(c.Message, "belongs to no known cluster") {
		t.Errorf("b: stray FDB entry reported as %+v", c)
	}

	// Restart a without cleanup (same options): the kernel kept everything, so Init only prunes
	// what is not ours to keep (a stray link with our prefix, a stray FDB entry on our link),
	// Connect changes nothing, and traffic flows throughout.
	a.Stop(t, syscall.SIGTERM)
	if p := readStatus(t, a).CloseProblem(); p != "" {
		t.Errorf("%s: %s", a.NS, p)
	}
	nstest.PingOK(t, b.NS, a.pod)
	nstest.MustRun(t, "ip", "-n", a.NS, "link", "add", "cbl-vx999", "type", "vxlan", "id", "999", "dstport", "4789", "local", a.underlay)
	nstest.MustRun(t, "bridge", "-n", a.NS, "fdb", "append", "00:00:00:00:00:00", "dev", altLink, "dst", stray, "self", "permanent")
	os.Remove(a.StatusPath)
	a.Args = replaceFlag(a.Args, "-options", altOptions)
	a.Start(t)
	st = waitStatus(t, a, "connected after restart", connectedTo("b"))
	if want := (vxlan.Stats{LinkChanges: 1, FDBChanges: 1}); st.AfterInit != want || st.AfterSecondConnect != want {
		t.Errorf("restart: stats after Init %+v, after Connect %+v; want %+v for both (prune only)", st.AfterInit, st.AfterSecondConnect, want)
	}
	if out, err := nstest.Run("ip", "-n", a.NS, "link", "show", "cbl-vx999"); err == nil {
		t.Errorf("a: stray link cbl-vx999 survived Init:\n%s", out)
	}
	if fdb := nstest.MustRun(t, "bridge", "-n", a.NS, "fdb", "show", "dev", altLink); strings.Contains(fdb, stray) {
		t.Errorf("a: stray FDB entry survived Init:\n%s", fdb)
	}
	nstest.PingOK(t, a.NS, b.pod)

	// Cleanup leaves no VXLAN link, no route with proto 157, no connections.json.
	for _, n := range []*node{a, b} {
		n.Stop(t, syscall.SIGUSR2)
		st := readStatus(t, n)
		if !st.CleanedUp || st.Error != "" {
			t.Errorf("%s: cleanup status %+v", n.NS, st)
		}
		if out := nstest.MustRun(t, "ip", "-n", n.NS, "-o", "link", "show"); strings.Contains(out, "cbl-vx") {
			t.Errorf("%s: cbl-vx links after Cleanup:\n%s", n.NS, out)
		}
		if routes := nstest.MustRun(t, "ip", "-n", n.NS, "route", "show", "proto", "157"); strings.TrimSpace(routes) != "" {
			t.Errorf("%s: routes with proto 157 after Cleanup:\n%s", n.NS, routes)
		}
		if _, err := os.Stat(filepath.Join(n.stateDir, "vxlan", "connections.json")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: connections.json after Cleanup: %v", n.NS, err)
		}
	}
	nstest.PingFails(t, b.NS, a.pod)
}

// coverDirEnv names a directory: when set, testpeer is built with coverage of the cable packages
// and writes its counters there (go tool covdata percent -i DIR), since the driver runs in
// testpeer, not in the test process.
const coverDirEnv = "CBTV_COVERDIR"

func buildTestpeer(t *testing.T, bin string) {
	t.Helper()
	args := []string{"go", "build", "-o", bin}
	if os.Getenv(coverDirEnv) != "" {
		// main must be among the covered packages, or nothing is written.
		args = append(args, "-cover", "-coverpkg=github.com/cablemesh/cablemesh/cable/vxlan,github.com/cablemesh/cablemesh/cable/route,github.com/cablemesh/cablemesh/tests/netns/vxlandriver/testpeer")
	}
	nstest.MustRun(t, append(args, "./testpeer")...)
}

// peerEnv is the environment of testpeer processes.
func peerEnv() []string {
	if dir := os.Getenv(coverDirEnv); dir != "" {
		return append(os.Environ(), "GOCOVERDIR="+dir)
	}
	return nil // inherit
}

func connectedTo(cluster string) func(Status) bool {
	return func(s Status) bool {
		return len(s.Connections) == 1 && s.Connections[0].Cluster == cluster && s.Connections[0].State == cable.StateConnected
	}
}

func replaceFlag(args []string, flag, value string) []string {
	out := append([]string(nil), args...)
	for i := range out {
		if out[i] == flag && i+1 < len(out) {
			out[i+1] = value
			return out
		}
	}
	return append(out, flag, value)
}

// checkHost reads n's link, FDB, neighbors and routes with iproute2 (not through the driver).
func checkHost(t *testing.T, n, r *node, link string, vni, port, dstPort, linkMTU, mtu int) {
	t.Helper()
	var links []struct {
		MTU      int    `json:"mtu"`
		Address  string `json:"address"`
		Flags    []string
		LinkInfo struct {
			Kind string `json:"info_kind"`
			Data struct {
				ID       int    `json:"id"`
				Local    string `json:"local"`
				Port     int    `json:"port"`
				Learning bool   `json:"learning"`
			} `json:"info_data"`
		} `json:"linkinfo"`
	}
	out := nstest.MustRun(t, "ip", "-n", n.NS, "-d", "-j", "link", "show", link)
	if err := json.Unmarshal([]byte(out), &links); err != nil || len(links) != 1 {
		t.Fatalf("%s: ip -j link show %s: %v\n%s", n.NS, link, err, out)
	}
	l := links[0]
	d := l.LinkInfo.Data
	if l.LinkInfo.Kind != "vxlan" || d.ID != vni || d.Port != port || d.Learning || d.Local != n.underlay || l.MTU != linkMTU || l.Address != n.mac {
		t.Errorf("%s: link %s is %+v, want vxlan id %d port %d learning off local %s mtu %d address %s\n%s",
			n.NS, link, l, vni, port, n.underlay, linkMTU, n.mac, out)
	}
	addrs := nstest.MustRun(t, "ip", "-n", n.NS, "-4", "-o", "addr", "show", "dev", link)
	if !strings.Contains(addrs, "inet "+n.vtep+"/8") {
		t.Errorf("%s: addresses of %s:\n%s\nwant %s/8", n.NS, link, addrs, n.vtep)
	}
	fdb := nstest.MustRun(t, "bridge", "-n", n.NS, "fdb", "show", "dev", link)
	portPart := ""
	if dstPort != port {
		portPart = fmt.Sprintf(" port %d", dstPort)
	}
	for _, want := range []string{
		fmt.Sprintf("00:00:00:00:00:00 dst %s%s self permanent", r.underlay, portPart),
		fmt.Sprintf("%s dst %s%s self permanent", r.mac, r.underlay, portPart),
	} {
		if !strings.Contains(fdb, want) {
			t.Errorf("%s: FDB of %s:\n%s\nwant a line with %q", n.NS, link, fdb, want)
		}
	}
	neigh := nstest.MustRun(t, "ip", "-n", n.NS, "neigh", "show", "dev", link)
	if want := fmt.Sprintf("%s lladdr %s PERMANENT", r.vtep, r.mac); !strings.Contains(neigh, want) {
		t.Errorf("%s: neighbors of %s:\n%s\nwant %q", n.NS, link, neigh, want)
	}
	routes := nstest.MustRun(t, "ip", "-n", n.NS, "route", "show", "proto", "157")
	re := regexp.MustCompile(fmt.Sprintf(`(?m)^%s via %s dev %s .*src %s .*onlink.* mtu %d advmss %d`,
		regexp.QuoteMeta(r.podNet), regexp.QuoteMeta(r.vtep), link, regexp.QuoteMeta(n.pod), mtu, mtu-40))
	if !re.MatchString(routes) {
		t.Errorf("%s: routes with proto 157:\n%s\nwant one matching %s", n.NS, routes, re)
	}
}

// checkDFPings sends DF pings of exactly mtu bytes (and 1400) on the wire both ways, and checks
// one byte more is refused locally ("message too long") instead of being lost.
func checkDFPings(t *testing.T, a, b *node, mtu int) {
	t.Helper()
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		from, to := p[0], p[1]
		for _, size := range []int{1400 - 28, mtu - 28} {
			if _, err := nstest.Run("ip", "netns", "exec", from.NS, "ping", "-M", "do", "-c", "2", "-i", "0.2", "-W", "2",
				"-s", strconv.Itoa(size), to.pod); err != nil {
				t.Errorf("DF ping of %d bytes from %s to %s: %v", size+28, from.NS, to.pod, err)
			}
		}
		out, err := nstest.Run("ip", "netns", "exec", from.NS, "ping", "-M", "do", "-c", "1", "-W", "1",
			"-s", strconv.Itoa(mtu-28+1), to.pod)
		if err == nil {
			t.Errorf("DF ping of %d bytes from %s crossed a path of MTU %d", mtu+1, from.NS, mtu)
		} else if !strings.Contains(strings.ToLower(out+err.Error()), "message too long") {
			t.Errorf("DF ping of %d bytes from %s failed, but not with 'message too long' at the source: %v", mtu+1, from.NS, err)
		}
	}
}

// tcpTransfer sends size pseudo-random bytes from one pod address to the other and checks they
// all arrive unchanged.
func tcpTransfer(t *testing.T, bin string, from, to *node, size, port int) {
	t.Helper()
	addr := fmt.Sprintf("%s:%d", to.pod, port)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sink := exec.CommandContext(ctx, "ip", "netns", "exec", to.NS, bin, "sink", "-listen", addr, "-bytes", strconv.Itoa(size))
	var sinkOut, sinkErr strings.Builder
	sink.Stdout, sink.Stderr = &sinkOut, &sinkErr
	if err := sink.Start(); err != nil {
		t.Fatal(err)
	}
	sinkDone := make(chan error, 1)
	go func() { sinkDone <- sink.Wait() }()
	t0 := time.Now()
	srcOut, srcErr := nstest.RunWithin(90*time.Second, "ip", "netns", "exec", from.NS, bin, "source", "-addr", addr, "-bind", from.pod,
		"-bytes", strconv.Itoa(size), "-seed", strconv.Itoa(port))
	elapsed := time.Since(t0)
	var err error
	select {
	case err = <-sinkDone:
	case <-time.After(30 * time.Second):
		sink.Process.Kill()
		err = <-sinkDone
	}
	if srcErr != nil || err != nil {
		t.Fatalf("TCP %d bytes %s -> %s: source %v; sink %v %s %s", size, from.NS, addr, srcErr, err, sinkOut.String(), sinkErr.String())
	}
	var sent, got Transfer
	if err := json.Unmarshal([]byte(lastLine(srcOut)), &sent); err != nil {
		t.Fatalf("source output %q: %v", srcOut, err)
	}
	if err := json.Unmarshal([]byte(lastLine(sinkOut.String())), &got); err != nil {
		t.Fatalf("sink output %q: %v", sinkOut.String(), err)
	}
	if sent != got || got.Bytes != int64(size) {
		t.Errorf("TCP %s -> %s: sent %+v, received %+v", from.NS, addr, sent, got)
	}
	t.Logf("TCP %d bytes %s -> %s intact in %v", size, from.NS, addr, elapsed.Round(time.Millisecond))
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

func readStatus(t *testing.T, n *node) Status { return nstest.ReadStatus[Status](t, &n.Peer) }

func waitStatus(t *testing.T, n *node, what string, ok func(Status) bool) Status {
	t.Helper()
	return nstest.WaitStatus(t, &n.Peer, what, 30*time.Second, ok)
}
