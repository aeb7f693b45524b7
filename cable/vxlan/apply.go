package vxlan

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/cablemesh/cablemesh/internal/nldump"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

// This file is the host side of the driver: netlink calls that read and change the VXLAN links,
// their addresses, FDB entries (fdb.go), neighbors and routes, applying what plan.go decides.
// Methods of Driver are called with d.mu held.

// linkOf is l as cable/route names links.
func linkOf(l netlink.Link) route.Link {
	return route.Link{Index: l.Attrs().Index, Name: l.Attrs().Name}
}

// connect makes want's link exist and hold the FDB entries, neighbor and routes of cluster (and
// takes them off its old link when the pair's options moved it), then stores want.
func (d *Driver) connect(cluster string, want conn) error {
	log := d.log.With("cluster", cluster, "node", want.Node, "interface", want.Device)
	old, hadOld := d.conns[cluster]
	if hadOld && old.Device != want.Device {
		// The pair's options moved it to another (VNI, port): take it off the old link first, so
		// its routes do not point at two links at once.
		log.Info("moving to another link", "oldInterface", old.Device)
		if err := d.removeConn(cluster, old); err != nil {
			return err
		}
		hadOld = false
	}
	link, err := d.ensureDevice(want)
	if err != nil {
		return err
	}
	newVTEP, oldVTEP := want.remoteVTEP(), old.remoteVTEP()
	ownedAddr := func(a netip.Addr) bool { return a == want.Address || hadOld && a == old.Address }
	ownedVTEP := func(a netip.Addr) bool { return a == newVTEP || hadOld && a == oldVTEP }
	ownedSubnet := func(s netip.Prefix) bool { return hadOld && slices.Contains(old.Subnets, s) }
	if err := d.syncEntries(link, want.Port, []conn{want}, ownedAddr, ownedVTEP, ownedSubnet, false); err != nil {
		return err
	}
	if hadOld && old.equal(want) {
		return nil
	}
	d.conns[cluster] = want
	if err := connections(d.dir).Save(d.conns); err != nil {
		return err
	}
	log.Info("connected", "remote", want.Address, "dstPort", want.DstPort, "vni", want.VNI, "mtu", want.MTU, "subnets", want.Subnets)
	return nil
}

// cleanup removes our routes and every VXLAN link with our prefix, and connections.json.
func (d *Driver) cleanup() error {
	var errs []error
	links, err := d.ourLinks()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		if existing, err := route.List(linkOf(l)); err != nil {
			errs = append(errs, err)
		} else if err := route.Apply(d.log.With("interface", l.Attrs().Name), linkOf(l), route.Plan{Delete: existing},
			func() { d.routeChanges.Add(1) }); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, d.deleteLink(l))
	}
	errs = append(errs, connections(d.dir).Remove())
	d.conns = nil
	return errors.Join(errs...)
}

// ourLinks lists the VXLAN links whose name has our prefix.
func (d *Driver) ourLinks() ([]netlink.Link, error) {
	all, err := nldump.Retry(func() ([]netlink.Link, error) { return netlink.LinkList() })
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []netlink.Link
	for _, l := range all {
		if strings.HasPrefix(l.Attrs().Name, d.cfg.Prefix) && l.Type() == "vxlan" {
			out = append(out, l)
		}
	}
	return out, nil
}

func (d *Driver) prune() error {
	links, err := d.ourLinks()
	if err != nil {
		return err
	}
	byDevice := map[string][]conn{}
	for _, c := range d.conns {
		byDevice[c.Device] = append(byDevice[c.Device], c)
	}
	all4 := func(netip.Addr) bool { return true }
	all6 := func(netip.Prefix) bool { return true }
	for _, l := range links {
		name := l.Attrs().Name
		cs := byDevice[name]
		if len(cs) == 0 {
			d.log.Info("removing stale link", "interface", name)
			if err := d.deleteLink(l); err != nil {
				return err
			}
			continue
		}
		port := cs[0].Port
		if v, ok := l.(*netlink.Vxlan); ok {
			port = v.Port
		}
		if err := d.syncEntries(l, port, cs, all4, all4, all6, true); err != nil {
			return err
		}
	}
	return nil
}

