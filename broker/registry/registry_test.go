package registry

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func pfx(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func TestOverlapCheck(t *testing.T) {
	existing := []ClusterCIDRs{
		{Name: "east", PodCIDRs: pfx("10.1.0.0/16"), ServiceCIDRs: pfx("10.96.0.0/16")},
		{Name: "west", PodCIDRs: pfx("10.2.0.0/16")},
	}
	tests := []struct {
		name    string
		c       ClusterCIDRs
		wantErr string
	}{
		{"disjoint CIDRs are accepted", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.3.0.0/16"), ServiceCIDRs: pfx("10.97.0.0/16")}, ""},
		{"a pod CIDR inside another cluster's pod CIDR is refused, naming both", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.1.128.0/17")},
			`pod CIDR 10.1.128.0/17 of cluster "north" overlaps pod CIDR 10.1.0.0/16 of cluster "east"`},
		{"a pod CIDR containing another cluster's is refused", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.0.0.0/8")},
			`pod CIDR 10.0.0.0/8 of cluster "north" overlaps pod CIDR 10.1.0.0/16 of cluster "east"`},
		{"service CIDRs may not overlap either", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.3.0.0/16"), ServiceCIDRs: pfx("10.96.0.0/12")},
			`service CIDR 10.96.0.0/12 of cluster "north" overlaps service CIDR 10.96.0.0/16 of cluster "east"`},
		{"a pod CIDR may not overlap another cluster's service CIDR", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.96.1.0/24")},
			`pod CIDR 10.96.1.0/24 of cluster "north" overlaps service CIDR 10.96.0.0/16 of cluster "east"`},
		{"a cluster's own pod and service CIDRs may not overlap", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.3.0.0/16"), ServiceCIDRs: pfx("10.3.1.0/24")},
			`pod CIDR 10.3.0.0/16 overlaps its own service CIDR 10.3.1.0/24`},
		{"IPv4 and IPv6 never overlap", ClusterCIDRs{Name: "north", PodCIDRs: pfx("::/0")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, CheckOverlap(tt.c, existing), tt.wantErr)
		})
	}
}

func TestOverlapsAreAdmittedOnlyBetweenTwoGatewayModeClusters(t *testing.T) {
	existing := []ClusterCIDRs{
		{Name: "east", PodCIDRs: pfx("10.1.0.0/16"), ServiceCIDRs: pfx("10.96.0.0/16"), GatewayMode: true},
		{Name: "west", PodCIDRs: pfx("10.2.0.0/16")},
	}
	tests := []struct {
		name    string
		c       ClusterCIDRs
		wantErr string
	}{
		{"a gateway-mode cluster may take a gateway-mode cluster's pod and service CIDRs", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.1.0.0/16"), ServiceCIDRs: pfx("10.96.0.0/16"), GatewayMode: true}, ""},
		{"a direct cluster may not overlap a gateway-mode one, and the refusal names the direct one and the flag",
			ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.1.0.0/16")},
			`pod CIDR 10.1.0.0/16 of cluster "north" overlaps pod CIDR 10.1.0.0/16 of cluster "east"; overlapping CIDRs are admitted only between two gateway-mode clusters, and "north" is not (join both with ` + "`cablectl cluster join-token --gateway-mode`"},
		{"a gateway-mode cluster may not overlap a direct one", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.2.0.0/16"), GatewayMode: true},
			`pod CIDR 10.2.0.0/16 of cluster "north" overlaps pod CIDR 10.2.0.0/16 of cluster "west"; overlapping CIDRs are admitted only between two gateway-mode clusters, and "west" is not`},
		{"two direct clusters are both named", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.2.0.0/24")}, `and "north" and "west" are not`},
		{"a gateway-mode cluster's own pod and service CIDRs still may not overlap", ClusterCIDRs{Name: "north", PodCIDRs: pfx("10.3.0.0/16"), ServiceCIDRs: pfx("10.3.1.0/24"), GatewayMode: true},
			`pod CIDR 10.3.0.0/16 overlaps its own service CIDR 10.3.1.0/24`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkErr(t, CheckOverlap(tt.c, existing), tt.wantErr)
		})
	}
}

func TestIDAllocationTakesTheLowestFreeIDAndRefusesTheTwoHundredFiftySixth(t *testing.T) {
	used := map[uint32]bool{}
	for want := uint32(1); want <= 255; want++ {
		id, err := AllocateID(used)
		if err != nil || id != want {
			t.Fatalf("allocation %d: got %d, %v", want, id, err)
		}
		used[id] = true
	}
	if _, err := AllocateID(used); err == nil || !strings.HasPrefix(err.Error(), "mesh is full: ") {
		t.Fatalf("256th allocation: %v, want 'mesh is full: ...'", err)
	}
	delete(used, 17)
	delete(used, 200)
	if id, _ := AllocateID(used); id != 17 {
		t.Fatalf("after freeing 17 and 200 got %d, want 17", id)
	}
}

func TestSubnetWithinClusterCIDRs(t *testing.T) {
	in := pfx("10.1.0.0/16", "fd00::/64")
	tests := []struct {
		name string
		s    string
		want bool
	}{
		{"the CIDR itself", "10.1.0.0/16", true},
		{"a smaller piece", "10.1.5.0/24", true},
		{"a larger one", "10.0.0.0/8", false},
		{"another range", "10.2.0.0/24", false},
		{"an IPv6 piece", "fd00::/80", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Within(netip.MustParsePrefix(tt.s), in); got != tt.want {
				t.Fatalf("Within(%s) = %v, want %v", tt.s, got, tt.want)
			}
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

func TestRefusalsAreTyped(t *testing.T) {
	existing := []ClusterCIDRs{{Name: "east", PodCIDRs: pfx("10.1.0.0/16")}}
	var oe *OverlapError
	if err := CheckOverlap(ClusterCIDRs{Name: "west", PodCIDRs: pfx("10.1.2.0/24")}, existing); !errors.As(err, &oe) ||
		*oe != (OverlapError{Cluster: "west", Kind: "pod CIDR", CIDR: pfx("10.1.2.0/24")[0], OtherCluster: "east", OtherKind: "pod CIDR", OtherCIDR: pfx("10.1.0.0/16")[0]}) {
		t.Fatalf("overlap: %#v (%v), want an *OverlapError naming west's and east's pod CIDRs", oe, err)
	}
	used := map[uint32]bool{}
	for id := uint32(MinClusterID); id <= MaxClusterID; id++ {
		used[id] = true
	}
	if _, err := AllocateID(used); !errors.Is(err, ErrMeshFull) {
		t.Fatalf("full mesh: %v, want ErrMeshFull", err)
	}
}
