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
//	mtu              MTU of every VXLAN link; 0 or unset: the underlay link's MTU - 50
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
//
// Files: settings.go validates settings and options; plan.go decides (pure); apply.go changes the
// host through netlink (fdb.go for the FDB); status.go judges what was observed; store.go is
// connections.json; vtep.go derives the inner addresses.
package vxlan

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

// Embedding is how another driver (cable/vxlanipsec) runs this driver's datapath under its own
// name, with its own links (settings' interfacePrefix) and state.
type Embedding struct {
	// Name replaces "vxlan" in the state directory (StateDir/<Name>) and the logs.
	Name string
	// PinSourcePort makes every link send from its own UDP port (the kernel's srcport range
	// [port, port+1)), so that a pair's VXLAN packets go port to port both ways and a
	// transport-mode IPsec traffic selector can name both ports. It costs the source-port
	// entropy ECMP on the underlay would hash on, which two gateways talking to each other do
	// not need.
	PinSourcePort bool
	// ExtraOverhead is subtracted from the default MTU (underlay MTU - Overhead) for what the
	// embedding driver adds around the VXLAN packets (ESP).
	ExtraOverhead int
}

// NewEmbedded builds the driver for an embedding driver (see Embedding). It is not registered.
func NewEmbedded(node cable.LocalNode, settings cable.Settings, e Embedding) (*Driver, error) {
	if e.Name == "" || e.ExtraOverhead < 0 {
		return nil, fmt.Errorf("vxlan: embedding %+v: want a name and a non-negative overhead", e)
	}
	d, err := NewDriver(node, settings)
	if err != nil {
		return nil, err
	}
	if e.PinSourcePort && d.cfg.Port == MaxPinnedPort+1 {
		return nil, cable.BadSetting(e.Name, keyPort, strconv.Itoa(d.cfg.Port), "cannot be pinned as the source port (the kernel's range ends one above it): at most %d", MaxPinnedPort)
	}
	d.embed = e
	d.dir = filepath.Join(node.StateDir, e.Name)
	d.log = node.Logger(e.Name).With("component", "vxlan")
	return d, nil
}

func init() {
	cable.Register(cable.Registration{Name: Name, New: cable.Constructor(NewDriver)})
}

// Driver is the vxlan cable driver. Its methods are safe for concurrent use. It runs no
// goroutine and holds no handle between calls.
type Driver struct {
	node cable.LocalNode
	cfg  config
	dir  string // StateDir/vxlan
	log  *slog.Logger
	vtep netip.Addr // this node's VTEP address
	mac  net.HardwareAddr

	mu            sync.Mutex
	initialised   bool
	mtu           int        // of every device
	src           netip.Addr // underlay source of the devices; invalid when no local link holds it
	underlayIndex int        // link holding src, 0 when none
	conns         map[string]conn

	// embed is how another driver embeds this one (NewEmbedded); zero for the vxlan driver.
	embed Embedding

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

// NewDriver validates settings and builds the driver; it touches nothing until Init. It returns
// the concrete type, for callers (tests, tools) that want Stats.
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
		log:  node.Logger(Name),
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
	if d.initialised {
		return nil
	}
	conns, err := connections(d.dir).Load()
	if err != nil {
		return err
	}
	u, err := route.FindUnderlay(d.log, d.node.AdvertiseAddress)
	if err != nil {
		return fmt.Errorf("vxlan init: %w", err)
	}
	d.src, d.underlayIndex = netip.Addr{}, 0
	if u.Found() {
		d.src, d.underlayIndex = d.node.AdvertiseAddress.Unmap(), u.Index
	} else {
		d.log.Info("no local link holds the advertise address: the kernel picks the VXLAN source")
	}
	d.mtu = d.cfg.MTU
	if d.mtu == 0 {
		d.mtu = max(defaultMTU(u.MTU)-d.embed.ExtraOverhead, MinMTU)
	}
	d.conns = conns
	if err := d.prune(); err != nil {
		return fmt.Errorf("vxlan init: %w", err)
	}
	d.initialised = true
	d.log.Info("vxlan ready", "vtep", d.vtep, "mac", d.mac.String(), "port", d.cfg.Port, "vni", d.cfg.VNI, "mtu", d.mtu,
		"source", d.src, "connections", len(d.conns))
	return nil
}

// Links are the VXLAN links of this driver: every link with its prefix.
func (d *Driver) Links() []string { return []string{d.cfg.Prefix + "*"} }

// Close stops using the driver. It releases nothing: the driver runs no goroutine and holds no
// handle between calls, and its kernel links outlive the process.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.initialised = false
	return nil
}

// LocalEndpoint is the UDP port to publish in Endpoint.cable_ports["vxlan"]. There is no key.
func (d *Driver) LocalEndpoint() cable.LocalEndpoint {
	return cable.LocalEndpoint{Port: uint16(d.cfg.Port)}
}

// Connect makes the link of the pair's (VNI, port) exist and hold the FDB entries, neighbor and
// routes of remote.Cluster. It reads first and changes nothing when everything already matches.
// opts are the policy's cableDriver.options: vni, port, mtu (all optional).
func (d *Driver) Connect(ctx context.Context, remote cable.RemoteEndpoint, opts cable.Options) error {
	where := "vxlan connect to cluster " + remote.Cluster
	o, err := parseOptions(opts)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	subnets, err := validateRemote(remote)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return cable.NotInitialised(where)
	}
	p, err := resolvePair(d.cfg, o, remote.Port, d.mtu)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	want := conn{Node: remote.Node, Address: remote.Address.Unmap(), VNI: p.VNI, Port: p.Port, DstPort: p.DstPort,
		MTU: p.MTU, Device: p.Device, Subnets: subnets, LocalSubnets: remote.LocalSubnets}
	if err := checkConflicts(remote.Cluster, want, d.vtep, d.conns); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := d.connect(remote.Cluster, want); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// Disconnect removes the FDB entries, neighbor and routes of cluster, and its link when no other
// connection uses it. An unknown cluster is no error.
func (d *Driver) Disconnect(ctx context.Context, cluster string) error {
	where := "vxlan disconnect cluster " + cluster
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return cable.NotInitialised(where)
	}
	c, ok := d.conns[cluster]
	if !ok {
		return nil
	}
	if err := d.removeConn(cluster, c); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	delete(d.conns, cluster)
	if err := connections(d.dir).Save(d.conns); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	d.log.Info("disconnected", "cluster", cluster, "interface", c.Device)
	return nil
}

// Connections reads every stored connection's state from the host. RxBytes/TxBytes are the
// counters of the connection's link: shared by every connection on it (the message says so when
// there are several). FDB entries on our links that no cluster owns are reported with an empty
// Cluster and an error state.
func (d *Driver) Connections(ctx context.Context) ([]cable.ConnectionStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return nil, cable.NotInitialised("vxlan connections")
	}
	views := map[string]deviceView{}
	for _, c := range d.conns {
		if _, ok := views[c.Device]; !ok {
			v, err := d.viewDevice(c.Device, c.Port)
			if err != nil {
				// Reported on each connection of the device: the others are still worth reading.
				v = deviceView{err: err}
			}
			views[c.Device] = v
		}
	}
	return connectionStatuses(d.conns, views), nil
}

// Cleanup removes our routes and every VXLAN link with our prefix, and connections.json.
// Init may be called again afterwards.
func (d *Driver) Cleanup(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.initialised = false
	if err := d.cleanup(); err != nil {
		return fmt.Errorf("vxlan cleanup: %w", err)
	}
	d.log.Info("cleaned up")
	return nil
}
