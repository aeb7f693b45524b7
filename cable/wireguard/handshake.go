package wireguard

import (
	"bytes"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// This file decides how a new peer gets its first handshake (pure; watch.go applies the
// decisions).
//
// # The stall
//
// When both ends add each other at about the same moment (they learn of each other from the
// broker within a millisecond), each device sends a handshake initiation at once: wireguard-go
// when a peer with a persistent keepalive is added (device/uapi.go handlePostConfig: the keepalive
// needs a session), the kernel on every change of a peer of a running device. The initiations
// cross. Each end consumes the other's initiation (device/noise-protocol.go
// ConsumeMessageInitiation), which overwrites its own handshake state, and answers it
// (CreateMessageResponse frees the index of its own initiation); the two answers then arrive for
// indexes that no longer exist and are dropped ("Received invalid response message"). Both ends
// hold only a responder keypair (keypairs.next), which may not send before the other end confirms
// it with a packet, and neither end is an initiator that would. Answering counts as sending a
// handshake (send.go SendHandshakeResponse sets lastSentHandshake), and no initiation leaves
// within REKEY_TIMEOUT (5 s) of the last one (SendHandshakeInitiation), so neither end can retry
// for 5 s; both answered in the same millisecond, so both retry in the same millisecond once a
// packet is queued on each side (health probes, pods) and cross again: 5, 10, 15, 20 s.
//
// A crossing can do worse. wireguard-go runs one handshake worker per CPU (receive.go
// RoutineHandshake), and ConsumeMessageResponse checks the handshake state under a read lock but
// writes it later under the write lock without checking again. When the answer to this end's
// initiation and a new initiation from the same peer are handled at once, the response can
// complete a session whose index the initiation's answer has just freed: this end then sends on a
// session the peer accepts, but drops everything the peer sends on it. Both ends report a fresh
// handshake, and traffic flows one way until the keepalive timers start a new handshake 15 s
// later (KEEPALIVE_TIMEOUT + REKEY_TIMEOUT). Crossings must not be repaired after the fact: they
// must not happen.
//
// # The cure, which never removes a peer and never touches a session
//
// Of two ends, the one with the smaller public key is the initiator, the other the responder.
// Nodes publish their device kind (AttrDevice); what both ends can do decides the mode, and both
// compute the same one.
//
//   - Both userspace: assisted. The responder adds a new peer held back: with its allowed IPs but
//     without endpoint and keepalive, so it cannot send an initiation (wireguard-go drops it for
//     lack of an endpoint, and sends none for 5 s after), while it answers the initiator's,
//     learning the endpoint from it, and keeps the packets routed to the peer until the session
//     is up. It gets its endpoint and keepalive when its first handshake completes (or after
//     holdFor, should the initiator never initiate). The initiator adds the peer at once, and
//     until the first handshake sends fresh initiations on a schedule (nudges), so that an
//     initiation dropped because the responder did not know the peer yet is sent again within
//     50 ms, not 5 s; wireguard-go's Peer.ExpireCurrentKeypairs lifts the rate limit first.
//     Only the initiator initiates and only the responder answers, so initiations never cross.
//     The initiator stops at a handshake completed after its last nudge: one completed just
//     before (the device is read a moment before each nudge) had its sending stopped by the
//     nudge, whose own handshake may yet fail (the responder ignores an initiation within 20 ms
//     of the last one it took, which happens when a loaded responder takes the previous late).
//     A nudge is safe even if this end is in fact a responder whose initiator already uses the
//     session (what made re-adding the peer wrong): ExpireCurrentKeypairs deletes no keypair, so
//     whatever the initiator sends still decrypts and confirms the session here, and the
//     initiator, answering our initiation, keeps its current keypair (a responder replaces only
//     its unconfirmed next one).
//   - Otherwise (a kernel device, which initiates on every peer change and offers no per-peer way
//     to lift its rate limit; or a node that does not publish its kind): plain. The responder adds
//     a new peer deferFor later than asked. The initiator's first initiation then either finds
//     the responder ready, or is dropped and the responder's own initiation, sent when it adds the
//     peer, reaches an initiator that cannot cross it (it sent its initiation less than 5 s
//     before). The initiations still cross if the initiator adds the peer exactly deferFor after
//     the responder, which is rare where the cause was both adding it in the same millisecond.
//
// A responder whose peer was connected before this process started (an agent restart with a
// userspace device, whose peers die with the process) adds it at once and initiates, as a plain
// WireGuard device would: the other end may still hold a session with the old device and would
// not initiate for up to 15 s.

// Timing of the first handshake of a new peer.
const (
	// defaultHoldFor is the longest an assisted responder holds a new peer back.
	defaultHoldFor = 2 * time.Second
	// defaultDeferFor is how much later than asked a plain responder adds a new peer.
	defaultDeferFor = 100 * time.Millisecond
	// defaultFirstNudge is how long an assisted initiator waits for the first handshake before
	// sending a fresh initiation; the interval doubles every nudgesPerStep nudges, up to
	// rekeyTimeout, and starts over when received bytes grow.
	defaultFirstNudge = 50 * time.Millisecond
	nudgesPerStep     = 3
	// defaultMaxNudges bounds the fresh initiations per peer (the last comes about 9.5 s after
	// the wait began); WireGuard's own retries (every 5 s for 90 s) go on after them.
	defaultMaxNudges = 18
	// watchInterval is how often the device is read while a new peer is being watched.
	watchInterval = 20 * time.Millisecond
	// rekeyTimeout is WireGuard's REKEY_TIMEOUT: the least time between two initiations it sends,
	// and the longest interval between two nudges.
	rekeyTimeout = 5 * time.Second
)

// handshakeTiming is the timing above; tests change it.
type handshakeTiming struct {
	HoldFor    time.Duration // 0: an assisted responder adds peers fully at once
	DeferFor   time.Duration // 0: a plain responder adds peers at once
	FirstNudge time.Duration
	MaxNudges  int // 0: never nudge
	Interval   time.Duration
}

func defaultHandshakeTiming() handshakeTiming {
	return handshakeTiming{HoldFor: defaultHoldFor, DeferFor: defaultDeferFor, FirstNudge: defaultFirstNudge,
		MaxNudges: defaultMaxNudges, Interval: watchInterval}
}

// initiates reports whether the node with public key local is the initiator towards the node
// with public key remote: the smaller key is. Both ends compute the same answer.
func initiates(local, remote wgtypes.Key) bool {
	return bytes.Compare(local[:], remote[:]) < 0
}

// assisted reports whether two ends with these device kinds use the assisted mode.
func assisted(ownKind, remoteKind string) bool {
	return ownKind == KindUserspace && remoteKind == KindUserspace
}

// addPlan is how Connect adds a peer that is not on the device.
type addPlan int

const (
	addFull  addPlan = iota // now, fully configured
	addHeld                 // now, held back (no endpoint, no keepalive)
	addLater                // not now: the watcher adds it when due
)

// newPeer is a peer this process adds (or added) to the device and watches until its first
// handshake.
type newPeer struct {
	want desiredPeer
	// addAt is when a plain responder's deferred peer is due; zero once added.
	addAt time.Time
	// holdUntil is when an assisted responder releases its held-back peer at the latest; zero
	// once released.
	holdUntil time.Time
	// nudge is set for an assisted initiator.
	nudge bool
	// since is when the current wait began: the peer's creation, or the last time its received
	// bytes grew.
	since time.Time
	rx    int64
	// step is the position in the schedule; total counts every nudge.
	step, total int
	lastNudge   time.Time
}

// handshakeWatch is the state of every watched new peer, keyed by public key.
type handshakeWatch struct {
	timing handshakeTiming
	peers  map[wgtypes.Key]*newPeer
}

func newHandshakeWatch(t handshakeTiming) *handshakeWatch {
	return &handshakeWatch{timing: t, peers: map[wgtypes.Key]*newPeer{}}
}

// add decides how to add want's peer, which is not on the device, and watches it when there is
// something to do. own and ownKind are this node's key and device kind; reconnect is set when the
// peer was connected before this process started.
func (w *handshakeWatch) add(now time.Time, own wgtypes.Key, ownKind string, want desiredPeer, reconnect bool) addPlan {
	p := &newPeer{want: want, since: now}
	plan := addFull
	initiator := initiates(own, want.PublicKey)
	switch {
	case assisted(ownKind, want.RemoteKind) && initiator:
		p.nudge = w.timing.MaxNudges > 0
	case reconnect:
	case assisted(ownKind, want.RemoteKind):
		if w.timing.HoldFor > 0 {
			p.holdUntil, plan = now.Add(w.timing.HoldFor), addHeld
		}
	case !initiator:
		if w.timing.DeferFor > 0 {
			p.addAt, plan = now.Add(w.timing.DeferFor), addLater
		}
	}
	if p.addAt.IsZero() && p.holdUntil.IsZero() && !p.nudge {
		delete(w.peers, want.PublicKey)
		return plan
	}
	w.peers[want.PublicKey] = p
	return plan
}

// pending reports how a watched peer currently wants to be on the device: addLater (deferred, not
// yet added), addHeld (held back) or addFull (anything else, watched or not). A pending peer's want
// becomes want (the latest Connect's).
func (w *handshakeWatch) pending(want desiredPeer) addPlan {
	p, ok := w.peers[want.PublicKey]
	switch {
	case !ok:
		return addFull
	case !p.addAt.IsZero():
		p.want = want
		return addLater
	case !p.holdUntil.IsZero():
		p.want = want
		return addHeld
	}
	return addFull
}

// pendingKeys are the keys of the peers deferred or held back, with which.
func (w *handshakeWatch) pendingKeys() map[wgtypes.Key]addPlan {
	out := map[wgtypes.Key]addPlan{}
	for k, p := range w.peers {
		switch {
		case !p.addAt.IsZero():
			out[k] = addLater
		case !p.holdUntil.IsZero():
			out[k] = addHeld
		}
	}
	return out
}

// forget stops watching k (its cluster was disconnected, or its key replaced).
func (w *handshakeWatch) forget(k wgtypes.Key) { delete(w.peers, k) }

// empty reports whether nothing is watched.
func (w *handshakeWatch) empty() bool { return len(w.peers) == 0 }

// handshakeActions is what one step decided.
type handshakeActions struct {
	// Add are deferred peers due on the device now; Release are held-back peers to configure
	// fully now.
	Add, Release []desiredPeer
	// Nudge are the peers to send a fresh initiation to now.
	Nudge []wgtypes.Key
}

// step looks at the device's peers at now and decides. A peer stops being watched once it is
// added, released, has completed a handshake, has had every nudge, or is gone from the device.
func (w *handshakeWatch) step(now time.Time, onDevice []wgtypes.Peer) handshakeActions {
	var act handshakeActions
	seen := make(map[wgtypes.Key]wgtypes.Peer, len(onDevice))
	for _, p := range onDevice {
		seen[p.PublicKey] = p
	}
	for k, p := range w.peers {
		dp, ok := seen[k]
		switch {
		case !p.addAt.IsZero():
			if !ok && now.Before(p.addAt) {
				continue
			}
			if !ok {
				act.Add = append(act.Add, p.want)
			}
			delete(w.peers, k) // due, or added meanwhile by someone else
		case !p.holdUntil.IsZero():
			if ok && !hasHandshake(dp.LastHandshakeTime) && now.Before(p.holdUntil) {
				continue
			}
			if ok {
				act.Release = append(act.Release, p.want)
			}
			delete(w.peers, k)
		case !ok || handshakeSince(dp.LastHandshakeTime, p.lastNudge) || p.total >= w.timing.MaxNudges:
			delete(w.peers, k)
		default:
			if dp.ReceiveBytes > p.rx {
				// Heard from the peer, yet no handshake: start the schedule over.
				p.rx, p.since, p.step = dp.ReceiveBytes, now, 0
			}
			from := p.since
			if p.lastNudge.After(from) {
				from = p.lastNudge
			}
			if now.Sub(from) >= nudgeDelay(w.timing.FirstNudge, p.step) {
				act.Nudge = append(act.Nudge, k)
				p.step++
				p.total++
				p.lastNudge = now
			}
		}
	}
	byKey := func(a, b desiredPeer) int { return bytes.Compare(a.PublicKey[:], b.PublicKey[:]) }
	slices.SortFunc(act.Add, byKey)
	slices.SortFunc(act.Release, byKey)
	slices.SortFunc(act.Nudge, func(a, b wgtypes.Key) int { return bytes.Compare(a[:], b[:]) })
	return act
}

// nudgeDelay is the wait before nudge n (0-based) of a schedule starting at first: first for
// nudgesPerStep nudges, then doubling every nudgesPerStep nudges, at most rekeyTimeout.
func nudgeDelay(first time.Duration, n int) time.Duration {
	d := first
	for i := 0; i < n/nudgesPerStep && d < rekeyTimeout; i++ {
		d *= 2
	}
	return min(d, rekeyTimeout)
}

// hasHandshake reports whether a device's last handshake time is a real one (wgctrl reports the
// zero time, or the Unix epoch, for never).
func hasHandshake(t time.Time) bool { return !t.IsZero() && t.Unix() > 0 }

// handshakeSince reports whether last, a device's last handshake time, is a handshake completed
// at or after the initiator's last nudge (any handshake when it has not nudged). A handshake
// completed just before a nudge does not count: the device is read a moment before the nudge,
// and the nudge's ExpireCurrentKeypairs stops that session from sending, so only the handshake
// the nudge starts makes the pair whole again. (Same clock: wireguard-go runs in this process.)
func handshakeSince(last, nudged time.Time) bool {
	return hasHandshake(last) && !last.Before(nudged)
}
