// Package meshaddr holds the broker's pure rules for mesh addresses: the range they come from
// (cable-broker --mesh-address-range) and how one is picked. A gateway's mesh address is the one
// address a gateway-mode pair's cable carries for it (the agent puts it on cbl-mesh0), so it must
// be unique in the mesh and never collide with a cluster's pod or service CIDRs or the clusterset
// VIPs. Nothing here does I/O; the broker allocates inside a store transaction.
package meshaddr

import (
	"fmt"
	"net/netip"
)

// DefaultRange is the mesh address range unless --mesh-address-range says otherwise. It lies in
// the reserved 240.0.0.0/4, which no host routes (like the default clusterset VIP range
// 241.0.0.0/8), so a mesh address never shadows a real one.
const DefaultRange = "242.0.0.0/16"

// Bounds of a range: at least a /30 (two usable addresses), at most a /8 (a mesh has at most 255
// clusters; a larger range would only hide a typo such as /1).
const (
	MinBits = 8
	MaxBits = 30
)

// ParseRange parses and checks a mesh address range: an IPv4 CIDR without host bits, /8 to /30.
// The error names the value.
func ParseRange(s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("mesh address range %q is not a CIDR: %v", s, err)
	}
	if !p.Addr().Is4() {
		return netip.Prefix{}, fmt.Errorf("mesh address range %q is not IPv4 (mesh addresses are IPv4 only)", s)
	}
	if p != p.Masked() {
		return netip.Prefix{}, fmt.Errorf("mesh address range %q has host bits set (did you mean %s?)", s, p.Masked())
	}
	if p.Bits() < MinBits || p.Bits() > MaxBits {
		return netip.Prefix{}, fmt.Errorf("mesh address range %q: the prefix length must be /%d to /%d", s, MinBits, MaxBits)
	}
	return p, nil
}

// CheckDisjoint refuses a mesh address range that overlaps one of the clusterset VIP ranges: a
// mesh address must never be a service's VIP.
func CheckDisjoint(r netip.Prefix, vipRanges []netip.Prefix) error {
	for _, v := range vipRanges {
		if r.Overlaps(v) {
			return fmt.Errorf("mesh address range %s overlaps the service VIP range %s", r, v)
		}
	}
	return nil
}

// Usable reports whether a lies in r and is neither its network nor its broadcast address.
func Usable(r netip.Prefix, a netip.Addr) bool {
	return a.Is4() && r.Contains(a) && a != r.Addr() && r.Contains(a.Next())
}

// Allocate returns the lowest usable address of r that is not in used, or an error naming r when
// every one is taken. It scans at most len(used)+1 candidates.
func Allocate(r netip.Prefix, used map[netip.Addr]bool) (netip.Addr, error) {
	a := r.Addr().Next() // the network address is never handed out
	for i := 0; i <= len(used); i++ {
		if !Usable(r, a) {
			break
		}
		if !used[a] {
			return a, nil
		}
		a = a.Next()
	}
	return netip.Addr{}, fmt.Errorf("mesh address range %s is exhausted (%d addresses in use): widen --mesh-address-range", r, len(used))
}

// Size is how many usable addresses r has.
func Size(r netip.Prefix) int {
	return 1<<(r.Addr().BitLen()-r.Bits()) - 2
}
