// Package vxlan is the "vxlan" cable driver: kernel VXLAN links through netlink, in the manner of
// Submariner's vxlan cable. Unencrypted: a policy must ask for it.
//
// Layout on a node:
//   - one VXLAN link per (VNI, port) in use, named <prefix><vni> (default cbl-vx100; see
//     deviceName), with this node's underlay address as source, learning off, the MTU of the
//     underlay minus Overhead, a MAC derived from the VTEP address and the VTEP address
//     240.b.c.d/8 (see vtep.go);
//   - per remote cluster on that link: an FDB entry 00:00:00:00:00:00 dst <remote underlay>
//     (appended, head-end replication), a unicast FDB entry <remote MAC> dst <remote underlay>, a
//     permanent neighbor <remote VTEP> lladdr <remote MAC>, and one route per remote subnet
//     "via <remote VTEP> dev <link> onlink proto 157 src <our pod address> mtu M advmss M-40".
//
// Node settings (cable.Settings, unknown keys are errors):
//
//	port             UDP port this node listens on and publishes as cable_ports["vxlan"] (4789)
//	vni              VNI of the default link; must be equal at both ends of a pair (100)
//	mtu              MTU of every VXLAN link (the underlay link's MTU - 50)
//	interfacePrefix  name prefix of our links, at most 6 bytes (cbl-vx)
//
// Per-connection options (the policy's cableDriver.options, unknown keys are errors):
//
//	vni   VNI of the pair (both ends read the same policy, so both use it)
//	port  UDP port both ends of the pair listen on and send to; without it a node listens on its
//	      own port and sends to the port the remote publishes (RemoteEndpoint.Port)
//	mtu   MTU (and MSS clamp) of the pair's routes, at most the link MTU
//
// Pairs with another (VNI, port) than the node's get their own link: cbl-vx<vni>p<port>.
//
// Everything is read before it is written; a Connect that finds the host as wanted changes
// nothing (Stats proves it). The kernel keeps all of it across an agent restart; connections.json
// in StateDir/vxlan names the cluster of each entry so Init can prune what no cluster owns.
//
// The agent process runs inside the node's network namespace (on a real node the host namespace;
// in tests `ip netns exec`): every netlink call here acts on the calling process's namespace.
package vxlan

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

// Name is the registry key of this driver.
const Name = "vxlan"

func init() {
	cable.Register(cable.Registration{
		Name: Name,
		New:  New,
		ParseSettings: func(s cable.Settings) error {
			_, err := parseSettings(s)
			return err
		},
		ValidateOptions: func(o cable.Options) error {
			_, err := parseOptions(o)
			return err
		},
	})
}

// Driver is the vxlan cable driver. Its methods are safe for concurrent use.
type Driver struct {
	node cable.LocalNode
	cfg  config
	dir  string // StateDir/vxlan
	log  *slog.Logger
	vtep netip.Addr // this node's VTEP address
	mac  net.HardwareAddr

	mu            sync.Mutex
	ready         bool
	mtu           int        // of every device
	src           netip.Addr // underlay source of the devices; invalid when no local link holds it
	underlayIndex int        // link holding src, 0 when none
	conns         map[string]conn

	linkChanges  atomic.Uint64
	addrChanges  atomic.Uint64
	fdbChanges   atomic.Uint64
	neighChanges atomic.Uint64
	routeChanges atomic.Uint64
}

// Stats counts the changes the driver made to the host since New. A Connect that finds
// everything in place leaves all of them unchanged; tests use this to prove idempotence.
type Stats struct {
	// LinkChanges counts links created, deleted, and changed (MTU, MAC, up).
	LinkChanges uint64
	// AddrChanges counts VTEP addresses added or removed.
	AddrChanges uint64
	// FDBChanges counts FDB entries added or deleted.
	FDBChanges uint64
	// NeighChanges counts neighbor entries set or deleted.
	NeighChanges uint64
	// RouteChanges counts routes replaced or deleted.
	RouteChanges uint64
}

// Total is the sum of all counters.
func (s Stats) Total() uint64 {
	return s.LinkChanges + s.AddrChanges + s.FDBChanges + s.NeighChanges + s.RouteChanges
}

// New validates settings and builds the driver; it touches nothing until Init.
func New(node cable.LocalNode, settings cable.Settings) (cable.Driver, error) {
	return NewDriver(node, settings)
}

