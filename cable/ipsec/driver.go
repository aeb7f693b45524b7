// Package ipsec is the "ipsec" cable driver: one IKEv2 connection per remote cluster, negotiated
// by strongSwan's charon and driven over its VICI socket with govici.
//
// The driver starts and supervises its own charon (unless the useSystemCharon setting names the
// vici socket of one it should use instead). Its strongswan.conf (StateDir/ipsec/, 0600 in a
// 0700 directory) loads an explicit minimal plugin list and sets the vici socket to
// StateDir/ipsec/charon.vici. Where the kernel has ESP (KernelHasESP), charon installs kernel
// xfrm SAs (kernel-netlink); where it has not, charon runs ESP itself on the TUN device ipsec0
// (kernel-libipsec), which needs UDP encapsulation. charon runs in a new mount namespace with a
// private /run (its pid file path is compiled in) and inherits the agent's network namespace.
//
// charon outlives the agent process (charon.go): it is started detached, not as the agent's
// child, logs to StateDir/ipsec/charon.log (its lines also go to the driver's log while a driver
// follows it) and is named by StateDir/ipsec/charon.pid. Close leaves it running with its SAs,
// ipsec0 and routes; the next Init adopts it when it is exactly the charon it would start
// (adopt.go), so an agent restart does not touch the tunnels, and the Connects that follow find
// everything in place (planConn) and change nothing. Cleanup stops it.
//
// Routes: the driver installs none itself. It relies on charon's install_routes: for every
// installed CHILD_SA charon puts a route to each remote traffic selector into table 220 (looked
// up by the rule "from all lookup 220", priority 220, which charon adds): via ipsec0 with
// libipsec, via the underlay with kernel xfrm; with a source address inside the local traffic
// selector when the node holds one (so traffic the gateway itself originates matches the
// CHILD_SA, the same reasoning as the wireguard driver's route src); with the MTU and advmss of
// kernel-netlink's mtu and mss settings, which the driver computes for the ESP overhead. When
// the CHILD_SA goes, charon removes its routes; when charon stops (Cleanup), ipsec0, the rule and
// all routes go with it. kernel-libipsec refuses a CHILD_SA whose local traffic selector holds no
// node address, so with it the driver gives the node one (tsaddr.go).
//
// Pre-shared keys (RemoteEndpoint.PreSharedKey) reach charon only in the VICI load-shared
// message. They are never written to a file, passed in an environment variable or logged; the
// driver keeps a copy in memory to load them again into a restarted charon. A key is loaded under
// an id that binds it to the connection's configuration without revealing it (keyID), which is
// how a restarted agent knows what the charon it adopted holds.
//
// Assumption, as for the wireguard driver: the agent process runs inside the node's network
// namespace.
//
// Goroutines: the driver runs the keeper (keeper.go) and, with its own charon, the supervisor and
// the log follower (charon.go); all live under a context that Close and Cleanup cancel, and both
// wait for them.
//
// Files: settings.go validates settings and options; plan.go decides (pure); apply.go talks to
// charon over VICI (vici.go) and to the host; status.go judges what charon reports; store.go is
// the in-memory record of the loaded connections; conf.go renders strongswan.conf; charon.go
// starts, adopts, supervises and stops our charon, adopt.go decides on adoption (pure); probe.go
// probes the kernel for ESP.
package ipsec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// Files under StateDir/ipsec.
const (
	confFile   = "strongswan.conf"
	socketFile = "charon.vici"
)

// libipsecDevice is the TUN device kernel-libipsec creates.
const libipsecDevice = "ipsec0"

// charonTable is the routing table (and rule priority) charon installs its routes in by default.
const charonTable = 220

func init() {
	cable.Register(cable.Registration{Name: Name, New: cable.Constructor(NewDriver)})
}

