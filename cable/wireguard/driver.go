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
//
// Files: settings.go validates the settings; plan.go decides (pure); apply.go changes the host
// through the host interface (host.go); status.go judges what the device reports; store.go is
// connections.json; device.go creates the kernel or userspace device; key.go the private key.
package wireguard

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
)

func init() {
	cable.Register(cable.Registration{Name: Name, New: cable.Constructor(NewDriver), PrepareProcess: RunIsolated})
}

// Driver is the wireguard cable driver. Its methods are safe for concurrent use.
type Driver struct {
	node cable.LocalNode
	cfg  config
	dir  string // StateDir/wireguard
	log  *slog.Logger
	host host
	// open creates or adopts the device (openDevice; tests replace it).
	open func(log *slog.Logger, name string, mtu int) (wgDevice, error)

	// timing of new peers' first handshakes (handshake.go) and the clock; tests change them.
	timing handshakeTiming
	now    func() time.Time

	mu          sync.Mutex
	initialised bool
	key         wgtypes.Key
	mtu         int
	dev         wgDevice
	conns       map[string]storedConn // cluster -> peer, mirrored in connections.json
	watch       *handshakeWatch       // new peers until their first handshake
	// reconnect are the keys of peers stored by an earlier process but gone from the device.
	reconnect map[wgtypes.Key]bool

	// The handshake watcher goroutine (watch.go), owned by the driver from Init to Close.
	watchMu   sync.Mutex
	watchStop chan struct{}
	watchDone chan struct{}
	kickCh    chan struct{}

	configures   atomic.Uint64
	routeChanges atomic.Uint64
	deferredAdds atomic.Uint64
	releases     atomic.Uint64
	initiations  atomic.Uint64
}

// Stats counts the changes Init, Connect and Disconnect made to the host since New. A Connect
// that finds everything in place leaves both unchanged; tests use this to prove idempotence. What
// the handshake watcher does later is in HandshakeStats.
type Stats struct {
	// Configures is the number of wgctrl ConfigureDevice calls.
	Configures uint64
	// RouteChanges is the number of routes replaced or deleted.
	RouteChanges uint64
}

// HandshakeStats counts what the handshake watcher did for new peers' first handshakes
// (handshake.go).
type HandshakeStats struct {
	// DeferredAdds counts the peers a plain responder added a moment after Connect.
	DeferredAdds uint64
	// Releases counts the held-back peers an assisted responder configured fully.
	Releases uint64
	// Initiations counts the fresh initiations an assisted initiator sent.
	Initiations uint64
}

// NewDriver validates settings and builds the driver; it touches nothing until Init. It returns
// the concrete type, for callers (tests, tools) that want Stats or DeviceKind.
func NewDriver(node cable.LocalNode, settings cable.Settings) (*Driver, error) {
	cfg, err := parseSettings(settings)
	if err != nil {
		return nil, err
	}
	if node.StateDir == "" {
		return nil, fmt.Errorf("wireguard: local node %s/%s has an empty StateDir", node.Cluster, node.Node)
	}
	return &Driver{
		node:   node,
		cfg:    cfg,
		dir:    filepath.Join(node.StateDir, Name),
		log:    node.Logger(Name).With("interface", cfg.Interface),
		host:   &netHost{},
		open:   openDevice,
		timing: defaultHandshakeTiming(),
		now:    time.Now,
		kickCh: make(chan struct{}, 1),
	}, nil
}

func (d *Driver) Name() string { return Name }

// Stats returns the change counters.
func (d *Driver) Stats() Stats {
	return Stats{Configures: d.configures.Load(), RouteChanges: d.routeChanges.Load()}
}

// HandshakeStats returns the handshake watcher's counters.
func (d *Driver) HandshakeStats() HandshakeStats {
	return HandshakeStats{DeferredAdds: d.deferredAdds.Load(), Releases: d.releases.Load(), Initiations: d.initiations.Load()}
}

