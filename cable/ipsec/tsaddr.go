package ipsec

import (
	"net/netip"
	"slices"
)

// Traffic-selector addresses (kernel-libipsec only).
//
// charon's kernel-libipsec plugin installs a route for every outbound policy of a CHILD_SA
// (install_route in kernel_libipsec_ipsec.c, whatever install_routes says), and that route needs
// a source: charon asks for a local address inside the policy's local traffic selector
// (get_address_by_ts). With none it logs "error installing route with policy ... out" and "unable
// to install IPsec policies (SPD) in kernel" and refuses the CHILD_SA, and the IKE_SA stays up
// alone. On Kubernetes a gateway's local selectors are the cluster's pod and service CIDRs: no node
// holds an address in a service CIDR (kube-proxy in iptables mode), and a node without a pod yet
// has no address on cni0. So the driver gives the node one address in each local subnet it holds
// none in: the subnet's last address, which neither Kubernetes' service allocator nor host-local
// IPAM hands out (it is the broadcast address of the subnet, or of the last node's share of it).
//
// Kernel ESP (kernel-netlink) needs none of this: its install_route skips a policy whose local
// selector holds no local address (it installs no route for it and keeps the CHILD_SA), so the
// driver leaves the kernel datapath as it is.

// TSAddressDevice is the dummy device that holds the traffic-selector addresses. A device of its
// own rather than lo, ipsec0 or the underlay link: charon's get_address_by_ts finds an address on
// any device (loopback and down ones included), but ipsec0 goes whenever charon stops (and its
// addresses with it: a restart would lose them), addresses on lo or the underlay link are the
// node's own and mixing ours in makes cleaning up a guess, and a device of ours is removed whole
// by Cleanup. The addresses have site scope: charon takes no address of link or host scope
// (its kernel-netlink address list skips them: measured, a host-scope address left the CHILD_SA
// refused), and the kernel picks a site-scope address as the source of traffic to a global
// destination only where a route names it (charon's routes in table 220 do), so the node's
// source address selection for everything else stays as it was.
const TSAddressDevice = "cm-ipsec-ts"

// tsAddress is one address the driver holds for a local subnet.
type tsAddress struct {
	Subnet netip.Prefix
	Addr   netip.Addr
}

// Prefix is the address as it goes on TSAddressDevice: a /32 (IPv4) or /128 (IPv6).
func (a tsAddress) Prefix() netip.Prefix { return netip.PrefixFrom(a.Addr, a.Addr.BitLen()) }

// wantedTSAddresses decides the addresses the node must hold for the local subnets of its
// connections, given the addresses it already holds elsewhere (on every device but
// TSAddressDevice): the last address of every subnet none of them lies in, once per subnet,
// sorted. A host prefix (a /32 or /128, e.g. a gateway-mode pair's own mesh address) gets none:
// it is an address the agent itself owns and puts in place; claiming it here would hide its
// absence. Pure, so it is table-tested.
func wantedTSAddresses(subnets []netip.Prefix, held []netip.Addr) []tsAddress {
	var out []tsAddress
	seen := map[netip.Prefix]bool{}
	for _, s := range subnets {
		s = s.Masked()
		if !s.IsValid() || s.IsSingleIP() || seen[s] {
			continue
		}
		seen[s] = true
		if slices.ContainsFunc(held, func(a netip.Addr) bool { return s.Contains(a.Unmap()) }) {
			continue
		}
		out = append(out, tsAddress{Subnet: s, Addr: lastAddr(s)})
	}
	slices.SortFunc(out, func(x, y tsAddress) int { return x.Addr.Compare(y.Addr) })
	return out
}

// lastAddr is the last address of p (every host bit set).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// keptTSAddresses are the addresses the driver may keep on TSAddressDevice for subnets: the last
// address of each that could get one (see wantedTSAddresses), whether or not a node address now
// lies in it.
func keptTSAddresses(subnets []netip.Prefix) map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	for _, a := range wantedTSAddresses(subnets, nil) {
		out[a.Addr] = true
	}
	return out
}
