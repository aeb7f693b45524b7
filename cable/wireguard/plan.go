package wireguard

import (
	"fmt"
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
	Keepalive time.Duration
}

// desiredFromRemote validates remote and builds the peer it asks for. Errors name the field.
func desiredFromRemote(remote cable.RemoteEndpoint, keepalive time.Duration) (desiredPeer, error) {
	if remote.Cluster == "" {
		return desiredPeer{}, fmt.Errorf("wireguard connect: remote cluster name is empty")
	}
	pub := remote.Attributes[AttrPublicKey]
	key, err := wgtypes.ParseKey(pub)
	if err != nil {
		return desiredPeer{}, fmt.Errorf("wireguard connect to cluster %s: public key %q: %w", remote.Cluster, pub, err)
	}
	if !remote.Address.IsValid() || remote.Address.IsUnspecified() {
		return desiredPeer{}, fmt.Errorf("wireguard connect to cluster %s: address %q is not a usable IP", remote.Cluster, remote.Address)
	}
	if remote.Port == 0 {
		return desiredPeer{}, fmt.Errorf("wireguard connect to cluster %s: port 0", remote.Cluster)
	}
	subnets, err := normalizeSubnets(remote.Subnets)
	if err != nil {
		return desiredPeer{}, fmt.Errorf("wireguard connect to cluster %s: %w", remote.Cluster, err)
	}
	return desiredPeer{
		Cluster:   remote.Cluster,
		Node:      remote.Node,
		PublicKey: key,
		Endpoint:  netip.AddrPortFrom(remote.Address.Unmap(), remote.Port),
		Subnets:   subnets,
		Keepalive: keepalive,
	}, nil
}

// normalizeSubnets masks, sorts and de-duplicates prefixes, rejecting invalid ones.
func normalizeSubnets(in []netip.Prefix) ([]netip.Prefix, error) { return route.NormalizeSubnets(in) }

// overlappingCluster returns the first subnet of another stored cluster that overlaps one of
// subnets. WireGuard gives an allowed IP to exactly one peer, so an overlap would silently move
// traffic from one cluster's tunnel to another's.
func overlappingCluster(cluster string, subnets []netip.Prefix, stored map[string]storedConn) (string, netip.Prefix, netip.Prefix, bool) {
	names := make([]string, 0, len(stored))
	for n := range stored {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, other := range names {
		if other == cluster {
			continue
		}
		for _, theirs := range stored[other].Subnets {
			for _, ours := range subnets {
				if theirs.Overlaps(ours) {
					return other, theirs, ours, true
				}
			}
		}
	}
	return "", netip.Prefix{}, netip.Prefix{}, false
}

// peerMatches reports whether the peer on the device already is exactly the desired one.
func peerMatches(p wgtypes.Peer, want desiredPeer) bool {
	if p.PublicKey != want.PublicKey || p.PersistentKeepaliveInterval != want.Keepalive {
		return false
	}
	if p.Endpoint == nil || p.Endpoint.AddrPort() != want.Endpoint {
		// UDPAddr.AddrPort keeps a v4-mapped form for some inputs; compare unmapped.
		if p.Endpoint == nil {
			return false
		}
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
	return normalizeSubnets(out)
}

// peerConfig is the wgctrl change that makes the device hold want.
func peerConfig(want desiredPeer) wgtypes.PeerConfig {
	ka := want.Keepalive
	allowed := make([]net.IPNet, 0, len(want.Subnets))
	for _, p := range want.Subnets {
		allowed = append(allowed, route.IPNetFromPrefix(p))
	}
	return wgtypes.PeerConfig{
		PublicKey:                   want.PublicKey,
		Endpoint:                    net.UDPAddrFromAddrPort(want.Endpoint),
		PersistentKeepaliveInterval: &ka,
		ReplaceAllowedIPs:           true,
		AllowedIPs:                  allowed,
	}
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
