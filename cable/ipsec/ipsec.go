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
// Routes: the driver installs none itself. It relies on charon's install_routes: for every
// installed CHILD_SA charon puts a route to each remote traffic selector into table 220 (looked
// up by the rule "from all lookup 220", priority 220, which charon adds): via ipsec0 with
// libipsec, via the underlay with kernel xfrm; with a source address inside the local traffic
// selector when the node holds one (so traffic the gateway itself originates matches the
// CHILD_SA, the same reasoning as the wireguard driver's route src); with the MTU and advmss of
// kernel-netlink's mtu and mss settings, which the driver computes for the ESP overhead. When
// the CHILD_SA goes, charon removes its routes; when charon stops, ipsec0, the rule and all
// routes go with it.
//
// Pre-shared keys (RemoteEndpoint.PreSharedKey) reach charon only in the VICI load-shared
// message. They are never written to a file, passed in an environment variable or logged; the
// driver keeps a copy in memory to load them again into a restarted charon.
//
// Assumption, as for the wireguard driver: the agent process runs inside the node's network
// namespace.
package ipsec

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/route"
	"github.com/cablemesh/cablemesh/internal/statefile"
)

// Name is the registry key of this driver.
const Name = "ipsec"

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

// Driver is the ipsec cable driver. Its methods are safe for concurrent use.
type Driver struct {
	node cable.LocalNode
	cfg  config
	dir  string // StateDir/ipsec
	log  *slog.Logger
	now  func() time.Time

	mu       sync.Mutex
	inited   bool
	libipsec bool
	mtu      int
	client   viciClient
	charon   *charonProcess // nil with a system charon
	conns    map[string]*loadedConn
	// keeper re-initiates connections of which this node is the initiator and that have no
	// IKE_SA (see keep); kickKeeper makes it look at once (after a load); stopKeeper ends it.
	stopKeeper context.CancelFunc
	keeperDone chan struct{}
	kickKeeper chan struct{}

	connLoads, sharedLoads, unloads, terminates, initiates atomic.Uint64
}

// loadedConn is a connection this driver loaded into charon.
type loadedConn struct {
	want        desiredConn
	fingerprint string
	psk         []byte // kept to load it again into a restarted charon; never logged
	digest      [32]byte
	loadedAt    time.Time
	// The keeper's schedule for this connection (see keep): next initiate not before
	// nextInitiate; initBackoff is the wait after the last initiate (nextInitBackoff); up says
	// the keeper last saw an established IKE_SA.
	nextInitiate time.Time
	initBackoff  time.Duration
	up           bool
}

// scheduleAfterLoad sets the keeper's schedule for a connection charon has just loaded: charon's
// start_action sends the first IKE_SA_INIT at once, and if the peer refuses it (it has not loaded
// its side yet) the keeper initiates again firstInitRetry later, then backs off.
func (c *loadedConn) scheduleAfterLoad(now time.Time) {
	c.nextInitiate, c.initBackoff, c.up = now.Add(firstInitRetry), 0, false
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
	// CharonStarts counts launches of our own charon, restarts included.
	CharonStarts uint64
	// Initiates counts the keeper's initiate requests (not changes of configuration: the keeper
	// runs on its own clock, so idempotence checks leave it out).
	Initiates uint64
}

// New validates settings and builds the driver; it touches nothing until Init.
func New(node cable.LocalNode, settings cable.Settings) (cable.Driver, error) {
	return NewDriver(node, settings)
}

// NewDriver is New with the concrete type, for callers (tests, tools) that want Stats or Datapath.
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
		log:   slog.Default().With("driver", Name),
		now:   time.Now,
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
	}
	d.mu.Lock()
	if d.charon != nil {
		s.CharonStarts = uint64(d.charon.Starts())
	}
	d.mu.Unlock()
	return s
}

// Datapath is DatapathLibipsec or DatapathKernel after Init ("" before).
func (d *Driver) Datapath() Datapath {
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case !d.inited:
		return ""
	case d.libipsec:
		return DatapathLibipsec
	default:
		return DatapathKernel
	}
}

// ViciSocket is the path of the vici socket the driver talks to.
func (d *Driver) ViciSocket() string {
	if d.cfg.SystemVICI != "" {
		return d.cfg.SystemVICI
	}
	return filepath.Join(d.dir, socketFile)
}

