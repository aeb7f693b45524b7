package vxlan

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

// This file holds the pure half of the driver: validating input, computing the kernel state a
// connection needs, and diffing it against what the kernel holds. No I/O.

// zeroMAC is the FDB "default" MAC: frames for unknown or broadcast destinations go to every
// remote appended under it (head-end replication), as in Submariner.
const zeroMAC = "00:00:00:00:00:00"

// conn is one connection: what Connect was asked for, after validation and options. It is also
// what connections.json stores, so the kernel state can be rebuilt and pruned after a restart.
type conn struct {
	Node string `json:"node"`
	// Address is the remote gateway's underlay IPv4 address.
	Address netip.Addr     `json:"address"`
	VNI     int            `json:"vni"`
	Port    int            `json:"port"`
	DstPort int            `json:"dstPort"`
	MTU     int            `json:"mtu"`
	Device  string         `json:"device"`
	Subnets []netip.Prefix `json:"subnets"` // masked, sorted, without duplicates
	// LocalSubnets override the node's for this connection's route source (a gateway-mode
	// pair: own mesh /32); empty = the node's.
	LocalSubnets []netip.Prefix `json:"localSubnets,omitempty"`
}

func (c conn) equal(o conn) bool {
	return c.Node == o.Node && c.Address == o.Address && c.VNI == o.VNI && c.Port == o.Port &&
		c.DstPort == o.DstPort && c.MTU == o.MTU && c.Device == o.Device && slices.Equal(c.Subnets, o.Subnets) &&
		slices.Equal(c.LocalSubnets, o.LocalSubnets)
}

// remoteVTEP is the remote's inner address (validated when the conn was built).
func (c conn) remoteVTEP() netip.Addr {
	v, _ := VTEPAddr(c.Address)
	return v
}

// validateRemote checks remote and returns its normalized subnets. Errors name the field.
func validateRemote(remote cable.RemoteEndpoint) ([]netip.Prefix, error) {
	if err := cable.CheckRemote(Name, remote); err != nil {
		return nil, err
	}
	if _, err := VTEPAddr(remote.Address); err != nil {
		return nil, fmt.Errorf("vxlan connect to cluster %s: %w", remote.Cluster, err)
	}
	subnets, err := cable.NormalizeSubnets(remote.Subnets)
	if err != nil {
		return nil, fmt.Errorf("vxlan connect to cluster %s: %w", remote.Cluster, err)
	}
	for _, s := range subnets {
		if !s.Addr().Is4() {
			return nil, fmt.Errorf("vxlan connect to cluster %s: subnet %s is IPv6; the vxlan cable carries IPv4 only", remote.Cluster, s)
		}
	}
	return subnets, nil
}

// checkConflicts refuses want when it cannot live beside the other stored connections: a VTEP
// address two remotes share on one device would send one's traffic to the other; a device name
// two (VNI, port) pairs share cannot carry both; a subnet two clusters share would have its route
// stolen by whichever connected last.
func checkConflicts(cluster string, want conn, local netip.Addr, stored map[string]conn) error {
	vtep := want.remoteVTEP()
	if vtep == local {
		return fmt.Errorf("remote address %s maps to VTEP address %s, the same as this node's (only the first octet differs)", want.Address, vtep)
	}
	others := make(map[string][]netip.Prefix, len(stored))
	for _, other := range slices.Sorted(maps.Keys(stored)) {
		if other == cluster {
			continue
		}
		o := stored[other]
		others[other] = o.Subnets
		if o.Device == want.Device && (o.VNI != want.VNI || o.Port != want.Port) {
			return fmt.Errorf("device %s already carries VNI %d port %d for cluster %s (names of long VNI/port pairs are hashed and collided): set another vni or port",
				want.Device, o.VNI, o.Port, other)
		}
		if o.Device == want.Device && o.remoteVTEP() == vtep {
			return fmt.Errorf("remote address %s maps to VTEP address %s, already used by cluster %s at %s", want.Address, vtep, other, o.Address)
		}
	}
	return cable.CheckOverlap(cluster, want.Subnets, others)
}

// fdbEntry is one FDB entry of a VXLAN device: frames for MAC go to Dst:Port.
type fdbEntry struct {
	MAC  string // canonical lower-case form
	Dst  netip.Addr
	Port int // the device's port when the kernel reports none
}

func (e fdbEntry) String() string { return fmt.Sprintf("%s dst %s port %d", e.MAC, e.Dst, e.Port) }

// neighEntry is one permanent neighbor entry: IP is reachable at MAC on the device.
type neighEntry struct {
	IP  netip.Addr
	MAC string
}

func (n neighEntry) String() string { return fmt.Sprintf("%s lladdr %s", n.IP, n.MAC) }

