package wgdriver

import (
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// TestFirstHandshakeAfterNearlySimultaneousConnects reproduces the mesh start where both sides
// add each other's peer at nearly the same moment, with the timing pinned down: each testpeer
// Inits, then waits for a planned instant (-connect-at) before Connect, side b `gap` after side a.
//
// When the first initiations cross in flight (each arrives after the other side added its peer),
// each side consumes the other's initiation and answers it as responder, which discards its own
// initiator state; both responses are then dropped as "invalid response", and without help
// WireGuard only retries after REKEY_TIMEOUT (5s), the device refusing any earlier initiation.
// A UDP relay that holds every datagram longer than the gap makes them cross on every run.
//
// When instead side a's first initiation reaches b before b knows a, b drops it, but b's own
// initiation (sent when b adds a) finds a ready and the handshake completes at once.
func TestFirstHandshakeAfterNearlySimultaneousConnects(t *testing.T) {
	nstest.RequireRoot(t, "creates network namespaces, veth pairs and WireGuard devices", "ip")
	tmp := t.TempDir()
	bin := filepath.Join(tmp, "testpeer")
	relay := filepath.Join(tmp, "delayrelay")
	nstest.MustRun(t, "go", "build", "-o", bin, "./testpeer")
	nstest.MustRun(t, "go", "build", "-o", relay, "./delayrelay")

	tests := []struct {
		name string
		// relayDelay > 0 routes both directions through a relay holding each datagram this long.
		relayDelay time.Duration
		// gap is how long after side a side b connects.
		gap time.Duration
		// within bounds the time from a's Connect to the first handshake on both sides.
		within time.Duration
		// kicked says whether the driver must have re-added a peer (Stats.HandshakeKicks).
		kicked bool
	}{
		{"initiations that cross in flight still complete a handshake within two seconds", 150 * time.Millisecond, 20 * time.Millisecond, 2 * time.Second, true},
		{"an initiation dropped by a side that does not know us yet is made good by that side's own", 0, 300 * time.Millisecond, 2 * time.Second, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := filepath.Join(tmp, strconv.Itoa(i))
			a := &node{cluster: "a", underlay: "10.250.0.1", pod: "10.251.1.1", podNet: "10.251.1.0/24"}
			b := &node{cluster: "b", underlay: "10.250.0.2", pod: "10.251.2.1", podNet: "10.251.2.0/24"}
			a.NS, b.NS = nsPrefix.Pair(t, nstest.Node{Underlay: a.underlay, Pod: a.pod}, nstest.Node{Underlay: b.underlay, Pod: b.pod})
			for _, n := range []*node{a, b} {
				n.stateDir = filepath.Join(dir, n.cluster, "state")
				n.StatusPath = filepath.Join(dir, n.cluster, "status.json")
				n.pub = writeKey(t, n.stateDir)
			}
			remoteAddr := map[*node]string{a: b.underlay + ":51820", b: a.underlay + ":51820"}
			if tt.relayDelay > 0 {
				r := &nstest.Peer{NS: b.NS, StatusPath: filepath.Join(dir, "relay", "status.json")}
				r.Args = []string{"netns", "exec", b.NS, relay, "-listen", b.underlay + ":51821",
					"-a", a.underlay + ":51820", "-b", b.underlay + ":51820", "-delay", tt.relayDelay.String(), "-status", r.StatusPath}
				r.Start(t)
				nstest.WaitStatus(t, r, "the relay listening", 10*time.Second, func(struct{ PID int }) bool { return true })
				remoteAddr[a], remoteAddr[b] = b.underlay+":51821", b.underlay+":51821"
			}
			// Far enough ahead for both processes to start and Init on a loaded machine.
			start := time.Now().Add(3 * time.Second)
			at := map[*node]time.Time{a: start, b: start.Add(tt.gap)}
			for _, p := range [][2]*node{{a, b}, {b, a}} {
				n, r := p[0], p[1]
				host, port, _ := net.SplitHostPort(remoteAddr[n])
				n.Args = []string{"netns", "exec", n.NS, bin, "-verbose",
					"-cluster", n.cluster, "-node", "gw", "-state-dir", n.stateDir, "-advertise", n.underlay,
					"-local-subnets", n.podNet, "-interface", iface, "-status", n.StatusPath,
					"-remote-cluster", r.cluster, "-remote-address", host, "-remote-port", port,
					"-remote-key", r.pub, "-remote-subnets", r.podNet, "-connect-at", strconv.FormatInt(at[n].UnixNano(), 10)}
				n.Start(t)
			}
			t.Logf("side a connects at %s, side b %v later", start.Format("15:04:05.000"), tt.gap)
			var took time.Duration
			var kicks uint64
			for _, n := range []*node{a, b} {
				st := nstest.WaitStatus(t, &n.Peer, "a first handshake", 20*time.Second, func(s Status) bool {
					return len(s.Connections) == 1 && s.Connections[0].LastHandshake.Unix() > 0
				})
				if st.ConnectLate != "" {
					t.Fatalf("%s: Init finished %s after the planned Connect: the timing this test needs did not hold", n.NS, st.ConnectLate)
				}
				hs := st.Connections[0].LastHandshake
				t.Logf("%s: connected at +%v (planned +%v), first handshake at +%v, stats %+v", n.NS,
					st.ConnectStarted.Sub(start), at[n].Sub(start), hs.Sub(start), st.Stats)
				took = max(took, hs.Sub(start))
				kicks += st.Stats.HandshakeKicks
			}
			if tt.kicked != (kicks > 0) {
				t.Errorf("the driver re-added peers %d times, want some: %v", kicks, tt.kicked)
			}
			if took >= tt.within {
				t.Errorf("first handshake on both sides %v after the first Connect, want under %v", took, tt.within)
			}
		})
	}
}
