package wireguard

import (
	"errors"
	"fmt"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

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
	for _, cluster := range forget {
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
	if len(forget) > 0 {
		return connections(d.dir).Save(d.conns)
	}
	return nil
}

// connect makes the device hold want's peer (read back: the device may silently disagree, e.g.
// about an allowed IP another peer held), routes want's subnets, and stores want.
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
	if peers := peerChanges(dev, old, want); len(peers) > 0 {
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
		if !deviceHolds(dev, want) {
			return fmt.Errorf("device %s did not keep the peer configuration", d.cfg.Interface)
		}
		log.Info("peer configured", "endpoint", want.Endpoint, "subnets", want.Subnets)
	}

	link, err := d.host.Link(d.cfg.Interface)
	if err != nil {
		return err
	}
	existing, err := d.host.Routes(link.Link)
	if err != nil {
		return err
	}
	src4, src6, err := d.host.Sources(d.node.LocalSubnets)
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
	if k, err := wgtypes.ParseKey(c.PublicKey); err == nil && hasPeer(dev, k) {
		if err := d.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: k, Remove: true}}}); err != nil {
			return err
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
