package mcs

import (
	"fmt"
	"net/netip"
	"strings"
)

// DefaultVIPRange is the range clusterset VIPs come from unless `cable-broker
// --service-vip-range` says otherwise: 241.0.0.0/8 lies in the reserved 240.0.0.0/4, which no
// host routes, so a VIP can never shadow a real address (Kuma's VIPs use 240.0.0.0/4 alike).
const DefaultVIPRange = "241.0.0.0/8"

// ParseVIPRanges parses --service-vip-range: one CIDR, or an IPv4 and an IPv6 CIDR separated by a
// comma (a dual-stack service then gets one VIP of each).
func ParseVIPRanges(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		p, err := netip.ParsePrefix(part)
		if err != nil {
			return nil, fmt.Errorf("service VIP range %q is not a CIDR: %v", part, err)
		}
		if p != p.Masked() {
			return nil, fmt.Errorf("service VIP range %q has host bits set (did you mean %s?)", part, p.Masked())
		}
		if hostBits(p) < 2 {
			return nil, fmt.Errorf("service VIP range %s is too small (at least a /%d)", p, p.Addr().BitLen()-2)
		}
		for _, q := range out {
			if q.Addr().Is4() == p.Addr().Is4() {
				return nil, fmt.Errorf("service VIP range %q: give at most one IPv4 and one IPv6 CIDR", s)
			}
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("service VIP range %q is empty", s)
	}
	return out, nil
}

func hostBits(p netip.Prefix) int { return p.Addr().BitLen() - p.Bits() }

// AllocateVIP returns the lowest address of r that is not in used, skipping the network address
// (and, for IPv4, the broadcast address), or an error saying the range is exhausted. It scans at
// most limit addresses past the used ones, so a huge IPv6 range costs no more than a small one.
func AllocateVIP(r netip.Prefix, used map[netip.Addr]bool) (netip.Addr, error) {
	a := r.Addr().Next() // skip the network address
	for i := 0; i <= len(used); i++ {
		if !r.Contains(a) || (r.Addr().Is4() && isBroadcast(a, r)) {
			break
		}
		if !used[a] {
			return a, nil
		}
		a = a.Next()
	}
	return netip.Addr{}, fmt.Errorf("service VIP range %s is exhausted (%d VIPs in use): widen --service-vip-range", r, len(used))
}

func isBroadcast(a netip.Addr, r netip.Prefix) bool {
	return !r.Contains(a.Next()) || !a.Next().IsValid()
}