// Driver is the ipsec cable driver. Its methods are safe for concurrent use.
type Driver struct {
	node cable.LocalNode
	cfg  config
	dir  string // StateDir/ipsec
	log  *slog.Logger
	now  func() time.Time
	// dial is the VICI client of the socket at path (socketClient; tests use a fake).
	dial func(path string) viciClient

	mu          sync.Mutex
	initialised bool
	libipsec    bool
	mtu         int
	// underlayLink is the name of the link holding the advertise address ("" when none does).
	underlayLink string
	client       viciClient
	// charon is our charon, nil with a system charon. It is written with mu held, and is atomic
	// so that Helpers and CharonPID can read it without waiting for mu (helper.go).
	charon atomic.Pointer[charonProcess]
	conns  map[string]*loadedConn
	// stop cancels the context the keeper and our charon's supervisor run under; wg waits for
	// the keeper (charon.stop for the supervisor). kickKeeper makes the keeper look at once.
	stop       context.CancelFunc
	wg         sync.WaitGroup
	kickKeeper chan struct{}

	connLoads, sharedLoads, unloads, terminates, initiates, adoptions atomic.Uint64

	// tsAddrErr is the last error keepTSAddresses logged, so a lasting failure is logged once.
	tsAddrErr string
	// tsAdded are the traffic-selector addresses this driver put in place (tsaddr_host.go): one
	// missing later was deleted by someone else, which the driver logs as a warning.
	tsAdded map[netip.Addr]bool

	// transport is set when another driver embeds this one for transport-mode connections
	// (NewEmbedded); nil for the ipsec driver itself.
	transport *Transport
}

// Transport makes an embedded driver's connections transport mode between the two gateways'
// underlay addresses, protecting only one protocol's traffic between them (cable/vxlanipsec:
// UDP from the local VXLAN port to the remote's). Such a driver installs no routes (charon's
// install_routes is off: transport mode needs none), never uses kernel-libipsec (it has no
// transport mode) and sends ESP without UDP encapsulation.
type Transport struct {
	// Name replaces "ipsec" in the state directory (StateDir/<Name>) and the logs, so the
	// embedding driver's charon is its own.
	Name string
	// Proto is the IP protocol of the traffic selectors, e.g. "udp".
	Proto string
}

// TransportPorts are the ports of one transport-mode connection's traffic selectors: Local on
// this gateway's underlay address, Remote on the remote's.
type TransportPorts struct {
	Local, Remote uint16
}

// NewEmbedded builds a driver for another driver's transport-mode connections (see Transport),
// with its own charon under StateDir/<t.Name>. It is not registered; Connect refuses, the
// embedding driver calls ConnectTransport. settings are this package's (port, nattPort, charon,
// mtu); datapath is forced to kernel.
func NewEmbedded(node cable.LocalNode, settings cable.Settings, t Transport) (*Driver, error) {
	if t.Name == "" || t.Proto == "" {
		return nil, fmt.Errorf("ipsec: embedded transport driver without a name or protocol (%+v)", t)
	}
	d, err := NewDriver(node, settings)
	if err != nil {
		return nil, err
	}
	if d.cfg.SystemVICI != "" {
		return nil, fmt.Errorf("%s: a system charon cannot be used for transport-mode connections", t.Name)
	}
	d.cfg.Datapath = DatapathKernel
	d.transport = &t
	d.dir = filepath.Join(node.StateDir, t.Name)
	d.log = node.Logger(t.Name).With("component", "ipsec")
	return d, nil
}

// Stats counts the changes the driver made to charon since New. A Connect that finds everything
// in place leaves them unchanged; tests use this to prove idempotence.
type Stats struct {
	// ConnLoads counts load-conn requests.
	ConnLoads uint64
	// SharedLoads counts load-shared requests.
	SharedLoads uint64
	// Unloads counts unload-conn and unload-shared requests.
	Unloads uint64
	// Terminates counts terminate requests.
	Terminates uint64
	// CharonStarts counts launches of our own charon, restarts included (adoptions are none).
	CharonStarts uint64
	// CharonAdoptions counts the times Init adopted a running charon an earlier run left.
	CharonAdoptions uint64
	// Initiates counts the keeper's initiate requests (not changes of configuration: the keeper
	// runs on its own clock, so idempotence checks leave it out).
	Initiates uint64
}