// CharonPID is the pid of our own charon, 0 when none runs (or with a system charon).
func (d *Driver) CharonPID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.charon == nil {
		return 0
	}
	return d.charon.PID()
}

// MTU is the tunnel MTU (valid after Init).
func (d *Driver) MTU() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.mtu
}

// Init decides the datapath, writes strongswan.conf and starts charon (or checks that the
// system charon answers).
func (d *Driver) Init(ctx context.Context) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inited {
		return nil
	}
	if d.cfg.SystemVICI != "" {
		return d.initSystem(ctx)
	}
	if fi, err := os.Stat(d.cfg.Charon); err != nil || fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("ipsec init: setting %s=%q: no charon executable there (Debian: apt-get install strongswan-charon strongswan-swanctl libcharon-extra-plugins libstrongswan-standard-plugins): %v", keyCharon, d.cfg.Charon, err)
	}
	libipsec := d.cfg.Datapath == DatapathLibipsec
	if d.cfg.Datapath == DatapathAuto {
		has, err := KernelHasESP()
		if err != nil {
			d.log.Info("kernel has no usable ESP, using kernel-libipsec", "probe", err.Error())
		}
		libipsec = !has
	}
	v6 := d.node.AdvertiseAddress.Unmap().Is6()
	mtu, err := tunnelMTU(d.cfg.MTU, d.underlayMTU(), libipsec, v6, allAEAD([]string{DefaultESPProposals}))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.dir, 0o700); err != nil {
		return fmt.Errorf("ipsec init: %w", err)
	}
	// MkdirAll keeps an existing directory's mode.
	if err := os.Chmod(d.dir, 0o700); err != nil {
		return fmt.Errorf("ipsec init: %w", err)
	}
	socket := filepath.Join(d.dir, socketFile)
	if !filepath.IsAbs(socket) {
		abs, err := filepath.Abs(socket)
		if err != nil {
			return fmt.Errorf("ipsec init: %w", err)
		}
		socket = abs
	}
	conf := filepath.Join(filepath.Dir(socket), confFile)
	text := renderConf(confParams{
		Port: d.cfg.Port, NATTPort: d.cfg.NATTPort, ViciSocket: socket,
		Libipsec: libipsec, MTU: mtu, MSS: mssFor(mtu, d.node.LocalSubnets),
	})
	if err := writeFileAtomic(conf, []byte(text), 0o600); err != nil {
		return fmt.Errorf("ipsec init: %w", err)
	}
	p := &charonProcess{
		binary: d.cfg.Charon,
		conf:   conf,
		socket: socket,
		log:    d.log.With("component", "charon"),
	}
	p.onStart = func(ctx context.Context, restart bool) { d.replay(ctx, p) }
	if err := p.start(ctx); err != nil {
		return fmt.Errorf("ipsec init: %w", err)
	}
	d.charon, d.client, d.libipsec, d.mtu = p, socketClient{path: socket}, libipsec, mtu
	version, err := d.client.call(ctx, "version", nil)
	if err != nil {
		d.charon = nil
		p.stop()
		return fmt.Errorf("ipsec init: %w", err)
	}
	d.inited = true
	d.startKeeper()
	d.log.Info("ipsec ready", "charon", str(version["daemon"])+" "+str(version["version"]),
		"datapath", d.datapathLocked(), "port", d.cfg.Port, "natt_port", d.cfg.NATTPort, "mtu", mtu)
	return nil
}

func (d *Driver) datapathLocked() Datapath {
	if d.libipsec {
		return DatapathLibipsec
	}
	return DatapathKernel
}

func (d *Driver) initSystem(ctx context.Context) error {
	d.client = socketClient{path: d.cfg.SystemVICI}
	version, err := d.client.call(ctx, "version", nil)
	if err != nil {
		return fmt.Errorf("ipsec init: system charon at %s=%q: %w", keyUseSystemCharon, d.cfg.SystemVICI, err)
	}
	// The system charon's own configuration decides the datapath and the route MTU; we can only
	// observe the first.
	_, err = netlink.LinkByName(libipsecDevice)
	d.libipsec = err == nil
	d.mtu, _ = tunnelMTU(d.cfg.MTU, d.underlayMTU(), d.libipsec, d.node.AdvertiseAddress.Unmap().Is6(), true)
	d.inited = true
	d.startKeeper()
	d.log.Info("ipsec ready with the system charon", "vici", d.cfg.SystemVICI,
		"charon", str(version["daemon"])+" "+str(version["version"]), "datapath", d.datapathLocked())
	return nil
}

