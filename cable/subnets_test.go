package cable

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func pfx(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(s))
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestNormalizeSubnets(t *testing.T) {
	got, err := NormalizeSubnets(pfx("10.2.0.0/16", "10.1.0.5/16", "10.2.0.0/16"))
	if err != nil {
		t.Fatal(err)
	}
	if want := pfx("10.1.0.0/16", "10.2.0.0/16"); !slices.Equal(got, want) {
		t.Errorf("NormalizeSubnets = %v, want masked, sorted, deduplicated %v", got, want)
	}
	if _, err := NormalizeSubnets([]netip.Prefix{{}}); err == nil || !strings.Contains(err.Error(), "is not a valid CIDR") {
		t.Errorf("an invalid prefix: err = %v", err)
	}
}

func TestCheckOverlap(t *testing.T) {
	others := map[string][]netip.Prefix{"b": pfx("10.2.0.0/16"), "c": pfx("10.3.0.0/16"), "a": pfx("10.3.0.0/24")}
	tests := []struct {
		name    string
		cluster string
		subnets []netip.Prefix
		want    string
	}{
		{"disjoint subnets are accepted", "d", pfx("10.4.0.0/16"), ""},
		{"a cluster overlapping its own old subnets is accepted", "b", pfx("10.2.0.0/24"), ""},
		{"an overlap names both subnets and the other cluster", "d", pfx("10.2.1.0/24"), "subnet 10.2.1.0/24 overlaps 10.2.0.0/16 of cluster b"},
		{"with several overlapping clusters the first by name is reported", "d", pfx("10.3.0.0/20"), "overlaps 10.3.0.0/24 of cluster a"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckOverlap(tt.cluster, tt.subnets, others)
			if (err == nil) != (tt.want == "") || err != nil && !strings.Contains(err.Error(), tt.want) {
				t.Errorf("CheckOverlap = %v, want %q", err, tt.want)
			}
		})
	}
	if ours, theirs, found := Overlap(pfx("10.9.0.0/16", "10.1.2.0/24"), pfx("10.1.0.0/16")); !found || ours != pfx("10.1.2.0/24")[0] || theirs != pfx("10.1.0.0/16")[0] {
		t.Errorf("Overlap = %s %s %v", ours, theirs, found)
	}
}

func TestSourceSubnetsPreferTheConnectionsOwn(t *testing.T) {
	node := LocalNode{LocalSubnets: []netip.Prefix{netip.MustParsePrefix("10.40.0.0/16")}}
	mesh := []netip.Prefix{netip.MustParsePrefix("242.0.0.1/32")}
	if got := (RemoteEndpoint{LocalSubnets: mesh}).SourceSubnets(node); len(got) != 1 || got[0] != mesh[0] {
		t.Errorf("with an override: %v, want %v", got, mesh)
	}
	if got := (RemoteEndpoint{}).SourceSubnets(node); len(got) != 1 || got[0] != node.LocalSubnets[0] {
		t.Errorf("without: %v, want the node's %v", got, node.LocalSubnets)
	}
}