// DeviceKind is KindKernel or KindUserspace after Init, "" before.
func (d *Driver) DeviceKind() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
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
	if d.initialised {
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
		u, _ := route.FindUnderlay(d.log, d.node.AdvertiseAddress)
		mtu = defaultMTU(u.MTU)
	}
	dev, err := d.open(d.log, d.cfg.Interface, mtu)
	if err != nil {
		return fmt.Errorf("wireguard init: %w", err)
	}
	d.key, d.mtu, d.dev, d.conns = key, mtu, dev, conns
	d.watch, d.reconnect = newHandshakeWatch(d.timing), map[wgtypes.Key]bool{}
	if err := d.initDevice(); err != nil {
		return fmt.Errorf("wireguard init: %w", errors.Join(err, d.release()))
	}
	d.initialised = true
	d.startWatcher()
	d.log.Info("wireguard ready", "kind", dev.Kind(), "port", d.cfg.Port, "mtu", mtu, "publicKey", key.PublicKey().String())
	return nil
}

// LocalEndpoint is the port, the base64 public key and the device kind to publish (valid after
// Init).
func (d *Driver) LocalEndpoint() cable.LocalEndpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	ep := cable.LocalEndpoint{Port: uint16(d.cfg.Port)}
	if d.key != (wgtypes.Key{}) {
		ep.Attributes = map[string]string{AttrPublicKey: d.key.PublicKey().String()}
		if d.dev != nil {
			ep.Attributes[AttrDevice] = d.dev.Kind()
		}
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
	where := "wireguard connect to cluster " + want.Cluster
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return cable.NotInitialised(where)
	}
	if err := checkConflicts(want, d.key.PublicKey(), d.conns); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := d.connect(want); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if !d.watch.empty() {
		d.kick()
	}
	return nil
}

// Disconnect removes the peer and routes of cluster. An unknown cluster is no error.
func (d *Driver) Disconnect(ctx context.Context, cluster string) error {
	where := "wireguard disconnect cluster " + cluster
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return cable.NotInitialised(where)
	}
	c, ok := d.conns[cluster]
	if !ok {
		return nil
	}
	if err := d.disconnect(cluster, c); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	d.log.Info("disconnected", "cluster", cluster)
	return nil
}

// Connections reads every peer from the device; the cluster and node names come from
// connections.json. A peer no cluster claims is reported with an empty Cluster and an error state.
func (d *Driver) Connections(ctx context.Context) ([]cable.ConnectionStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return nil, cable.NotInitialised("wireguard connections")
	}
	dev, err := d.host.Device(d.cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("wireguard connections: %w", err)
	}
	return peerStatuses(dev, d.conns, d.watch.pendingKeys(), d.now(), d.mtu), nil
}

// Cleanup removes our routes, the link (kernel) or the device with its UAPI socket (userspace),
// and connections.json. The private key stays: the node keeps its identity. It works without
// Init too (an uninstall command): a kernel link with the interface name is ours.
func (d *Driver) Cleanup(ctx context.Context) error {
	d.stopWatcher()
	d.mu.Lock()
	defer d.mu.Unlock()
	err := d.cleanup()
	err = errors.Join(err, d.release())
	if err != nil {
		return fmt.Errorf("wireguard cleanup: %w", err)
	}
	d.log.Info("cleaned up")
	return nil
}

// Close releases the device and the wgctrl client without cleaning up, as a process exit does: a
// kernel link and its routes stay; a userspace device (with its goroutines), its link and its
// routes go away with it. connections.json stays, so the next Init can tell our peers from stale
// ones.
func (d *Driver) Close() error {
	d.stopWatcher()
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.release()
}

// release ends what runs in this process: the userspace device and the wgctrl client. The driver
// is then not initialised. Called with d.mu held.
func (d *Driver) release() error {
	var errs []error
	if d.dev != nil && d.dev.Kind() == KindUserspace {
		// The tunnels stop here: a restart's stall runs from this line to the next agent's
		// first handshake (docs/helm.md has a timeline).
		d.log.Info("closing the userspace wireguard device: its tunnels are down until a device is up again")
		errs = append(errs, d.dev.Close())
		d.log.Info("userspace wireguard device closed")
	}
	errs = append(errs, d.host.Close())
	d.dev, d.initialised = nil, false
	return errors.Join(errs...)
}
