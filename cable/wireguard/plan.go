package wireguard

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

// This file holds the pure half of the driver: validating input, deciding whether the device and
// the routes already match what is wanted, and computing the changes. No I/O.

// desiredPeer is the peer one remote cluster should have on the device.
type desiredPeer struct {
	Cluster   string
	Node      string
	PublicKey wgtypes.Key
	Endpoint  netip.AddrPort
	Subnets   []netip.Prefix // masked, sorted, without duplicates
	// LocalSubnets override the node's for the route source (a gateway-mode pair: own mesh /32);
	// empty = the node's.
	LocalSubnets []netip.Prefix
	Keepalive    time.Duration
	// RemoteKind is the device kind the remote node publishes (AttrDevice): KindKernel,
	// KindUserspace, or "" when it does not say.
	RemoteKind string
}

// desiredFromRemote validates remote and builds the peer it asks for. Errors name the field.
func desiredFromRemote(remote cable.RemoteEndpoint, keepalive time.Duration) (desiredPeer, error) {
	if err := cable.CheckRemote(Name, remote); err != nil {
		return desiredPeer{}, err
	}
	pub := remote.Attributes[AttrPublicKey]
	key, err := wgtypes.ParseKey(pub)
	if err != nil {
		return desiredPeer{}, fmt.Errorf("wireguard connect to cluster %s: public key %q: %w", remote.Cluster, pub, err)
	}
	if remote.Port == 0 {
		return desiredPeer{}, fmt.Errorf("wireguard connect to cluster %s: port 0", remote.Cluster)
	}
	subnets, err := cable.NormalizeSubnets(remote.Subnets)
	if err != nil {
		return desiredPeer{}, fmt.Errorf("wireguard connect to cluster %s: %w", remote.Cluster, err)
	}
	return desiredPeer{
		Cluster:      remote.Cluster,
		Node:         remote.Node,
		PublicKey:    key,
		Endpoint:     netip.AddrPortFrom(remote.Address.Unmap(), remote.Port),
		Subnets:      subnets,
		LocalSubnets: remote.LocalSubnets,
		Keepalive:    keepalive,
		RemoteKind:   remote.Attributes[AttrDevice],
	}, nil
}

// checkConflicts refuses want when it cannot live beside the stored clusters: this node's own
// key; a subnet another cluster has (WireGuard gives an allowed IP to exactly one peer, so an
// overlap would silently move traffic from one cluster's tunnel to another's); a key another
// cluster's peer has.
func checkConflicts(want desiredPeer, own wgtypes.Key, stored map[string]storedConn) error {
	if want.PublicKey == own {
		return fmt.Errorf("public key %s is this node's own", want.PublicKey)
	}
	others := make(map[string][]netip.Prefix, len(stored))
	for cluster, c := range stored {
		others[cluster] = c.Subnets
	}
	if err := cable.CheckOverlap(want.Cluster, want.Subnets, others); err != nil {
		return err
	}
	for _, cluster := range slices.Sorted(maps.Keys(stored)) {
		if cluster != want.Cluster && stored[cluster].PublicKey == want.PublicKey.String() {
			return fmt.Errorf("public key %s is already the peer of cluster %s", want.PublicKey, cluster)
		}
	}
	return nil
}

// peerChanges is the wgctrl change that makes dev hold want for its cluster: the peer of the
// cluster's old key removed when the remote's key changed (old is the stored connection, if
// any), and want's peer configured as plan says (fully, held back, or not yet: see handshake.go)
// unless the device already has it so. Empty: nothing to do.
func peerChanges(dev *wgtypes.Device, old *storedConn, want desiredPeer, plan addPlan) []wgtypes.PeerConfig {
	var peers []wgtypes.PeerConfig
	if old != nil && old.PublicKey != want.PublicKey.String() {
		if k, err := wgtypes.ParseKey(old.PublicKey); err == nil && hasPeer(dev, k) {
			peers = append(peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
		}
	}
	if plan != addLater && !deviceHolds(dev, want, plan == addHeld) {
		peers = append(peers, peerConfig(want, plan == addHeld))
	}
	return peers
}

// deviceHolds reports whether dev has exactly want's peer (held back: without allowed IPs and
// keepalive).
func deviceHolds(dev *wgtypes.Device, want desiredPeer, held bool) bool {
	p, ok := findPeer(dev, want.PublicKey)
	return ok && peerMatches(p, want, held)
}

func findPeer(dev *wgtypes.Device, k wgtypes.Key) (wgtypes.Peer, bool) {
	for _, p := range dev.Peers {
		if p.PublicKey == k {
			return p, true
		}
	}
	return wgtypes.Peer{}, false
}

func hasPeer(dev *wgtypes.Device, k wgtypes.Key) bool {
	_, ok := findPeer(dev, k)
	return ok
}

// peerMatches reports whether the peer on the device already is exactly the desired one. A
// held-back peer (see peerConfig) has no keepalive, and any endpoint or none.
func peerMatches(p wgtypes.Peer, want desiredPeer, held bool) bool {
	keepalive := want.Keepalive
	if held {
		keepalive = 0
	}
	if p.PublicKey != want.PublicKey || p.PersistentKeepaliveInterval != keepalive {
		return false
	}
	if !held {
		if p.Endpoint == nil {
			return false
		}
		// UDPAddr.AddrPort keeps a v4-mapped form for some inputs; compare unmapped.
		ap := p.Endpoint.AddrPort()
		if netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()) != want.Endpoint {
			return false
		}
	}
	have, err := prefixesFromIPNets(p.AllowedIPs)
	if err != nil {
		return false
	}
	return slices.Equal(have, want.Subnets)
}