func (d *Driver) deleteLink(l netlink.Link) error {
	if err := netlink.LinkDel(l); err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) || errors.Is(err, unix.ENODEV) {
			return nil
		}
		return fmt.Errorf("delete link %s: %w", l.Attrs().Name, err)
	}
	d.linkChanges.Add(1)
	d.log.Info("link deleted", "interface", l.Attrs().Name)
	return nil
}

// readDevice returns the link named name and its spec, or nil, nil when there is none. A link of
// another type under our name is an error: it is not ours to change.
func readDevice(name string) (netlink.Link, *deviceSpec, error) {
	l, err := netlink.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, nil, nil
		}
		return nil, nil, fmt.Errorf("find link %s: %w", name, err)
	}
	v, ok := l.(*netlink.Vxlan)
	if !ok {
		return nil, nil, fmt.Errorf("link %s exists and is a %s link, not a VXLAN link of ours", name, l.Type())
	}
	spec := &deviceSpec{
		VNI: v.VxlanId, Port: v.Port, Learning: v.Learning, MTU: v.MTU, MAC: v.HardwareAddr.String(),
		Up: v.Flags&net.FlagUp != 0, SrcPorts: [2]int{v.PortLow, v.PortHigh},
	}
	if src, ok := netip.AddrFromSlice(v.SrcAddr); ok {
		spec.Src = src.Unmap()
	}
	addrs, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(l, netlink.FAMILY_V4) })
	if err != nil {
		return nil, nil, fmt.Errorf("list addresses of %s: %w", name, err)
	}
	for _, a := range addrs {
		if p, err := route.PrefixFromIPNet(*a.IPNet); err == nil {
			// Keep the host part: PrefixFromIPNet masks, we compare the address itself.
			ip, _ := netip.AddrFromSlice(a.IP)
			spec.Addrs = append(spec.Addrs, netip.PrefixFrom(ip.Unmap(), p.Bits()))
		}
	}
	return l, spec, nil
}

// ensureDevice makes the link of c's (VNI, port) match what this node wants, creating it if
// needed, and returns it.
func (d *Driver) ensureDevice(c conn) (netlink.Link, error) {
	want := deviceSpec{VNI: c.VNI, Port: c.Port, Src: d.src, MTU: d.mtu, MAC: d.mac.String(), Up: true,
		Addrs: []netip.Prefix{netip.PrefixFrom(d.vtep, VTEPPrefix.Bits())}}
	if d.embed.PinSourcePort {
		want.SrcPorts = [2]int{c.Port, c.Port + 1}
	}
	log := d.log.With("interface", c.Device)
	for attempt := 0; attempt < 2; attempt++ {
		link, have, err := readDevice(c.Device)
		if err != nil {
			return nil, err
		}
		plan := planDevice(have, want)
		switch {
		case plan.Recreate:
			log.Info("link has another VNI, port, source or learning: recreating", "haveVNI", have.VNI, "havePort", have.Port, "haveSrc", have.Src)
			if err := d.deleteLink(link); err != nil {
				return nil, err
			}
			fallthrough
		case plan.Create:
			if err := d.createDevice(c, want); err != nil {
				return nil, err
			}
			continue // read back, then set addresses and up
		}
		if err := d.applyDevice(link, plan, want); err != nil {
			return nil, err
		}
		return link, nil
	}
	return nil, fmt.Errorf("link %s: created but does not read back as wanted", c.Device)
}