// underlayMTU is the MTU of the link holding the advertise address, or a common default.
func (d *Driver) underlayMTU() int {
	if !d.node.AdvertiseAddress.IsValid() {
		return fallbackUnderlayMTU
	}
	_, mtu, found, err := route.UnderlayLink(d.node.AdvertiseAddress)
	if err != nil {
		d.log.Warn("find the underlay link for its MTU", "error", err)
		return fallbackUnderlayMTU
	}
	if !found {
		d.log.Warn("advertise address is on no local link, assuming underlay MTU", "address", d.node.AdvertiseAddress, "mtu", fallbackUnderlayMTU)
		return fallbackUnderlayMTU
	}
	return mtu
}

// LocalEndpoint is the IKE port to publish.
func (d *Driver) LocalEndpoint() cable.LocalEndpoint {
	return cable.LocalEndpoint{Port: uint16(d.cfg.Port)}
}

// Connect makes charon hold the connection and the key for remote.Cluster. It reads first (the
// loaded connection from list-conns, the key ids from get-shared) and changes nothing when
// everything already matches.
func (d *Driver) Connect(ctx context.Context, remote cable.RemoteEndpoint, opts cable.Options) error {
	o, err := parseOptions(opts)
	if err != nil {
		return err
	}
	want, err := desiredFromRemote(d.node, remote, o)
	if err != nil {
		return err
	}
	where := "ipsec connect to cluster " + want.Cluster
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.inited {
		return fmt.Errorf("%s: driver not initialised", where)
	}
	if d.libipsec && !o.Encap {
		return fmt.Errorf("%s: option %s=false: kernel-libipsec sends ESP only in UDP (encap must be true here)", where, optEncap)
	}
	for name, c := range d.conns {
		if name == want.Name {
			continue
		}
		for _, r := range want.RemoteTS {
			for _, theirs := range c.want.RemoteTS {
				if r.Overlaps(theirs) {
					return fmt.Errorf("%s: subnet %s overlaps %s of cluster %s", where, r, theirs, c.want.Cluster)
				}
			}
		}
	}
	msg := connMessage(want)
	fp := fingerprint(msg)
	digest := pskDigest(remote.PreSharedKey)
	log := d.log.With("cluster", want.Cluster, "node", want.Node, "peer", want.RemoteAddr.String())

	// Observe.
	loaded, err := d.listConn(ctx, want.Name)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	ids, err := d.sharedIDs(ctx)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	old := d.conns[want.Name]
	connOK := loaded != nil && old != nil && old.fingerprint == fp && loadedMatches(loaded, want)
	keyOK := old != nil && old.digest == digest && slices.Contains(ids, want.Name)
	if connOK && keyOK {
		return nil
	}

	// Apply: the key first, so an initiating connection finds it.
	if !keyOK {
		if err := d.loadShared(ctx, want, remote.PreSharedKey); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		log.Info("pre-shared key loaded", "id", want.Name)
	}
	keyChanged := old != nil && old.digest != digest
	if !connOK || keyChanged {
		// A changed connection: established SAs keep the old selectors (or the old key's
		// authentication), so take them down and load afresh; the initiator's start_action
		// brings the new one up. A connection charon holds as we want it but that this process
		// did not load (an agent restart with a system charon) is loaded again on top, which
		// charon treats as no change: its SAs stay up.
		changed := loaded != nil && (keyChanged || !loadedMatches(loaded, want) || (old != nil && old.fingerprint != fp))
		if changed {
			if err := d.unloadConn(ctx, want.Name); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			if err := d.terminate(ctx, want.Name); err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
		}
		d.connLoads.Add(1)
		if _, err := d.client.call(ctx, "load-conn", msg); err != nil {
			return fmt.Errorf("%s: %w", where, err)
		}
		// Read back: charon may have parsed something differently than we meant.
		loaded, err = d.listConn(ctx, want.Name)
		if err != nil {
			return fmt.Errorf("%s: read back: %w", where, err)
		}
		if loaded == nil || !loadedMatches(loaded, want) {
			return fmt.Errorf("%s: charon did not keep the connection %s as loaded (list-conns shows %v)", where, want.Name, loaded)
		}
		log.Info("connection loaded", "name", want.Name, "initiator", want.Initiator,
			"local_ts", want.LocalTS, "remote_ts", want.RemoteTS, "remote_port", want.RemotePort)
	}
	lc := &loadedConn{want: want, fingerprint: fp, psk: slices.Clone(remote.PreSharedKey), digest: digest, loadedAt: d.now()}
	if old != nil && connOK && !keyChanged {
		// Only the key was loaded again: the connection and its SAs stay, and so does the
		// keeper's schedule.
		lc.loadedAt = old.loadedAt
		lc.nextInitiate, lc.initBackoff, lc.up = old.nextInitiate, old.initBackoff, old.up
	} else {
		lc.scheduleAfterLoad(d.now())
		if want.Initiator {
			d.kick()
		}
	}
	if old != nil {
		clear(old.psk)
	}
	d.conns[want.Name] = lc
	return nil
}