// prefixesFromIPNets converts, masks and sorts what the device reports.
func prefixesFromIPNets(nets []net.IPNet) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(nets))
	for _, n := range nets {
		p, err := route.PrefixFromIPNet(n)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return cable.NormalizeSubnets(out)
}

// peerConfig is the wgctrl change that makes the device hold want. Held back, the peer has no
// endpoint and no keepalive, so the device cannot send it an initiation (wireguard-go drops one
// for lack of an endpoint, and then sends none for REKEY_TIMEOUT), but it answers the peer's
// initiation, learning the endpoint from it, and keeps what it routes to the peer until the
// session is up. A userspace device only: see handshake.go.
func peerConfig(want desiredPeer, held bool) wgtypes.PeerConfig {
	ka := want.Keepalive
	var endpoint *net.UDPAddr
	if held {
		ka = 0
	} else {
		endpoint = net.UDPAddrFromAddrPort(want.Endpoint)
	}
	allowed := make([]net.IPNet, 0, len(want.Subnets))
	for _, p := range want.Subnets {
		allowed = append(allowed, route.IPNetFromPrefix(p))
	}
	return wgtypes.PeerConfig{
		PublicKey:                   want.PublicKey,
		Endpoint:                    endpoint,
		PersistentKeepaliveInterval: &ka,
		ReplaceAllowedIPs:           true,
		AllowedIPs:                  allowed,
	}
}

// deviceChanges is what Init changes on the device: its key and port when they differ, and the
// removal of the peers no stored cluster claims (see staleState). nil: nothing.
func deviceChanges(dev *wgtypes.Device, key wgtypes.Key, port int, stale []wgtypes.Key) *wgtypes.Config {
	var cfg wgtypes.Config
	changed := false
	if dev.PrivateKey != key {
		cfg.PrivateKey, changed = &key, true
	}
	if dev.ListenPort != port {
		cfg.ListenPort, changed = &port, true
	}
	for _, k := range stale {
		cfg.Peers, changed = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true}), true
	}
	if !changed {
		return nil
	}
	return &cfg
}

// staleState compares the peers on the device with the stored clusters after a restart. Peers no
// cluster claims are stale (a kernel device kept a peer whose cluster was disconnected while the
// agent was down): remove them. Clusters whose peer is not on the device (always so for a fresh
// userspace device) are forgotten: the agent's reconcile connects them again.
func staleState(onDevice []wgtypes.Key, conns map[string]storedConn) (remove []wgtypes.Key, forget []string) {
	known := map[wgtypes.Key]bool{}
	for _, c := range conns {
		if k, err := wgtypes.ParseKey(c.PublicKey); err == nil {
			known[k] = true
		}
	}
	present := map[wgtypes.Key]bool{}
	for _, k := range onDevice {
		present[k] = true
		if !known[k] {
			remove = append(remove, k)
		}
	}
	for cluster, c := range conns {
		if k, err := wgtypes.ParseKey(c.PublicKey); err != nil || !present[k] {
			forget = append(forget, cluster)
		}
	}
	slices.Sort(forget)
	return remove, forget
}

// staleRoutes are the routes of ours over the link for subnets no stored cluster has.
func staleRoutes(existing []route.Spec, conns map[string]storedConn) []route.Spec {
	owned := map[netip.Prefix]bool{}
	for _, c := range conns {
		for _, s := range c.Subnets {
			owned[s] = true
		}
	}
	var stale []route.Spec
	for _, r := range existing {
		if !owned[r.Dst] {
			stale = append(stale, r)
		}
	}
	return stale
}

// routePlan is the route change over the link for one cluster: want are its routes now (nil for
// Disconnect); its old subnets (old, the stored connection, if any) that want has not any more
// are removed. Routes of other clusters are left alone.
func routePlan(existing []route.Spec, old *storedConn, want []route.Spec) route.Plan {
	return route.PlanRoutes(existing, want, func(p netip.Prefix) bool {
		return old != nil && slices.Contains(old.Subnets, p)
	})
}
