// Package wgdriver tests the wireguard cable driver end to end: two network namespaces joined by
// a veth, one testpeer process per namespace, both with the same interface name cbl-wg0 (which
// only works because RunIsolated gives each its own /run/wireguard).
package wgdriver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/wireguard"
)

// status mirrors testpeer's Status.
type status struct {
	PID                int                      `json:"pid"`
	Kind               string                   `json:"kind"`
	PublicKey          string                   `json:"publicKey"`
	AfterFirstConnect  wireguard.Stats          `json:"afterFirstConnect"`
	AfterSecondConnect wireguard.Stats          `json:"afterSecondConnect"`
	Stats              wireguard.Stats          `json:"stats"`
	Connections        []cable.ConnectionStatus `json:"connections"`
	Disconnected       bool                     `json:"disconnected"`
	CleanedUp          bool                     `json:"cleanedUp"`
	SocketExists       bool                     `json:"socketExists"`
	Error              string                   `json:"error"`
}

const (
	nsA   = "cbtw-a"
	nsB   = "cbtw-b"
	iface = "cbl-wg0"
)

// node is one side of the test mesh.
type node struct {
	ns, cluster, underlay, pod, podNet string
	stateDir, statusPath               string
	pub                                string
	args                               []string
	cmd                                *exec.Cmd
	exited                             chan error
}

