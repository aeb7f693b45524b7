// Package ipsecdriver tests the ipsec cable driver end to end: two network namespaces joined by
// a veth, one testpeer process per namespace, each with its own charon (in its own mount
// namespace, so both can use /run/charon.pid), a pod address on each side, and a fixed test key
// handed over on stdin.
package ipsecdriver

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// Namespaces are cbti<pid>-a and cbti<pid>-b (see nstest).
const nsPrefix = nstest.Prefix("cbti")

// testPSK is printable so that a leak is easy to find in any file or log, in any of the forms
// searched for (raw, hex, base64).
var testPSK = []byte("cbti-test-psk-must-never-be-written-0123456789")

// node is one side of the test mesh.
type node struct {
	nstest.Peer
	cluster, underlay, pod, podNet string
	// svcNet is a local subnet in which the node holds no address ("" for none; newPairWith).
	svcNet   string
	stateDir string
}

func TestIPsecDriverBetweenTwoNamespaces(t *testing.T) {
	tmp, a, b := newPair(t)
	a.Start(t)
	b.Start(t)

	sts := map[*node]Status{}
	for _, n := range []*node{a, b} {
		other := map[string]*node{"a": b, "b": a}[n.cluster]
		st := waitStatus(t, n, "a connected connection", 60*time.Second, func(s Status) bool {
			return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
		})
		sts[n] = st
		t.Logf("%s: datapath %s, MTU %d, charon pid %d, stats %+v", n.NS, st.Datapath, st.MTU, st.CharonPID, st.Stats)
		if st.Datapath != string(ipsec.DatapathLibipsec) && st.Datapath != string(ipsec.DatapathKernel) {
			t.Errorf("%s: datapath %q", n.NS, st.Datapath)
		}
		c := st.Connections[0]
		if c.Cluster != other.cluster || c.Node != "gw" || c.MTU != st.MTU || !strings.HasPrefix(c.Endpoint, other.underlay+":") {
			t.Errorf("%s: connection %+v, want cluster %s node gw endpoint %s:*", n.NS, c, other.cluster, other.underlay)
		}
		if c.LastHandshake.IsZero() {
			t.Errorf("%s: connected without an IKE_SA establishment time", n.NS)
		}
		// Connect twice with the same input: the second must change nothing.
		if st.AfterFirstConnect != st.AfterSecondConnect {
			t.Errorf("%s: second Connect changed charon: stats %+v then %+v", n.NS, st.AfterFirstConnect, st.AfterSecondConnect)
		}
		if st.AfterFirstConnect.ConnLoads != 1 || st.AfterFirstConnect.SharedLoads != 1 {
			t.Errorf("%s: first Connect stats %+v, want one load-conn and one load-shared", n.NS, st.AfterFirstConnect)
		}
		// The kernel's view: charon's route in table 220 with a source inside the local pod
		// subnet and the tunnel MTU.
		routes := nstest.MustRun(t, "ip", "-n", n.NS, "route", "show", "table", "220")
		wantRoute := fmt.Sprintf("%s dev ipsec0 proto static src %s mtu %d advmss %d", other.podNet, n.pod, st.MTU, st.MTU-40)
		if st.Datapath == string(ipsec.DatapathKernel) {
			// Kernel xfrm: charon routes via the underlay link; the xfrm policy does the rest.
			wantRoute = fmt.Sprintf("src %s mtu %d", n.pod, st.MTU)
			if !strings.Contains(routes, other.podNet) {
				t.Errorf("%s: table 220 has no route to %s:\n%s", n.NS, other.podNet, routes)
			}
		}
		if !strings.Contains(routes, wantRoute) {
			t.Errorf("%s: table 220:\n%s\nwant a line with %q", n.NS, routes, wantRoute)
		}
		if st.Datapath == string(ipsec.DatapathLibipsec) {
			if st.MTU != ipsec.LibipsecMTU {
				t.Errorf("%s: MTU %d with libipsec, want %d", n.NS, st.MTU, ipsec.LibipsecMTU)
			}
			if out, err := nstest.Run("ip", "-n", n.NS, "link", "show", "ipsec0"); err != nil {
				t.Errorf("%s: no ipsec0 with libipsec: %v", n.NS, err)
			} else {
				t.Logf("%s: %s", n.NS, strings.TrimSpace(strings.Split(out, "\n")[0]))
			}
		} else {
			if out := nstest.MustRun(t, "ip", "-n", n.NS, "xfrm", "state"); !strings.Contains(out, "proto esp") {
				t.Errorf("%s: kernel datapath but no ESP xfrm state:\n%s", n.NS, out)
			}
		}
		// charon's files: a private directory, a private strongswan.conf.
		dir := filepath.Join(n.stateDir, "ipsec")
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %s: %v, want mode 0700", n.NS, dir, err)
		}
		if fi, err := os.Stat(filepath.Join(dir, "strongswan.conf")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: strongswan.conf: %v, want mode 0600", n.NS, err)
		}
		if st.ViciSocket != filepath.Join(dir, "charon.vici") {
			t.Errorf("%s: vici socket %s, want it in %s", n.NS, st.ViciSocket, dir)
		}
		// What swanctl sees over the same socket.
		if _, err := exec.LookPath("swanctl"); err == nil {
			out := nstest.MustRun(t, "swanctl", "--list-sas", "--uri", "unix://"+st.ViciSocket)
			if !strings.Contains(out, "cbl-"+other.cluster) || !strings.Contains(out, "ESTABLISHED") || !strings.Contains(out, "INSTALLED") {
				t.Errorf("%s: swanctl --list-sas:\n%s\nwant cbl-%s ESTABLISHED with an INSTALLED CHILD_SA", n.NS, out, other.cluster)
			}
			t.Logf("%s: swanctl --list-sas:\n%s", n.NS, out)
		} else {
			t.Logf("swanctl not installed: SAs checked through the driver's list-sas only")
		}
	}

	// Traffic between the pod addresses, sourced by the gateways themselves (route src).
	before := sts[a].Connections[0]
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)
	after := waitStatus(t, a, "grown counters", 10*time.Second, func(s Status) bool {
		return len(s.Connections) == 1 && s.Connections[0].RxBytes >= before.RxBytes+3*84 && s.Connections[0].TxBytes >= before.TxBytes+3*84
	}).Connections[0]
	t.Logf("a: rx %d -> %d, tx %d -> %d bytes", before.RxBytes, after.RxBytes, before.TxBytes, after.TxBytes)

	// MTU: a 1400-byte packet with DF set crosses. A larger one is refused by the sender with
	// the route MTU (a local error the application sees, not a silent loss).
	mtu := sts[a].MTU
	if _, err := nstest.Run("ip", "netns", "exec", a.NS, "ping", "-c", "2", "-W", "2", "-M", "do", "-s", fmt.Sprint(mtu-28), b.pod); err != nil {
		t.Errorf("%d-byte DF ping (the tunnel MTU) did not cross: %v", mtu, err)
	}
	if mtu >= 1428 {
		if _, err := nstest.Run("ip", "netns", "exec", a.NS, "ping", "-c", "2", "-W", "2", "-M", "do", "-s", "1400", b.pod); err != nil {
			t.Errorf("ping -s 1400 -M do did not cross with MTU %d: %v", mtu, err)
		}
	} else {
		out, err := nstest.Run("ip", "netns", "exec", a.NS, "ping", "-c", "1", "-W", "2", "-M", "do", "-s", "1400", b.pod)
		if err == nil || !strings.Contains(out, fmt.Sprintf("mtu=%d", mtu)) {
			t.Errorf("ping -s 1400 -M do (1428 bytes) with tunnel MTU %d: want a local 'message too long, mtu=%d', got %v", mtu, mtu, err)
		}
		t.Logf("ping -s 1400 -M do (a 1428-byte packet) does not fit the %s MTU %d: the sender gets %q", sts[a].Datapath, mtu, mtuLine(out))
	}

	// Disconnect removes the connection, the SAs and the routes; Connect brings them back.
	a.Signal(t, syscall.SIGHUP)
	waitStatus(t, a, "no connection after Disconnect", 10*time.Second, func(s Status) bool { return s.Disconnected && len(s.Connections) == 0 })
	if routes := nstest.MustRun(t, "ip", "-n", a.NS, "route", "show", "table", "220"); strings.TrimSpace(routes) != "" {
		t.Errorf("routes in table 220 after Disconnect:\n%s", routes)
	}
	if _, err := nstest.Run("ip", "netns", "exec", a.NS, "ping", "-c", "1", "-W", "1", b.pod); err == nil {
		t.Errorf("ping %s from %s worked after Disconnect", b.pod, a.NS)
	}
	if _, err := nstest.Run("ip", "netns", "exec", b.NS, "ping", "-c", "1", "-W", "1", a.pod); err == nil {
		t.Errorf("ping %s from %s worked after %s disconnected", a.pod, b.NS, a.NS)
	}
	a.Signal(t, syscall.SIGUSR1)
	waitStatus(t, a, "connected again", 30*time.Second, func(s Status) bool {
		return !s.Disconnected && len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)

	// charon dies: the supervisor starts a new one and loads the connection again.
	oldPID := readStatus(t, a).CharonPID
	if err := syscall.Kill(oldPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill charon %d: %v", oldPID, err)
	}
	st := waitStatus(t, a, "a new charon, connected", 60*time.Second, func(s Status) bool {
		return s.CharonPID != 0 && s.CharonPID != oldPID && len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	if st.Stats.CharonStarts != 2 {
		t.Errorf("charon starts %d after one kill, want 2", st.Stats.CharonStarts)
	}
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)

	// An agent restart (Close, then a new process) leaves charon, its SAs and ipsec0 alone, and
	// the new process adopts that charon (TestAgentRestartKeepsTheTunnel looks closer).
	pid := readStatus(t, a).CharonPID
	a.Stop(t, syscall.SIGTERM)
	if p := readStatus(t, a).CloseProblem(); p != "" {
		t.Errorf("%s: %s", a.NS, p)
	}
	if !processRuns(pid) {
		t.Errorf("charon %d stopped with its testpeer's Close", pid)
	}
	if readStatus(t, a).Datapath == string(ipsec.DatapathLibipsec) {
		if _, err := nstest.Run("ip", "-n", a.NS, "link", "show", "ipsec0"); err != nil {
			t.Errorf("ipsec0 went with Close: %v", err)
		}
	}
	os.Remove(a.StatusPath)
	restarted := time.Now()
	a.Start(t)
	st = waitStatus(t, a, "connected after restart", 60*time.Second, func(s Status) bool {
		return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	if st.CharonPID != pid || st.Stats.CharonAdoptions != 1 || st.Stats.CharonStarts != 0 {
		t.Errorf("after the restart: charon pid %d (was %d), stats %+v; want the same charon, adopted", st.CharonPID, pid, st.Stats)
	}
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)
	t.Logf("connected %s after the restart of a", time.Since(restarted).Round(100*time.Millisecond))

	// The key is in no file and no log, in no form.
	checkNoPSK(t, tmp)
	for _, n := range []*node{a, b} {
		pid := readStatus(t, n).CharonPID
		for _, f := range []string{"environ", "cmdline"} {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
			if err != nil {
				t.Errorf("%s: read charon's %s: %v", n.NS, f, err)
				continue
			}
			if leak := findPSK(data); leak != "" {
				t.Errorf("%s: charon's %s holds the pre-shared key (%s)", n.NS, f, leak)
			}
		}
	}

	// Cleanup leaves no charon, no ipsec0, no route, rule or file.
	for _, n := range []*node{a, b} {
		checkCleanedUp(t, n)
	}
	checkNoPSK(t, tmp)
}

// mtuLine is ping's line about the MTU (its local error), or its last line.
func mtuLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for _, l := range lines {
		if strings.Contains(l, "mtu=") {
			return strings.TrimSpace(l)
		}
	}
	return lines[len(lines)-1]
}

// findPSK returns which form of the test key data holds, "" for none.
func findPSK(data []byte) string {
	forms := map[string][]byte{
		"raw":       testPSK,
		"hex":       []byte(hex.EncodeToString(testPSK)),
		"HEX":       []byte(strings.ToUpper(hex.EncodeToString(testPSK))),
		"base64":    []byte(base64.StdEncoding.EncodeToString(testPSK)),
		"0x-hex":    []byte("0x" + hex.EncodeToString(testPSK)),
		"a quarter": testPSK[:len(testPSK)/4+8],
	}
	for name, f := range forms {
		if bytes.Contains(data, f) {
			return name
		}
	}
	return ""
}

// checkNoPSK searches every file under dir (state directories, strongswan.conf, status files,
// the testpeer logs with everything the driver and charon logged) for the key.
func checkNoPSK(t *testing.T, dir string) {
	t.Helper()
	n := 0
	err := filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
		if err != nil || !e.Type().IsRegular() || e.Name() == "testpeer" {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		n++
		if leak := findPSK(data); leak != "" {
			t.Errorf("%s holds the pre-shared key (%s form)", path, leak)
		}
		return nil
	})
	if err != nil {
		t.Errorf("walk %s: %v", dir, err)
	}
	if n == 0 {
		t.Errorf("no file under %s to search for the key: the check proves nothing", dir)
	}
}

func readStatus(t *testing.T, n *node) Status { return nstest.ReadStatus[Status](t, &n.Peer) }

func waitStatus(t *testing.T, n *node, what string, within time.Duration, ok func(Status) bool) Status {
	t.Helper()
	return nstest.WaitStatus(t, &n.Peer, what, within, ok)
}