func (d *Driver) loadShared(ctx context.Context, want desiredConn, psk []byte) error {
	d.sharedLoads.Add(1)
	if _, err := d.client.call(ctx, "load-shared", sharedMessage(want, psk)); err != nil {
		// The error comes from charon and names no secret; it is safe to wrap.
		return fmt.Errorf("load shared key %s: %w", want.Name, err)
	}
	return nil
}

func (d *Driver) unloadConn(ctx context.Context, name string) error {
	d.unloads.Add(1)
	if _, err := d.client.call(ctx, "unload-conn", map[string]any{"name": name}); err != nil {
		return fmt.Errorf("unload connection %s: %w", name, err)
	}
	return nil
}

// terminate deletes the IKE_SAs (and their CHILD_SAs) of the connection name, if any, without
// waiting for the peer to answer (force): the peer may be gone.
func (d *Driver) terminate(ctx context.Context, name string) error {
	sas, err := d.client.stream(ctx, "list-sas", "list-sa", map[string]any{"ike": name, "noblock": "yes"})
	if err != nil {
		return fmt.Errorf("list SAs of %s: %w", name, err)
	}
	if len(parseSAs(sas)[name]) == 0 {
		return nil
	}
	d.terminates.Add(1)
	_, err = d.client.stream(ctx, "terminate", "control-log", map[string]any{"ike": name, "force": "yes", "timeout": "5000"})
	if err != nil && !strings.Contains(err.Error(), "no matching SAs") {
		return fmt.Errorf("terminate SAs of %s: %w", name, err)
	}
	return nil
}

// listConn returns the list-conns section of the connection name, nil when charon has none.
func (d *Driver) listConn(ctx context.Context, name string) (map[string]any, error) {
	evs, err := d.client.stream(ctx, "list-conns", "list-conn", map[string]any{"ike": name})
	if err != nil {
		return nil, fmt.Errorf("list connection %s: %w", name, err)
	}
	for _, ev := range evs {
		if sec, ok := ev[name].(map[string]any); ok {
			return sec, nil
		}
	}
	return nil, nil
}

// ourConns lists the names of every connection of ours (ConnPrefix) charon holds.
func (d *Driver) ourConns(ctx context.Context) ([]string, error) {
	evs, err := d.client.stream(ctx, "list-conns", "list-conn", nil)
	if err != nil {
		return nil, fmt.Errorf("list connections: %w", err)
	}
	var out []string
	for _, ev := range evs {
		for name := range ev {
			if clusterFromConn(name) != "" {
				out = append(out, name)
			}
		}
	}
	slices.Sort(out)
	return out, nil
}

// sharedIDs lists the ids of the shared keys loaded over VICI (the keys themselves are never
// returned by charon).
func (d *Driver) sharedIDs(ctx context.Context) ([]string, error) {
	resp, err := d.client.call(ctx, "get-shared", nil)
	if err != nil {
		return nil, fmt.Errorf("list shared key ids: %w", err)
	}
	return listOf(resp["keys"]), nil
}

