// Package wireguard is the "wireguard" cable driver: one WireGuard peer per remote cluster on one
// link (default cbl-wg0), plus a route per remote subnet over that link.
//
// Where the kernel has WireGuard the link is a kernel device (it survives agent restarts and is
// adopted again); where it has not, wireguard-go runs in this process on a TUN device and serves
// its UAPI socket. Keys, port and peers are configured through the same wgctrl client for both.
//
// Assumption: the agent process runs inside the node's network namespace (on a real node the host
// namespace; in tests `ip netns exec`), so the link, the TUN and wireguard-go's UDP sockets are
// all created there and no setns is needed. When several agents share one host's mount namespace
// with a userspace device, call RunIsolated first thing in main (see isolate.go).
package wireguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

// Name is the registry key of this driver.
const Name = "wireguard"

// RouteProtocol marks every route this driver installs (rtnetlink protocol number), so cleanup
// and pruning find exactly ours. `ip route show proto 157` lists them. It is the protocol of
// every cable driver's routes (cable/route).
const RouteProtocol = route.Protocol

// AttrPublicKey is the attribute a wireguard node publishes its public key under (base64, as
// wg(8) prints it).
const AttrPublicKey = "publicKey"

func init() {
	cable.Register(cable.Registration{
		Name: Name,
		New:  New,
		ParseSettings: func(s cable.Settings) error {
			_, err := parseSettings(s)
			return err
		},
		ValidateOptions: parseOptions,
		CheckPublished: func(attrs map[string]string) error {
			if attrs[AttrPublicKey] == "" {
				return fmt.Errorf("publishes no wireguard key")
			}
			if _, err := wgtypes.ParseKey(attrs[AttrPublicKey]); err != nil {
				return fmt.Errorf("wireguard %s %q is not a base64 32-byte key", AttrPublicKey, attrs[AttrPublicKey])
			}
			return nil
		},
	})
}

// Driver is the wireguard cable driver. Its methods are safe for concurrent use.
type Driver struct {
	node cable.LocalNode
	cfg  config
	dir  string // StateDir/wireguard
	log  *slog.Logger

	mu     sync.Mutex
	key    wgtypes.Key
	mtu    int
	dev    wgDevice
	client *wgctrl.Client
	conns  map[string]storedConn // cluster -> peer, mirrored in connections.json

	configures   atomic.Uint64
	routeChanges atomic.Uint64
}

// Stats counts the changes the driver made to the host since New. A Connect that finds everything
// in place leaves both unchanged; tests use this to prove idempotence.
type Stats struct {
	// Configures is the number of wgctrl ConfigureDevice calls.
	Configures uint64
	// RouteChanges is the number of routes replaced or deleted.
	RouteChanges uint64
}

// New validates settings and builds the driver; it touches nothing until Init.
func New(node cable.LocalNode, settings cable.Settings) (cable.Driver, error) {
	return NewDriver(node, settings)
}

// NewDriver is New with the concrete type, for callers (tests, tools) that want Stats or DeviceKind.
func NewDriver(node cable.LocalNode, settings cable.Settings) (*Driver, error) {
	cfg, err := parseSettings(settings)
	if err != nil {
		return nil, err
	}
	if node.StateDir == "" {
		return nil, fmt.Errorf("wireguard: local node %s/%s has an empty StateDir", node.Cluster, node.Node)
	}
	return &Driver{
		node: node,
		cfg:  cfg,
		dir:  filepath.Join(node.StateDir, Name),
		log:  slog.Default().With("driver", Name, "interface", cfg.Interface),
	}, nil
}

func (d *Driver) Name() string { return Name }

// Stats returns the change counters.
func (d *Driver) Stats() Stats {
	return Stats{Configures: d.configures.Load(), RouteChanges: d.routeChanges.Load()}
}

// DeviceKind is KindKernel or KindUserspace after Init, "" before.
func (d *Driver) DeviceKind() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dev == nil {
		return ""
	}
	return d.dev.Kind()
}