// NewDriver is New with the concrete type, for callers (tests, tools) that want Stats.
func NewDriver(node cable.LocalNode, settings cable.Settings) (*Driver, error) {
	cfg, err := parseSettings(settings)
	if err != nil {
		return nil, err
	}
	if node.StateDir == "" {
		return nil, fmt.Errorf("vxlan: local node %s/%s has an empty StateDir", node.Cluster, node.Node)
	}
	vtep, err := VTEPAddr(node.AdvertiseAddress)
	if err != nil {
		return nil, fmt.Errorf("vxlan: local node %s/%s advertise address: %w", node.Cluster, node.Node, err)
	}
	return &Driver{
		node: node,
		cfg:  cfg,
		dir:  filepath.Join(node.StateDir, Name),
		log:  slog.Default().With("driver", Name),
		vtep: vtep,
		mac:  VTEPMAC(vtep),
	}, nil
}

func (d *Driver) Name() string { return Name }

// Stats returns the change counters.
func (d *Driver) Stats() Stats {
	return Stats{
		LinkChanges:  d.linkChanges.Load(),
		AddrChanges:  d.addrChanges.Load(),
		FDBChanges:   d.fdbChanges.Load(),
		NeighChanges: d.neighChanges.Load(),
		RouteChanges: d.routeChanges.Load(),
	}
}

// VTEP is this node's VTEP address.
func (d *Driver) VTEP() netip.Addr { return d.vtep }

// MTU is the device MTU (valid after Init).
func (d *Driver) MTU() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mtu
}

// Init finds the underlay link (for the source address and the default MTU), loads
// connections.json and prunes what no stored connection owns: our links no connection uses,
// and FDB entries, neighbors and routes of ours on the others. Devices are created by Connect,
// since the policy's options decide which (VNI, port) pairs exist.
func (d *Driver) Init(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.ready {
		return nil
	}
	conns, err := connections(d.dir).Load()
	if err != nil {
		return err
	}
	idx, umtu, found, err := route.UnderlayLink(d.node.AdvertiseAddress)
	if err != nil {
		return fmt.Errorf("vxlan init: %w", err)
	}
	d.src, d.underlayIndex = netip.Addr{}, 0
	if found {
		d.src, d.underlayIndex = d.node.AdvertiseAddress.Unmap(), idx
	} else {
		umtu = route.FallbackUnderlayMTU
		d.log.Warn("advertise address is on no local link: the kernel picks the VXLAN source, assuming underlay MTU",
			"address", d.node.AdvertiseAddress, "mtu", umtu)
	}
	d.mtu = d.cfg.MTU
	if d.mtu == 0 {
		d.mtu = defaultMTU(umtu)
	}
	d.conns = conns
	if err := d.prune(); err != nil {
		return fmt.Errorf("vxlan init: %w", err)
	}
	d.ready = true
	d.log.Info("vxlan ready", "vtep", d.vtep, "mac", d.mac.String(), "port", d.cfg.Port, "vni", d.cfg.VNI, "mtu", d.mtu,
		"source", d.src, "connections", len(d.conns))
	return nil
}

