// Package wgdriver tests the wireguard cable driver end to end: two network namespaces joined by
// a veth, one testpeer process per namespace, both with the same interface name cbl-wg0 (which
// only works because RunIsolated gives each its own /run/wireguard).
package wgdriver

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/wireguard"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// Namespaces are cbtw<pid>-a and cbtw<pid>-b (see nstest).
const (
	nsPrefix = nstest.Prefix("cbtw")
	iface    = "cbl-wg0"
)

// node is one side of the test mesh.
type node struct {
	nstest.Peer
	cluster, underlay, pod, podNet string
	stateDir                       string
	pub                            string
}

func TestWireGuardDriverBetweenTwoNamespaces(t *testing.T) {
	nstest.RequireRoot(t, "creates network namespaces, veth pairs and WireGuard devices", "ip", "ping")
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "testpeer")
	nstest.MustRun(t, "go", "build", "-o", bin, "./testpeer")

	hostSock := wireguard.UAPISocketPath(iface)
	_, hostSockErr := os.Stat(hostSock)
	hostHadSock := hostSockErr == nil

	a := &node{cluster: "a", underlay: "10.250.0.1", pod: "10.251.1.1", podNet: "10.251.1.0/24"}
	b := &node{cluster: "b", underlay: "10.250.0.2", pod: "10.251.2.1", podNet: "10.251.2.0/24"}
	a.NS, b.NS = nsPrefix.Pair(t, nstest.Node{Underlay: a.underlay, Pod: a.pod}, nstest.Node{Underlay: b.underlay, Pod: b.pod})
	for _, n := range []*node{a, b} {
		n.stateDir = filepath.Join(tmp, n.cluster, "state")
		n.StatusPath = filepath.Join(tmp, n.cluster, "status.json")
		n.pub = writeKey(t, n.stateDir)
	}
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		n, r := p[0], p[1]
		n.Args = []string{"netns", "exec", n.NS, bin,
			"-cluster", n.cluster, "-node", "gw", "-state-dir", n.stateDir, "-advertise", n.underlay,
			"-local-subnets", n.podNet, "-interface", iface, "-status", n.StatusPath,
			"-remote-cluster", r.cluster, "-remote-address", r.underlay, "-remote-port", "51820",
			"-remote-key", r.pub, "-remote-subnets", r.podNet}
	}
	a.Start(t)
	b.Start(t)

	// Both devices carry the same name, each in its own namespace with its own UAPI directory.
	for _, n := range []*node{a, b} {
		st := waitStatus(t, n, "a connected peer", func(s Status) bool {
			return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
		})
		if st.Kind != wireguard.KindUserspace && st.Kind != wireguard.KindKernel {
			t.Errorf("%s: device kind %q", n.NS, st.Kind)
		}
		if st.PublicKey != n.pub {
			t.Errorf("%s: public key %s, want the one from the pre-seeded private key %s", n.NS, st.PublicKey, n.pub)
		}
		c := st.Connections[0]
		other := map[string]string{"a": "b", "b": "a"}[n.cluster]
		if c.Cluster != other || c.Node != "gw" || c.MTU != 1420 || !strings.HasSuffix(c.Endpoint, ":51820") {
			t.Errorf("%s: connection %+v, want cluster %s node gw MTU 1420 endpoint port 51820", n.NS, c, other)
		}
		// Connect twice with the same input: the second must change nothing.
		if st.AfterFirstConnect != st.AfterSecondConnect {
			t.Errorf("%s: second Connect changed the host: stats %+v then %+v", n.NS, st.AfterFirstConnect, st.AfterSecondConnect)
		}
		if st.AfterFirstConnect.Configures == 0 || st.AfterFirstConnect.RouteChanges != 1 {
			t.Errorf("%s: first Connect stats %+v, want at least one configure and one route", n.NS, st.AfterFirstConnect)
		}
		routes := nstest.MustRun(t, "ip", "-n", n.NS, "route", "show", "proto", "157")
		other2 := map[string]*node{"a": b, "b": a}[n.cluster]
		want := fmt.Sprintf("%s dev %s scope link src %s mtu 1420", other2.podNet, iface, n.pod)
		if !strings.Contains(routes, want) {
			t.Errorf("%s: routes with proto 157:\n%s\nwant a line with %q", n.NS, routes, want)
		}
	}
	if !hostHadSock {
		if _, err := os.Stat(hostSock); err == nil {
			t.Errorf("%s appeared in the host's mount namespace: the peers are not isolated", hostSock)
		}
	}

	// Traffic between the pod addresses, sourced by the gateway itself (route src).
	before := waitStatus(t, a, "any status", func(Status) bool { return true }).Connections[0]
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)
	after := waitStatus(t, a, "grown counters", func(s Status) bool {
		return len(s.Connections) == 1 && s.Connections[0].RxBytes > before.RxBytes+3*84 && s.Connections[0].TxBytes > before.TxBytes+3*84
	}).Connections[0]
	t.Logf("a: rx %d -> %d, tx %d -> %d", before.RxBytes, after.RxBytes, before.TxBytes, after.TxBytes)

	// Disconnect removes the peer and the route; Connect brings them back.
	a.Signal(t, syscall.SIGHUP)
	waitStatus(t, a, "no connection after Disconnect", func(s Status) bool { return s.Disconnected && len(s.Connections) == 0 })
	if routes := nstest.MustRun(t, "ip", "-n", a.NS, "route", "show", "proto", "157"); strings.TrimSpace(routes) != "" {
		t.Errorf("routes left after Disconnect:\n%s", routes)
	}
	if _, err := nstest.Run("ip", "netns", "exec", a.NS, "ping", "-c", "1", "-W", "1", b.pod); err == nil {
		t.Errorf("ping %s from %s worked after Disconnect", b.pod, a.NS)
	}
	a.Signal(t, syscall.SIGUSR1)
	waitStatus(t, a, "connected again", func(s Status) bool {
		return !s.Disconnected && len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	nstest.PingOK(t, a.NS, b.pod)

	// Restart a without cleanup: same key, traffic recovers.
	a.Stop(t, syscall.SIGTERM)
	if p := readStatus(t, a).CloseProblem(); p != "" {
		t.Errorf("%s: %s", a.NS, p)
	}
	if _, err := nstest.Run("ip", "-n", a.NS, "link", "show", iface); err == nil {
		t.Logf("%s still has %s after the process ended (kernel device)", a.NS, iface)
	}
	os.Remove(a.StatusPath)
	a.Start(t)
	st := waitStatus(t, a, "connected after restart", func(s Status) bool {
		return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	if st.PublicKey != a.pub {
		t.Errorf("public key changed across restart: %s -> %s", a.pub, st.PublicKey)
	}
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)

	// Cleanup leaves no link, no route of ours, no socket; the key stays.
	for _, n := range []*node{a, b} {
		n.Stop(t, syscall.SIGUSR2)
		st := readStatus(t, n)
		if !st.CleanedUp || st.Error != "" {
			t.Errorf("%s: cleanup status %+v", n.NS, st)
		}
		if st.SocketExists {
			t.Errorf("%s: UAPI socket still there after Cleanup", n.NS)
		}
		if out, err := nstest.Run("ip", "-n", n.NS, "link", "show", iface); err == nil {
			t.Errorf("%s: %s still exists after Cleanup:\n%s", n.NS, iface, out)
		}
		if routes := nstest.MustRun(t, "ip", "-n", n.NS, "route", "show", "proto", "157"); strings.TrimSpace(routes) != "" {
			t.Errorf("%s: routes with proto 157 after Cleanup:\n%s", n.NS, routes)
		}
		if _, err := os.Stat(filepath.Join(n.stateDir, "wireguard", "connections.json")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: connections.json after Cleanup: %v", n.NS, err)
		}
		if _, err := os.Stat(filepath.Join(n.stateDir, "wireguard", "private.key")); err != nil {
			t.Errorf("%s: private key gone after Cleanup: %v", n.NS, err)
		}
	}
}

// writeKey seeds the node's private key, so the test knows both public keys before either
// process starts (the driver must reuse an existing key, never replace it).
func writeKey(t *testing.T, stateDir string) string {
	t.Helper()
	k, err := wgtypes.GeneratePrivateKey()
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(stateDir, "wireguard")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "private.key"), []byte(k.String()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return k.PublicKey().String()
}

func readStatus(t *testing.T, n *node) Status { return nstest.ReadStatus[Status](t, &n.Peer) }

func waitStatus(t *testing.T, n *node, what string, ok func(Status) bool) Status {
	t.Helper()
	return nstest.WaitStatus(t, &n.Peer, what, 30*time.Second, ok)
}
