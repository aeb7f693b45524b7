package wireguard

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/internal/statefile"
)

// connections is the driver's connections.json in dir (StateDir/wireguard): the remote clusters
// and the peers this driver configured for them. A kernel device survives an agent restart, and
// the device itself only knows public keys: this file lets Init tell our peers from stale ones
// and lets Connections name each peer's cluster.
func connections(dir string) statefile.Store[storedConn] {
	return statefile.Store[storedConn]{Driver: Name, Dir: dir, Check: checkStored}
}

// storedConn is what Connect configured for one remote cluster.
type storedConn struct {
	Node      string         `json:"node"`
	PublicKey string         `json:"publicKey"`
	Endpoint  string         `json:"endpoint"`
	Subnets   []netip.Prefix `json:"subnets"`
	// LocalSubnets and RemoteKind complete the record, so that a userspace device, whose peers
	// die with the process, gets them back at Init exactly as Connect made them (absent in a
	// file an older agent wrote: such a peer waits for the first reconcile, as before).
	LocalSubnets []netip.Prefix `json:"localSubnets,omitempty"`
	RemoteKind   string         `json:"remoteKind,omitempty"`
}

// stored is the record of want.
func stored(want desiredPeer) storedConn {
	return storedConn{Node: want.Node, PublicKey: want.PublicKey.String(), Endpoint: want.Endpoint.String(), Subnets: want.Subnets,
		LocalSubnets: want.LocalSubnets, RemoteKind: want.RemoteKind}
}

// desiredFromStored is the peer c records for cluster, as Connect built it, with the keepalive
// in force; an error when the record lacks what a peer needs (a file of an older agent).
func desiredFromStored(cluster string, c storedConn, keepalive time.Duration) (desiredPeer, error) {
	key, err := wgtypes.ParseKey(c.PublicKey)
	if err != nil {
		return desiredPeer{}, fmt.Errorf("cluster %s: stored public key %q: %w", cluster, c.PublicKey, err)
	}
	ep, err := netip.ParseAddrPort(c.Endpoint)
	if err != nil {
		return desiredPeer{}, fmt.Errorf("cluster %s: stored endpoint %q: %w", cluster, c.Endpoint, err)
	}
	return desiredPeer{Cluster: cluster, Node: c.Node, PublicKey: key, Endpoint: ep, Subnets: c.Subnets,
		LocalSubnets: c.LocalSubnets, Keepalive: keepalive, RemoteKind: c.RemoteKind}, nil
}

func storedEqual(a, b storedConn) bool {
	return a.Node == b.Node && a.PublicKey == b.PublicKey && a.Endpoint == b.Endpoint && slices.Equal(a.Subnets, b.Subnets) &&
		slices.Equal(a.LocalSubnets, b.LocalSubnets) && a.RemoteKind == b.RemoteKind
}

// checkStored validates one record of connections.json.
func checkStored(cluster string, c storedConn) error {
	for _, p := range c.Subnets {
		if !p.IsValid() {
			return fmt.Errorf("cluster %s: invalid subnet", cluster)
		}
	}
	for _, p := range c.LocalSubnets {
		if !p.IsValid() {
			return fmt.Errorf("cluster %s: invalid local subnet", cluster)
		}
	}
	return nil
}
