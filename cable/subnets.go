package cable

import (
	"fmt"
	"net/netip"
	"slices"
)

// NormalizeSubnets masks, unmaps, sorts and de-duplicates prefixes, rejecting invalid ones: the
// form every driver compares, stores and configures subnets in.
func NormalizeSubnets(in []netip.Prefix) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(in))
	for _, p := range in {
		if !p.IsValid() {
			return nil, fmt.Errorf("subnet %q is not a valid CIDR", p)
		}
		out = append(out, netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked())
	}
	slices.SortFunc(out, ComparePrefix)
	return slices.Compact(out), nil
}

// ComparePrefix orders prefixes by address, then length.
func ComparePrefix(a, b netip.Prefix) int {
	if c := a.Addr().Compare(b.Addr()); c != 0 {
		return c
	}
	return a.Bits() - b.Bits()
}

// Overlap returns the first prefix of a (in order) that overlaps a prefix of b, and that prefix
// of b.
func Overlap(a, b []netip.Prefix) (ours, theirs netip.Prefix, found bool) {
	for _, x := range a {
		for _, y := range b {
			if x.Overlaps(y) {
				return x, y, true
			}
		}
	}
	return netip.Prefix{}, netip.Prefix{}, false
}

// CheckOverlap refuses subnets for cluster when one overlaps a subnet of another cluster in
// others (cluster -> its subnets; cluster's own entry, its old subnets, is skipped). Two clusters
// sharing a subnet would have one's traffic silently carried to the other, whichever connected
// last. Clusters are looked at in name order, so the error is deterministic.
func CheckOverlap(cluster string, subnets []netip.Prefix, others map[string][]netip.Prefix) error {
	names := make([]string, 0, len(others))
	for n := range others {
		if n != cluster {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	for _, other := range names {
		if ours, theirs, found := Overlap(subnets, others[other]); found {
			return fmt.Errorf("subnet %s overlaps %s of cluster %s", ours, theirs, other)
		}
	}
	return nil
}