// NewDriver validates settings and builds the driver; it touches nothing until Init. It returns
// the concrete type for callers (tests, tools) that want Stats or Datapath; the registry builds
// through cable.Constructor(NewDriver).
func NewDriver(node cable.LocalNode, settings cable.Settings) (*Driver, error) {
	cfg, err := parseSettings(settings)
	if err != nil {
		return nil, err
	}
	if node.StateDir == "" {
		return nil, fmt.Errorf("ipsec: local node %s/%s has an empty StateDir", node.Cluster, node.Node)
	}
	return &Driver{
		node:  node,
		cfg:   cfg,
		dir:   filepath.Join(node.StateDir, Name),
		log:   node.Logger(Name),
		now:   time.Now,
		dial:  func(path string) viciClient { return socketClient{path: path} },
		conns: map[string]*loadedConn{},
	}, nil
}

func (d *Driver) Name() string { return Name }

// Stats returns the change counters.
func (d *Driver) Stats() Stats {
	s := Stats{
		ConnLoads:   d.connLoads.Load(),
		SharedLoads: d.sharedLoads.Load(),
		Unloads:     d.unloads.Load(),
		Terminates:  d.terminates.Load(),
		Initiates:   d.initiates.Load(),

		CharonAdoptions: d.adoptions.Load(),
	}
	if p := d.charon.Load(); p != nil {
		s.CharonStarts = uint64(p.Starts())
	}
	return s
}

// Datapath is DatapathLibipsec or DatapathKernel after Init ("" before).
func (d *Driver) Datapath() Datapath {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return ""
	}
	return d.datapathLocked()
}

func (d *Driver) datapathLocked() Datapath {
	if d.libipsec {
		return DatapathLibipsec
	}
	return DatapathKernel
}

// ViciSocket is the path of the vici socket the driver talks to.
func (d *Driver) ViciSocket() string {
	if d.cfg.SystemVICI != "" {
		return d.cfg.SystemVICI
	}
	return filepath.Join(d.dir, socketFile)
}

// CharonPID is the pid of our own charon, 0 when none runs (or with a system charon, or after
// Close). It does not wait for d.mu (see Helpers).
func (d *Driver) CharonPID() int {
	if p := d.charon.Load(); p != nil {
		return p.PID()
	}
	return 0
}

// MTU is the tunnel MTU (valid after Init).
func (d *Driver) MTU() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mtu
}

// Init decides the datapath and adopts the charon an earlier run left running or starts a new one
// (or checks that the system charon answers), then starts the keeper.
func (d *Driver) Init(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.initialised {
		return nil
	}
	life, stop := context.WithCancel(context.Background())
	var err error
	if d.cfg.SystemVICI != "" {
		err = d.initSystem(ctx)
	} else {
		err = d.initOwn(ctx, life)
	}
	if err != nil {
		stop()
		return fmt.Errorf("ipsec init: %w", err)
	}
	d.initialised, d.stop = true, stop
	d.startKeeper(life)
	return nil
}

// LocalEndpoint is the IKE port to publish. A system charon's is not ours to know: remote ends
// use the IKE standard port, DefaultPort.
func (d *Driver) LocalEndpoint() cable.LocalEndpoint {
	if d.cfg.SystemVICI != "" {
		return cable.LocalEndpoint{Port: DefaultPort}
	}
	return cable.LocalEndpoint{Port: uint16(d.cfg.Port)}
}