// Interface is the name of the WireGuard link.
func (d *Driver) Interface() string { return d.cfg.Interface }

// Init loads (or creates once) the private key, creates or adopts the device, configures key and
// port, brings the link up with its MTU, and removes peers and routes that belong to no cluster
// in connections.json.
func (d *Driver) Init(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dev != nil {
		return nil
	}
	key, err := loadOrCreateKey(d.dir)
	if err != nil {
		return err
	}
	conns, err := connections(d.dir).Load()
	if err != nil {
		return err
	}
	mtu := d.cfg.MTU
	if mtu == 0 {
		mtu = defaultMTU(d.underlayMTU())
	}

	dev, err := openDevice(ctx, d.log, d.cfg.Interface, mtu)
	if err != nil {
		return fmt.Errorf("wireguard init: %w", err)
	}
	client, err := wgctrl.New()
	if err != nil {
		dev.Close()
		return fmt.Errorf("wireguard init: open wgctrl: %w", err)
	}
	d.key, d.mtu, d.dev, d.client, d.conns = key, mtu, dev, client, conns
	if err := d.initDevice(); err != nil {
		d.closeLocked()
		return fmt.Errorf("wireguard init: %w", err)
	}
	d.log.Info("wireguard ready", "kind", dev.Kind(), "port", d.cfg.Port, "mtu", mtu, "public_key", key.PublicKey().String())
	return nil
}

// underlayMTU is the MTU of the link holding the advertise address, or a common default when no
// local link holds it (a public address behind NAT).
func (d *Driver) underlayMTU() int {
	if !d.node.AdvertiseAddress.IsValid() {
		return fallbackUnderlayMTU
	}
	_, mtu, found, err := route.UnderlayLink(d.node.AdvertiseAddress)
	if err != nil {
		d.log.Warn("find the underlay link for its MTU", "error", err)
	}
	if err != nil || !found {
		d.log.Warn("advertise address is on no local link, assuming underlay MTU", "address", d.node.AdvertiseAddress, "mtu", fallbackUnderlayMTU)
		return fallbackUnderlayMTU
	}
	return mtu
}

func (d *Driver) initDevice() error {
	name := d.cfg.Interface
	dev, err := d.client.Device(name)
	if err != nil {
		return fmt.Errorf("read device %s: %w", name, err)
	}
	var cfg wgtypes.Config
	changed := false
	if dev.PrivateKey != d.key {
		cfg.PrivateKey = &d.key
		changed = true
	}
	if dev.ListenPort != d.cfg.Port {
		cfg.ListenPort = &d.cfg.Port
		changed = true
	}
	keys := make([]wgtypes.Key, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		keys = append(keys, p.PublicKey)
	}
	stalePeers, forget := staleState(keys, d.conns)
	for _, k := range stalePeers {
		d.log.Info("removing stale peer", "peer", k.String())
		cfg.Peers = append(cfg.Peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
		changed = true
	}
	if changed {
		if err := d.configure(cfg); err != nil {
			return err
		}
	}
	for _, cluster := range forget {
		delete(d.conns, cluster)
	}
	storeChanged := len(forget) > 0

	link, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find link %s: %w", name, err)
	}
	if link.Attrs().MTU != d.mtu {
		if err := netlink.LinkSetMTU(link, d.mtu); err != nil {
			return fmt.Errorf("set MTU %d on %s: %w", d.mtu, name, err)
		}
	}
	if link.Attrs().Flags&net.FlagUp == 0 {
		if err := netlink.LinkSetUp(link); err != nil {
			return fmt.Errorf("set %s up: %w", name, err)
		}
	}
	// Routes of ours for subnets no stored cluster has are stale too.
	owned := map[netip.Prefix]bool{}
	for _, c := range d.conns {
		for _, s := range c.Subnets {
			owned[s] = true
		}
	}
	existing, err := d.ourRoutes(link.Attrs().Index)
	if err != nil {
		return err
	}
	var stale []route.Spec
	for _, r := range existing {
		if !owned[r.Dst] {
			stale = append(stale, r)
		}
	}
	if err := d.applyRoutes(link.Attrs().Index, route.Plan{Delete: stale}); err != nil {
		return err
	}
	if storeChanged {
		return connections(d.dir).Save(d.conns)
	}
	return nil
}

