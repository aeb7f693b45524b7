package wireguard

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

// This file is the host side of the driver: it observes the device, the link and the routes
// through d.host, lets plan.go decide, and applies the result. Every method is called with d.mu
// held.

// initDevice gives the device its key and port, removes the peers and the routes no stored
// cluster claims, forgets the stored clusters whose peer is gone, and brings the link up with
// its MTU.
func (d *Driver) initDevice() error {
	name := d.cfg.Interface
	dev, err := d.host.Device(name)
	if err != nil {
		return err
	}
	keys := make([]wgtypes.Key, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		keys = append(keys, p.PublicKey)
	}
	stalePeers, forget := staleState(keys, d.conns)
	for _, k := range stalePeers {
		d.log.Info("removing stale peer", "peer", k.String())
	}
	if cfg := deviceChanges(dev, d.key, d.cfg.Port, stalePeers); cfg != nil {
		if err := d.configure(*cfg); err != nil {
			return err
		}
	}
	restore := map[string]storedConn{}
	for _, cluster := range forget {
		// Its peer died with an earlier process (a userspace device): adding it again is a
		// reconnect, not a new pair (see handshake.go).
		if k, err := wgtypes.ParseKey(d.conns[cluster].PublicKey); err == nil {
			d.reconnect[k] = true
		}
		if d.dev.Kind() == KindUserspace {
			restore[cluster] = d.conns[cluster]
		}
		delete(d.conns, cluster)
	}

	link, err := d.host.Link(name)
	if err != nil {
		return err
	}
	if link.MTU != d.mtu {
		if err := d.host.SetLinkMTU(link, d.mtu); err != nil {
			return err
		}
	}
	if !link.Up {
		if err := d.host.SetLinkUp(link); err != nil {
			return err
		}
	}
	existing, err := d.host.Routes(link.Link)
	if err != nil {
		return err
	}
	if err := d.applyRoutes(link.Link, route.Plan{Delete: staleRoutes(existing, d.conns)}); err != nil {
		return err
	}
	d.restorePeers(restore)
	if len(forget) > 0 {
		return connections(d.dir).Save(d.conns)
	}
	return nil
}

// restorePeers adds again, at once, the peers an earlier process had connected on its userspace
// device (which died with it), as that process's Connect made them. The pair then carries
// traffic again as soon as this device is up, without waiting for the agent's first reconcile,
// which comes only once every cable driver has initialised (charon's start, for one) and the
// services datapath is loaded; that reconcile finds the peer in place, or changes it as the plan
// in force says. A peer that cannot be restored (a record of an older agent, without endpoint)
// waits for that reconcile, as before.
func (d *Driver) restorePeers(restore map[string]storedConn) {
	for _, cluster := range slices.Sorted(maps.Keys(restore)) {
		want, err := desiredFromStored(cluster, restore[cluster], d.cfg.Keepalive)
		if err != nil {
			d.log.Debug("peer of the previous run not restored: the first reconcile adds it", "cluster", cluster, "err", err)
			continue
		}
		d.log.Info("restoring the previous run's peer at once (it died with that process's device)", "cluster", cluster, "node", want.Node, "peer", want.PublicKey.String())
		if err := d.connect(want); err != nil {
			d.log.Warn("peer of the previous run not restored: the first reconcile adds it", "cluster", cluster, "err", err)
			delete(d.conns, cluster)
		}
	}
}

