package ipsecdriver

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// tsDevice is the dummy device the driver puts its traffic-selector addresses on (written out,
// not ipsec.TSAddressDevice, so that the test also builds against a driver without it).
const tsDevice = "cm-ipsec-ts"

// TestLocalSubnetWithoutNodeAddress: each side's local subnets include a "service CIDR" in
// which the node holds no address (a Kubernetes node with kube-proxy in iptables mode). With
// kernel-libipsec charon installs a route for every outbound policy, and needs a local address
// inside the policy's local traffic selector for it; without one it refuses the CHILD_SA
// ("unable to install IPsec policies (SPD) in kernel"), and the IKE_SA stays up alone. The
// driver gives the node one: the service CIDR's last address, a /32 on cm-ipsec-ts, and none in
// the pod subnet, where the node holds an address already. It keeps the address when someone
// deletes it or charon restarts, removes it when no connection has the subnet any more
// (Disconnect), and Cleanup removes it.
func TestLocalSubnetWithoutNodeAddress(t *testing.T) {
	_, a, b := newPairWith(t, true)
	a.Start(t)
	b.Start(t)

	svcAddr := map[*node]string{a: "10.255.255.255", b: "10.255.127.255"}
	podLast := map[*node]string{a: "10.255.1.255", b: "10.255.2.255"}
	for _, n := range []*node{a, b} {
		other := map[*node]*node{a: b, b: a}[n]
		st := waitStatus(t, n, "a connected connection (CHILD_SA installed)", 60*time.Second, func(s Status) bool {
			return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
		})
		if st.Datapath != string(ipsec.DatapathLibipsec) {
			t.Skipf("%s: datapath %s: the traffic-selector addresses are kernel-libipsec's need", n.NS, st.Datapath)
		}
		addrs := tsAddrs(t, n)
		if !strings.Contains(addrs, "inet "+svcAddr[n]+"/32 ") {
			t.Errorf("%s: %s:\n%s\nwant %s/32 (the last address of %s)", n.NS, tsDevice, addrs, svcAddr[n], n.svcNet)
		}
		if strings.Contains(addrs, podLast[n]) {
			t.Errorf("%s: %s holds %s although the node holds %s in %s:\n%s", n.NS, tsDevice, podLast[n], n.pod, n.podNet, addrs)
		}
		// Only the one address: nothing else of the node moved there.
		if c := strings.Count(addrs, "inet "); c != 1 {
			t.Errorf("%s: %d IPv4 addresses on %s, want 1:\n%s", n.NS, c, tsDevice, addrs)
		}
		routes := nstest.MustRun(t, "ip", "-n", n.NS, "route", "show", "table", "220")
		t.Logf("%s: table 220:\n%s%s:\n%s", n.NS, routes, tsDevice, addrs)
		for _, want := range []string{other.podNet + " dev ipsec0", other.svcNet + " dev ipsec0"} {
			if !strings.Contains(routes, want) {
				t.Errorf("%s: table 220 has no %q:\n%s", n.NS, want, routes)
			}
		}
		// charon installs a route per (local, remote) selector pair, and for one remote subnet
		// the last local selector's wins: here the service CIDR's, so the route source is the
		// driver's address (as on the Kubernetes test clusters).
		if want := fmt.Sprintf("%s dev ipsec0 proto static src %s ", other.podNet, svcAddr[n]); !strings.Contains(routes, want) {
			t.Errorf("%s: table 220:\n%s\nwant a line with %q", n.NS, routes, want)
		}
	}

	// Pod to pod, and service address to service address (the service CIDRs' CHILD_SA policies).
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)
	if out, err := nstest.Run("ip", "netns", "exec", a.NS, "ping", "-c", "2", "-W", "2", "-I", svcAddr[a], svcAddr[b]); err != nil {
		t.Errorf("ping from %s to %s: %v\n%s", svcAddr[a], svcAddr[b], err, out)
	}

	// Someone deletes the address (charon's routes, which carry it as their source, stay in
	// table 220: the kernel flushes only the main table's): the driver puts it back, and the
	// traffic crosses. Then the same with the whole device.
	for _, del := range [][]string{
		{"addr", "del", svcAddr[a] + "/32", "dev", tsDevice},
		{"link", "del", tsDevice},
	} {
		deleted := time.Now()
		nstest.MustRun(t, append([]string{"ip", "-n", a.NS}, del...)...)
		routes := nstest.MustRun(t, "ip", "-n", a.NS, "route", "show", "table", "220")
		t.Logf("%s: table 220 right after ip %s:\n%s", a.NS, strings.Join(del, " "), routes)
		waitTSAddr(t, a, svcAddr[a], 10*time.Second)
		back := time.Since(deleted)
		waitFor(t, 10*time.Second, "a route to "+b.podNet+" in table 220 again", func() bool {
			out, _ := nstest.Run("ip", "-n", a.NS, "route", "show", "table", "220")
			return strings.Contains(out, b.podNet+" dev ipsec0")
		})
		nstest.PingOK(t, a.NS, b.pod)
		nstest.PingOK(t, b.NS, a.pod)
		t.Logf("%s: ip %s: address back after %s, route and traffic after %s", a.NS, strings.Join(del, " "), back.Round(10*time.Millisecond), time.Since(deleted).Round(10*time.Millisecond))
	}

	// charon dies: the new one installs the CHILD_SA again (the address is still there).
	oldPID := readStatus(t, a).CharonPID
	if err := syscall.Kill(oldPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill charon %d: %v", oldPID, err)
	}
	waitStatus(t, a, "a new charon, connected", 60*time.Second, func(s Status) bool {
		return s.CharonPID != 0 && s.CharonPID != oldPID && len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	waitTSAddr(t, a, svcAddr[a], 10*time.Second)
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)

	// a disconnects: its service CIDR is no longer a local subnet of any connection, so the
	// address goes, and the device with it.
	a.Signal(t, syscall.SIGHUP)
	waitStatus(t, a, "no connection after Disconnect", 10*time.Second, func(s Status) bool { return s.Disconnected && len(s.Connections) == 0 })
	if out, err := nstest.Run("ip", "-n", a.NS, "link", "show", tsDevice); err == nil {
		t.Errorf("%s: %s still exists after the only connection's Disconnect:\n%s", a.NS, tsDevice, out)
	}
	if !strings.Contains(tsAddrs(t, b), "inet "+svcAddr[b]+"/32 ") {
		t.Errorf("%s: %s lost %s although its connection is still loaded", b.NS, tsDevice, svcAddr[b])
	}

	for _, n := range []*node{a, b} {
		checkCleanedUp(t, n)
		if out, err := nstest.Run("ip", "-n", n.NS, "link", "show", tsDevice); err == nil {
			t.Errorf("%s: %s still exists after Cleanup:\n%s", n.NS, tsDevice, out)
		}
		if out := nstest.MustRun(t, "ip", "-n", n.NS, "-4", "addr", "show"); strings.Contains(out, svcAddr[n]) {
			t.Errorf("%s: %s still on the node after Cleanup:\n%s", n.NS, svcAddr[n], out)
		}
	}
}

