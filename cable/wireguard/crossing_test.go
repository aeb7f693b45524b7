package wireguard

import (
	"encoding/hex"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/conn"
	"golang.zx2c4.com/wireguard/conn/bindtest"
	"golang.zx2c4.com/wireguard/device"
	"golang.zx2c4.com/wireguard/tun/tuntest"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// These tests run two wireguard-go devices of the version in go.mod in this process, joined by
// in-memory binds that the test can hold and release packet by packet. They show the stall of
// handshake.go on the real library, and that what the driver does about it keeps every session
// alive.

// gate is a bind whose outgoing packets are held while it is closed.
type gate struct {
	conn.Bind
	mu     sync.Mutex
	closed bool
	held   []heldPacket
}

type heldPacket struct {
	bufs [][]byte
	ep   conn.Endpoint
}

func (g *gate) Send(bufs [][]byte, ep conn.Endpoint) error {
	g.mu.Lock()
	if g.closed {
		cp := make([][]byte, len(bufs))
		for i, b := range bufs {
			cp[i] = append([]byte(nil), b...)
		}
		g.held = append(g.held, heldPacket{cp, ep})
		g.mu.Unlock()
		return nil
	}
	g.mu.Unlock()
	return g.Bind.Send(bufs, ep)
}

// hold closes the gate.
func (g *gate) hold() { g.mu.Lock(); g.closed = true; g.mu.Unlock() }

// flush sends the one packet held (the test knows there is exactly one) and keeps the gate
// closed.
func (g *gate) flush(t *testing.T) {
	t.Helper()
	g.mu.Lock()
	held := g.held
	g.held = nil
	g.mu.Unlock()
	if len(held) != 1 {
		t.Fatalf("gate holds %d packets, want 1", len(held))
	}
	_ = g.Bind.Send(held[0].bufs, held[0].ep)
}

// open sends what is held and lets everything through from now on.
func (g *gate) open() {
	g.mu.Lock()
	g.closed = false
	held := g.held
	g.held = nil
	g.mu.Unlock()
	for _, p := range held {
		_ = g.Bind.Send(p.bufs, p.ep)
	}
}

// count is the number of packets held.
func (g *gate) count() int { g.mu.Lock(); defer g.mu.Unlock(); return len(g.held) }

// end is one of the two devices.
type end struct {
	dev  *device.Device
	tun  *tuntest.ChannelTUN
	gate *gate
	key  wgtypes.Key // private
	ip   netip.Addr  // its tunnel address
	// endpoint is where this end sends to reach the other through the in-memory binds.
	endpoint string
	// got receives every packet the device delivers to its TUN.
	got chan []byte
}

func (e *end) pub() wgtypes.Key { return e.key.PublicKey() }

// newEnds starts two devices with keys and ports but no peers; ends[0] has the smaller public
// key (it is the initiator of handshake.go).
func newEnds(t *testing.T) [2]*end {
	t.Helper()
	binds := bindtest.NewChannelBinds()
	var ends [2]*end
	for i := range ends {
		k, err := wgtypes.GeneratePrivateKey()
		if err != nil {
			t.Fatal(err)
		}
		g := &gate{Bind: binds[i]}
		e := &end{tun: tuntest.NewChannelTUN(), gate: g, key: k, ip: netip.AddrFrom4([4]byte{10, 99, 0, byte(i + 1)}), got: make(chan []byte, 64)}
		e.dev = device.NewDevice(e.tun.TUN(), g, device.NewLogger(device.LogLevelSilent, ""))
		if err := e.dev.IpcSet(fmt.Sprintf("private_key=%s\nlisten_port=0\n", hex.EncodeToString(k[:]))); err != nil {
			t.Fatal(err)
		}
		if err := e.dev.Up(); err != nil {
			t.Fatal(err)
		}
		go func() {
			for p := range e.tun.Inbound {
				e.got <- p
			}
		}()
		t.Cleanup(e.dev.Close)
		ends[i] = e
	}
	// The in-memory bind of device i reaches the other through port i+1 (bindtest's targets).
	ends[0].endpoint, ends[1].endpoint = "127.0.0.1:1", "127.0.0.1:2"
	if !initiates(ends[0].pub(), ends[1].pub()) {
		ends[0], ends[1] = ends[1], ends[0]
	}
	return ends
}

// addPeer configures other as a peer of e as the driver would: fully (endpoint, allowed IP,
// keepalive 25 s), or held back (allowed IP only).
func (e *end) addPeer(t *testing.T, other *end, held bool) {
	t.Helper()
	pub := other.pub()
	cfg := fmt.Sprintf("public_key=%s\nreplace_allowed_ips=true\nallowed_ip=%s/32\n", hex.EncodeToString(pub[:]), other.ip)
	if !held {
		cfg += fmt.Sprintf("endpoint=%s\npersistent_keepalive_interval=25\n", e.endpoint)
	}
	if err := e.dev.IpcSet(cfg); err != nil {
		t.Fatal(err)
	}
}

// peerState reads e's peer: whether it completed a handshake, and its received bytes.
func (e *end) peerState(t *testing.T) (handshake bool, rx int64) {
	t.Helper()
	s, err := e.dev.IpcGet()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(s, "\n") {
		k, v, _ := strings.Cut(l, "=")
		switch k {
		case "last_handshake_time_sec":
			handshake = v != "0"
		case "rx_bytes":
			rx, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	return handshake, rx
}

func waitFor(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// send puts a ping from e to other on e's TUN (the device routes it to the peer).
func (e *end) send(other *end) { e.tun.Outbound <- tuntest.Ping(other.ip, e.ip) }

// receive counts the packets e's TUN gets within d, returning early once it has want.
func (e *end) receive(want int, d time.Duration) int {
	n := 0
	deadline := time.After(d)
	for {
		select {
		case <-e.got:
			n++
			if n == want {
				return n
			}
		case <-deadline:
			return n
		}
	}
}

// cross adds each end's peer with both gates closed, lets the two initiations cross, waits until
// each end has answered the other's, then opens the gates: the answers arrive for initiations
// their receivers have forgotten.
func cross(t *testing.T, a, b *end) {
	t.Helper()
	a.gate.hold()
	b.gate.hold()
	a.addPeer(t, b, false)
	b.addPeer(t, a, false)
	a.gate.flush(t)
	b.gate.flush(t)
	// Each answer is sent (held) after its initiation's index is freed.
	waitFor(t, "each end answers the other's initiation", 2*time.Second, func() bool {
		return a.gate.count() > 0 && b.gate.count() > 0
	})
	a.gate.open()
	b.gate.open()
}

func TestCrossingInitiationsStallUntilOneEndInitiatesAgain(t *testing.T) {
	ends := newEnds(t)
	a, b := ends[0], ends[1]
	cross(t, a, b)

	// The stall: both ends heard the other, neither has a session, and WireGuard's rate limit
	// keeps both from trying again for 5 s.
	time.Sleep(300 * time.Millisecond)
	for _, e := range ends {
		if hs, rx := e.peerState(t); hs || rx == 0 {
			t.Fatalf("after crossing initiations: handshake %v, rx %d; want no handshake and bytes received", hs, rx)
		}
	}
	a.send(b)
	if n := b.receive(1, 200*time.Millisecond); n != 0 {
		t.Fatalf("a packet crossed a tunnel without a session")
	}
	// A plain SendHandshakeInitiation does nothing: the answer a sent counts as a handshake sent.
	a.dev.LookupPeer(device.NoisePublicKey(b.pub())).SendHandshakeInitiation(false)
	time.Sleep(100 * time.Millisecond)
	if hs, _ := a.peerState(t); hs {
		t.Fatalf("SendHandshakeInitiation alone completed a handshake; the rate limit this test relies on is gone")
	}

	// The repair: the initiator sends a fresh initiation; the staged packet then goes through.
	if err := (&userDevice{name: "a", dev: a.dev}).Initiate(b.pub()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a handshake on both ends after the fresh initiation", time.Second, func() bool {
		ha, _ := a.peerState(t)
		hb, _ := b.peerState(t)
		return ha && hb
	})
	if n := b.receive(1, time.Second); n < 1 {
		t.Errorf("the packet a queued during the stall did not arrive after the handshake")
	}
	b.send(a)
	if n := a.receive(1, time.Second); n != 1 {
		t.Errorf("b -> a after the handshake: %d packets, want 1", n)
	}
}

// awaitingConfirmation brings the pair into the state that made re-adding a peer wrong: a
// completed the handshake as initiator and holds a session it sends on, while b answered and
// waits for a's first packet to confirm it (b shows no handshake yet). a's confirming keepalive
// is held in a's gate.
func awaitingConfirmation(t *testing.T, a, b *end) {
	t.Helper()
	a.gate.hold()
	b.gate.hold()
	b.addPeer(t, a, true) // b cannot initiate
	a.addPeer(t, b, false)
	a.gate.flush(t) // a's initiation reaches b; b answers
	waitFor(t, "b answers", 2*time.Second, func() bool { return b.gate.count() > 0 })
	b.gate.open() // b's answer reaches a: a's session is up, its keepalive held
	waitFor(t, "a completes the handshake", 2*time.Second, func() bool { hs, _ := a.peerState(t); return hs })
	if hs, _ := b.peerState(t); hs {
		t.Fatalf("b reports a handshake before a's first packet")
	}
}

func TestAFreshInitiationKeepsTheSessionTheOtherEndUses(t *testing.T) {
	ends := newEnds(t)
	a, b := ends[0], ends[1]
	awaitingConfirmation(t, a, b)

	// b has no handshake, so the driver would send a fresh initiation (here from b, the worse
	// case: it is in fact the responder of a session a uses).
	if err := (&userDevice{name: "b", dev: b.dev}).Initiate(a.pub()); err != nil {
		t.Fatal(err)
	}
	const n = 5
	for range n {
		a.send(b) // a sends on its session; the packets wait in a's gate behind the keepalive
	}
	a.gate.open()
	if got := b.receive(n, 2*time.Second); got != n {
		t.Errorf("b received %d of the %d packets a sent on its session", got, n)
	}
	waitFor(t, "a handshake on both ends", time.Second, func() bool {
		ha, _ := a.peerState(t)
		hb, _ := b.peerState(t)
		return ha && hb
	})
	b.send(a)
	if got := a.receive(1, time.Second); got != 1 {
		t.Errorf("b -> a: %d packets, want 1", got)
	}
}

func TestReAddingThePeerLosesTheSessionTheOtherEndUses(t *testing.T) {
	// What the reverted attempt did, for contrast: the same state, then b removes and re-adds a.
	ends := newEnds(t)
	a, b := ends[0], ends[1]
	awaitingConfirmation(t, a, b)
	pub := a.pub()
	if err := b.dev.IpcSet(fmt.Sprintf("public_key=%s\nremove=true\n", hex.EncodeToString(pub[:]))); err != nil {
		t.Fatal(err)
	}
	b.gate.hold() // b's own new initiation must not rescue a
	b.addPeer(t, a, false)
	for range 5 {
		a.send(b)
	}
	a.gate.open()
	if got := b.receive(1, 500*time.Millisecond); got != 0 {
		t.Errorf("b received %d packets after re-adding the peer; the session should be gone", got)
	}
	if hs, _ := a.peerState(t); !hs {
		t.Errorf("a should still believe in its session")
	}
}

func TestAHeldBackPeerNeverInitiatesAndKeepsWhatItRoutesUntilTheSession(t *testing.T) {
	ends := newEnds(t)
	a, b := ends[0], ends[1]
	b.gate.hold()
	b.addPeer(t, a, true)
	for range 3 {
		b.send(a) // routed to the held-back peer: queued, no initiation
	}
	time.Sleep(100 * time.Millisecond)
	if sent := b.gate.count(); sent != 0 {
		t.Fatalf("a held-back peer sent %d packets", sent)
	}
	b.gate.open()
	// The initiator's initiation is answered (b learns a's endpoint from it), and b's queued
	// packets follow once a's first packet confirms the session.
	a.addPeer(t, b, false)
	waitFor(t, "a handshake on both ends", time.Second, func() bool {
		ha, _ := a.peerState(t)
		hb, _ := b.peerState(t)
		return ha && hb
	})
	if got := a.receive(3, 2*time.Second); got != 3 {
		t.Errorf("a received %d of the 3 packets b queued while held back", got)
	}
}
