package wireguard

import (
	"bytes"
	"slices"
	"testing"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// keyPair returns two keys, the first smaller (the initiator's).
func keyPair(t *testing.T) (small, large wgtypes.Key) {
	t.Helper()
	a, b := testKey(t), testKey(t)
	if bytes.Compare(a[:], b[:]) > 0 {
		a, b = b, a
	}
	return a, b
}

func TestBothEndsAgreeOnWhoInitiates(t *testing.T) {
	for range 50 {
		a, b := testKey(t), testKey(t)
		if initiates(a, b) == initiates(b, a) {
			t.Fatalf("initiates(%s, %s) = %v both ways", a, b, initiates(a, b))
		}
	}
	a := testKey(t)
	if initiates(a, a) {
		t.Errorf("a key initiates towards itself")
	}
}

func TestHowANewPeerIsAdded(t *testing.T) {
	small, large := keyPair(t)
	now := time.Unix(1000, 0)
	tests := []struct {
		name                 string
		ownKind, remoteKind  string
		initiator, reconnect bool
		timing               handshakeTiming
		want                 addPlan
		watched, nudged      bool
	}{
		{"an assisted initiator adds at once and nudges", KindUserspace, KindUserspace, true, false, defaultHandshakeTiming(), addFull, true, true},
		{"an assisted responder holds the peer back", KindUserspace, KindUserspace, false, false, defaultHandshakeTiming(), addHeld, true, false},
		{"an assisted responder reconnecting after a restart adds at once", KindUserspace, KindUserspace, false, true, defaultHandshakeTiming(), addFull, false, false},
		{"a responder towards a kernel device defers", KindUserspace, KindKernel, false, false, defaultHandshakeTiming(), addLater, true, false},
		{"a kernel responder defers", KindKernel, KindUserspace, false, false, defaultHandshakeTiming(), addLater, true, false},
		{"a responder towards a node that does not say its kind defers", KindUserspace, "", false, false, defaultHandshakeTiming(), addLater, true, false},
		{"a plain responder reconnecting after a restart adds at once", KindKernel, KindKernel, false, true, defaultHandshakeTiming(), addFull, false, false},
		{"a plain initiator adds at once and does not nudge", KindUserspace, KindKernel, true, false, defaultHandshakeTiming(), addFull, false, false},
		{"a kernel initiator adds at once and cannot nudge", KindKernel, KindKernel, true, false, defaultHandshakeTiming(), addFull, false, false},
		{"without timing a responder adds at once", KindUserspace, KindUserspace, false, false, handshakeTiming{}, addFull, false, false},
		{"without timing a plain responder adds at once", KindKernel, KindKernel, false, false, handshakeTiming{}, addFull, false, false},
		{"without nudges an assisted initiator is not watched", KindUserspace, KindUserspace, true, false, handshakeTiming{}, addFull, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			own, remote := large, small
			if tt.initiator {
				own, remote = small, large
			}
			w := newHandshakeWatch(tt.timing)
			want := desiredPeer{Cluster: "b", PublicKey: remote, RemoteKind: tt.remoteKind}
			if got := w.add(now, own, tt.ownKind, want, tt.reconnect); got != tt.want {
				t.Errorf("add = %v, want %v", got, tt.want)
			}
			p, watched := w.peers[remote]
			if watched != tt.watched || watched && p.nudge != tt.nudged {
				t.Errorf("watched %v (%+v), want watched %v nudged %v", watched, p, tt.watched, tt.nudged)
			}
			if got := w.pending(want); got != tt.want {
				t.Errorf("pending = %v after add %v", got, tt.want)
			}
		})
	}
}

// peerOn is the device's view of a peer.
func peerOn(k wgtypes.Key, handshake bool, rx int64) wgtypes.Peer {
	p := wgtypes.Peer{PublicKey: k, ReceiveBytes: rx}
	if handshake {
		p.LastHandshakeTime = time.Unix(2000, 0)
	}
	return p
}

// watchInitiator is a watch with an assisted initiator's new peer added at t0.
func watchInitiator(t *testing.T, t0 time.Time) (*handshakeWatch, wgtypes.Key) {
	t.Helper()
	own, remote := keyPair(t)
	w := newHandshakeWatch(defaultHandshakeTiming())
	if plan := w.add(t0, own, KindUserspace, desiredPeer{PublicKey: remote, RemoteKind: KindUserspace}, false); plan != addFull {
		t.Fatalf("add = %v", plan)
	}
	return w, remote
}

