// Package ipsecdriver tests the ipsec cable driver end to end: two network namespaces joined by
// a veth, one testpeer process per namespace, each with its own charon (in its own mount
// namespace, so both can use /run/charon.pid), a pod address on each side, and a fixed test key
// handed over on stdin.
package ipsecdriver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
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
)

// status mirrors testpeer's Status.
type status struct {
	PID                int                      `json:"pid"`
	CharonPID          int                      `json:"charonPID"`
	Datapath           string                   `json:"datapath"`
	MTU                int                      `json:"mtu"`
	ViciSocket         string                   `json:"viciSocket"`
	AfterFirstConnect  ipsec.Stats              `json:"afterFirstConnect"`
	AfterSecondConnect ipsec.Stats              `json:"afterSecondConnect"`
	Stats              ipsec.Stats              `json:"stats"`
	Connections        []cable.ConnectionStatus `json:"connections"`
	Disconnected       bool                     `json:"disconnected"`
	CleanedUp          bool                     `json:"cleanedUp"`
	Error              string                   `json:"error"`
}

const (
	nsA = "cbti-a"
	nsB = "cbti-b"
)

// testPSK is printable so that a leak is easy to find in any file or log, in any of the forms
// searched for (raw, hex, base64).
var testPSK = []byte("cbti-test-psk-must-never-be-written-0123456789")