// Links is kernel-libipsec's TUN device when ESP runs in charon. With kernel ESP the tunnelled
// packets leave through the underlay link, their route being the xfrm bundle whose MTU is the
// tunnel's: the MSS clamp on that link (`rt mtu`) lowers their MSS to the tunnel's and leaves
// every other SYN leaving there as it is (the route MTU of plain traffic is the link's, and the
// clamp only ever lowers).
func (d *Driver) Links() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case !d.initialised:
		return nil
	case d.libipsec:
		return []string{libipsecDevice}
	case d.underlayLink != "":
		return []string{d.underlayLink}
	}
	return nil
}

// Connect makes charon hold the connection and the key for remote.Cluster. It reads first (the
// loaded connection from list-conns, the key ids from get-shared) and changes nothing when
// everything already matches.
func (d *Driver) Connect(ctx context.Context, remote cable.RemoteEndpoint, opts cable.Options) error {
	if d.transport != nil {
		return fmt.Errorf("ipsec connect to cluster %s: this driver is embedded by %s for transport mode (ConnectTransport)", remote.Cluster, d.transport.Name)
	}
	o, err := parseOptions(opts)
	if err != nil {
		return err
	}
	want, err := desiredFromRemote(d.node, remote, o)
	if err != nil {
		return err
	}
	return d.connectWant(ctx, want, remote.PreSharedKey)
}

// ConnectTransport is Connect for an embedded driver (NewEmbedded): a transport-mode connection
// between the two underlay addresses whose traffic selectors are the Transport protocol on
// ports. ESP goes without UDP encapsulation (opts may not set encap).
func (d *Driver) ConnectTransport(ctx context.Context, remote cable.RemoteEndpoint, opts cable.Options, ports TransportPorts) error {
	if d.transport == nil {
		return fmt.Errorf("ipsec connect to cluster %s: transport mode needs an embedded driver (NewEmbedded)", remote.Cluster)
	}
	if _, ok := opts[optEncap]; ok {
		return fmt.Errorf("%s option %s=%q: not taken (transport-mode ESP goes without UDP encapsulation)", d.transport.Name, optEncap, opts[optEncap])
	}
	o, err := parseOptions(opts)
	if err != nil {
		return err
	}
	o.Encap = false
	want, err := desiredTransport(d.node, remote, o, d.transport.Proto, ports)
	if err != nil {
		return err
	}
	return d.connectWant(ctx, want, remote.PreSharedKey)
}

func (d *Driver) connectWant(ctx context.Context, want desiredConn, psk []byte) error {
	where := "ipsec connect to cluster " + want.Cluster
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return cable.NotInitialised(where)
	}
	if err := checkConflicts(want, d.libipsec, d.conns); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	// Before charon holds the connection: it installs the CHILD_SA's routes as soon as the IKE
	// exchange ends, and refuses the CHILD_SA if a local subnet has no address then.
	if err := d.ensureTSAddresses(want); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if err := d.connect(ctx, want, psk); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// Disconnect removes the connection to cluster, its SAs (charon then removes its routes) and its
// key. An unknown cluster is no error.
func (d *Driver) Disconnect(ctx context.Context, cluster string) error {
	if err := validClusterName(cluster); err != nil {
		return fmt.Errorf("ipsec disconnect: cluster %q: %w", cluster, err)
	}
	where := "ipsec disconnect cluster " + cluster
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.initialised {
		return cable.NotInitialised(where)
	}
	if err := d.remove(ctx, ConnName(cluster)); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	// The connection's local subnets may need no address any more; a failure here leaves an
	// address behind, which harms nothing, and the keeper tries again.
	d.keepTSAddresses()
	return nil
}

