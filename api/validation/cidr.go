package validation

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"
)

// ParseCIDRs parses CIDRs given for field (e.g. "pod CIDR"). Each must be a network address
// (no host bits set), and the list may not repeat or overlap itself. Values may be comma lists,
// so a repeated flag and "a,b" mean the same.
func ParseCIDRs(field string, values []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range values {
		for _, s := range strings.Split(v, ",") {
			s = strings.TrimSpace(s)
			if s == "" {
				continue
			}
			p, err := ParseCIDR(field, s)
			if err != nil {
				return nil, err
			}
			for _, q := range out {
				if q.Overlaps(p) {
					return nil, fmt.Errorf("%s %s overlaps %s %s given in the same request", field, p, field, q)
				}
			}
			out = append(out, p)
		}
	}
	return out, nil
}

// ParseCIDR parses one CIDR, refusing host bits so that stored values are canonical.
func ParseCIDR(field, s string) (netip.Prefix, error) {
	p, err := netip.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%s %q is not a CIDR (want e.g. 10.1.0.0/16): %v", field, s, err)
	}
	if p.Addr().Zone() != "" {
		return netip.Prefix{}, fmt.Errorf("%s %q has a zone, which a CIDR may not have", field, s)
	}
	if p.Addr().Is4In6() {
		return netip.Prefix{}, fmt.Errorf("%s %q is an IPv4-mapped IPv6 prefix; write it as IPv4", field, s)
	}
	if m := p.Masked(); m != p {
		return netip.Prefix{}, fmt.Errorf("%s %q has host bits set (did you mean %s?)", field, s, m)
	}
	return p, nil
}

// Strings formats prefixes for storage.
func Strings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// SameCIDRs reports whether a and b hold the same set of prefixes, in any order.
func SameCIDRs(a, b []netip.Prefix) bool {
	if len(a) != len(b) {
		return false
	}
	as, bs := Strings(a), Strings(b)
	sort.Strings(as)
	sort.Strings(bs)
	for i := range as {
		if as[i] != bs[i] {
			return false
		}
	}
	return true
}