func TestTheInitiatorNudgesOnScheduleUntilTheFirstHandshake(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w, k := watchInitiator(t, t0)
	var at []time.Duration
	for d := time.Duration(0); d <= 1100*time.Millisecond; d += 10 * time.Millisecond {
		if act := w.step(t0.Add(d), []wgtypes.Peer{peerOn(k, false, 0)}); len(act.Nudge) > 0 {
			at = append(at, d)
		}
	}
	ms := time.Millisecond
	want := []time.Duration{50 * ms, 100 * ms, 150 * ms, 250 * ms, 350 * ms, 450 * ms, 650 * ms, 850 * ms, 1050 * ms}
	if !slices.Equal(at, want) {
		t.Errorf("nudges at %v, want %v", at, want)
	}
	// The first handshake ends it.
	if act := w.step(t0.Add(5*time.Second), []wgtypes.Peer{peerOn(k, true, 92)}); len(act.Nudge) != 0 || !w.empty() {
		t.Errorf("after the handshake: %+v, watch empty %v", act, w.empty())
	}
}

func TestTheInitiatorStartsOverWhenItHearsFromThePeer(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w, k := watchInitiator(t, t0)
	for d := time.Duration(0); d <= 700*time.Millisecond; d += 10 * time.Millisecond {
		w.step(t0.Add(d), []wgtypes.Peer{peerOn(k, false, 0)})
	}
	// Now 200 ms apart; the peer's initiation arrives (148 bytes), yet no handshake.
	heard := t0.Add(710 * time.Millisecond)
	if act := w.step(heard, []wgtypes.Peer{peerOn(k, false, 148)}); len(act.Nudge) != 0 {
		t.Fatalf("nudged at once on hearing from the peer")
	}
	if act := w.step(heard.Add(40*time.Millisecond), []wgtypes.Peer{peerOn(k, false, 148)}); len(act.Nudge) != 0 {
		t.Errorf("nudged 40ms after hearing from the peer, want 50ms")
	}
	if act := w.step(heard.Add(50*time.Millisecond), []wgtypes.Peer{peerOn(k, false, 148)}); len(act.Nudge) != 1 {
		t.Errorf("no nudge 50ms after hearing from the peer")
	}
}

func TestTheInitiatorStopsNudgingAfterMaxNudgesOrWhenThePeerIsGone(t *testing.T) {
	t0 := time.Unix(1000, 0)
	w, k := watchInitiator(t, t0)
	n := 0
	for d := time.Duration(0); d <= 30*time.Second; d += 10 * time.Millisecond {
		n += len(w.step(t0.Add(d), []wgtypes.Peer{peerOn(k, false, 0)}).Nudge)
	}
	if n != defaultMaxNudges || !w.empty() {
		t.Errorf("%d nudges in 30s (watch empty %v), want %d and then nothing", n, w.empty(), defaultMaxNudges)
	}

	w, _ = watchInitiator(t, t0)
	if act := w.step(t0.Add(time.Second), nil); len(act.Nudge) != 0 || !w.empty() {
		t.Errorf("a peer gone from the device: %+v, watch empty %v", act, w.empty())
	}
}

func TestAHeldBackPeerIsReleasedAtItsFirstHandshakeOrAtTheLatest(t *testing.T) {
	t0 := time.Unix(1000, 0)
	small, large := keyPair(t)
	want := desiredPeer{Cluster: "a", PublicKey: small, RemoteKind: KindUserspace}
	held := func() *handshakeWatch {
		w := newHandshakeWatch(defaultHandshakeTiming())
		if plan := w.add(t0, large, KindUserspace, want, false); plan != addHeld {
			t.Fatalf("add = %v", plan)
		}
		return w
	}

	w := held()
	if act := w.step(t0.Add(time.Second), []wgtypes.Peer{peerOn(small, false, 148)}); len(act.Release)+len(act.Nudge) != 0 {
		t.Errorf("answered but not confirmed yet: %+v", act)
	}
	if act := w.step(t0.Add(1100*time.Millisecond), []wgtypes.Peer{peerOn(small, true, 180)}); len(act.Release) != 1 || act.Release[0].Cluster != "a" || !w.empty() {
		t.Errorf("after the first handshake: %+v, watch empty %v", act, w.empty())
	}

	w = held()
	if act := w.step(t0.Add(defaultHoldFor-time.Millisecond), []wgtypes.Peer{peerOn(small, false, 0)}); len(act.Release) != 0 {
		t.Errorf("released before holdFor: %+v", act)
	}
	if act := w.step(t0.Add(defaultHoldFor), []wgtypes.Peer{peerOn(small, false, 0)}); len(act.Release) != 1 || !w.empty() {
		t.Errorf("not released after holdFor without a handshake: %+v", act)
	}

	w = held()
	if act := w.step(t0.Add(time.Second), nil); len(act.Release) != 0 || !w.empty() {
		t.Errorf("a held-back peer gone from the device: %+v, watch empty %v", act, w.empty())
	}
}

