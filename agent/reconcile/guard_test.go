package reconcile

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// TestDesiredNeverRoutesWhatTheNodeMustReach: a remote subnet that covers the
// broker, this node's underlay network or advertise address, or any gateway's address, is left
// out of its pair (the pair's other subnets are still routed) with a partial problem saying why;
// a pair left with no subnet is not connected.
func TestDesiredNeverRoutesWhatTheNodeMustReach(t *testing.T) {
	guard := Guard{Protected: []Protected{
		ProtectAddr(netip.MustParseAddr("172.31.0.1"), "the broker's address 172.31.0.1"),
		ProtectAddr(netip.MustParseAddr("172.31.0.11"), "this node's advertise address 172.31.0.11"),
		{Prefix: netip.MustParsePrefix("172.31.0.0/24"), What: "this node's underlay network 172.31.0.0/24"},
	}}
	eps := []*apiv1.Endpoint{ep("east", "e1", "172.31.0.11", "KE"), ep("west", "w1", "172.31.0.12", "KW")}
	withPublic := ep("north", "n1", "192.0.2.13", "KN")
	withPublic.PublicIp = "198.51.100.13"
	tests := []struct {
		name        string
		cidrs       []string
		guard       Guard
		wantSubnets []string // nil: the pair is not connected
		wantWhy     []string // a word of each problem, in order
	}{
		{"subnets clear of everything are all routed", []string{"10.2.0.0/16", "10.96.2.0/24"}, guard, []string{"10.2.0.0/16", "10.96.2.0/24"}, nil},
		{"a subnet covering the broker's address is left out, the others stay",
			[]string{"10.2.0.0/16", "172.16.0.0/12"}, guard, []string{"10.2.0.0/16"}, []string{"172.16.0.0/12 is not routed over the cable: it covers the broker's address 172.31.0.1"}},
		{"a subnet inside the underlay network is left out though it covers no address in use",
			[]string{"10.2.0.0/16", "172.31.0.128/25"}, guard, []string{"10.2.0.0/16"}, []string{"172.31.0.128/25 is not routed over the cable: it overlaps this node's underlay network 172.31.0.0/24"}},
		{"a subnet equal to the underlay network names the broker first",
			[]string{"172.31.0.0/24", "10.2.0.0/16"}, guard, []string{"10.2.0.0/16"}, []string{"covers the broker's address 172.31.0.1"}},
		{"the advertise address alone is protected",
			[]string{"10.2.0.0/16", "172.31.0.11/32"}, guard, []string{"10.2.0.0/16"}, []string{"covers this node's advertise address 172.31.0.11"}},
		{"a remote gateway's address is protected without a guard",
			[]string{"10.2.0.0/16", "172.31.0.12/31"}, Guard{}, []string{"10.2.0.0/16"}, []string{"covers the address 172.31.0.12 of gateway west/w1"}},
		{"this node's own gateway address is protected without a guard",
			[]string{"10.2.0.0/16", "172.31.0.8/29"}, Guard{}, []string{"10.2.0.0/16"}, []string{"covers the address 172.31.0.11 of gateway east/e1"}},
		{"a gateway's public address is protected",
			[]string{"10.2.0.0/16", "198.51.100.0/24"}, Guard{}, []string{"10.2.0.0/16"}, []string{"covers the address 198.51.100.13 of gateway north/n1"}},
		{"a loopback or link-local subnet is never routed",
			[]string{"10.2.0.0/16", "127.0.0.0/8", "169.254.0.0/16"}, Guard{}, []string{"10.2.0.0/16"}, []string{"loopback", "link-local"}},
		{"a default route is never routed", []string{"10.2.0.0/16", "0.0.0.0/0"}, guard, []string{"10.2.0.0/16"}, []string{"broker's address"}},
		{"a pair left with no subnet is not connected",
			[]string{"172.31.0.0/16"}, guard, nil, []string{"not connected: no subnet left to route (subnet 172.31.0.0/16 is not routed over the cable: it covers the broker's address"}},
		{"IPv6 subnets are judged against IPv6 addresses only",
			[]string{"fd00:2::/48", "10.2.0.0/16"}, guard, []string{"fd00:2::/48", "10.2.0.0/16"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := state([]*apiv1.Cluster{cl("east", 1, "10.1.0.0/16"), {Name: "west", Id: 2, PodCidrs: tt.cidrs}}, append(slices.Clone(eps), withPublic)...)
			wants, problems, _ := Desired(st, "east", nil, Drivers{"wireguard": nil}, tt.guard)
			var got []string
			found := false
			for _, w := range wants {
				if w.Remote.Cluster != "west" {
					continue
				}
				found = true
				for _, p := range w.Remote.Subnets {
					got = append(got, p.String())
				}
			}
			if tt.wantSubnets == nil && found {
				t.Errorf("west is connected with %v, want not connected", got)
			}
			if tt.wantSubnets != nil && !slices.Equal(got, tt.wantSubnets) {
				t.Errorf("west subnets = %v, want %v", got, tt.wantSubnets)
			}
			var west []Problem
			for _, p := range problems {
				if p.Cluster == "west" {
					west = append(west, p)
				}
			}
			if len(west) != len(tt.wantWhy) {
				t.Fatalf("problems of west = %+v, want %d", west, len(tt.wantWhy))
			}
			for i, p := range west {
				if !strings.Contains(p.Message, tt.wantWhy[i]) {
					t.Errorf("problem %d = %q, want it to say %q", i, p.Message, tt.wantWhy[i])
				}
				if p.Partial != (tt.wantSubnets != nil) {
					t.Errorf("problem %d partial = %v, want %v (the pair connects: %v)", i, p.Partial, tt.wantSubnets != nil, tt.wantSubnets != nil)
				}
			}
		})
	}
}
