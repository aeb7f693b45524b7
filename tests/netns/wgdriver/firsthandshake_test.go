package wgdriver

import (
	"bytes"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/wireguard"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// pairStarts is how many fresh pairs each mode starts.
const pairStarts = 4

// TestANewPairHandshakesAtOnce starts both ends of a new pair at the same moment, so that both
// add their peer at about the same time (the case where first initiations used to cross and
// wait WireGuard's 5 s retry), in both ways of making the first handshake: plain (the remote
// does not publish its device kind, as a kernel device's agent would not help: the responder
// adds its peer a moment later) and assisted (both userspace: the responder holds its peer
// back, the initiator sends fresh initiations until the first handshake).
func TestANewPairHandshakesAtOnce(t *testing.T) {
	nstest.RequireRoot(t, "creates network namespaces, veth pairs and WireGuard devices", "ip", "ping")
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "testpeer")
	nstest.MustRun(t, "go", "build", "-o", bin, "./testpeer")

	for _, mode := range []struct{ name, remoteDevice string }{{"plain", ""}, {"assisted", wireguard.KindUserspace}} {
		t.Run(mode.name, func(t *testing.T) {
			for i := range pairStarts {
				// A subtest per start: its namespaces go when it ends.
				t.Run(fmt.Sprintf("start %d", i+1), func(t *testing.T) {
					d := startPair(t, bin, filepath.Join(tmp, mode.name, fmt.Sprint(i)), mode.remoteDevice)
					t.Logf("both ends connected %s after both started", d.Round(time.Millisecond))
				})
			}
		})
	}
}

// startPair starts a fresh pair in new namespaces, waits until both ends are connected and pass
// traffic, checks the mode's mechanism did its part, and returns how long the pair took.
func startPair(t *testing.T, bin, dir, remoteDevice string) time.Duration {
	t.Helper()
	a := &node{cluster: "a", underlay: "10.250.0.1", pod: "10.251.1.1", podNet: "10.251.1.0/24"}
	b := &node{cluster: "b", underlay: "10.250.0.2", pod: "10.251.2.1", podNet: "10.251.2.0/24"}
	a.NS, b.NS = nsPrefix.Pair(t, nstest.Node{Underlay: a.underlay, Pod: a.pod}, nstest.Node{Underlay: b.underlay, Pod: b.pod})
	for _, n := range []*node{a, b} {
		n.stateDir = filepath.Join(dir, n.cluster, "state")
		n.StatusPath = filepath.Join(dir, n.cluster, "status.json")
		n.pub = writeKey(t, n.stateDir)
	}
	for _, p := range [][2]*node{{a, b}, {b, a}} {
		n, r := p[0], p[1]
		n.Args = []string{"netns", "exec", n.NS, bin,
			"-cluster", n.cluster, "-node", "gw", "-state-dir", n.stateDir, "-advertise", n.underlay,
			"-local-subnets", n.podNet, "-interface", iface, "-status", n.StatusPath,
			"-remote-cluster", r.cluster, "-remote-address", r.underlay, "-remote-port", "51820",
			"-remote-key", r.pub, "-remote-subnets", r.podNet, "-remote-device", remoteDevice}
	}
	a.Start(t)
	b.Start(t)
	started := time.Now()
	var sts [2]Status
	for i, n := range []*node{a, b} {
		sts[i] = nstest.WaitStatus(t, &n.Peer, "connected", 20*time.Second, func(s Status) bool {
			return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
		})
	}
	took := time.Since(started)
	nstest.PingOK(t, a.NS, b.pod)
	nstest.PingOK(t, b.NS, a.pod)
	// The mechanism's counters are read again now: the status that first said connected may have
	// been written before the handshake's counters were (CI once read all zeros at 101 ms).
	for i, n := range []*node{a, b} {
		sts[i] = nstest.WaitStatus(t, &n.Peer, "connected", 5*time.Second, func(s Status) bool {
			return len(s.Connections) == 1 && s.Connections[0].State == cable.StateConnected
		})
	}

	// The initiator is the end with the smaller key.
	ka, errA := wgtypes.ParseKey(a.pub)
	kb, errB := wgtypes.ParseKey(b.pub)
	if errA != nil || errB != nil {
		t.Fatal(errA, errB)
	}
	init, resp := sts[0], sts[1]
	if bytes.Compare(ka[:], kb[:]) > 0 {
		init, resp = sts[1], sts[0]
	}
	switch remoteDevice {
	case "":
		if resp.Handshakes.DeferredAdds != 1 || init.Handshakes != (wireguard.HandshakeStats{}) {
			t.Errorf("plain: responder %+v, initiator %+v; want one deferred add on the responder only", resp.Handshakes, init.Handshakes)
		}
	default:
		if resp.Handshakes.Releases != 1 || resp.Handshakes.Initiations != 0 || init.Handshakes.Releases != 0 {
			t.Errorf("assisted: responder %+v, initiator %+v; want one release on the responder, nudges only from the initiator", resp.Handshakes, init.Handshakes)
		}
	}
	// Well under WireGuard's 5 s retry, including both processes' start.
	if took > 3*time.Second {
		t.Errorf("the pair took %s to connect", took)
	}
	return took
}
