package route

import (
	"net"
	"net/netip"
	"slices"
	"testing"
)

func pfx(s ...string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(s))
	for _, x := range s {
		out = append(out, netip.MustParsePrefix(x))
	}
	return out
}

func TestPlanRoutes(t *testing.T) {
	src := netip.MustParseAddr("10.1.0.1")
	gw := netip.MustParseAddr("240.0.0.2")
	r := func(dst string, mtu int) Spec {
		return Spec{Dst: netip.MustParsePrefix(dst), Src: src, MTU: mtu}
	}
	via := func(dst string, mtu, mss int) Spec {
		return Spec{Dst: netip.MustParsePrefix(dst), Gw: gw, Src: src, MTU: mtu, AdvMSS: mss}
	}
	all := func(netip.Prefix) bool { return true }
	none := func(netip.Prefix) bool { return false }
	tests := []struct {
		name        string
		existing    []Spec
		want        []Spec
		owned       func(netip.Prefix) bool
		wantReplace []Spec
		wantDelete  []Spec
	}{
		{name: "routes already in place need nothing", existing: []Spec{r("10.2.0.0/16", 1420)}, want: []Spec{r("10.2.0.0/16", 1420)}, owned: all},
		{name: "a missing route is added", want: []Spec{r("10.2.0.0/16", 1420)}, owned: all, wantReplace: []Spec{r("10.2.0.0/16", 1420)}},
		{name: "a route with another MTU is replaced", existing: []Spec{r("10.2.0.0/16", 1500)}, want: []Spec{r("10.2.0.0/16", 1420)}, owned: all,
			wantReplace: []Spec{r("10.2.0.0/16", 1420)}},
		{name: "a route with another source is replaced", existing: []Spec{{Dst: netip.MustParsePrefix("10.2.0.0/16"), MTU: 1420}}, want: []Spec{r("10.2.0.0/16", 1420)}, owned: all,
			wantReplace: []Spec{r("10.2.0.0/16", 1420)}},
		{name: "a route without the MSS clamp is replaced", existing: []Spec{via("10.2.0.0/16", 1450, 0)}, want: []Spec{via("10.2.0.0/16", 1450, 1410)}, owned: all,
			wantReplace: []Spec{via("10.2.0.0/16", 1450, 1410)}},
		{name: "a route via another gateway is replaced", existing: []Spec{r("10.2.0.0/16", 1450)}, want: []Spec{via("10.2.0.0/16", 1450, 1410)}, owned: all,
			wantReplace: []Spec{via("10.2.0.0/16", 1450, 1410)}},
		{name: "a gateway route already in place needs nothing", existing: []Spec{via("10.2.0.0/16", 1450, 1410)}, want: []Spec{via("10.2.0.0/16", 1450, 1410)}, owned: all},
		{name: "an owned unwanted route is deleted", existing: []Spec{r("10.3.0.0/16", 1420)}, owned: all, wantDelete: []Spec{r("10.3.0.0/16", 1420)}},
		{name: "another cluster's route is left alone", existing: []Spec{r("10.3.0.0/16", 1420)}, owned: none},
		{name: "changes come sorted by destination", want: []Spec{r("10.9.0.0/16", 1420), r("10.2.0.0/16", 1420)}, owned: all,
			wantReplace: []Spec{r("10.2.0.0/16", 1420), r("10.9.0.0/16", 1420)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := PlanRoutes(tt.existing, tt.want, tt.owned)
			if !slices.Equal(got.Replace, tt.wantReplace) || !slices.Equal(got.Delete, tt.wantDelete) {
				t.Errorf("plan = %+v, want replace %v delete %v", got, tt.wantReplace, tt.wantDelete)
			}
			if got.Empty() != (len(tt.wantReplace)+len(tt.wantDelete) == 0) {
				t.Errorf("Empty() = %v for %+v", got.Empty(), got)
			}
		})
	}
}

func TestWantedGivesEachFamilyItsSource(t *testing.T) {
	s4, s6 := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd00:1::1")
	got := Wanted(pfx("10.2.0.0/16", "fd00:2::/64"), 1450, s4, s6)
	want := []Spec{{Dst: pfx("10.2.0.0/16")[0], Src: s4, MTU: 1450}, {Dst: pfx("fd00:2::/64")[0], Src: s6, MTU: 1450}}
	if !slices.Equal(got, want) {
		t.Errorf("Wanted = %+v, want %+v", got, want)
	}
}

func TestPickSource(t *testing.T) {
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.250.0.1"),
		netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd00:1::1"), netip.MustParseAddr("fe80::1")}
	tests := []struct {
		name  string
		local []netip.Prefix
		v4    bool
		want  string
	}{
		{"the node's address inside its pod subnet is chosen", pfx("10.1.0.0/16"), true, "10.1.0.1"},
		{"no address inside the subnets gives none", pfx("10.9.0.0/16"), true, "invalid IP"},
		{"an IPv6 subnet gives an IPv6 source", pfx("10.1.0.0/16", "fd00:1::/64"), false, "fd00:1::1"},
		{"loopback is never chosen", pfx("127.0.0.0/8"), true, "invalid IP"},
		{"link-local is never chosen", pfx("fe80::/10"), false, "invalid IP"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := PickSource(addrs, tt.local, tt.v4); got.String() != tt.want {
				t.Errorf("PickSource = %s, want %s", got, tt.want)
			}
		})
	}
}

func TestPrefixFromIPNetUnmapsIPv4(t *testing.T) {
	n := net.IPNet{IP: net.ParseIP("10.2.3.4"), Mask: net.CIDRMask(112, 128)} // 16-byte form of a /16
	got, err := PrefixFromIPNet(n)
	if err != nil {
		t.Fatal(err)
	}
	if got != netip.MustParsePrefix("10.2.0.0/16") {
		t.Errorf("PrefixFromIPNet = %s, want 10.2.0.0/16", got)
	}
	if back := IPNetFromPrefix(got); back.String() != "10.2.0.0/16" {
		t.Errorf("IPNetFromPrefix = %s", back.String())
	}
}
