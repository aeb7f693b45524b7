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

// reserved are ranges no cluster's pod or service CIDR may touch: traffic to them never goes
// over a cable, and routing them over one would take the node's own addresses or its default
// route away.
var reserved = []struct {
	p    netip.Prefix
	what string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), "the unspecified ('this network') range 0.0.0.0/8"},
	{netip.MustParsePrefix("127.0.0.0/8"), "the loopback range 127.0.0.0/8"},
	{netip.MustParsePrefix("169.254.0.0/16"), "the link-local range 169.254.0.0/16"},
	{netip.MustParsePrefix("224.0.0.0/4"), "the multicast range 224.0.0.0/4"},
	{netip.MustParsePrefix("255.255.255.255/32"), "the broadcast address 255.255.255.255"},
	{netip.MustParsePrefix("::/128"), "the unspecified address ::"},
	{netip.MustParsePrefix("::1/128"), "the loopback address ::1"},
	{netip.MustParsePrefix("fe80::/10"), "the link-local range fe80::/10"},
	{netip.MustParsePrefix("ff00::/8"), "the multicast range ff00::/8"},
}

// CheckClusterCIDR refuses, as a pod or service CIDR given for field, a default route (/0) and
// a prefix that overlaps the loopback, link-local, multicast or unspecified ranges.
func CheckClusterCIDR(field string, p netip.Prefix) error {
	if p.Bits() == 0 {
		return fmt.Errorf("%s %s is a default route (every address): a cluster's CIDR must be its own network, never the whole address space", field, p)
	}
	for _, r := range reserved {
		if r.p.Overlaps(p) {
			return fmt.Errorf("%s %s overlaps %s, which no cluster CIDR may cover", field, p, r.what)
		}
	}
	return nil
}