func TestADeferredPeerIsAddedWhenDue(t *testing.T) {
	t0 := time.Unix(1000, 0)
	small, large := keyPair(t)
	want := desiredPeer{Cluster: "a", PublicKey: small}
	w := newHandshakeWatch(defaultHandshakeTiming())
	if plan := w.add(t0, large, KindKernel, want, false); plan != addLater {
		t.Fatalf("add = %v", plan)
	}
	if act := w.step(t0.Add(defaultDeferFor-time.Millisecond), nil); len(act.Add) != 0 {
		t.Errorf("added early: %+v", act)
	}
	if got := w.pendingKeys(); got[small] != addLater {
		t.Errorf("pendingKeys = %v", got)
	}
	if act := w.step(t0.Add(defaultDeferFor), nil); len(act.Add) != 1 || act.Add[0].Cluster != "a" || !w.empty() {
		t.Errorf("when due: %+v, watch empty %v", act, w.empty())
	}

	// Added meanwhile (by a Connect after the deadline): nothing left to do.
	w = newHandshakeWatch(defaultHandshakeTiming())
	w.add(t0, large, KindKernel, want, false)
	if act := w.step(t0.Add(time.Second), []wgtypes.Peer{peerOn(small, false, 0)}); len(act.Add) != 0 || !w.empty() {
		t.Errorf("a deferred peer already on the device: %+v", act)
	}
}

func TestNudgeDelay(t *testing.T) {
	ms := time.Millisecond
	for n, want := range []time.Duration{50 * ms, 50 * ms, 50 * ms, 100 * ms, 100 * ms, 100 * ms, 200 * ms} {
		if got := nudgeDelay(50*ms, n); got != want {
			t.Errorf("nudgeDelay(50ms, %d) = %s, want %s", n, got, want)
		}
	}
	if got := nudgeDelay(50*ms, 100); got != rekeyTimeout {
		t.Errorf("nudgeDelay(50ms, 100) = %s, want at most %s", got, rekeyTimeout)
	}
}

func TestAHandshakeBeforeTheLastNudgeDoesNotEndTheNudges(t *testing.T) {
	// The device was read a moment before a nudge while the previous initiation's answer was on
	// its way: the handshake it completed has lost its sending to the nudge, whose own handshake
	// the responder may refuse. Only a handshake after the nudge ends the watch.
	t0 := time.Unix(1000, 0)
	w, k := watchInitiator(t, t0)
	nudged := t0.Add(50 * time.Millisecond)
	if act := w.step(nudged, []wgtypes.Peer{peerOn(k, false, 0)}); len(act.Nudge) != 1 {
		t.Fatalf("no nudge at 50ms")
	}
	before := wgtypes.Peer{PublicKey: k, LastHandshakeTime: nudged.Add(-time.Millisecond), ReceiveBytes: 92}
	if w.step(nudged.Add(20*time.Millisecond), []wgtypes.Peer{before}); w.empty() {
		t.Fatalf("a handshake from before the nudge ended the watch")
	}
	if act := w.step(nudged.Add(70*time.Millisecond), []wgtypes.Peer{before}); len(act.Nudge) != 1 {
		t.Errorf("no further nudge while the only handshake predates the last one: %+v", act)
	}
	after := wgtypes.Peer{PublicKey: k, LastHandshakeTime: nudged.Add(80 * time.Millisecond), ReceiveBytes: 184}
	if act := w.step(nudged.Add(90*time.Millisecond), []wgtypes.Peer{after}); len(act.Nudge) != 0 || !w.empty() {
		t.Errorf("a handshake after the last nudge did not end the watch: %+v", act)
	}
}