// replay loads every connection and key again into a restarted charon. It runs on the
// supervisor's goroutine.
func (d *Driver) replay(ctx context.Context, p *charonProcess) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.charon != p {
		return // Cleanup or Close is stopping this charon
	}
	for name, c := range d.conns {
		if err := d.loadShared(ctx, c.want, c.psk); err != nil {
			d.log.Error("reload after charon restart", "cluster", c.want.Cluster, "error", err)
			continue
		}
		d.connLoads.Add(1)
		if _, err := d.client.call(ctx, "load-conn", connMessage(c.want)); err != nil {
			d.log.Error("reload after charon restart", "cluster", c.want.Cluster, "error", err)
			continue
		}
		c.loadedAt = d.now()
		c.scheduleAfterLoad(c.loadedAt)
		d.log.Info("connection reloaded after charon restart", "cluster", c.want.Cluster, "name", name)
	}
	d.kick()
}

// The keeper's clock. keepEvery is its period while every connection it watches is established
// (or charon is still working on one): it bounds how late the keeper notices that the peer
// deleted an IKE_SA (a restarting responder), and a list-sas over a unix socket each second costs
// next to nothing. firstInitRetry is the wait after a connection is loaded or
// after the first initiate of a series, doubling per initiate up to maxInitBackoff, so a peer
// that has not loaded its side yet is asked again within a fraction of a second, and one that
// refuses for good is not asked every few seconds forever. lossGrace is how long the keeper
// waits before initiating again when an established IKE_SA has gone: the peer deleted it, most
// likely because its agent is removing this connection, and ours is about to do the same.
const (
	keepEvery      = time.Second
	firstInitRetry = 200 * time.Millisecond
	maxInitBackoff = time.Minute
	lossGrace      = time.Second
	// minKeepWait keeps a misbehaving schedule from spinning the keeper.
	minKeepWait = 10 * time.Millisecond
	// keeperErrorWait is the keeper's period while charon does not answer.
	keeperErrorWait = 5 * time.Second
)

// nextInitBackoff is the wait after an initiate, given the wait after the one before (0 for the
// first initiate of a series): firstInitRetry, then doubling, capped at maxInitBackoff.
func nextInitBackoff(prev time.Duration) time.Duration {
	if prev <= 0 {
		return firstInitRetry
	}
	return min(2*prev, maxInitBackoff)
}

// startKeeper starts the keeper goroutine; the driver owns it and stops it in Cleanup and Close.
// It runs keep when keep asked to be run again, and at once when kicked (a connection was
// loaded).
func (d *Driver) startKeeper() {
	ctx, cancel := context.WithCancel(context.Background())
	d.stopKeeper, d.keeperDone, d.kickKeeper = cancel, make(chan struct{}), make(chan struct{}, 1)
	kick, done := d.kickKeeper, d.keeperDone
	go func() {
		defer close(done)
		t := time.NewTimer(keepEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-kick:
			}
			t.Reset(d.keep(ctx))
		}
	}()
}

// kick makes the keeper look at its connections now. Called with d.mu held; never blocks.
func (d *Driver) kick() {
	if d.kickKeeper == nil {
		return
	}
	select {
	case d.kickKeeper <- struct{}{}:
	default:
	}
}

