// Package registry holds the broker's pure rules for clusters and endpoints: name, CIDR and label
// validation, cluster ID allocation and the CIDR overlap check of seed 001. Nothing here does I/O,
// so every rule is tested with tables and fuzzed; the broker applies the results to its store.
package registry

import (
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strings"
)

const (
	// MinClusterID and MaxClusterID bound the IDs the broker allocates (seed 001: 1..255).
	MinClusterID = 1
	MaxClusterID = 255
)

var (
	dnsLabelRE     = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	labelNameRE    = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomainRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// ValidateClusterName checks that name is a DNS label (RFC 1123, at most 63 characters), as
// cluster names become parts of DNS names and interface names.
func ValidateClusterName(name string) error {
	return validateDNSLabel("cluster name", name)
}

// ValidateNodeName checks a node name: a DNS subdomain (as Kubernetes node names) of at most 253
// characters.
func ValidateNodeName(name string) error {
	if name == "" {
		return fmt.Errorf("node name is empty")
	}
	if len(name) > 253 {
		return fmt.Errorf("node name %q is %d characters long, at most 253 allowed", name, len(name))
	}
	if !dnsSubdomainRE.MatchString(name) {
		return fmt.Errorf("node name %q is not a DNS subdomain (lower-case letters, digits, '-' and '.', starting and ending with a letter or digit)", name)
	}
	return nil
}

func validateDNSLabel(field, v string) error {
	if v == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if len(v) > 63 {
		return fmt.Errorf("%s %q is %d characters long, at most 63 allowed", field, v, len(v))
	}
	if !dnsLabelRE.MatchString(v) {
		return fmt.Errorf("%s %q is not a DNS label (lower-case letters, digits and '-', starting and ending with a letter or digit)", field, v)
	}
	return nil
}

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
