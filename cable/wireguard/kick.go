package wireguard

import (
	"bytes"
	"context"
	"math/rand/v2"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// Why the driver kicks new peers.
//
// When both sides add each other's peer within one one-way delay of each other, their first
// handshake initiations cross in flight: each side consumes the other's initiation and answers
// as responder, which replaces its own initiator state, so both responses are then dropped
// ("invalid response"). Neither side holds a confirmed session, and WireGuard (wireguard-go and
// the kernel alike) retries only after REKEY_TIMEOUT, 5s plus jitter; until then it refuses to
// send any initiation, since one was sent less than REKEY_TIMEOUT ago. Over a long path the
// retries can cross again. (An initiation that reaches a side which does not know us yet is
// harmless: that side's own initiation, sent when it adds us, completes the handshake.)
//
// A peer that is removed and added again starts with a handshake state that allows an
// initiation at once, and a peer added with a persistent keepalive sends one immediately. So a
// watcher re-adds a new peer that has not completed a handshake after about a second, a few
// times with backoff. The side with the smaller public key goes first and the other later, so
// the two sides' re-adds do not cross in turn. A peer that has ever completed a handshake is
// never touched: an established session is not torn down.

// Handshake kick schedule.
const (
	// kickFirst is how long after Connect the side with the smaller public key first checks.
	kickFirst = time.Second
	// kickStagger delays the other side's checks, so that they come after the first side's
	// re-add has had time to complete a handshake and confirm it to this side (one and a half
	// round trips): checking earlier would find no handshake yet and re-add again, undoing it.
	kickStagger = time.Second
	// kickMaxJitter spreads the checks of many peers and agents.
	kickMaxJitter = 100 * time.Millisecond
	// kickAttempts bounds the re-adds of one peer; after them WireGuard's own retries go on.
	kickAttempts = 4
)

// defaultKickSchedule is how long to wait before each check of a new peer, each wait counted from the
// previous check: kickFirst (plus kickStagger for the side whose public key is the larger) and
// then doubling, each with jitter added. Pure, for the tests.
func defaultKickSchedule(ours, theirs wgtypes.Key, jitter func() time.Duration) []time.Duration {
	first := kickFirst
	if bytes.Compare(ours[:], theirs[:]) > 0 {
		first += kickStagger
	}
	out := make([]time.Duration, kickAttempts)
	step := kickFirst
	for i := range out {
		if i == 0 {
			out[i] = first + jitter()
		} else {
			step *= 2
			out[i] = step + jitter()
		}
	}
	return out
}

func randomJitter() time.Duration { return rand.N(kickMaxJitter) }

// neverHandshook says whether the device reports no completed handshake for a peer (the kernel
// reports the Unix epoch, wireguard-go the zero time).
func neverHandshook(t time.Time) bool { return t.IsZero() || t.Unix() <= 0 }

// kickDecision is what one check of a watched peer concludes.
type kickDecision int

const (
	kickStop kickDecision = iota // the peer shook hands, is gone or was changed: stop watching
	kickNow                      // the peer never shook hands: re-add it
)

// decideKick looks at the peer on the device (found says whether it is there). Pure.
func decideKick(p wgtypes.Peer, found bool, want desiredPeer) kickDecision {
	if !found || !peerMatches(p, want) || !neverHandshook(p.LastHandshakeTime) {
		return kickStop
	}
	return kickNow
}

// handshakeWatch is the watcher of one cluster's new peer.
type handshakeWatch struct {
	want   desiredPeer
	cancel context.CancelFunc
	ctx    context.Context
}

// startWatchLocked replaces the watcher of want.Cluster by one for want. d.mu must be held and
// the driver initialised.
func (d *Driver) startWatchLocked(want desiredPeer) {
	d.stopWatchLocked(want.Cluster)
	ctx, cancel := context.WithCancel(d.ctx)
	w := &handshakeWatch{want: want, cancel: cancel, ctx: ctx}
	d.watches[want.Cluster] = w
	schedule := d.kickSchedule(d.key.PublicKey(), want.PublicKey)
	d.watchers.Go(func() {
		// Owned by the driver: ends when the peer shook hands, after the last attempt, or when
		// ctx ends (Disconnect, a new Connect for the cluster, Close, Cleanup).
		defer cancel()
		for i, wait := range schedule {
			timer := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				timer.Stop()
				return
			case <-timer.C:
			}
			if !d.checkKick(w, i+1, len(schedule)) {
				return
			}
		}
	})
}

// stopWatchLocked cancels the watcher of cluster, if any. d.mu must be held.
func (d *Driver) stopWatchLocked(cluster string) {
	if w, ok := d.watches[cluster]; ok {
		w.cancel()
		delete(d.watches, cluster)
	}
}

// stopAllWatchesLocked cancels every watcher; the caller waits for them with d.watchers.Wait
// after releasing d.mu, since a watcher may be waiting for d.mu. d.mu must be held.
func (d *Driver) stopAllWatchesLocked() {
	if d.stop != nil {
		d.stop()
	}
	for c := range d.watches {
		d.stopWatchLocked(c)
	}
}

// checkKick re-adds w's peer if it never completed a handshake; it reports whether to keep
// watching.
func (d *Driver) checkKick(w *handshakeWatch, attempt, attempts int) (keep bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	// Checked under the lock: a watcher cancelled by Disconnect, Close or a newer Connect must
	// not touch the device any more.
	if w.ctx.Err() != nil || d.watches[w.want.Cluster] != w || d.dev == nil {
		return false
	}
	defer func() {
		if !keep {
			delete(d.watches, w.want.Cluster)
		}
	}()
	log := d.log.With("cluster", w.want.Cluster, "node", w.want.Node, "peer", w.want.PublicKey.String())
	dev, err := d.client.Device(d.cfg.Interface)
	if err != nil {
		log.Warn("read device to check the first handshake", "error", err)
		return attempt < attempts
	}
	p, found := findPeer(dev, w.want.PublicKey)
	if decideKick(p, found, w.want) == kickStop {
		log.Debug("stop watching for the first handshake", "handshake", p.LastHandshakeTime, "on_device", found)
		return false
	}
	// Remove and add in one change: the peer created again may initiate at once, and turning
	// its persistent keepalive on makes it do so.
	cfg := wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: w.want.PublicKey, Remove: true}, peerConfig(w.want)}}
	d.kicks.Add(1)
	if err := d.client.ConfigureDevice(d.cfg.Interface, cfg); err != nil {
		log.Warn("re-add peer to restart its handshake", "attempt", attempt, "of", attempts, "error", err)
		// The removal may have happened without the addition: put the peer back.
		if err := d.client.ConfigureDevice(d.cfg.Interface, wgtypes.Config{Peers: []wgtypes.PeerConfig{peerConfig(w.want)}}); err != nil {
			log.Error("restore peer after a failed re-add", "error", err)
		}
		return attempt < attempts
	}
	log.Info("no handshake yet, re-added peer to restart its handshake", "attempt", attempt, "of", attempts)
	return attempt < attempts
}