// keep initiates every connection this node initiates that has no IKE_SA at all, and returns
// how long to wait before the next look. charon's start_action only fires when a connection is
// loaded, and a definitive answer from the peer (NO_PROPOSAL_CHOSEN while the peer has not
// loaded its side yet, AUTHENTICATION_FAILED while its key is not there yet) destroys the IKE_SA
// and ends the attempt for good even with keyingtries 0. So an absent IKE_SA is the sign of
// such a failure: this is read from list-sas, a level rather than an event, so nothing is
// missed across a charon restart or a dropped event subscription. A connecting IKE_SA is left
// alone (charon retransmits to a silent peer itself) and looked at again soon. The initiate is
// asynchronous (timeout -1): charon reports the outcome in list-sas.
func (d *Driver) keep(ctx context.Context) time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.inited {
		return keepEvery
	}
	wait := keepEvery
	initiator := false
	for _, c := range d.conns {
		initiator = initiator || c.want.Initiator
	}
	if !initiator {
		return wait
	}
	evs, err := d.client.stream(ctx, "list-sas", "list-sa", map[string]any{"noblock": "yes"})
	if err != nil {
		// charon is down or restarting: its supervisor's replay kicks the keeper once the new
		// one holds the connections again, so look less often meanwhile.
		d.log.Warn("keeper: list SAs", "error", err)
		return keeperErrorWait
	}
	sas := parseSAs(evs)
	now := d.now()
	for name, c := range d.conns {
		if !c.want.Initiator {
			continue
		}
		due := keepAction(c, sas[name], now)
		if due.initiate {
			d.initiates.Add(1)
			if _, err := d.client.stream(ctx, "initiate", "control-log", map[string]any{"child": name, "ike": name, "timeout": "-1"}); err != nil {
				d.log.Warn("keeper: initiate", "cluster", c.want.Cluster, "error", err)
			}
		}
		wait = min(wait, max(due.after, minKeepWait))
	}
	return wait
}

// keepDecision is what keepAction decided for one connection.
type keepDecision struct {
	initiate bool          // send an initiate now
	after    time.Duration // look at the connection again after this
}

// keepAction updates c's schedule from the IKE_SAs charon holds for it at now and decides
// whether to initiate. Pure, so the schedule is table-tested.
func keepAction(c *loadedConn, sas []ikeSA, now time.Time) keepDecision {
	established := slices.ContainsFunc(sas, func(sa ikeSA) bool { return slices.Contains(ikeUsable, sa.State) })
	switch {
	case established:
		c.up, c.initBackoff, c.nextInitiate = true, 0, time.Time{}
		return keepDecision{after: keepEvery}
	case len(sas) > 0:
		// Connecting (or being deleted): charon is at work; look again as soon as a refusal
		// could have ended it.
		return keepDecision{after: min(max(c.initBackoff, firstInitRetry), keepEvery)}
	case c.up:
		// An established IKE_SA went: the peer deleted it. Give our own agent lossGrace to
		// remove the connection too before asking the peer again.
		c.up, c.initBackoff, c.nextInitiate = false, 0, now.Add(lossGrace)
		return keepDecision{after: lossGrace}
	case now.Before(c.nextInitiate):
		return keepDecision{after: c.nextInitiate.Sub(now)}
	}
	c.initBackoff = nextInitBackoff(c.initBackoff)
	c.nextInitiate = now.Add(c.initBackoff)
	// Look again soon whatever the backoff: to see the outcome (a refusal comes within a round
	// trip), and above all to see the IKE_SA established, so that a later delete by the peer is
	// taken for what it is (lossGrace) and not for one more refusal.
	return keepDecision{initiate: true, after: firstInitRetry}
}