func (d *Driver) configure(cfg wgtypes.Config) error {
	d.configures.Add(1)
	if err := d.client.ConfigureDevice(d.cfg.Interface, cfg); err != nil {
		return fmt.Errorf("configure device %s: %w", d.cfg.Interface, err)
	}
	return nil
}

// LocalEndpoint is the port and the base64 public key to publish (valid after Init).
func (d *Driver) LocalEndpoint() cable.LocalEndpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	var pub string
	if d.key != (wgtypes.Key{}) {
		pub = d.key.PublicKey().String()
	}
	ep := cable.LocalEndpoint{Port: uint16(d.cfg.Port)}
	if pub != "" {
		ep.Attributes = map[string]string{AttrPublicKey: pub}
	}
	return ep
}

// Links is the WireGuard link.
func (d *Driver) Links() []string { return []string{d.cfg.Interface} }

// Connect makes the device hold exactly one peer for remote.Cluster and routes its subnets over
// the link. It reads first and changes nothing when everything already matches.
func (d *Driver) Connect(ctx context.Context, remote cable.RemoteEndpoint, opts cable.Options) error {
	if err := parseOptions(opts); err != nil {
		return err
	}
	want, err := desiredFromRemote(remote, d.cfg.Keepalive)
	if err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dev == nil {
		return fmt.Errorf("wireguard connect to cluster %s: driver not initialised", want.Cluster)
	}
	if want.PublicKey == d.key.PublicKey() {
		return fmt.Errorf("wireguard connect to cluster %s: public key %s is this node's own", want.Cluster, want.PublicKey)
	}
	if other, theirs, ours, bad := overlappingCluster(want.Cluster, want.Subnets, d.conns); bad {
		return fmt.Errorf("wireguard connect to cluster %s: subnet %s overlaps %s of cluster %s", want.Cluster, ours, theirs, other)
	}
	for cluster, c := range d.conns {
		if cluster != want.Cluster && c.PublicKey == want.PublicKey.String() {
			return fmt.Errorf("wireguard connect to cluster %s: public key %s is already the peer of cluster %s", want.Cluster, want.PublicKey, cluster)
		}
	}
	log := d.log.With("cluster", want.Cluster, "node", want.Node, "peer", want.PublicKey.String())

	// Observe.
	dev, err := d.client.Device(d.cfg.Interface)
	if err != nil {
		return fmt.Errorf("wireguard connect to cluster %s: read device %s: %w", want.Cluster, d.cfg.Interface, err)
	}
	old, hadOld := d.conns[want.Cluster]

	// Diff the device.
	var peers []wgtypes.PeerConfig
	if hadOld && old.PublicKey != want.PublicKey.String() {
		if k, err := wgtypes.ParseKey(old.PublicKey); err == nil && hasPeer(dev, k) {
			log.Info("remote key changed, removing old peer", "old_peer", old.PublicKey)
			peers = append(peers, wgtypes.PeerConfig{PublicKey: k, Remove: true})
		}
	}
	if p, ok := findPeer(dev, want.PublicKey); !ok || !peerMatches(p, want) {
		peers = append(peers, peerConfig(want))
	}
	if len(peers) > 0 {
		if err := d.configure(wgtypes.Config{Peers: peers}); err != nil {
			return fmt.Errorf("wireguard connect to cluster %s: %w", want.Cluster, err)
		}
		// Read back: the device may silently disagree (e.g. an allowed IP another peer held).
		dev, err = d.client.Device(d.cfg.Interface)
		if err != nil {
			return fmt.Errorf("wireguard connect to cluster %s: read back device: %w", want.Cluster, err)
		}
		if p, ok := findPeer(dev, want.PublicKey); !ok || !peerMatches(p, want) {
			return fmt.Errorf("wireguard connect to cluster %s: device %s did not keep the peer configuration", want.Cluster, d.cfg.Interface)
		}
		log.Info("peer configured", "endpoint", want.Endpoint, "subnets", want.Subnets)
	}

	// Routes: this cluster's new subnets wanted; its old ones removed.
	link, err := netlink.LinkByName(d.cfg.Interface)
	if err != nil {
		return fmt.Errorf("wireguard connect to cluster %s: find link %s: %w", want.Cluster, d.cfg.Interface, err)
	}
	src4, src6 := d.sources()
	existing, err := d.ourRoutes(link.Attrs().Index)
	if err != nil {
		return fmt.Errorf("wireguard connect to cluster %s: %w", want.Cluster, err)
	}
	owned := func(p netip.Prefix) bool { return hadOld && slices.Contains(old.Subnets, p) }
	plan := route.PlanRoutes(existing, route.Wanted(want.Subnets, d.mtu, src4, src6), owned)
	if err := d.applyRoutes(link.Attrs().Index, plan); err != nil {
		return fmt.Errorf("wireguard connect to cluster %s: %w", want.Cluster, err)
	}

	entry := storedConn{Node: want.Node, PublicKey: want.PublicKey.String(), Endpoint: want.Endpoint.String(), Subnets: want.Subnets}
	if !hadOld || !storedEqual(old, entry) {
		d.conns[want.Cluster] = entry
		if err := connections(d.dir).Save(d.conns); err != nil {
			return fmt.Errorf("wireguard connect to cluster %s: %w", want.Cluster, err)
		}
	}
	return nil
}

