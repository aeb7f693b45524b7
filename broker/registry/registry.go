// Package registry holds the broker's pure rules for clusters: cluster ID allocation and the CIDR
// overlap check. Name, CIDR and label validation, shared with the agent config and
// cablectl, is api/validation. Nothing here does I/O, so every rule is tested with tables and
// fuzzed; the broker applies the results to its store.
package registry

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

const (
	// MinClusterID and MaxClusterID bound the IDs the broker allocates (1..255: a cluster ID is one byte in the datapath).
	MinClusterID = 1
	MaxClusterID = 255
)

// ClusterCIDRs is what the overlap check needs to know about one cluster.
type ClusterCIDRs struct {
	Name         string
	PodCIDRs     []netip.Prefix
	ServiceCIDRs []netip.Prefix
	// GatewayMode: the cluster joined in gateway mode. Two gateway-mode clusters may overlap:
	// their pair's cable carries only the gateways' mesh addresses, never these CIDRs.
	GatewayMode bool
}

// OverlapError is the refusal of CheckOverlap: CIDR of Cluster overlaps OtherCIDR of
// OtherCluster (Kind and OtherKind are "pod CIDR" or "service CIDR"). OtherCluster is Cluster
// itself when a cluster's own pod and service CIDRs overlap.
type OverlapError struct {
	Cluster      string
	Kind         string
	CIDR         netip.Prefix
	OtherCluster string
	OtherKind    string
	OtherCIDR    netip.Prefix
	// GatewayMode and OtherGatewayMode say which of the two clusters is in gateway mode (the
	// refusal says which one is not: overlaps are admitted only between two gateway-mode
	// clusters).
	GatewayMode, OtherGatewayMode bool
}

func (e *OverlapError) Error() string {
	if e.OtherCluster == e.Cluster {
		return fmt.Sprintf("cluster %q: %s %s overlaps its own %s %s", e.Cluster, e.Kind, e.CIDR, e.OtherKind, e.OtherCIDR)
	}
	var direct []string
	if !e.GatewayMode {
		direct = append(direct, fmt.Sprintf("%q", e.Cluster))
	}
	if !e.OtherGatewayMode {
		direct = append(direct, fmt.Sprintf("%q", e.OtherCluster))
	}
	return fmt.Sprintf("%s %s of cluster %q overlaps %s %s of cluster %q; overlapping CIDRs are admitted only between two gateway-mode clusters, and %s %s not (join both with `cablectl cluster join-token --gateway-mode`, or choose disjoint CIDRs)",
		e.Kind, e.CIDR, e.Cluster, e.OtherKind, e.OtherCIDR, e.OtherCluster, strings.Join(direct, " and "), isOrAre(len(direct)))
}

func isOrAre(n int) string {
	if n == 1 {
		return "is"
	}
	return "are"
}

const (
	podCIDR     = "pod CIDR"
	serviceCIDR = "service CIDR"
)

// CheckOverlap refuses a new cluster whose pod or service CIDRs overlap any CIDR of an existing
// cluster (routes to each cluster's CIDRs go over that cluster's cable, so overlapping
// ranges would be unroutable), unless both clusters are in gateway mode (their cables carry only
// mesh addresses), or whose own pod and service CIDRs overlap each other. The error is
// an *OverlapError naming both clusters and both CIDRs.
func CheckOverlap(c ClusterCIDRs, existing []ClusterCIDRs) error {
	for _, p := range c.PodCIDRs {
		for _, s := range c.ServiceCIDRs {
			if p.Overlaps(s) {
				return &OverlapError{Cluster: c.Name, Kind: podCIDR, CIDR: p, OtherCluster: c.Name, OtherKind: serviceCIDR, OtherCIDR: s}
			}
		}
	}
	for _, e := range existing {
		if e.Name == c.Name || (c.GatewayMode && e.GatewayMode) {
			continue
		}
		for _, m := range kinds(c) {
			for _, p := range m.ps {
				for _, t := range kinds(e) {
					for _, q := range t.ps {
						if p.Overlaps(q) {
							return &OverlapError{Cluster: c.Name, Kind: m.kind, CIDR: p, OtherCluster: e.Name, OtherKind: t.kind, OtherCIDR: q,
								GatewayMode: c.GatewayMode, OtherGatewayMode: e.GatewayMode}
						}
					}
				}
			}
		}
	}
	return nil
}

type cidrsOfKind struct {
	kind string
	ps   []netip.Prefix
}

func kinds(c ClusterCIDRs) []cidrsOfKind {
	return []cidrsOfKind{{podCIDR, c.PodCIDRs}, {serviceCIDR, c.ServiceCIDRs}}
}

// ErrMeshFull is the refusal of AllocateID when every cluster ID is in use.
var ErrMeshFull = errors.New("mesh is full")

// AllocateID returns the lowest free cluster ID in MinClusterID..MaxClusterID, or an error
// wrapping ErrMeshFull.
func AllocateID(used map[uint32]bool) (uint32, error) {
	for id := uint32(MinClusterID); id <= MaxClusterID; id++ {
		if !used[id] {
			return id, nil
		}
	}
	return 0, fmt.Errorf("%w: all %d cluster IDs (%d..%d) are in use; remove a cluster first", ErrMeshFull, MaxClusterID-MinClusterID+1, MinClusterID, MaxClusterID)
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
