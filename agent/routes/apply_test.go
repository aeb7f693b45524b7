package routes

import (
	"io"
	"log/slog"
	"net"
	"net/netip"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/cable/route"
	"github.com/cablemesh/cablemesh/internal/scratchns"
)

func TestApplySetsKeepsAndRemovesOnlyItsRoutes(t *testing.T) {
	scratchns.Run(t, func() {
		la := netlink.NewLinkAttrs()
		la.Name = "cbta-v0"
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: la, PeerName: "cbta-v1"}); err != nil {
			t.Fatalf("veth: %v", err)
		}
		link, _ := netlink.LinkByName("cbta-v0")
		addr, _ := netlink.ParseAddr("192.168.251.1/24")
		if err := netlink.AddrAdd(link, addr); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(link); err != nil {
			t.Fatal(err)
		}
		peer, _ := netlink.LinkByName("cbta-v1")
		_ = netlink.LinkSetUp(peer)

		log := slog.New(slog.NewTextHandler(io.Discard, nil))
		gw := netip.MustParseAddr("192.168.251.2")
		want := []Route{{netip.MustParsePrefix("10.2.0.0/16"), gw}, {netip.MustParsePrefix("10.3.0.0/16"), gw}}
		if err := Apply(want, log); err != nil {
			t.Fatalf("Apply: %v", err)
		}
		owned := func() []netlink.Route {
			rs, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: route.Protocol}, netlink.RT_FILTER_PROTOCOL)
			if err != nil {
				t.Fatal(err)
			}
			return rs
		}
		if got := owned(); len(got) != 2 {
			t.Fatalf("owned routes after Apply = %v", got)
		}
		// A route the agent does not own must survive.
		_, foreign, _ := netlinkParseCIDR("10.9.0.0/16")
		if err := netlink.RouteAdd(&netlink.Route{Dst: foreign, Gw: gw.AsSlice()}); err != nil {
			t.Fatal(err)
		}
		// A driver's route (ours by protocol, but over its own link without a gateway) is not the
		// agent's to judge: it must survive too.
		_, driverDst, _ := netlinkParseCIDR("10.8.0.0/16")
		if err := netlink.RouteAdd(&netlink.Route{Dst: driverDst, LinkIndex: link.Attrs().Index, Scope: netlink.SCOPE_LINK, Protocol: route.Protocol}); err != nil {
			t.Fatal(err)
		}
		if err := Apply(want[:1], log); err != nil {
			t.Fatalf("second Apply: %v", err)
		}
		if got := owned(); len(got) != 2 || got[0].Dst.String() != "10.2.0.0/16" || got[1].Dst.String() != "10.8.0.0/16" {
			t.Fatalf("owned routes after shrinking = %v, want 10.2.0.0/16 and the driver's 10.8.0.0/16", got)
		}
		if err := Apply(nil, log); err != nil {
			t.Fatal(err)
		}
		if got := owned(); len(got) != 1 || got[0].Dst.String() != "10.8.0.0/16" {
			t.Fatalf("owned routes after cleanup = %v, want only the driver's", got)
		}
		all, _ := netlink.RouteList(nil, netlink.FAMILY_V4)
		kept := false
		for _, r := range all {
			if r.Dst != nil && r.Dst.String() == "10.9.0.0/16" {
				kept = true
			}
		}
		if !kept {
			t.Error("Apply removed a route it does not own")
		}
	})
}

func netlinkParseCIDR(s string) (netip.Prefix, *net.IPNet, error) {
	p := netip.MustParsePrefix(s)
	_, n, err := net.ParseCIDR(s)
	return p, n, err
}