// tsAddrs is `ip -4 addr show dev cm-ipsec-ts` in n's namespace ("" when the device is missing).
func tsAddrs(t *testing.T, n *node) string {
	t.Helper()
	out, err := nstest.Run("ip", "-n", n.NS, "-4", "addr", "show", "dev", tsDevice)
	if err != nil {
		return ""
	}
	return out
}

// waitTSAddr waits until addr is on cm-ipsec-ts in n's namespace.
func waitTSAddr(t *testing.T, n *node, addr string, within time.Duration) {
	t.Helper()
	for deadline := time.Now().Add(within); !strings.Contains(tsAddrs(t, n), "inet "+addr+"/32 "); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s not on %s within %s:\n%s", n.NS, addr, tsDevice, within, tsAddrs(t, n))
		}
	}
}

// waitFor waits until ok, failing the test after within.
func waitFor(t *testing.T, within time.Duration, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(within); !ok(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %s", what, within)
		}
	}
}

// TestTSAddressRefusedIsReported: when the driver cannot give the node its address (here a
// device of another type already holds the name cm-ipsec-ts), Connect fails with an error that
// names the address and the subnet, and Cleanup leaves the foreign device alone.
func TestTSAddressRefusedIsReported(t *testing.T) {
	_, a, _ := newPairWith(t, true)
	nstest.MustRun(t, "ip", "-n", a.NS, "link", "add", tsDevice, "type", "veth", "peer", "name", "cbti-foreign")
	cmd := exec.Command("ip", a.Args...)
	cmd.Stdin = a.Stdin()
	out, err := runWithin(cmd, 90*time.Second)
	if err == nil {
		t.Fatalf("testpeer ran without an error although %s is a veth:\n%s", tsDevice, out)
	}
	want := "10.255.255.255/32 for local subnet 10.255.128.0/17"
	if !strings.Contains(out, want) || !strings.Contains(out, `exists with type "veth"`) {
		t.Errorf("testpeer's error does not name %q and the device's type:\n%s", want, lastLines(out, 5))
	}
	t.Logf("testpeer: %s", lastLines(out, 1))
	if _, err := nstest.Run("ip", "-n", a.NS, "link", "show", tsDevice); err != nil {
		t.Errorf("%s: the foreign %s went with the driver's Cleanup: %v", a.NS, tsDevice, err)
	}
}

// runWithin runs cmd, killing it after limit, and returns its combined output.
func runWithin(cmd *exec.Cmd, limit time.Duration) (string, error) {
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return "", err
	}
	timer := time.AfterFunc(limit, func() { _ = cmd.Process.Kill() })
	defer timer.Stop()
	err := cmd.Wait()
	return buf.String(), err
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