func storedEqual(a, b storedConn) bool {
	return a.Node == b.Node && a.PublicKey == b.PublicKey && a.Endpoint == b.Endpoint && slices.Equal(a.Subnets, b.Subnets)
}

func findPeer(dev *wgtypes.Device, k wgtypes.Key) (wgtypes.Peer, bool) {
	for _, p := range dev.Peers {
		if p.PublicKey == k {
			return p, true
		}
	}
	return wgtypes.Peer{}, false
}

func hasPeer(dev *wgtypes.Device, k wgtypes.Key) bool {
	_, ok := findPeer(dev, k)
	return ok
}

// sources picks this node's addresses inside its local subnets, per family, as route sources.
func (d *Driver) sources() (netip.Addr, netip.Addr) {
	src4, src6, err := route.Sources(d.node.LocalSubnets)
	if err != nil {
		d.log.Warn("no route source", "error", err)
	}
	return src4, src6
}

// ourRoutes lists the routes with RouteProtocol on the link, in the main table.
func (d *Driver) ourRoutes(linkIndex int) ([]route.Spec, error) {
	return route.List(linkIndex, d.cfg.Interface)
}

func (d *Driver) applyRoutes(linkIndex int, plan route.Plan) error {
	return route.Apply(d.log, linkIndex, d.cfg.Interface, plan, func() { d.routeChanges.Add(1) })
}

// Disconnect removes the peer and routes of cluster. An unknown cluster is no error.
func (d *Driver) Disconnect(ctx context.Context, cluster string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dev == nil {
		return fmt.Errorf("wireguard disconnect cluster %s: driver not initialised", cluster)
	}
	c, ok := d.conns[cluster]
	if !ok {
		return nil
	}
	dev, err := d.client.Device(d.cfg.Interface)
	if err != nil {
		return fmt.Errorf("wireguard disconnect cluster %s: read device: %w", cluster, err)
	}
	if k, err := wgtypes.ParseKey(c.PublicKey); err == nil && hasPeer(dev, k) {
		if err := d.configure(wgtypes.Config{Peers: []wgtypes.PeerConfig{{PublicKey: k, Remove: true}}}); err != nil {
			return fmt.Errorf("wireguard disconnect cluster %s: %w", cluster, err)
		}
	}
	if link, err := netlink.LinkByName(d.cfg.Interface); err == nil {
		existing, err := d.ourRoutes(link.Attrs().Index)
		if err != nil {
			return fmt.Errorf("wireguard disconnect cluster %s: %w", cluster, err)
		}
		plan := route.PlanRoutes(existing, nil, func(p netip.Prefix) bool { return slices.Contains(c.Subnets, p) })
		if err := d.applyRoutes(link.Attrs().Index, plan); err != nil {
			return fmt.Errorf("wireguard disconnect cluster %s: %w", cluster, err)
		}
	}
	delete(d.conns, cluster)
	if err := connections(d.dir).Save(d.conns); err != nil {
		return fmt.Errorf("wireguard disconnect cluster %s: %w", cluster, err)
	}
	d.log.Info("disconnected", "cluster", cluster)
	return nil
}

