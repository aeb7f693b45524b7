package ipsec

import (
	"net/netip"
	"reflect"
	"testing"
)

func TestWantedTSAddresses(t *testing.T) {
	p := netip.MustParsePrefix
	a := netip.MustParseAddr
	tests := []struct {
		name    string
		subnets []netip.Prefix
		held    []netip.Addr
		want    []tsAddress
	}{
		{
			name:    "a service CIDR no node address lies in gets its last address; the pod CIDR cni0 covers gets none",
			subnets: []netip.Prefix{p("10.244.0.0/16"), p("10.96.0.0/12")},
			held:    []netip.Addr{a("172.18.0.2"), a("10.244.1.1")},
			want:    []tsAddress{{Subnet: p("10.96.0.0/12"), Addr: a("10.111.255.255")}},
		},
		{
			name:    "a gateway without a pod yet (no cni0 address) gets one in the pod CIDR too",
			subnets: []netip.Prefix{p("10.244.0.0/16"), p("10.96.0.0/12")},
			held:    []netip.Addr{a("172.18.0.2")},
			want: []tsAddress{
				{Subnet: p("10.96.0.0/12"), Addr: a("10.111.255.255")},
				{Subnet: p("10.244.0.0/16"), Addr: a("10.244.255.255")},
			},
		},
		{
			name:    "IPv6: the last address of the prefix",
			subnets: []netip.Prefix{p("fd00:10:96::/108")},
			want:    []tsAddress{{Subnet: p("fd00:10:96::/108"), Addr: a("fd00:10:96::f:ffff")}},
		},
		{
			name:    "a host prefix (a gateway-mode pair's mesh address) gets none",
			subnets: []netip.Prefix{p("100.64.0.7/32"), p("fd00::7/128")},
		},
		{
			name:    "a subnet named twice (two connections), or unmasked, gets one address",
			subnets: []netip.Prefix{p("10.96.0.0/16"), p("10.96.3.4/16")},
			want:    []tsAddress{{Subnet: p("10.96.0.0/16"), Addr: a("10.96.255.255")}},
		},
		{
			name:    "an IPv4-mapped node address covers an IPv4 subnet",
			subnets: []netip.Prefix{p("10.96.0.0/16")},
			held:    []netip.Addr{a("::ffff:10.96.0.1")},
		},
		{name: "no subnets, nothing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := wantedTSAddresses(tt.subnets, tt.held)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("wantedTSAddresses(%v, %v) = %v, want %v", tt.subnets, tt.held, got, tt.want)
			}
			for _, w := range got {
				if !w.Subnet.Contains(w.Addr) || w.Prefix().Bits() != w.Addr.BitLen() {
					t.Errorf("%v: address %s not a host prefix inside its subnet", w, w.Prefix())
				}
			}
		})
	}
}

func TestLastAddr(t *testing.T) {
	for in, want := range map[string]string{
		"10.96.0.0/12":   "10.111.255.255",
		"10.255.1.0/24":  "10.255.1.255",
		"192.168.0.0/31": "192.168.0.1",
		"0.0.0.0/0":      "255.255.255.255",
		"fd00::/64":      "fd00::ffff:ffff:ffff:ffff",
		"fd00::/127":     "fd00::1",
	} {
		if got := lastAddr(netip.MustParsePrefix(in)); got.String() != want {
			t.Errorf("lastAddr(%s) = %s, want %s", in, got, want)
		}
	}
}

// An address stays while its subnet is local, even once a node address lies in the subnet
// (charon's routes may carry it as their source); it goes with the subnet.
func TestKeptTSAddresses(t *testing.T) {
	subnets := []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("100.64.0.7/32")}
	kept := keptTSAddresses(subnets)
	want := map[netip.Addr]bool{netip.MustParseAddr("10.244.255.255"): true, netip.MustParseAddr("10.111.255.255"): true}
	if !reflect.DeepEqual(kept, want) {
		t.Errorf("keptTSAddresses(%v) = %v, want %v", subnets, kept, want)
	}
	if got := wantedTSAddresses(subnets, []netip.Addr{netip.MustParseAddr("10.244.1.1")}); len(got) != 1 || !kept[got[0].Addr] {
		t.Errorf("wanted %v: each wanted address must be kept", got)
	}
}