func (d *Driver) createDevice(c conn, want deviceSpec) error {
	la := netlink.NewLinkAttrs()
	la.Name = c.Device
	la.MTU = want.MTU
	la.HardwareAddr = d.mac
	v := &netlink.Vxlan{LinkAttrs: la, VxlanId: c.VNI, Port: c.Port, Learning: false, VtepDevIndex: d.underlayIndex,
		PortLow: want.SrcPorts[0], PortHigh: want.SrcPorts[1]}
	if d.src.IsValid() {
		v.SrcAddr = d.src.AsSlice()
	}
	if err := netlink.LinkAdd(v); err != nil {
		return fmt.Errorf("create VXLAN link %s vni %d port %d: %w", c.Device, c.VNI, c.Port, err)
	}
	d.linkChanges.Add(1)
	d.log.Info("link created", "interface", c.Device, "vni", c.VNI, "port", c.Port, "mtu", want.MTU, "mac", d.mac.String(), "source", d.src)
	return nil
}

func (d *Driver) applyDevice(link netlink.Link, plan devicePlan, want deviceSpec) error {
	name := link.Attrs().Name
	if plan.SetMTU {
		if err := netlink.LinkSetMTU(link, want.MTU); err != nil {
			return fmt.Errorf("set MTU %d on %s: %w", want.MTU, name, err)
		}
		d.linkChanges.Add(1)
	}
	if plan.SetMAC {
		if err := netlink.LinkSetHardwareAddr(link, d.mac); err != nil {
			return fmt.Errorf("set MAC %s on %s: %w", d.mac, name, err)
		}
		d.linkChanges.Add(1)
	}
	for _, a := range plan.DelAddrs {
		if err := netlink.AddrDel(link, &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), 32)}}); err != nil && !isGone(err) {
			return fmt.Errorf("delete address %s from %s: %w", a, name, err)
		}
		d.addrChanges.Add(1)
	}
	for _, a := range plan.AddAddrs {
		if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: a.Addr().AsSlice(), Mask: net.CIDRMask(a.Bits(), 32)}}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add address %s to %s: %w", a, name, err)
		}
		d.addrChanges.Add(1)
	}
	if plan.SetUp {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
		d.linkChanges.Add(1)
	}
	return nil
}

// syncEntries makes the FDB entries, neighbors and routes of ours on link match those of want,
// deleting only existing entries the predicates own (other clusters' entries on a shared link
// are left alone). deleteOnly skips additions (Init's prune).
func (d *Driver) syncEntries(link netlink.Link, devicePort int, want []conn,
	ownedAddr, ownedVTEP func(netip.Addr) bool, ownedSubnet func(netip.Prefix) bool, deleteOnly bool) error {
	idx, name := link.Attrs().Index, link.Attrs().Name
	log := d.log.With("interface", name)

	// FDB.
	haveFDB, err := listFDB(idx, devicePort)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	var wantFDB []fdbEntry
	var wantNeigh []neighEntry
	for _, c := range want {
		wantFDB = append(wantFDB, wantedFDB(c)...)
		wantNeigh = append(wantNeigh, wantedNeigh(c))
	}
	addF, delF := planFDB(haveFDB, wantFDB, func(e fdbEntry) bool { return ownedAddr(e.Dst) })
	if deleteOnly {
		addF = nil
	}
	for _, e := range delF {
		if err := delFDB(idx, e); err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
		d.fdbChanges.Add(1)
		log.Info("FDB entry deleted", "mac", e.MAC, "dst", e.Dst, "port", e.Port)
	}
	for _, e := range addF {
		if err := addFDB(idx, e); err != nil {
			return fmt.Errorf("link %s: %w", name, err)
		}
		d.fdbChanges.Add(1)
		log.Info("FDB entry added", "mac", e.MAC, "dst", e.Dst, "port", e.Port)
	}

	// Neighbors.
	haveNeigh, err := listNeigh(idx)
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	setN, delN := planNeigh(haveNeigh, wantNeigh, func(n neighEntry) bool { return ownedVTEP(n.IP) })
	if deleteOnly {
		setN = nil
	}
	for _, n := range delN {
		if err := netlink.NeighDel(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, IP: n.IP.AsSlice()}); err != nil && !isGone(err) {
			return fmt.Errorf("link %s: delete neighbor %s: %w", name, n, err)
		}
		d.neighChanges.Add(1)
		log.Info("neighbor deleted", "ip", n.IP, "mac", n.MAC)
	}
	for _, n := range setN {
		mac, _ := net.ParseMAC(n.MAC)
		if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
			IP: n.IP.AsSlice(), HardwareAddr: mac}); err != nil {
			return fmt.Errorf("link %s: set neighbor %s: %w", name, n, err)
		}
		d.neighChanges.Add(1)
		log.Info("neighbor set", "ip", n.IP, "mac", n.MAC)
	}

	// Routes.
	var wantRoutes []route.Spec
	for _, c := range want {
		// Per connection: a gateway-mode pair's source is this gateway's mesh address.
		src4, _, err := route.Sources(cable.RemoteEndpoint{LocalSubnets: c.LocalSubnets}.SourceSubnets(d.node))
		if err != nil {
			d.log.Warn("no route source", "err", err)
		}
		wantRoutes = append(wantRoutes, wantedRoutes(c, src4)...)
	}
	haveRoutes, err := route.List(linkOf(link))
	if err != nil {
		return err
	}
	wanted := map[netip.Prefix]bool{}
	for _, r := range wantRoutes {
		wanted[r.Dst] = true
	}
	plan := route.PlanRoutes(haveRoutes, wantRoutes, func(p netip.Prefix) bool { return wanted[p] || ownedSubnet(p) })
	if deleteOnly {
		plan.Replace = nil
	}
	return route.Apply(log, linkOf(link), plan, func() { d.routeChanges.Add(1) })
}

