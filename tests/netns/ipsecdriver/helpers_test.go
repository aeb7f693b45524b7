package ipsecdriver

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// newPair builds testpeer and sets up two namespaces joined by a veth, with a testpeer command
// line for each end (not started; extraArgs go first, e.g. -hold), and returns the test's
// directory and the two nodes: a (10.254.0.1, the initiator) and b.
func newPair(t *testing.T, extraArgs ...string) (tmp string, a, b *node) {
	t.Helper()
	return newPairWith(t, false, extraArgs...)
}

// newPairWith is newPair; with services, each side's local subnets (and the other side's remote
// subnets) also hold a "service CIDR" in which no address of the node lies, as on a Kubernetes
// node with kube-proxy in iptables mode: a 10.255.128.0/17, b 10.255.64.0/18. Each sorts after
// its side's pod subnet, as the test clusters' service CIDRs (10.96.<i>.0/24) sort after their
// pod CIDRs (10.<i>.0.0/16): charon's routes then take their source from the service CIDR.
func newPairWith(t *testing.T, services bool, extraArgs ...string) (tmp string, a, b *node) {
	t.Helper()
	nstest.RequireRoot(t, "creates network namespaces, veth pairs, mount namespaces and runs charon", "ip", "ping")
	if _, err := os.Stat(ipsec.DefaultCharon); err != nil {
		t.Skipf("needs strongSwan's charon at %s (Debian: strongswan-charon, strongswan-swanctl, libcharon-extra-plugins): %v", ipsec.DefaultCharon, err)
	}
	tmp = t.TempDir()
	bin := filepath.Join(tmp, "testpeer")
	nstest.MustRun(t, "go", "build", "-o", bin, "./testpeer")

	a = &node{cluster: "a", underlay: "10.254.0.1", pod: "10.255.1.1", podNet: "10.255.1.0/24"}
	b = &node{cluster: "b", underlay: "10.254.0.2", pod: "10.255.2.1", podNet: "10.255.2.0/24"}
	if services {
		a.svcNet, b.svcNet = "10.255.128.0/17", "10.255.64.0/18"
	}
	a.NS, b.NS = nsPrefix.Pair(t, nstest.Node{Underlay: a.underlay, Pod: a.pod}, nstest.Node{Underlay: b.underlay, Pod: b.pod})
	for _, n := range []*node{a, b} {
		n.stateDir = filepath.Join(tmp, n.cluster, "state")
		n.StatusPath = filepath.Join(tmp, n.cluster, "status.json")
		// The key goes on stdin. On a test's end, SIGTERM lets testpeer close the driver, which
		// leaves charon running (as an agent restart does); the namespace's removal kills it.
		n.Stdin = func() io.Reader { return strings.NewReader(hex.EncodeToString(testPSK) + "\n") }
		n.TermGrace, n.StopWithin = 15*time.Second, 30*time.Second
	}
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		n, r := p[0], p[1]
		n.Args = append([]string{"netns", "exec", n.NS, bin}, extraArgs...)
		n.Args = append(n.Args,
			"-cluster", n.cluster, "-node", "gw", "-state-dir", n.stateDir, "-advertise", n.underlay,
			"-local-subnets", n.localSubnets(), "-status", n.StatusPath,
			"-remote-cluster", r.cluster, "-remote-address", r.underlay, "-remote-port", "500",
			"-remote-subnets", r.localSubnets())
	}
	return tmp, a, b
}

// processRuns says whether process pid runs: it exists and is no zombie (charon is no child of
// the testpeer, so once it is killed it waits for init to reap it).
func processRuns(pid int) bool {
	if pid <= 0 {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat[bytes.LastIndexByte(stat, ')')+1:]), " ")
	return !strings.HasPrefix(rest, "Z") && !strings.HasPrefix(rest, "X")
}

// checkCleanedUp stops n with Cleanup (SIGUSR2) and checks that nothing of the driver is left:
// no charon, no ipsec0, no route in table 220 nor its rule, no pid file, no state directory.
func checkCleanedUp(t *testing.T, n *node) {
	t.Helper()
	pid := readStatus(t, n).CharonPID
	n.Stop(t, syscall.SIGUSR2)
	st := readStatus(t, n)
	if !st.CleanedUp || st.Error != "" {
		t.Errorf("%s: cleanup status %+v", n.NS, st)
	}
	if pid == 0 {
		t.Errorf("%s: no charon pid in the status before Cleanup: the check proves nothing", n.NS)
	}
	if processRuns(pid) {
		t.Errorf("%s: charon %d still runs after Cleanup", n.NS, pid)
	}
	if out, err := nstest.Run("ip", "-n", n.NS, "link", "show", "ipsec0"); err == nil {
		t.Errorf("%s: ipsec0 still exists after Cleanup:\n%s", n.NS, out)
	}
	if routes := nstest.MustRun(t, "ip", "-n", n.NS, "route", "show", "table", "220"); strings.TrimSpace(routes) != "" {
		t.Errorf("%s: table 220 after Cleanup:\n%s", n.NS, routes)
	}
	if rules := nstest.MustRun(t, "ip", "-n", n.NS, "rule", "show"); strings.Contains(rules, "lookup 220") {
		t.Errorf("%s: rule to table 220 after Cleanup:\n%s", n.NS, rules)
	}
	if _, err := os.Stat(filepath.Join(n.stateDir, "ipsec", "charon.pid")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: charon.pid after Cleanup: %v", n.NS, err)
	}
	if _, err := os.Stat(filepath.Join(n.stateDir, "ipsec")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: %s after Cleanup: %v", n.NS, filepath.Join(n.stateDir, "ipsec"), err)
	}
}

// localSubnets is the node's -local-subnets: its pod subnet, and its service CIDR if it has one.
func (n *node) localSubnets() string {
	if n.svcNet == "" {
		return n.podNet
	}
	return n.podNet + "," + n.svcNet
}
