package broker

import (
	"sync"

	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
)

// clusterNetworks keeps the clusters' CIDRs as of the clusters a transaction holds, under their
// digest. Every registration is checked against every cluster's CIDRs in the store's one
// committer: decoding 255 clusters for each of 5,000 registrations of a fleet starting at once
// was most of the committer's time, and the registrations behind it missed their deadline.
type clusterNetworks struct {
	mu     sync.Mutex
	digest uint64
	valid  bool
	nets   admission.ClusterNetworks
}

// of returns the CIDRs of the clusters tx holds, decoding them only when they changed.
func (c *clusterNetworks) of(tx store.ReadTx) (admission.ClusterNetworks, error) {
	d, err := tx.ClustersDigest()
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.valid && c.digest == d {
		nets := c.nets
		c.mu.Unlock()
		return nets, nil
	}
	c.mu.Unlock()
	clusters, err := tx.Clusters()
	if err != nil {
		return nil, err
	}
	nets := admission.NetworksOf(clusters)
	c.mu.Lock()
	c.digest, c.valid, c.nets = d, true, nets
	c.mu.Unlock()
	return nets, nil
}