// listNeigh lists the permanent IPv4 neighbors inside VTEPPrefix on the link: the only kind we
// make. Entries the kernel made itself (ARP) are not ours to judge.
func listNeigh(linkIndex int) ([]neighEntry, error) {
	ns, err := nldump.Retry(func() ([]netlink.Neigh, error) { return netlink.NeighList(linkIndex, unix.AF_INET) })
	if err != nil {
		return nil, fmt.Errorf("list neighbors: %w", err)
	}
	var out []neighEntry
	for _, n := range ns {
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || n.State&netlink.NUD_PERMANENT == 0 || len(n.HardwareAddr) != 6 || !VTEPPrefix.Contains(ip.Unmap()) {
			continue
		}
		out = append(out, neighEntry{IP: ip.Unmap(), MAC: canonicalMAC(n.HardwareAddr)})
	}
	return out, nil
}

// removeConn takes c's entries off its link, and deletes the link when no other connection uses
// it. d.conns is not changed.
func (d *Driver) removeConn(cluster string, c conn) error {
	link, _, err := readDevice(c.Device)
	if err != nil {
		return err
	}
	if link == nil {
		return nil
	}
	for other, o := range d.conns {
		if other != cluster && o.Device == c.Device {
			vtep := c.remoteVTEP()
			return d.syncEntries(link, c.Port, nil,
				func(a netip.Addr) bool { return a == c.Address },
				func(a netip.Addr) bool { return a == vtep },
				func(p netip.Prefix) bool { return slices.Contains(c.Subnets, p) }, true)
		}
	}
	// The last connection of the link: deleting it takes its entries and routes along.
	return d.deleteLink(link)
}

func (d *Driver) viewDevice(name string, port int) (deviceView, error) {
	link, _, err := readDevice(name)
	if err != nil || link == nil {
		return deviceView{}, err
	}
	a := link.Attrs()
	v := deviceView{found: true, up: a.Flags&net.FlagUp != 0 && a.OperState != netlink.OperDown}
	if s := a.Statistics; s != nil {
		v.rx, v.tx = s.RxBytes, s.TxBytes
	}
	if v.fdb, err = listFDB(a.Index, port); err != nil {
		return deviceView{}, fmt.Errorf("link %s: %w", name, err)
	}
	if v.neigh, err = listNeigh(a.Index); err != nil {
		return deviceView{}, fmt.Errorf("link %s: %w", name, err)
	}
	if v.routes, err = route.List(linkOf(link)); err != nil {
		return deviceView{}, err
	}
	return v, nil
}
