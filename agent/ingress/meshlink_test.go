package ingress

import (
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/internal/scratchns"
)

// meshAddrs lists the IPv4 addresses on cbl-mesh0 and whether it is up.
func meshAddrs(t *testing.T) ([]string, bool) {
	t.Helper()
	link, err := netlink.LinkByName(MeshLinkName)
	if err != nil {
		t.Fatalf("look up %s: %v", MeshLinkName, err)
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		out = append(out, a.IPNet.String())
	}
	return out, link.Attrs().Flags&net.FlagUp != 0
}

func TestMeshLink(t *testing.T) {
	scratchns.Enter(t)
	a, b := netip.MustParseAddr("242.0.0.7"), netip.MustParseAddr("242.0.0.8")

	if err := EnsureMeshLink(a); err != nil {
		t.Fatalf("EnsureMeshLink(%s): %v", a, err)
	}
	if got, up := meshAddrs(t); len(got) != 1 || got[0] != "242.0.0.7/32" || !up {
		t.Fatalf("after Ensure: addrs %v up %v, want [242.0.0.7/32] up", got, up)
	}
	if err := EnsureMeshLink(a); err != nil {
		t.Fatalf("second EnsureMeshLink: %v", err)
	}
	if got, _ := meshAddrs(t); len(got) != 1 {
		t.Fatalf("idempotent Ensure left %v", got)
	}
	// A new allocation replaces the stale address, and a stray one goes too.
	link, _ := netlink.LinkByName(MeshLinkName)
	stray, _ := netlink.ParseAddr("10.9.9.9/24")
	if err := netlink.AddrAdd(link, stray); err != nil {
		t.Fatal(err)
	}
	if err := EnsureMeshLink(b); err != nil {
		t.Fatalf("EnsureMeshLink(%s): %v", b, err)
	}
	if got, _ := meshAddrs(t); len(got) != 1 || got[0] != "242.0.0.8/32" {
		t.Fatalf("after re-Ensure: %v, want [242.0.0.8/32]", got)
	}
	// The address is local: the kernel answers for it.
	routes, err := netlink.RouteGet(b.AsSlice())
	if err != nil || len(routes) == 0 || routes[0].Type != 2 /* RTN_LOCAL */ {
		t.Errorf("route to %s = %+v, %v; want a local route", b, routes, err)
	}

	if err := EnsureMeshLink(netip.MustParseAddr("fd00::1")); err == nil || !strings.Contains(err.Error(), "fd00::1") {
		t.Errorf("IPv6 mesh address: error %v, want one naming it", err)
	}
	if err := EnsureMeshLink(netip.Addr{}); err == nil {
		t.Error("invalid mesh address accepted")
	}

	if err := RemoveMeshLink(); err != nil {
		t.Fatalf("RemoveMeshLink: %v", err)
	}
	if _, err := netlink.LinkByName(MeshLinkName); err == nil {
		t.Error("cbl-mesh0 still present after RemoveMeshLink")
	}
	if err := RemoveMeshLink(); err != nil {
		t.Errorf("second RemoveMeshLink: %v", err)
	}
}

func TestMeshLinkRefusesForeignLink(t *testing.T) {
	scratchns.Enter(t)
	attrs := netlink.NewLinkAttrs()
	attrs.Name = MeshLinkName
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: attrs, PeerName: "cbl-mesh0p"}); err != nil {
		t.Fatalf("create veth: %v", err)
	}
	if err := EnsureMeshLink(netip.MustParseAddr("242.0.0.7")); err == nil || !strings.Contains(err.Error(), `type "veth"`) {
		t.Errorf("EnsureMeshLink over a veth: %v, want an error naming the type", err)
	}
	if err := RemoveMeshLink(); err == nil {
		t.Error("RemoveMeshLink deleted a veth it did not make")
	}
}