func run(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func mustRun(t *testing.T, args ...string) string {
	t.Helper()
	out, err := run(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestWireGuardDriverBetweenTwoNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veth pairs and WireGuard devices")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip command")
	}
	if _, err := exec.LookPath("ping"); err != nil {
		t.Skip("needs ping")
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "testpeer")
	mustRun(t, "go", "build", "-o", bin, "./testpeer")

	hostSock := wireguard.UAPISocketPath(iface)
	_, hostSockErr := os.Stat(hostSock)
	hostHadSock := hostSockErr == nil

	setupNamespaces(t)

	a := &node{ns: nsA, cluster: "a", underlay: "10.250.0.1", pod: "10.251.1.1", podNet: "10.251.1.0/24"}
	b := &node{ns: nsB, cluster: "b", underlay: "10.250.0.2", pod: "10.251.2.1", podNet: "10.251.2.0/24"}
	for _, n := range []*node{a, b} {
		n.stateDir = filepath.Join(tmp, n.cluster, "state")
		n.statusPath = filepath.Join(tmp, n.cluster, "status.json")
		n.pub = writeKey(t, n.stateDir)
	}
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		n, r := p[0], p[1]
		n.args = []string{"netns", "exec", n.ns, bin,
			"-cluster", n.cluster, "-node", "gw", "-state-dir", n.stateDir, "-advertise", n.underlay,
			"-local-subnets", n.podNet, "-interface", iface, "-status", n.statusPath,
			"-remote-cluster", r.cluster, "-remote-address", r.underlay, "-remote-port", "51820",
			"-remote-key", r.pub, "-remote-subnets", r.podNet}
	}
	start(t, a)
	start(t, b)

	// Both devices carry the same name, each in its own namespace with its own UAPI directory.
	for _, n := range []*node{a, b} {
		st := waitStatus(t, n, "a connected peer", func(s status) bool {
			return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
		})
		if st.Kind != wireguard.KindUserspace && st.Kind != wireguard.KindKernel {
			t.Errorf("%s: device kind %q", n.ns, st.Kind)
		}
		if st.PublicKey != n.pub {
			t.Errorf("%s: public key %s, want the one from the pre-seeded private key %s", n.ns, st.PublicKey, n.pub)
		}
		c := st.Connections[0]
		other := map[string]string{"a": "b", "b": "a"}[n.cluster]
		if c.Cluster != other || c.Node != "gw" || c.MTU != 1420 || !strings.HasSuffix(c.Endpoint, ":51820") {
			t.Errorf("%s: connection %+v, want cluster %s node gw MTU 1420 endpoint port 51820", n.ns, c, other)
		}
		// Connect twice with the same input: the second must change nothing.
		if st.AfterFirstConnect != st.AfterSecondConnect {
			t.Errorf("%s: second Connect changed the host: stats %+v then %+v", n.ns, st.AfterFirstConnect, st.AfterSecondConnect)
		}
		if st.AfterFirstConnect.Configures == 0 || st.AfterFirstConnect.RouteChanges != 1 {
			t.Errorf("%s: first Connect stats %+v, want at least one configure and one route", n.ns, st.AfterFirstConnect)
		}
		routes := mustRun(t, "ip", "-n", n.ns, "route", "show", "proto", "157")
		other2 := map[string]*node{"a": b, "b": a}[n.cluster]
		want := fmt.Sprintf("%s dev %s scope link src %s mtu 1420", other2.podNet, iface, n.pod)
		if !strings.Contains(routes, want) {
			t.Errorf("%s: routes with proto 157:\n%s\nwant a line with %q", n.ns, routes, want)
		}
	}
	if !hostHadSock {
		if _, err := os.Stat(hostSock); err == nil {
			t.Errorf("%s appeared in the host's mount namespace: the peers are not isolated", hostSock)
		}
	}

	// Traffic between the pod addresses, sourced by the gateway itself (route src).
	before := waitStatus(t, a, "any status", func(status) bool { return true }).Connections[0]
	pingOK(t, a.ns, b.pod)
	pingOK(t, b.ns, a.pod)
	after := waitStatus(t, a, "grown counters", func(s status) bool {
		return len(s.Connections) == 1 && s.Connections[0].RxBytes > before.RxBytes+3*84 && s.Connections[0].TxBytes > before.TxBytes+3*84
	}).Connections[0]
	t.Logf("a: rx %d -> %d, tx %d -> %d", before.RxBytes, after.RxBytes, before.TxBytes, after.TxBytes)

	// Disconnect removes the peer and the route; Connect brings them back.
	signal(t, a, syscall.SIGHUP)
	waitStatus(t, a, "no connection after Disconnect", func(s status) bool { return s.Disconnected && len(s.Connections) == 0 })
	if routes := mustRun(t, "ip", "-n", a.ns, "route", "show", "proto", "157"); strings.TrimSpace(routes) != "" {
		t.Errorf("routes left after Disconnect:\n%s", routes)
	}
	if _, err := run(t, "ip", "netns", "exec", a.ns, "ping", "-c", "1", "-W", "1", b.pod); err == nil {
		t.Errorf("ping %s from %s worked after Disconnect", b.pod, a.ns)
	}
	signal(t, a, syscall.SIGUSR1)
	waitStatus(t, a, "connected again", func(s status) bool {
		return !s.Disconnected && len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	pingOK(t, a.ns, b.pod)

	// Restart a without cleanup: same key, traffic recovers.
	stop(t, a, syscall.SIGTERM)
	if _, err := run(t, "ip", "-n", a.ns, "link", "show", iface); err == nil {
		t.Logf("%s still has %s after the process ended (kernel device)", a.ns, iface)
	}
	os.Remove(a.statusPath)
	start(t, a)
	st := waitStatus(t, a, "connected after restart", func(s status) bool {
		return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	if st.PublicKey != a.pub {
		t.Errorf("public key changed across restart: %s -> %s", a.pub, st.PublicKey)
	}
	pingOK(t, a.ns, b.pod)
	pingOK(t, b.ns, a.pod)

	// Cleanup leaves no link, no route of ours, no socket; the key stays.
	for _, n := range []*node{a, b} {
		stop(t, n, syscall.SIGUSR2)
		st := readStatus(t, n)
		if !st.CleanedUp || st.Error != "" {
			t.Errorf("%s: cleanup status %+v", n.ns, st)
		}
		if st.SocketExists {
			t.Errorf("%s: UAPI socket still there after Cleanup", n.ns)
		}
		if out, err := run(t, "ip", "-n", n.ns, "link", "show", iface); err == nil {
			t.Errorf("%s: %s still exists after Cleanup:\n%s", n.ns, iface, out)
		}
		if routes := mustRun(t, "ip", "-n", n.ns, "route", "show", "proto", "157"); strings.TrimSpace(routes) != "" {
			t.Errorf("%s: routes with proto 157 after Cleanup:\n%s", n.ns, routes)
		}
		if _, err := os.Stat(filepath.Join(n.stateDir, "wireguard", "connections.json")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: connections.json after Cleanup: %v", n.ns, err)
		}
		if _, err := os.Stat(filepath.Join(n.stateDir, "wireguard", "private.key")); err != nil {
			t.Errorf("%s: private key gone after Cleanup: %v", n.ns, err)
		}
	}
}

func setupNamespaces(t *testing.T) {
	t.Helper()
	for _, ns := range []string{nsA, nsB} {
		run(t, "ip", "netns", "del", ns) // leftover from a killed run
	}
	t.Cleanup(func() {
		for _, ns := range []string{nsA, nsB} {
			if out, err := run(t, "ip", "netns", "del", ns); err != nil {
				t.Logf("delete netns %s: %v %s", ns, err, out)
			}
		}
	})
	mustRun(t, "ip", "netns", "add", nsA)
	mustRun(t, "ip", "netns", "add", nsB)
	mustRun(t, "ip", "-n", nsA, "link", "add", "cbtw-va", "type", "veth", "peer", "name", "cbtw-vb", "netns", nsB)
	for _, c := range [][]string{
		{"ip", "-n", nsA, "addr", "add", "10.250.0.1/24", "dev", "cbtw-va"},
		{"ip", "-n", nsB, "addr", "add", "10.250.0.2/24", "dev", "cbtw-vb"},
		{"ip", "-n", nsA, "link", "set", "cbtw-va", "up"},
		{"ip", "-n", nsB, "link", "set", "cbtw-vb", "up"},
		{"ip", "-n", nsA, "link", "set", "lo", "up"},
		{"ip", "-n", nsB, "link", "set", "lo", "up"},
		// The "pod" addresses: one address of each node inside its cluster's pod CIDR.
		{"ip", "-n", nsA, "addr", "add", "10.251.1.1/32", "dev", "lo"},
		{"ip", "-n", nsB, "addr", "add", "10.251.2.1/32", "dev", "lo"},
	} {
		mustRun(t, c...)
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

func start(t *testing.T, n *node) {
	t.Helper()
	cmd := exec.Command("ip", n.args...)
	logPath := filepath.Join(filepath.Dir(n.statusPath), "testpeer.log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		t.Fatal(err)
	}
	n.exited = make(chan error, 1)
	go func() { n.exited <- cmd.Wait(); logf.Close() }()
	exited := n.exited
	first := n.cmd == nil
	n.cmd = cmd
	t.Cleanup(func() {
		select {
		case <-exited:
			return
		default:
		}
		// SIGKILL the isolating parent; its child gets SIGTERM through Pdeathsig. Kill the
		// child by the pid it reported too, in case it was already orphaned.
		cmd.Process.Kill()
		if data, err := os.ReadFile(n.statusPath); err == nil {
			var st status
			if json.Unmarshal(data, &st) == nil && st.PID > 0 && st.PID != cmd.Process.Pid {
				syscall.Kill(st.PID, syscall.SIGKILL)
			}
		}
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			t.Logf("%s: testpeer did not exit", n.ns)
		}
	})
	if !first {
		return // the log is shown once, by the first start's cleanup
	}
	t.Cleanup(func() {
		if t.Failed() || testing.Verbose() {
			if data, err := os.ReadFile(logPath); err == nil {
				t.Logf("%s testpeer log:\n%s", n.ns, data)
			}
		}
	})
}

func signal(t *testing.T, n *node, s syscall.Signal) {
	t.Helper()
	if err := n.cmd.Process.Signal(s); err != nil {
		t.Fatalf("%s: signal %v: %v", n.ns, s, err)
	}
}

// stop signals the process and waits for it to exit.
func stop(t *testing.T, n *node, s syscall.Signal) {
	t.Helper()
	signal(t, n, s)
	select {
	case err := <-n.exited:
		if err != nil {
			t.Errorf("%s: testpeer exited with %v after %v", n.ns, err, s)
		}
		n.exited <- err // for the cleanup's check
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: testpeer did not exit after %v", n.ns, s)
	}
}

func readStatus(t *testing.T, n *node) status {
	t.Helper()
	data, err := os.ReadFile(n.statusPath)
	if err != nil {
		t.Fatalf("%s: read status: %v", n.ns, err)
	}
	var st status
	if err := json.Unmarshal(data, &st); err != nil {
		t.Fatalf("%s: decode status %s: %v", n.ns, data, err)
	}
	return st
}

func waitStatus(t *testing.T, n *node, what string, ok func(status) bool) status {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var last status
	for time.Now().Before(deadline) {
		select {
		case err := <-n.exited:
			n.exited <- err
			t.Fatalf("%s: testpeer exited (%v) while waiting for %s", n.ns, err, what)
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

func pingOK(t *testing.T, ns, dst string) {
	t.Helper()
	var err error
	for i := 0; i < 10; i++ {
		if _, err = run(t, "ip", "netns", "exec", ns, "ping", "-c", "3", "-i", "0.2", "-W", "1", dst); err == nil {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("ping %s from %s: %v", dst, ns, err)
}
