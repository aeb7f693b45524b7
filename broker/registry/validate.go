// Package registry holds the broker's pure rules for clusters: cluster ID allocation and the CIDR
// overlap check of seed 001. Name, CIDR and label validation, shared with the agent config and
// cablectl, is api/validation. Nothing here does I/O, so every rule is tested with tables and
// fuzzed; the broker applies the results to its store.
package registry

import (
	"fmt"
	"net/netip"
)

const (
	// MinClusterID and MaxClusterID bound the IDs the broker allocates (seed 001: 1..255).
	MinClusterID = 1
	MaxClusterID = 255
)

// ClusterCIDRs is what the overlap check needs to know about one cluster.
type ClusterCIDRs struct {
	Name         string
	PodCIDRs     []netip.Prefix
	ServiceCIDRs []netip.Prefix
}

// CheckOverlap refuses a new cluster whose pod or service CIDRs overlap any CIDR of an existing
// cluster (seed 001: routes to each cluster's CIDRs go over that cluster's cable, so overlapping
// ranges would be unroutable; gateway mode for overlapping pairs is a later feature), or whose own
// pod and service CIDRs overlap each other. The error names both clusters and both CIDRs.
func CheckOverlap(c ClusterCIDRs, existing []ClusterCIDRs) error {
	for _, p := range c.PodCIDRs {
		for _, s := range c.ServiceCIDRs {
			if p.Overlaps(s) {
				return fmt.Errorf("cluster %q: pod CIDR %s overlaps its own service CIDR %s", c.Name, p, s)
			}
		}
	}
	mine := []struct {
		kind string
		ps   []netip.Prefix
	}{{"pod CIDR", c.PodCIDRs}, {"service CIDR", c.ServiceCIDRs}}
	for _, e := range existing {
		if e.Name == c.Name {
			continue
		}
		theirs := []struct {
			kind string
			ps   []netip.Prefix
		}{{"pod CIDR", e.PodCIDRs}, {"service CIDR", e.ServiceCIDRs}}
		for _, m := range mine {
			for _, p := range m.ps {
				for _, t := range theirs {
					for _, q := range t.ps {
						if p.Overlaps(q) {
							return fmt.Errorf("%s %s of cluster %q overlaps %s %s of cluster %q", m.kind, p, c.Name, t.kind, q, e.Name)
						}
					}
				}
			}
		}
	}
	return nil
}

// AllocateID returns the lowest free cluster ID in MinClusterID..MaxClusterID, or an error saying
// the mesh is full.
func AllocateID(used map[uint32]bool) (uint32, error) {
	for id := uint32(MinClusterID); id <= MaxClusterID; id++ {
		if !used[id] {
			return id, nil
		}
	}
	return 0, fmt.Errorf("mesh is full: all %d cluster IDs (%d..%d) are in use; remove a cluster first", MaxClusterID-MinClusterID+1, MinClusterID, MaxClusterID)
}

// Within reports whether subnet lies inside one of the prefixes.
func Within(subnet netip.Prefix, in []netip.Prefix) bool {
	for _, p := range in {
		if p.Addr().BitLen() == subnet.Addr().BitLen() && p.Bits() <= subnet.Bits() && p.Contains(subnet.Addr()) {
			return true
		}
	}
	return false
}