// ourLinks lists the VXLAN links whose name has our prefix.
func (d *Driver) ourLinks() ([]netlink.Link, error) {
	all, err := netlink.LinkList()
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

// Links are the VXLAN links of this driver: every link with its prefix.
func (d *Driver) Links() []string { return []string{d.cfg.Prefix + "*"} }

// Close releases nothing: the driver runs no goroutine and holds no handle between calls, and its
// kernel links outlive the process.
func (d *Driver) Close() error { return nil }

// LocalEndpoint is the UDP port to publish in Endpoint.cable_ports["vxlan"]. There is no key.
func (d *Driver) LocalEndpoint() cable.LocalEndpoint {
	return cable.LocalEndpoint{Port: uint16(d.cfg.Port)}
}

// Connect makes the link of the pair's (VNI, port) exist and hold the FDB entries, neighbor and
// routes of remote.Cluster. It reads first and changes nothing when everything already matches.
// opts are the policy's cableDriver.options: vni, port, mtu (all optional).
func (d *Driver) Connect(ctx context.Context, remote cable.RemoteEndpoint, opts cable.Options) error {
	o, err := parseOptions(opts)
	if err != nil {
		return fmt.Errorf("vxlan connect to cluster %s: %w", remote.Cluster, err)
	}
	subnets, err := validateRemote(remote)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.ready {
		return fmt.Errorf("vxlan connect to cluster %s: driver not initialised", remote.Cluster)
	}
	p, err := resolvePair(d.cfg, o, remote.Port, d.mtu)
	if err != nil {
		return fmt.Errorf("vxlan connect to cluster %s: %w", remote.Cluster, err)
	}
	want := conn{Node: remote.Node, Address: remote.Address.Unmap(), VNI: p.VNI, Port: p.Port, DstPort: p.DstPort,
		MTU: p.MTU, Device: p.Device, Subnets: subnets}
	if why := conflict(remote.Cluster, want, d.vtep, d.conns); why != "" {
		return fmt.Errorf("vxlan connect to cluster %s: %s", remote.Cluster, why)
	}
	log := d.log.With("cluster", remote.Cluster, "node", remote.Node, "interface", want.Device)

	old, hadOld := d.conns[remote.Cluster]
	if hadOld && old.Device != want.Device {
		// The pair's options moved it to another (VNI, port): take it off the old link first, so
		// its routes do not point at two links at once.
		log.Info("moving to another link", "old_interface", old.Device)
		if err := d.removeConn(remote.Cluster, old); err != nil {
			return fmt.Errorf("vxlan connect to cluster %s: %w", remote.Cluster, err)
		}
		hadOld = false
	}
	link, err := d.ensureDevice(want)
	if err != nil {
		return fmt.Errorf("vxlan connect to cluster %s: %w", remote.Cluster, err)
	}
	newVTEP, oldVTEP := want.remoteVTEP(), old.remoteVTEP()
	ownedAddr := func(a netip.Addr) bool { return a == want.Address || hadOld && a == old.Address }
	ownedVTEP := func(a netip.Addr) bool { return a == newVTEP || hadOld && a == oldVTEP }
	ownedSubnet := func(s netip.Prefix) bool { return hadOld && slices.Contains(old.Subnets, s) }
	if err := d.syncEntries(link, want.Port, []conn{want}, ownedAddr, ownedVTEP, ownedSubnet, false); err != nil {
		return fmt.Errorf("vxlan connect to cluster %s: %w", remote.Cluster, err)
	}
	if !hadOld || !old.equal(want) {
		d.conns[remote.Cluster] = want
		if err := connections(d.dir).Save(d.conns); err != nil {
			return fmt.Errorf("vxlan connect to cluster %s: %w", remote.Cluster, err)
		}
		log.Info("connected", "remote", want.Address, "dst_port", want.DstPort, "vni", want.VNI, "mtu", want.MTU, "subnets", want.Subnets)
	}
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
		Up: v.Flags&net.FlagUp != 0,
	}
	if src, ok := netip.AddrFromSlice(v.SrcAddr); ok {
		spec.Src = src.Unmap()
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
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
	log := d.log.With("interface", c.Device)
	for attempt := 0; attempt < 2; attempt++ {
		link, have, err := readDevice(c.Device)
		if err != nil {
			return nil, err
		}
		plan := planDevice(have, want)
		switch {
		case plan.Recreate:
			log.Info("link has another VNI, port, source or learning: recreating", "have_vni", have.VNI, "have_port", have.Port, "have_src", have.Src)
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
	v := &netlink.Vxlan{LinkAttrs: la, VxlanId: c.VNI, Port: c.Port, Learning: false, VtepDevIndex: d.underlayIndex}
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
	src4, _, err := route.Sources(d.node.LocalSubnets)
	if err != nil {
		d.log.Warn("no route source", "error", err)
	}
	var wantRoutes []route.Spec
	for _, c := range want {
		wantRoutes = append(wantRoutes, wantedRoutes(c, src4)...)
	}
	haveRoutes, err := route.List(idx, name)
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
	return route.Apply(log, idx, name, plan, func() { d.routeChanges.Add(1) })
}

// listNeigh lists the permanent IPv4 neighbors inside VTEPPrefix on the link: the only kind we
// make. Entries the kernel made itself (ARP) are not ours to judge.
func listNeigh(linkIndex int) ([]neighEntry, error) {
	ns, err := netlink.NeighList(linkIndex, unix.AF_INET)
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

// Disconnect removes the FDB entries, neighbor and routes of cluster, and its link when no other
// connection uses it. An unknown cluster is no error.
func (d *Driver) Disconnect(ctx context.Context, cluster string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.ready {
		return fmt.Errorf("vxlan disconnect cluster %s: driver not initialised", cluster)
	}
	c, ok := d.conns[cluster]
	if !ok {
		return nil
	}
	if err := d.removeConn(cluster, c); err != nil {
		return fmt.Errorf("vxlan disconnect cluster %s: %w", cluster, err)
	}
	delete(d.conns, cluster)
	if err := connections(d.dir).Save(d.conns); err != nil {
		return fmt.Errorf("vxlan disconnect cluster %s: %w", cluster, err)
	}
	d.log.Info("disconnected", "cluster", cluster, "interface", c.Device)
	return nil
}

// deviceView is what Connections read of one link, once per call.
type deviceView struct {
	err       error // reading the device failed
	found, up bool
	rx, tx    uint64
	fdb       []fdbEntry
	neigh     []neighEntry
	routes    []route.Spec
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
	if v.routes, err = route.List(a.Index, name); err != nil {
		return deviceView{}, err
	}
	return v, nil
}

// Connections reads every stored connection's state from the host. RxBytes/TxBytes are the
// counters of the connection's link: shared by every connection on it (the message says so when
// there are several). FDB entries on our links that no cluster owns are reported with an empty
// Cluster and an error state.
func (d *Driver) Connections(ctx context.Context) ([]cable.ConnectionStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.ready {
		return nil, fmt.Errorf("vxlan connections: driver not initialised")
	}
	views := map[string]deviceView{}
	users := map[string]int{}
	known := map[string]map[netip.Addr]bool{}
	for _, c := range d.conns {
		if _, ok := views[c.Device]; !ok {
			v, err := d.viewDevice(c.Device, c.Port)
			if err != nil {
				// Reported on each connection of the device: the others are still worth reading.
				v = deviceView{err: err}
			}
			views[c.Device] = v
			known[c.Device] = map[netip.Addr]bool{}
		}
		users[c.Device]++
		known[c.Device][c.Address] = true
	}
	out := make([]cable.ConnectionStatus, 0, len(d.conns))
	for cluster, c := range d.conns {
		v := views[c.Device]
		obs := observation{DeviceFound: v.found, DeviceUp: v.up, SharedWith: users[c.Device] - 1}
		for _, e := range wantedFDB(c) {
			if !slices.Contains(v.fdb, e) {
				obs.MissingFDB = append(obs.MissingFDB, e)
			}
		}
		if n := wantedNeigh(c); !slices.Contains(v.neigh, n) {
			obs.MissingNeigh = append(obs.MissingNeigh, n)
		}
		gw := c.remoteVTEP()
		for _, s := range c.Subnets {
			if !slices.ContainsFunc(v.routes, func(r route.Spec) bool { return r.Dst == s && r.Gw == gw }) {
				obs.MissingRoutes = append(obs.MissingRoutes, s)
			}
		}
		st := cable.ConnectionStatus{
			Cluster:  cluster,
			Node:     c.Node,
			Endpoint: netip.AddrPortFrom(c.Address, uint16(c.DstPort)).String(),
			RxBytes:  v.rx,
			TxBytes:  v.tx,
			MTU:      c.MTU,
			Subnets:  slices.Clone(c.Subnets),
		}
		st.State, st.Message = connState(c.Device, obs)
		if v.err != nil {
			st.State, st.Message = cable.StateError, v.err.Error()
		}
		out = append(out, st)
	}
	for name, v := range views {
		for _, e := range v.fdb {
			if e.MAC == zeroMAC && !known[name][e.Dst] {
				out = append(out, cable.ConnectionStatus{
					Endpoint: netip.AddrPortFrom(e.Dst, uint16(e.Port)).String(),
					State:    cable.StateError,
					Message:  fmt.Sprintf("FDB entry %s on %s belongs to no known cluster", e, name),
				})
			}
		}
	}
	cable.SortConnections(out)
	return out, nil
}

// Cleanup removes our routes and every VXLAN link with our prefix, and connections.json.
// Init may be called again afterwards.
func (d *Driver) Cleanup(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	links, err := d.ourLinks()
	if err != nil {
		errs = append(errs, err)
	}
	for _, l := range links {
		a := l.Attrs()
		if existing, err := route.List(a.Index, a.Name); err != nil {
			errs = append(errs, err)
		} else if err := route.Apply(d.log.With("interface", a.Name), a.Index, a.Name, route.Plan{Delete: existing},
			func() { d.routeChanges.Add(1) }); err != nil {
			errs = append(errs, err)
		}
		errs = append(errs, d.deleteLink(l))
	}
	if err := connections(d.dir).Remove(); err != nil {
		errs = append(errs, err)
	}
	d.conns = nil
	d.ready = false
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("vxlan cleanup: %w", err)
	}
	d.log.Info("cleaned up")
	return nil
}
