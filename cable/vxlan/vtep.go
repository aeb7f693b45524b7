package vxlan

import (
	"fmt"
	"net"
	"net/netip"
)

// VTEP addressing, in the manner of Submariner's vxlan cable: every node's VXLAN devices carry an
// inner "VTEP" address derived from the node's IPv4 underlay address a.b.c.d by replacing the
// first octet with 240: 240.b.c.d/8. Routes to a remote cluster go via the remote's VTEP address,
// which every node can compute from the address the remote publishes, so nothing extra needs to
// be exchanged through the broker.
//
// The price is that two nodes whose underlay addresses differ only in the first octet (10.1.2.3
// and 192.1.2.3) get the same VTEP address. Connect refuses such a remote (naming both addresses)
// instead of silently sending one node's traffic to the other. 240.0.0.0/4 is reserved
// (class E) and never routed on the Internet, so the inner addresses cannot shadow a real one;
// the clusterset VIPs use 241.0.0.0/8, so they do not collide either.
//
// VXLAN device MACs are random by default, so a node could not know a remote device's MAC in
// advance. We set every device's MAC from its VTEP address (VTEPMAC), which lets each node install
// a permanent neighbor entry and a unicast FDB entry for every remote without ARP.

// VTEPPrefix is the inner network of every VXLAN device.
var VTEPPrefix = netip.MustParsePrefix("240.0.0.0/8")

// VTEPAddr derives the VTEP address from an IPv4 underlay address: 240.b.c.d from a.b.c.d.
func VTEPAddr(underlay netip.Addr) (netip.Addr, error) {
	u := underlay.Unmap()
	if !u.Is4() {
		return netip.Addr{}, fmt.Errorf("underlay address %q is not IPv4: the vxlan cable derives its VTEP address from an IPv4 address", underlay)
	}
	b := u.As4()
	b[0] = 240
	v := netip.AddrFrom4(b)
	if b[1] == 0 && b[2] == 0 && b[3] == 0 || b[1] == 255 && b[2] == 255 && b[3] == 255 {
		return netip.Addr{}, fmt.Errorf("underlay address %s maps to VTEP address %s, the network or broadcast address of %s", u, v, VTEPPrefix)
	}
	return v, nil
}

// VTEPMAC is the MAC of a device whose VTEP address is vtep: 02:cb followed by the four bytes of
// the address. 0x02 makes it a locally administered unicast address; "cb" marks it as Cablemesh's.
func VTEPMAC(vtep netip.Addr) net.HardwareAddr {
	b := vtep.Unmap().As4()
	return net.HardwareAddr{0x02, 0xcb, b[0], b[1], b[2], b[3]}
}