// wantedFDB: the head-end replication entry (zero MAC, appended) so broadcast reaches the remote,
// and a unicast entry for the remote device's MAC so traffic to it goes to it alone instead of
// being flooded to every remote of the device.
func wantedFDB(c conn) []fdbEntry {
	return []fdbEntry{
		{MAC: zeroMAC, Dst: c.Address, Port: c.DstPort},
		{MAC: VTEPMAC(c.remoteVTEP()).String(), Dst: c.Address, Port: c.DstPort},
	}
}

// wantedNeigh: the remote VTEP address resolves to the remote device's MAC without ARP.
func wantedNeigh(c conn) neighEntry {
	v := c.remoteVTEP()
	return neighEntry{IP: v, MAC: VTEPMAC(v).String()}
}

// wantedRoutes: one route per remote subnet, onlink via the remote VTEP address over the device,
// with the pair's MTU and the TCP MSS clamped to what fits in it.
func wantedRoutes(c conn, src4 netip.Addr) []route.Spec {
	out := route.Wanted(c.Subnets, c.MTU, src4, netip.Addr{})
	for i := range out {
		out[i].Gw = c.remoteVTEP()
		out[i].AdvMSS = c.MTU - route.TCPIPv4HeaderBytes
	}
	return out
}

// planFDB returns the entries to add and to delete so that the owned part of existing becomes
// want. Entries not owned (other clusters' remotes on a shared device) are left alone.
func planFDB(existing, want []fdbEntry, owned func(fdbEntry) bool) (add, del []fdbEntry) {
	for _, w := range want {
		if !slices.Contains(existing, w) {
			add = append(add, w)
		}
	}
	for _, e := range existing {
		if owned(e) && !slices.Contains(want, e) {
			del = append(del, e)
		}
	}
	return add, del
}

// planNeigh is planFDB for neighbor entries.
func planNeigh(existing, want []neighEntry, owned func(neighEntry) bool) (set, del []neighEntry) {
	for _, w := range want {
		if !slices.Contains(existing, w) {
			set = append(set, w)
		}
	}
	for _, e := range existing {
		if owned(e) && !slices.Contains(want, e) && !slices.ContainsFunc(set, func(s neighEntry) bool { return s.IP == e.IP }) {
			// An entry for an IP we set anyway is replaced in place, not deleted first.
			del = append(del, e)
		}
	}
	return set, del
}

// deviceSpec is a VXLAN link as far as we care about it.
type deviceSpec struct {
	VNI      int
	Port     int
	Src      netip.Addr // invalid: not set (want: no local link holds the advertise address)
	Learning bool
	MTU      int
	MAC      string
	Up       bool
	Addrs    []netip.Prefix // IPv4 addresses
	// SrcPorts is the source port range [low, high) the link sends from; zero: the kernel's
	// default (not compared).
	SrcPorts [2]int
}

// devicePlan is what to do to make a link match a deviceSpec.
type devicePlan struct {
	// Create the link (it is absent), or Recreate it: VNI, port, source and learning cannot be
	// changed on a live VXLAN link.
	Create, Recreate bool
	SetMTU, SetMAC   bool
	SetUp            bool
	AddAddrs         []netip.Prefix
	DelAddrs         []netip.Prefix
}

func (p devicePlan) empty() bool {
	return !p.Create && !p.Recreate && !p.SetMTU && !p.SetMAC && !p.SetUp && len(p.AddAddrs) == 0 && len(p.DelAddrs) == 0
}

// planDevice compares the link (nil when absent) with want. Every IPv4 address on the link other
// than want's is removed: the link is ours and carries exactly this node's VTEP address.
func planDevice(have *deviceSpec, want deviceSpec) devicePlan {
	if have == nil {
		return devicePlan{Create: true}
	}
	if have.VNI != want.VNI || have.Port != want.Port || have.Learning != want.Learning ||
		(want.Src.IsValid() && have.Src != want.Src) || (want.SrcPorts != [2]int{} && have.SrcPorts != want.SrcPorts) {
		return devicePlan{Recreate: true}
	}
	p := devicePlan{
		SetMTU: have.MTU != want.MTU,
		SetMAC: !strings.EqualFold(have.MAC, want.MAC),
		SetUp:  !have.Up,
	}
	for _, a := range want.Addrs {
		if !slices.Contains(have.Addrs, a) {
			p.AddAddrs = append(p.AddAddrs, a)
		}
	}
	for _, a := range have.Addrs {
		if !slices.Contains(want.Addrs, a) {
			p.DelAddrs = append(p.DelAddrs, a)
		}
	}
	return p
}

// canonicalMAC lower-cases a MAC the way net.HardwareAddr prints it.
func canonicalMAC(b []byte) string { return net.HardwareAddr(b).String() }
