package registry

import (
	"net/netip"
	"testing"

	"github.com/cablemesh/cablemesh/api/validation"
)

// FuzzParseCIDRs: whatever is accepted is canonical (re-parses to itself, no host bits) and free of
// overlaps; nothing panics.
func FuzzParseCIDRs(f *testing.F) {
	for _, s := range []string{"10.1.0.0/16", "10.1.0.0/16,10.2.0.0/16", "fd00::/64", "10.1.2.3/16", "::ffff:1.2.3.4/128", "1.2.3.4/33", "fe80::%eth0/64", ",,"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		ps, err := validation.ParseCIDRs("pod CIDR", []string{in})
		if err != nil {
			return
		}
		for i, p := range ps {
			if p.Masked() != p {
				t.Fatalf("accepted %s with host bits", p)
			}
			q, err := netip.ParsePrefix(p.String())
			if err != nil || q != p {
				t.Fatalf("accepted %s does not round-trip: %v %v", p, q, err)
			}
			for _, o := range ps[i+1:] {
				if p.Overlaps(o) {
					t.Fatalf("accepted overlapping %s and %s", p, o)
				}
			}
		}
		if err := CheckOverlap(ClusterCIDRs{Name: "a", PodCIDRs: ps}, []ClusterCIDRs{{Name: "b", PodCIDRs: ps}}); len(ps) > 0 && err == nil {
			t.Fatalf("CIDRs %v did not overlap themselves", ps)
		}
		// Gateway mode admits the overlap only when both sides have it.
		if err := CheckOverlap(ClusterCIDRs{Name: "a", PodCIDRs: ps, GatewayMode: true}, []ClusterCIDRs{{Name: "b", PodCIDRs: ps, GatewayMode: true}}); err != nil {
			t.Fatalf("two gateway-mode clusters on %v refused: %v", ps, err)
		}
		if err := CheckOverlap(ClusterCIDRs{Name: "a", PodCIDRs: ps, GatewayMode: true}, []ClusterCIDRs{{Name: "b", PodCIDRs: ps}}); len(ps) > 0 && err == nil {
			t.Fatalf("a gateway-mode and a direct cluster on %v admitted", ps)
		}
	})
}
