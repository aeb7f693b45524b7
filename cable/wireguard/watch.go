package wireguard

import (
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"
)

// The handshake watcher: the goroutine that applies handshakeWatch's decisions (handshake.go). It
// reads the device every timing.Interval while a new peer is being watched and sleeps otherwise;
// Connect wakes it. The driver owns it from Init to Close (or Cleanup).

// startWatcher starts the watcher. Called by Init with d.mu held.
func (d *Driver) startWatcher() {
	d.watchMu.Lock()
	defer d.watchMu.Unlock()
	if d.watchStop != nil {
		return
	}
	stop, done := make(chan struct{}), make(chan struct{})
	d.watchStop, d.watchDone = stop, done
	go func() {
		defer close(done)
		d.watchHandshakes(stop)
	}()
}

// stopWatcher stops the watcher and waits for it. Called without d.mu held: the watcher takes it.
func (d *Driver) stopWatcher() {
	d.watchMu.Lock()
	stop, done := d.watchStop, d.watchDone
	d.watchStop, d.watchDone = nil, nil
	d.watchMu.Unlock()
	if stop != nil {
		close(stop)
		<-done
	}
}

// kick wakes the watcher.
func (d *Driver) kick() {
	select {
	case d.kickCh <- struct{}{}:
	default:
	}
}

func (d *Driver) watchHandshakes(stop <-chan struct{}) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		var tick <-chan time.Time
		if d.handshakeStep() {
			t.Reset(max(d.timing.Interval, time.Millisecond))
			tick = t.C
		}
		select {
		case <-stop:
			return
		case <-d.kickCh:
		case <-tick:
		}
	}
}

// handshakeStep reads the device once and applies the decisions; it reports whether peers are
// still watched.
func (d *Driver) handshakeStep() (busy bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised || d.watch.empty() {
		return false
	}
	dev, err := d.host.Device(d.cfg.Interface)
	if err != nil {
		d.log.Warn("handshake watcher cannot read the device", "err", err)
		return true
	}
	act := d.watch.step(d.now(), dev.Peers)
	for _, want := range act.Add {
		if d.configurePeer(want, "peer configured", "deferred", true) {
			d.deferredAdds.Add(1)
		}
	}
	for _, want := range act.Release {
		if d.configurePeer(want, "peer released: allowed IPs and keepalive configured", "handshake", hasHandshake(handshakeTime(dev, want.PublicKey))) {
			d.releases.Add(1)
		}
	}
	for _, k := range act.Nudge {
		if err := d.dev.Initiate(k); err != nil {
			d.log.Warn("cannot send a fresh handshake initiation", "peer", k.String(), "err", err)
			continue
		}
		d.initiations.Add(1)
		d.log.Info("no handshake yet: sent a fresh initiation", "peer", k.String())
	}
	return !d.watch.empty()
}

// configurePeer configures want's peer fully for the watcher and logs msg with one more key and
// value; false when it failed (the next Connect of the cluster, the agent's resync at the latest,
// does it then).
func (d *Driver) configurePeer(want desiredPeer, msg, key string, value any) bool {
	log := d.log.With("cluster", want.Cluster, "node", want.Node, "peer", want.PublicKey.String())
	if err := d.host.ConfigureDevice(d.cfg.Interface, wgtypes.Config{Peers: []wgtypes.PeerConfig{peerConfig(want, false)}}); err != nil {
		log.Warn("cannot configure the peer", "err", err)
		return false
	}
	log.Info(msg, "endpoint", want.Endpoint, "subnets", want.Subnets, key, value)
	return true
}

func handshakeTime(dev *wgtypes.Device, k wgtypes.Key) time.Time {
	p, _ := findPeer(dev, k)
	return p.LastHandshakeTime
}