// Disconnect removes the connection to cluster, its SAs (charon then removes its routes) and its
// key. An unknown cluster is no error.
func (d *Driver) Disconnect(ctx context.Context, cluster string) error {
	if err := validClusterName(cluster); err != nil {
		return fmt.Errorf("ipsec disconnect: cluster %q: %w", cluster, err)
	}
	name := ConnName(cluster)
	where := "ipsec disconnect cluster " + cluster
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.inited {
		return fmt.Errorf("%s: driver not initialised", where)
	}
	if err := d.removeLocked(ctx, name); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// removeLocked unloads the connection (so nothing restarts it), terminates its SAs, unloads its
// key and forgets it; each step only when charon still holds the thing.
func (d *Driver) removeLocked(ctx context.Context, name string) error {
	loaded, err := d.listConn(ctx, name)
	if err != nil {
		return err
	}
	if loaded != nil {
		if err := d.unloadConn(ctx, name); err != nil {
			return err
		}
	}
	if err := d.terminate(ctx, name); err != nil {
		return err
	}
	ids, err := d.sharedIDs(ctx)
	if err != nil {
		return err
	}
	if slices.Contains(ids, name) {
		d.unloads.Add(1)
		if _, err := d.client.call(ctx, "unload-shared", map[string]any{"id": name}); err != nil {
			return fmt.Errorf("unload shared key %s: %w", name, err)
		}
	}
	if c, ok := d.conns[name]; ok {
		clear(c.psk)
		delete(d.conns, name)
		d.log.Info("disconnected", "cluster", c.want.Cluster)
	}
	return nil
}

// Connections reports one entry per connection of ours, with its state from list-sas.
func (d *Driver) Connections(ctx context.Context) ([]cable.ConnectionStatus, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.inited {
		return nil, fmt.Errorf("ipsec connections: driver not initialised")
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

// Cleanup removes every connection, SA and key of ours from charon; stops our own charon (which
// takes ipsec0, its routes and its rule with it) and removes StateDir/ipsec. With a system charon
// only our connections and keys go.
func (d *Driver) Cleanup(ctx context.Context) error {
	d.mu.Lock()
	var errs []error
	if d.inited {
		names, err := d.ourConns(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for n := range d.conns {
			if !slices.Contains(names, n) {
				names = append(names, n)
			}
		}
		ids, err := d.sharedIDs(ctx)
		if err != nil {
			errs = append(errs, err)
		}
		for _, id := range ids {
			if clusterFromConn(id) != "" && !slices.Contains(names, id) {
				names = append(names, id)
			}
		}
		slices.Sort(names)
		for _, n := range names {
			if err := d.removeLocked(ctx, n); err != nil {
				errs = append(errs, err)
			}
		}
	}
	p, stopKeeper, keeperDone := d.charon, d.stopKeeper, d.keeperDone
	d.charon, d.inited, d.client, d.stopKeeper = nil, false, nil, nil
	d.mu.Unlock()

	// Outside the lock: the supervisor may be waiting for it in replay, the keeper in keep.
	if stopKeeper != nil {
		stopKeeper()
		<-keeperDone
	}
	if p != nil {
		p.stop()
	}
	if d.cfg.SystemVICI == "" {
		errs = append(errs, d.removeHostLeftovers())
		if err := os.RemoveAll(d.dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("ipsec cleanup: %w", err)
	}
	d.log.Info("cleaned up")
	return nil
}

// removeHostLeftovers removes what a charon that died without cleaning up (SIGKILL) leaves in
// this network namespace: the ipsec0 TUN device (with its routes), and charon's rule to table
// 220 once that table is empty. A charon of ours stops cleanly and leaves nothing; this is for
// the other case.
func (d *Driver) removeHostLeftovers() error {
	var errs []error
	if l, err := netlink.LinkByName(libipsecDevice); err == nil && l.Type() == "tuntap" {
		if err := netlink.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("delete %s: %w", libipsecDevice, err))
		}
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: charonTable}, netlink.RT_FILTER_TABLE)
	if err == nil && len(routes) == 0 {
		rules, err := netlink.RuleList(netlink.FAMILY_ALL)
		if err == nil {
			for _, r := range rules {
				if r.Table == charonTable && r.Priority == charonTable {
					r := r
					if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, os.ErrNotExist) {
						errs = append(errs, fmt.Errorf("delete rule to table %d: %w", charonTable, err))
					}
				}
			}
		}
	}
	return errors.Join(errs...)
}

// Links is kernel-libipsec's TUN device when ESP runs in charon; with kernel ESP the traffic
// leaves through the underlay link and there is no link of the driver's own.
func (d *Driver) Links() []string {
	if d.Datapath() == DatapathLibipsec {
		return []string{libipsecDevice}
	}
	return nil
}

// Close stops our own charon without removing connections from the configuration, as a process
// exit does: its SAs, ipsec0 and routes go with it; the next Init starts a new charon and the
// agent's reconcile connects again.
func (d *Driver) Close() error {
	d.mu.Lock()
	p, stopKeeper, keeperDone := d.charon, d.stopKeeper, d.keeperDone
	d.charon, d.inited, d.client, d.stopKeeper = nil, false, nil, nil
	for _, c := range d.conns {
		clear(c.psk)
	}
	d.conns = map[string]*loadedConn{}
	d.mu.Unlock()
	if stopKeeper != nil {
		stopKeeper()
		<-keeperDone
	}
	if p != nil {
		p.stop()
	}
	return nil
}

// writeFileAtomic writes data to path through a temporary file in the same directory.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := statefile.WriteAtomic(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