// Connections reports one entry per connection of ours, with its state from list-sas.
func (d *Driver) Connections(ctx context.Context) ([]cable.ConnectionStatus, error) {
	if err := d.lock(ctx); err != nil {
		return nil, fmt.Errorf("ipsec connections: %w", err)
	}
	defer d.mu.Unlock()
	if !d.initialised {
		return nil, cable.NotInitialised("ipsec connections")
	}
	names, err := d.ourConns(ctx)
	if err != nil {
		return nil, fmt.Errorf("ipsec connections: %w", err)
	}
	evs, err := d.client.stream(ctx, "list-sas", "list-sa", map[string]any{"noblock": "yes"})
	if err != nil {
		return nil, fmt.Errorf("ipsec connections: list SAs: %w", err)
	}
	known := make(map[string]connInfo, len(d.conns))
	for name, c := range d.conns {
		known[name] = connInfo{
			Cluster:   c.want.Cluster,
			Node:      c.want.Node,
			Endpoint:  netip.AddrPortFrom(c.want.RemoteAddr, c.want.RemotePort).String(),
			Subnets:   c.want.RemoteTS,
			Initiator: c.want.Initiator,
			LoadedAt:  c.loadedAt,
		}
	}
	var foreign []string
	for _, n := range names {
		if _, ok := known[n]; !ok {
			foreign = append(foreign, n)
		}
	}
	return connectionStatuses(known, foreign, parseSAs(evs), d.now(), d.mtu), nil
}

// Cleanup removes every connection, SA and key of ours from charon; stops the keeper and our own
// charon (which takes ipsec0, its routes and its rule with it), also one an earlier run left when
// this driver never initialised, and removes StateDir/ipsec. With a system charon only our
// connections and keys go.
func (d *Driver) Cleanup(ctx context.Context) error {
	d.mu.Lock()
	var errs []error
	if d.initialised {
		errs = append(errs, d.removeAll(ctx))
	}
	stop, p := d.release()
	d.mu.Unlock()

	d.wait(stop, p)
	if d.cfg.SystemVICI == "" {
		errs = append(errs, d.stopOwnCharon())
		if d.transport == nil {
			// ipsec0 and the rule to table 220 are the ipsec driver's; an embedded driver's
			// charon makes neither, and must not remove the ipsec driver's.
			errs = append(errs, removeHostLeftovers(), d.removeTSDevice("cleanup"))
		}
		errs = append(errs, removeStateDir(d.dir))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ipsec cleanup: %w", err)
	}
	d.log.Info("cleaned up")
	return nil
}

// StopProcesses ends our charon, which Close leaves running (cable.ProcessOwner): for a next
// agent that cannot adopt it. A system charon (useSystemCharon) is not ours to stop.
func (d *Driver) StopProcesses(ctx context.Context) error {
	if d.cfg.SystemVICI != "" {
		return nil
	}
	if err := d.stopOwnCharon(); err != nil {
		return fmt.Errorf("ipsec: stop charon for the next agent: %w", err)
	}
	return nil
}

// Close stops the driver's goroutines (the keeper, our charon's supervisor and log follower) and
// forgets what it holds in memory, and changes nothing in charon or on the host: our charon keeps
// running with its connections, SAs, ipsec0 and routes, as a system charon does, so the tunnels
// outlive an agent restart. The next Init adopts it, and the agent's Connects find everything in
// place.
func (d *Driver) Close() error {
	d.mu.Lock()
	stop, p := d.release()
	d.forgetAll()
	d.mu.Unlock()
	d.wait(stop, p)
	return nil
}

// release marks the driver not initialised and hands over what runs in this process for wait to
// stop. Called with d.mu held.
func (d *Driver) release() (context.CancelFunc, *charonProcess) {
	stop, p := d.stop, d.charon.Swap(nil)
	d.initialised, d.stop, d.client, d.kickKeeper = false, nil, nil, nil
	return stop, p
}

// wait stops the keeper and the charon supervisor that release handed over and waits for them;
// charon itself keeps running. Called without d.mu: the supervisor may be waiting for it in
// replay, the keeper in keep.
func (d *Driver) wait(stop context.CancelFunc, p *charonProcess) {
	if stop != nil {
		stop()
	}
	d.wg.Wait()
	if p != nil {
		p.detach()
	}
}