// Connections reads every peer from the device; the cluster and node names come from
// connections.json. A peer no cluster claims is reported with an empty Cluster and an error state.
func (d *Driver) Connections(ctx context.Context) ([]cable.ConnectionStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.dev == nil {
		return nil, fmt.Errorf("wireguard connections: driver not initialised")
	}
	dev, err := d.client.Device(d.cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("wireguard connections: read device %s: %w", d.cfg.Interface, err)
	}
	byKey := map[string]string{}
	for cluster, c := range d.conns {
		byKey[c.PublicKey] = cluster
	}
	now := time.Now()
	out := make([]cable.ConnectionStatus, 0, len(dev.Peers))
	for _, p := range dev.Peers {
		st := cable.ConnectionStatus{
			RxBytes:       uint64(max(p.ReceiveBytes, 0)),
			TxBytes:       uint64(max(p.TransmitBytes, 0)),
			LastHandshake: p.LastHandshakeTime,
			MTU:           d.mtu,
		}
		if p.Endpoint != nil {
			st.Endpoint = p.Endpoint.String()
		}
		st.Subnets, _ = prefixesFromIPNets(p.AllowedIPs)
		st.State, st.Message = connectionState(p.LastHandshakeTime, now, st.RxBytes)
		if cluster, ok := byKey[p.PublicKey.String()]; ok {
			st.Cluster = cluster
			st.Node = d.conns[cluster].Node
		} else {
			st.State = cable.StateError
			st.Message = fmt.Sprintf("peer %s belongs to no known cluster", p.PublicKey)
		}
		out = append(out, st)
	}
	cable.SortConnections(out)
	return out, nil
}

// Cleanup removes our routes, the link (kernel) or the device with its UAPI socket (userspace),
// and connections.json. The private key stays: the node keeps its identity.
func (d *Driver) Cleanup(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	if link, err := netlink.LinkByName(d.cfg.Interface); err == nil {
		existing, err := d.ourRoutes(link.Attrs().Index)
		if err != nil {
			errs = append(errs, err)
		} else {
			errs = append(errs, d.applyRoutes(link.Attrs().Index, route.Plan{Delete: existing}))
		}
		if d.dev == nil && link.Type() == "wireguard" {
			// Cleanup without Init (e.g. an uninstall command): the kernel link is still ours.
			errs = append(errs, (&kernelDevice{name: d.cfg.Interface}).Close())
		}
	}
	if d.dev != nil {
		errs = append(errs, d.dev.Close())
	}
	if d.client != nil {
		errs = append(errs, d.client.Close())
	}
	d.dev, d.client = nil, nil
	if err := connections(d.dir).Remove(); err != nil {
		errs = append(errs, err)
	}
	d.conns = nil
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("wireguard cleanup: %w", err)
	}
	d.log.Info("cleaned up")
	return nil
}

// Close releases the device and the wgctrl client without cleaning up, as a process exit does: a
// kernel link and its routes stay; a userspace device, its link and its routes go away with it.
// connections.json stays, so the next Init can tell our peers from stale ones.
func (d *Driver) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.closeLocked()
}

func (d *Driver) closeLocked() error {
	var errs []error
	if d.dev != nil && d.dev.Kind() == KindUserspace {
		errs = append(errs, d.dev.Close())
	}
	if d.client != nil {
		errs = append(errs, d.client.Close())
	}
	d.dev, d.client = nil, nil
	return errors.Join(errs...)
}
