package wireguard

import (
	"fmt"
	"net/netip"
	"slices"

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
}

// stored is the record of want.
func stored(want desiredPeer) storedConn {
	return storedConn{Node: want.Node, PublicKey: want.PublicKey.String(), Endpoint: want.Endpoint.String(), Subnets: want.Subnets}
}

func storedEqual(a, b storedConn) bool {
	return a.Node == b.Node && a.PublicKey == b.PublicKey && a.Endpoint == b.Endpoint && slices.Equal(a.Subnets, b.Subnets)
}

// checkStored validates one record of connections.json.
func checkStored(cluster string, c storedConn) error {
	for _, p := range c.Subnets {
		if !p.IsValid() {
			return fmt.Errorf("cluster %s: invalid subnet", cluster)
		}
	}
	return nil
}