// node is one side of the test mesh.
type node struct {
	ns, cluster, underlay, pod, podNet string
	stateDir, statusPath, logPath      string
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

func TestIPsecDriverBetweenTwoNamespaces(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces, veth pairs, mount namespaces and runs charon")
	}
	for _, tool := range []string{"ip", "ping"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	if _, err := os.Stat(ipsec.DefaultCharon); err != nil {
		t.Skipf("needs strongSwan's charon at %s (Debian: strongswan-charon, strongswan-swanctl, libcharon-extra-plugins): %v", ipsec.DefaultCharon, err)
	}
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "testpeer")
	mustRun(t, "go", "build", "-o", bin, "./testpeer")

	setupNamespaces(t)

	a := &node{ns: nsA, cluster: "a", underlay: "10.254.0.1", pod: "10.255.1.1", podNet: "10.255.1.0/24"}
	b := &node{ns: nsB, cluster: "b", underlay: "10.254.0.2", pod: "10.255.2.1", podNet: "10.255.2.0/24"}
	for _, n := range []*node{a, b} {
		n.stateDir = filepath.Join(tmp, n.cluster, "state")
		n.statusPath = filepath.Join(tmp, n.cluster, "status.json")
		n.logPath = filepath.Join(tmp, n.cluster, "testpeer.log")
		if err := os.MkdirAll(filepath.Dir(n.statusPath), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		n, r := p[0], p[1]
		n.args = []string{"netns", "exec", n.ns, bin,
			"-cluster", n.cluster, "-node", "gw", "-state-dir", n.stateDir, "-advertise", n.underlay,
			"-local-subnets", n.podNet, "-status", n.statusPath,
			"-remote-cluster", r.cluster, "-remote-address", r.underlay, "-remote-port", "500",
			"-remote-subnets", r.podNet}
	}
	start(t, a)
	start(t, b)

	sts := map[*node]status{}
	for _, n := range []*node{a, b} {
		other := map[string]*node{"a": b, "b": a}[n.cluster]
		st := waitStatus(t, n, "a connected connection", 60*time.Second, func(s status) bool {
			return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
		})
		sts[n] = st
		t.Logf("%s: datapath %s, MTU %d, charon pid %d, stats %+v", n.ns, st.Datapath, st.MTU, st.CharonPID, st.Stats)
		if st.Datapath != string(ipsec.DatapathLibipsec) && st.Datapath != string(ipsec.DatapathKernel) {
			t.Errorf("%s: datapath %q", n.ns, st.Datapath)
		}
		c := st.Connections[0]
		if c.Cluster != other.cluster || c.Node != "gw" || c.MTU != st.MTU || !strings.HasPrefix(c.Endpoint, other.underlay+":") {
			t.Errorf("%s: connection %+v, want cluster %s node gw endpoint %s:*", n.ns, c, other.cluster, other.underlay)
		}
		if c.LastHandshake.IsZero() {
			t.Errorf("%s: connected without an IKE_SA establishment time", n.ns)
		}
		// Connect twice with the same input: the second must change nothing.
		if st.AfterFirstConnect != st.AfterSecondConnect {
			t.Errorf("%s: second Connect changed charon: stats %+v then %+v", n.ns, st.AfterFirstConnect, st.AfterSecondConnect)
		}
		if st.AfterFirstConnect.ConnLoads != 1 || st.AfterFirstConnect.SharedLoads != 1 {
			t.Errorf("%s: first Connect stats %+v, want one load-conn and one load-shared", n.ns, st.AfterFirstConnect)
		}
		// The kernel's view: charon's route in table 220 with a source inside the local pod
		// subnet and the tunnel MTU.
		routes := mustRun(t, "ip", "-n", n.ns, "route", "show", "table", "220")
		wantRoute := fmt.Sprintf("%s dev ipsec0 proto static src %s mtu %d advmss %d", other.podNet, n.pod, st.MTU, st.MTU-40)
		if st.Datapath == string(ipsec.DatapathKernel) {
			// Kernel xfrm: charon routes via the underlay link; the xfrm policy does the rest.
			wantRoute = fmt.Sprintf("src %s mtu %d", n.pod, st.MTU)
			if !strings.Contains(routes, other.podNet) {
				t.Errorf("%s: table 220 has no route to %s:\n%s", n.ns, other.podNet, routes)
			}
		}
		if !strings.Contains(routes, wantRoute) {
			t.Errorf("%s: table 220:\n%s\nwant a line with %q", n.ns, routes, wantRoute)
		}
		if st.Datapath == string(ipsec.DatapathLibipsec) {
			if st.MTU != ipsec.LibipsecMTU {
				t.Errorf("%s: MTU %d with libipsec, want %d", n.ns, st.MTU, ipsec.LibipsecMTU)
			}
			if out, err := run(t, "ip", "-n", n.ns, "link", "show", "ipsec0"); err != nil {
				t.Errorf("%s: no ipsec0 with libipsec: %v", n.ns, err)
			} else {
				t.Logf("%s: %s", n.ns, strings.TrimSpace(strings.Split(out, "\n")[0]))
			}
		} else {
			if out := mustRun(t, "ip", "-n", n.ns, "xfrm", "state"); !strings.Contains(out, "proto esp") {
				t.Errorf("%s: kernel datapath but no ESP xfrm state:\n%s", n.ns, out)
			}
		}
		// charon's files: a private directory, a private strongswan.conf.
		dir := filepath.Join(n.stateDir, "ipsec")
		if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
			t.Errorf("%s: %s: %v, want mode 0700", n.ns, dir, err)
		}
		if fi, err := os.Stat(filepath.Join(dir, "strongswan.conf")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: strongswan.conf: %v, want mode 0600", n.ns, err)
		}
		if st.ViciSocket != filepath.Join(dir, "charon.vici") {
			t.Errorf("%s: vici socket %s, want it in %s", n.ns, st.ViciSocket, dir)
		}
		// What swanctl sees over the same socket.
		if _, err := exec.LookPath("swanctl"); err == nil {
			out := mustRun(t, "swanctl", "--list-sas", "--uri", "unix://"+st.ViciSocket)
			if !strings.Contains(out, "cbl-"+other.cluster) || !strings.Contains(out, "ESTABLISHED") || !strings.Contains(out, "INSTALLED") {
				t.Errorf("%s: swanctl --list-sas:\n%s\nwant cbl-%s ESTABLISHED with an INSTALLED CHILD_SA", n.ns, out, other.cluster)
			}
			t.Logf("%s: swanctl --list-sas:\n%s", n.ns, out)
		} else {
			t.Logf("swanctl not installed: SAs checked through the driver's list-sas only")
		}
	}

	// Traffic between the pod addresses, sourced by the gateways themselves (route src).
	before := sts[a].Connections[0]
	pingOK(t, a.ns, b.pod)
	pingOK(t, b.ns, a.pod)
	after := waitStatus(t, a, "grown counters", 10*time.Second, func(s status) bool {
		return len(s.Connections) == 1 && s.Connections[0].RxBytes >= before.RxBytes+3*84 && s.Connections[0].TxBytes >= before.TxBytes+3*84
	}).Connections[0]
	t.Logf("a: rx %d -> %d, tx %d -> %d bytes", before.RxBytes, after.RxBytes, before.TxBytes, after.TxBytes)

	// MTU: a 1400-byte packet with DF set crosses. A larger one is refused by the sender with
	// the route MTU (a local error the application sees, not a silent loss).
	mtu := sts[a].MTU
	if _, err := run(t, "ip", "netns", "exec", a.ns, "ping", "-c", "2", "-W", "2", "-M", "do", "-s", fmt.Sprint(mtu-28), b.pod); err != nil {
		t.Errorf("%d-byte DF ping (the tunnel MTU) did not cross: %v", mtu, err)
	}
	if mtu >= 1428 {
		if _, err := run(t, "ip", "netns", "exec", a.ns, "ping", "-c", "2", "-W", "2", "-M", "do", "-s", "1400", b.pod); err != nil {
			t.Errorf("ping -s 1400 -M do did not cross with MTU %d: %v", mtu, err)
		}
	} else {
		out, err := run(t, "ip", "netns", "exec", a.ns, "ping", "-c", "1", "-W", "2", "-M", "do", "-s", "1400", b.pod)
		if err == nil || !strings.Contains(out, fmt.Sprintf("mtu=%d", mtu)) {
			t.Errorf("ping -s 1400 -M do (1428 bytes) with tunnel MTU %d: want a local 'message too long, mtu=%d', got %v", mtu, mtu, err)
		}
		t.Logf("ping -s 1400 -M do (a 1428-byte packet) does not fit the %s MTU %d: the sender gets %q", sts[a].Datapath, mtu, mtuLine(out))
	}

	// Disconnect removes the connection, the SAs and the routes; Connect brings them back.
	signal(t, a, syscall.SIGHUP)
	waitStatus(t, a, "no connection after Disconnect", 10*time.Second, func(s status) bool { return s.Disconnected && len(s.Connections) == 0 })
	if routes := mustRun(t, "ip", "-n", a.ns, "route", "show", "table", "220"); strings.TrimSpace(routes) != "" {
		t.Errorf("routes in table 220 after Disconnect:\n%s", routes)
	}
	if _, err := run(t, "ip", "netns", "exec", a.ns, "ping", "-c", "1", "-W", "1", b.pod); err == nil {
		t.Errorf("ping %s from %s worked after Disconnect", b.pod, a.ns)
	}
	if _, err := run(t, "ip", "netns", "exec", b.ns, "ping", "-c", "1", "-W", "1", a.pod); err == nil {
		t.Errorf("ping %s from %s worked after %s disconnected", a.pod, b.ns, a.ns)
	}
	signal(t, a, syscall.SIGUSR1)
	waitStatus(t, a, "connected again", 30*time.Second, func(s status) bool {
		return !s.Disconnected && len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	pingOK(t, a.ns, b.pod)
	pingOK(t, b.ns, a.pod)

	// charon dies: the supervisor starts a new one and loads the connection again.
	oldPID := readStatus(t, a).CharonPID
	if err := syscall.Kill(oldPID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill charon %d: %v", oldPID, err)
	}
	st := waitStatus(t, a, "a new charon, connected", 60*time.Second, func(s status) bool {
		return s.CharonPID != 0 && s.CharonPID != oldPID && len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	if st.Stats.CharonStarts != 2 {
		t.Errorf("charon starts %d after one kill, want 2", st.Stats.CharonStarts)
	}
	pingOK(t, a.ns, b.pod)
	pingOK(t, b.ns, a.pod)

	// An agent restart (Close, then a new process): charon goes with the old process and a new
	// one brings the tunnel back.
	pid := readStatus(t, a).CharonPID
	stop(t, a, syscall.SIGTERM)
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("charon %d still runs after its testpeer closed the driver (kill 0: %v)", pid, err)
	}
	if out, err := run(t, "ip", "-n", a.ns, "link", "show", "ipsec0"); err == nil {
		t.Errorf("ipsec0 still exists after Close:\n%s", out)
	}
	os.Remove(a.statusPath)
	restarted := time.Now()
	start(t, a)
	waitStatus(t, a, "connected after restart", 60*time.Second, func(s status) bool {
		return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
	})
	pingOK(t, a.ns, b.pod)
	pingOK(t, b.ns, a.pod)
	t.Logf("tunnel back %s after the restart of a", time.Since(restarted).Round(100*time.Millisecond))

	// The key is in no file and no log, in no form.
	checkNoPSK(t, tmp)
	for _, n := range []*node{a, b} {
		pid := readStatus(t, n).CharonPID
		for _, f := range []string{"environ", "cmdline"} {
			data, err := os.ReadFile(fmt.Sprintf("/proc/%d/%s", pid, f))
			if err != nil {
				t.Errorf("%s: read charon's %s: %v", n.ns, f, err)
				continue
			}
			if leak := findPSK(data); leak != "" {
				t.Errorf("%s: charon's %s holds the pre-shared key (%s)", n.ns, f, leak)
			}
		}
	}

	// Cleanup leaves no charon, no ipsec0, no route, rule or file.
	for _, n := range []*node{a, b} {
		pid := readStatus(t, n).CharonPID
		stop(t, n, syscall.SIGUSR2)
		st := readStatus(t, n)
		if !st.CleanedUp || st.Error != "" {
			t.Errorf("%s: cleanup status %+v", n.ns, st)
		}
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s: charon %d still exists after Cleanup (kill 0: %v)", n.ns, pid, err)
		}
		if out, err := run(t, "ip", "-n", n.ns, "link", "show", "ipsec0"); err == nil {
			t.Errorf("%s: ipsec0 still exists after Cleanup:\n%s", n.ns, out)
		}
		if routes := mustRun(t, "ip", "-n", n.ns, "route", "show", "table", "220"); strings.TrimSpace(routes) != "" {
			t.Errorf("%s: table 220 after Cleanup:\n%s", n.ns, routes)
		}
		if rules := mustRun(t, "ip", "-n", n.ns, "rule", "show"); strings.Contains(rules, "lookup 220") {
			t.Errorf("%s: rule to table 220 after Cleanup:\n%s", n.ns, rules)
		}
		if _, err := os.Stat(filepath.Join(n.stateDir, "ipsec")); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: %s after Cleanup: %v", n.ns, filepath.Join(n.stateDir, "ipsec"), err)
		}
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
	mustRun(t, "ip", "-n", nsA, "link", "add", "cbti-va", "type", "veth", "peer", "name", "cbti-vb", "netns", nsB)
	for _, c := range [][]string{
		{"ip", "-n", nsA, "addr", "add", "10.254.0.1/24", "dev", "cbti-va"},
		{"ip", "-n", nsB, "addr", "add", "10.254.0.2/24", "dev", "cbti-vb"},
		{"ip", "-n", nsA, "link", "set", "cbti-va", "up"},
		{"ip", "-n", nsB, "link", "set", "cbti-vb", "up"},
		{"ip", "-n", nsA, "link", "set", "lo", "up"},
		{"ip", "-n", nsB, "link", "set", "lo", "up"},
		// The "pod" addresses: one address of each node inside its cluster's pod CIDR.
		{"ip", "-n", nsA, "addr", "add", "10.255.1.1/32", "dev", "lo"},
		{"ip", "-n", nsB, "addr", "add", "10.255.2.1/32", "dev", "lo"},
	} {
		mustRun(t, c...)
	}
}

func start(t *testing.T, n *node) {
	t.Helper()
	cmd := exec.Command("ip", n.args...)
	logf, err := os.OpenFile(n.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Stdin = strings.NewReader(hex.EncodeToString(testPSK) + "\n")
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
		default:
			// SIGTERM: testpeer closes the driver, which stops charon. Then SIGKILL, and the
			// charon it leaves gets SIGTERM through Pdeathsig.
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(15 * time.Second):
				cmd.Process.Kill()
				<-exited
			}
		}
		if first && (t.Failed() || testing.Verbose()) {
			// Once, by the first start's cleanup: the log file collects every start.
			if data, err := os.ReadFile(n.logPath); err == nil {
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
	case <-time.After(30 * time.Second):
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

func waitStatus(t *testing.T, n *node, what string, within time.Duration, ok func(status) bool) status {
	t.Helper()
	deadline := time.Now().Add(within)
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
	t.Fatalf("%s: no %s within %s; last status %+v", n.ns, what, within, last)
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