// connect makes the device hold want's peer (read back: the device may silently disagree, e.g.
// about an allowed IP another peer held), routes want's subnets, and stores want. A new peer is
// added as handshake.go decides: fully at once, held back at once, or a moment later by the
// handshake watcher.
func (d *Driver) connect(want desiredPeer) error {
	log := d.log.With("cluster", want.Cluster, "node", want.Node, "peer", want.PublicKey.String())
	dev, err := d.host.Device(d.cfg.Interface)
	if err != nil {
		return err
	}
	var old *storedConn
	if c, ok := d.conns[want.Cluster]; ok {
		old = &c
	}
	if old != nil && old.PublicKey != want.PublicKey.String() {
		if k, err := wgtypes.ParseKey(old.PublicKey); err == nil {
			d.watch.forget(k)
		}
	}
	plan := d.watch.pending(want)
	if plan == addFull && !hasPeer(dev, want.PublicKey) {
		plan = d.watch.add(d.now(), d.key.PublicKey(), d.dev.Kind(), want, d.reconnect[want.PublicKey])
		delete(d.reconnect, want.PublicKey)
	}
	if peers := peerChanges(dev, old, want, plan); len(peers) > 0 {
		if old != nil && old.PublicKey != want.PublicKey.String() {
			log.Info("remote key changed", "oldPeer", old.PublicKey)
		}
		if err := d.configure(wgtypes.Config{Peers: peers}); err != nil {
			return err
		}
		dev, err = d.host.Device(d.cfg.Interface)
		if err != nil {
			return fmt.Errorf("read back: %w", err)
		}
		if plan != addLater && !deviceHolds(dev, want, plan == addHeld) {
			return fmt.Errorf("device %s did not keep the peer configuration", d.cfg.Interface)
		}
		switch plan {
		case addFull:
			log.Info("peer configured", "endpoint", want.Endpoint, "subnets", want.Subnets)
		case addHeld:
			log.Info("peer configured, held back until the first handshake: the remote end initiates it, this end answers",
				"endpoint", want.Endpoint, "subnets", want.Subnets)
		}
	}
	if plan == addLater && (old == nil || old.PublicKey != want.PublicKey.String()) {
		log.Info("peer deferred: the remote end initiates the first handshake, this end adds the peer shortly",
			"endpoint", want.Endpoint, "subnets", want.Subnets, "in", d.timing.DeferFor)
	}

	link, err := d.host.Link(d.cfg.Interface)
	if err != nil {
		return err
	}
	existing, err := d.host.Routes(link.Link)
	if err != nil {
		return err
	}
	src4, src6, err := d.host.Sources(cable.RemoteEndpoint{LocalSubnets: want.LocalSubnets}.SourceSubnets(d.node))
	if err != nil {
		d.log.Warn("no route source", "err", err)
	}
	if err := d.applyRoutes(link.Link, routePlan(existing, old, route.Wanted(want.Subnets, d.mtu, src4, src6))); err != nil {
		return err
	}

	if entry := stored(want); old == nil || !storedEqual(*old, entry) {
		d.conns[want.Cluster] = entry
		return connections(d.dir).Save(d.conns)
	}
	return nil
}

// disconnect removes c's peer and routes and forgets cluster.
func (d *Driver) disconnect(cluster string, c storedConn) error {
	dev, err := d.host.Device(d.cfg.Interface)
	if err != nil {
		return err
	}
	if k, err := wgtypes.ParseKey(c.PublicKey); err == nil {
		d.watch.forget(k)
		delete(d.reconnect, k)
		if hasPeer(dev, k) {
			if err := d.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: k, Remove: true}}}); err != nil {
				return err
			}
		}
	}
	link, err := d.host.Link(d.cfg.Interface)
	switch {
	case errors.Is(err, errLinkNotFound):
	case err != nil:
		return err
	default:
		existing, err := d.host.Routes(link.Link)
		if err != nil {
			return err
		}
		if err := d.applyRoutes(link.Link, routePlan(existing, &c, nil)); err != nil {
			return err
		}
	}
	delete(d.conns, cluster)
	return connections(d.dir).Save(d.conns)
}

// cleanup removes our routes and the link (the device, for a userspace one) and
// connections.json.
func (d *Driver) cleanup() error {
	var errs []error
	link, err := d.host.Link(d.cfg.Interface)
	switch {
	case errors.Is(err, errLinkNotFound):
	case err != nil:
		errs = append(errs, err)
	default:
		if existing, err := d.host.Routes(link.Link); err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, d.applyRoutes(link.Link, route.Plan{Delete: existing}))
		}
		if d.dev == nil && link.Type == "wireguard" {
			// Cleanup without Init: the kernel link is still ours.
			errs = append(errs, d.host.DeleteLink(d.cfg.Interface))
		}
	}
	if d.dev != nil {
		errs = append(errs, d.dev.Close())
		d.dev = nil
	}
	errs = append(errs, connections(d.dir).Remove())
	d.conns = nil
	return errors.Join(errs...)
}

func (d *Driver) configure(cfg wgtypes.Config) error {
	d.configures.Add(1)
	return d.host.ConfigureDevice(d.cfg.Interface, cfg)
}

func (d *Driver) applyRoutes(link route.Link, plan route.Plan) error {
	return d.host.ApplyRoutes(d.log, link, plan, func() { d.routeChanges.Add(1) })
}
