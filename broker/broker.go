// Package broker is the Cablemesh broker: it holds the mesh's shared state (clusters, gateway
// endpoints, connection policies, service exports and their clusterset VIPs) in a Store, issues
// join tokens and agent certificates from the mesh CA, derives each cluster pair's pre-shared key
// from the mesh secret, merges exports into service imports once per revision for every watcher,
// and serves the Admin and Agent gRPC services over one mTLS listener.
package broker

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/keepalive"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// maxSnapshotSends is how many watch snapshots the broker sends at once (see agentService.Watch).
// A snapshot's parts are shared between its watchers (watchsnapshot.go), so a send holds little
// of its own; what it holds is its place until its agent has read the snapshot, which a slow
// agent takes long to do: 32 slots let 2,600 agents of a fleet of 5,100 wait for one.
const maxSnapshotSends = 256

// maxSnapshotHold is how long a snapshot waits at most while connections wait for a handshake
// (handshakes.go) or more than writesBacklog registrations and heartbeats are in flight: a
// broker that is dialed without pause still sends every snapshot.
const maxSnapshotHold = 10 * time.Second

// writesBacklog is how many registrations and heartbeats may be in flight before snapshots wait
// for them.
const writesBacklog = 32

// Defaults, as DESIGN.md and the agreed wire facts give them.
const (
	DefaultListen        = "0.0.0.0:7443"
	DefaultLease         = 30 * time.Second
	DefaultMaxLease      = 5 * time.Minute
	DefaultTokenValidity = 24 * time.Hour
	MaxTokenValidity     = 365 * 24 * time.Hour
	AdminConfigFile      = "admin.yaml"
	StoreFile            = "broker.db"
)

// Config configures a broker.
type Config struct {
	// DataDir holds broker.db, the PKI and admin.yaml. Required.
	DataDir string
	// Listen is the address the broker will serve on; its IP goes into the serving certificate.
	Listen string
	// Lease is the default endpoint lease (default 30s); MaxLease caps what an agent may ask for
	// (default 5m).
	Lease    time.Duration
	MaxLease time.Duration
	// ReapInterval is how often expired endpoints are withdrawn. Default (0): a tenth of the
	// shortest lease a registered endpoint holds, or of Lease when none is shorter, at least
	// 100ms, so that an endpoint that asked for a short lease (a cluster with several gateways
	// that wants fast failover) is withdrawn soon after it expires, not up to Lease/10 later.
	ReapInterval time.Duration
	// DefaultCableDriver is the driver of the mesh default policy the broker creates at first
	// start: one of the registered cable drivers (cable.Names; the cable-broker binary links them
	// all). Empty means wireguard. Later starts keep the stored default policy (an operator may
	// have changed it with apply) and only log when this differs.
	DefaultCableDriver string
	// ServiceVIPRanges are the ranges clusterset VIPs come from: at most one IPv4 and one IPv6
	// prefix (a service gets one VIP from each). Default mcs.DefaultVIPRange. A stored VIP
	// outside them (the ranges changed since) is kept and logged, never renumbered.
	ServiceVIPRanges []netip.Prefix
	// MeshAddressRange is the IPv4 range gateways' mesh addresses come from (gateway mode, issue
	// 9): default meshaddr.DefaultRange; /8 to /30; it must not overlap ServiceVIPRanges, and no
	// cluster's CIDRs may overlap it. A stored address outside it (the range changed since) is
	// replaced by one inside it at start and at the node's next registration.
	MeshAddressRange netip.Prefix
	// ExportQuota bounds what the nodes of one cluster export together (services, endpoints,
	// importers' load balancer entries); fields left 0 take admission's defaults.
	ExportQuota admission.ExportQuota
	// StoreOptions tune the embedded store (event log size, watcher buffer).
	StoreOptions store.Options
	// Store, when set, is the store to use instead of the embedded one in DataDir/broker.db
	// (StoreOptions are then not used), e.g. store.Memory in tests. The server owns it: Close
	// closes it, and so does New when it fails.
	Store store.Store
	// Etcd, when set, keeps the store and the shared secrets (mesh CA, join-token key, mesh
	// secret) in etcd, so that several replicas serve one mesh (see ha.go). Exclusive with Store.
	Etcd   *EtcdConfig
	Logger *slog.Logger
	// WatchMessageBytes is the most a watch message may hold before a batch is sent in parts
	// (default DefaultWatchMessageBytes; agents receive at most 4 MiB).
	WatchMessageBytes int
	// SelfAddresses are the broker's own addresses, which no cluster's pod or service CIDR may
	// cover: default the listen address when it is a specific IP, else every interface
	// address (tests inject them).
	SelfAddresses func() ([]netip.Addr, error)
	// Now is the clock (tests move it); default time.Now. Leases, token expiry and the reaper
	// read it.
	Now func() time.Time
	// StartTimeout bounds the store work New does after opening the store (the default policy,
	// service VIPs, mesh addresses, leases), so that a store that does not answer fails the
	// start instead of hanging it; default DefaultStartTimeout. Opening an etcd store is bounded
	// apart, by EtcdConfig.StartTimeout.
	StartTimeout time.Duration
	// LinkReportInterval is how often gateways send their full link report (the summary;
	// changes go at once), default DefaultLinkReportInterval; a report is stale after three.
	// LinkReportMinInterval is the shortest time between two accepted reports of one node (the
	// rate limit), default DefaultLinkReportMinInterval.
	LinkReportInterval, LinkReportMinInterval time.Duration
	// AgentCertificateLifetime is how long the agent certificates issued from now on last
	// (joins and renewals): default and at most DefaultAgentCertificateLifetime (one year), at
	// least MinAgentCertificateLifetime. Agents renew two thirds into a certificate's lifetime, so a shorter
	// one bounds how long a stolen certificate stays useful, at the price of more renewals.
	AgentCertificateLifetime time.Duration
	// UnaryInterceptors and StreamInterceptors run around every call after the broker's own
	// (metrics, then authentication: a call they see is authenticated), outermost first: for
	// auditing, tracing, or a test that refuses or observes calls. A Watch stream's SendMsg gets
	// messages the broker encoded once for many watchers as PreEncoded.
	UnaryInterceptors  []grpc.UnaryServerInterceptor
	StreamInterceptors []grpc.StreamServerInterceptor
}

// MinAgentCertificateLifetime is the shortest Config.AgentCertificateLifetime (for tests and
// drills: an agent must renew within the last third of it); DefaultAgentCertificateLifetime,
// pki.Validity, is the default and the longest.
const (
	MinAgentCertificateLifetime     = time.Second
	DefaultAgentCertificateLifetime = pki.Validity
)

// DefaultStartTimeout is Config.StartTimeout's default.
const DefaultStartTimeout = 60 * time.Second

// Server is a broker.
type Server struct {
	cfg Config
	log *slog.Logger
	// pki is the key material as loaded at start; certs holds the current one (a CA rotation
	// replaces it): read it with s.currentPKI().
	pki   *pki.PKI
	certs *certState
	store store.Store
	// ha is the link to etcd of a replica (Config.Etcd); nil for the embedded store.
	ha   *haReplica
	grpc *grpc.Server
	// meshSecret derives the pair PSKs (PairPSK); it never leaves the broker.
	meshSecret []byte
	// imports computes the service imports once per revision for every watcher.
	imports *importTracker

	// stopping ends long-lived streams (watches) so a graceful stop does not wait for them.
	stopping     chan struct{}
	stoppingOnce sync.Once
	// ready is closed once Serve has written admin.yaml and accepts connections.
	ready chan struct{}
	// watchBudget is Config.WatchMessageBytes (watchsend.go).
	watchBudget int
	// snapshotSends are the slots of the watch snapshots being sent (agent.go).
	snapshotSends chan struct{}
	// watchEnc holds the watch events encoded once for every watcher (watchsend.go).
	watchEnc *watchEncodings
	// watchBatches holds the delta batches encoded once for every watcher (watchsend.go), and
	// watchSnapshots the parts of snapshots (watchsnapshot.go).
	watchBatches   batchEncodings
	watchSnapshots snapshotEncodings
	// metrics are served by MetricsHandler (metrics.go).
	metrics *metrics
	// firstUse shares the write of a certificate's first use between the calls that need it
	// (checkAgent).
	firstUse singleflight.Group
	// writing counts the registrations and heartbeats in flight (snapshots wait while there
	// are many).
	writing *backlog
	// writes measures the same calls' rate: registrations are turned away as busy when the
	// calls ahead of them would keep them waiting too long (registerbusy.go).
	writes *writeMeter
	// handshakes are the server's TLS credentials, which run a limited number of handshakes at
	// once (handshakes.go).
	handshakes *handshakeLimit
	// clusterNets are the clusters' CIDRs every registration is checked against (agent.go).
	clusterNets clusterNetworks
	// meshHint is where mesh address allocation starts looking (meshaddrs.go).
	meshHint meshHint
	// linkReports are the gateways' latest link reports; on etcd, linkShare the nodes whose
	// report is still to be written there and linkLease the lease they are written under
	// (linkreports.go, linkreports_ha.go).
	linkReports *linkReportStore
	linkShare   linkShare
	linkLease   linkReportLease
}

// New loads or creates the broker's PKI, mesh secret and store in cfg.DataDir, creates the mesh
// default policy on first start, and extends every stored endpoint lease by one lease period, so
// agents have time to reconnect after broker downtime. Its store work ends with ctx, and after
// cfg.StartTimeout at the latest.
func New(ctx context.Context, cfg Config) (_ *Server, err error) {
	st := cfg.Store
	defer func() {
		if err != nil && st != nil {
			st.Close()
		}
	}()
	if cfg.DataDir == "" {
		return nil, errors.New("data dir is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Lease <= 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.MaxLease <= 0 {
		cfg.MaxLease = DefaultMaxLease
	}
	if cfg.MaxLease < cfg.Lease {
		cfg.MaxLease = cfg.Lease
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = DefaultStartTimeout
	}
	if cfg.AgentCertificateLifetime, err = agentCertificateLifetime(cfg.AgentCertificateLifetime); err != nil {
		return nil, err
	}
	if cfg.DefaultCableDriver != "" {
		if err := ValidateDefaultCableDriver(cfg.DefaultCableDriver); err != nil {
			return nil, err
		}
	}
	if err := cfg.ExportQuota.Validate(); err != nil {
		return nil, err
	}
	cfg.ExportQuota = cfg.ExportQuota.WithDefaults()
	if cfg.ServiceVIPRanges, err = vipRanges(cfg.ServiceVIPRanges); err != nil {
		return nil, err
	}
	if cfg.MeshAddressRange, err = meshRange(cfg.MeshAddressRange, cfg.ServiceVIPRanges); err != nil {
		return nil, err
	}
	host, _, err := net.SplitHostPort(cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen address %q is not host:port: %v", cfg.Listen, err)
	}
	ips := []net.IP{net.IPv4(127, 0, 0, 1).To4(), net.IPv6loopback}
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() && !ip.IsLoopback() {
		ips = append(ips, ip)
	}
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("create data dir: %w", err)
	}
	var ha *haReplica
	if cfg.Etcd != nil {
		if st != nil {
			return nil, errors.New("config: Store and Etcd are exclusive")
		}
		// The shared secrets come from etcd into the data dir before they are loaded below.
		var es *store.Etcd
		if ha, es, err = openHA(ctx, *cfg.Etcd, cfg.DataDir, cfg.Logger, cfg.StoreOptions, ips, cfg.Now()); err != nil {
			return nil, err
		}
		st = es
		defer func() {
			if err != nil {
				ha.close()
			}
		}()
	}
	p, created, err := pki.LoadOrCreate(cfg.DataDir, ips, cfg.Now())
	if err != nil {
		return nil, err
	}
	if created {
		cfg.Logger.Info("created mesh CA", "dir", cfg.DataDir, "ca", p.CAHash())
	}
	secret, created, err := loadOrCreateMeshSecret(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if created {
		cfg.Logger.Info("created mesh secret", "path", filepath.Join(cfg.DataDir, MeshSecretFile))
	}
	if st == nil {
		b, err := store.OpenBolt(filepath.Join(cfg.DataDir, StoreFile), cfg.StoreOptions)
		if err != nil {
			return nil, err
		}
		st = b
	}
	s := &Server{cfg: cfg, log: cfg.Logger, pki: p, store: st, ha: ha, meshSecret: secret, stopping: make(chan struct{}), ready: make(chan struct{})}
	s.imports = newImportTracker(cfg.Logger, s.stopping)
	s.linkReports = newLinkReportStore(cfg.LinkReportInterval, cfg.LinkReportMinInterval)
	s.linkShare.wake = make(chan struct{}, 1)
	s.watchBudget = cfg.WatchMessageBytes
	s.snapshotSends = make(chan struct{}, maxSnapshotSends)
	s.watchEnc = newWatchEncodings(watchEncodingBytes)
	if err := s.startStore(ctx); err != nil {
		return nil, err
	}
	// The TLS configuration follows the PKI, which a CA rotation replaces (certs.go).
	s.certs = newCertState(p, ips)
	tlsCfg := &tls.Config{MinVersion: tls.VersionTLS12, GetConfigForClient: s.certs.tlsConfig}
	s.handshakes = limitHandshakes(credentials.NewTLS(tlsCfg), 0)
	s.writing = newBacklog(writesBacklog)
	s.writes = newWriteMeter(nil)
	// Metrics first, so refused calls are counted with their code; watches after auth, which
	// names the agent (metrics.go).
	s.metrics = newMetrics(s)
	s.grpc = grpc.NewServer(
		grpc.Creds(s.handshakes),
		grpc.ChainUnaryInterceptor(append([]grpc.UnaryServerInterceptor{s.metrics.grpc.UnaryServerInterceptor(), s.unaryAuth}, cfg.UnaryInterceptors...)...),
		grpc.ChainStreamInterceptor(append([]grpc.StreamServerInterceptor{s.metrics.grpc.StreamServerInterceptor(), s.streamAuth, s.metrics.watchStream}, cfg.StreamInterceptors...)...),
		// Pings find dead peers (a watcher whose host vanished) so their streams end.
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 20 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		// Protobuf, but watch messages encoded once for many watchers go as they are.
		grpc.ForceServerCodecV2(newWatchCodec()),
		// Thousands of agents hold a connection each, and send little (registrations,
		// heartbeats, exports): a connection's read buffer of 8 KiB instead of gRPC's 32 KiB
		// (120 MB less at 5,000 agents). Write buffers go back to a pool after each flush
		// already (gRPC's default).
		grpc.ReadBufferSize(8<<10),
	)
	apiv1.RegisterAdminServer(s.grpc, &adminService{s: s})
	apiv1.RegisterAgentServer(s.grpc, &agentService{s: s})
	s.metrics.grpc.InitializeMetrics(s.grpc) // every method's series from the start, at 0
	return s, nil
}

// agentCertificateLifetime is Config.AgentCertificateLifetime checked, with its default.
func agentCertificateLifetime(d time.Duration) (time.Duration, error) {
	if d == 0 {
		return DefaultAgentCertificateLifetime, nil
	}
	if err := ValidateAgentCertificateLifetime(d); err != nil {
		return 0, fmt.Errorf("config: AgentCertificateLifetime: %w", err)
	}
	return d, nil
}

// ValidateAgentCertificateLifetime checks an agent certificate lifetime: from
// MinAgentCertificateLifetime to DefaultAgentCertificateLifetime.
func ValidateAgentCertificateLifetime(d time.Duration) error {
	if d < MinAgentCertificateLifetime || d > DefaultAgentCertificateLifetime {
		return fmt.Errorf("agent certificate lifetime %s is outside %s to %s", d, MinAgentCertificateLifetime, DefaultAgentCertificateLifetime)
	}
	return nil
}

// AdminConfigPath is DIR/admin.yaml.
func (s *Server) AdminConfigPath() string { return filepath.Join(s.cfg.DataDir, AdminConfigFile) }

// CAHash is the mesh CA fingerprint that join tokens carry.
func (s *Server) CAHash() string { return s.currentPKI().CAHash() }

// startStore is New's store work: the default policy, the service VIPs and mesh addresses
// checked against the config, and every lease extended. It gives up after cfg.StartTimeout.
func (s *Server) startStore(ctx context.Context) error {
	timedOut := fmt.Errorf("the store did not answer within the start timeout %s", s.cfg.StartTimeout)
	ctx, cancel := context.WithTimeoutCause(ctx, s.cfg.StartTimeout, timedOut)
	defer cancel()
	steps := []struct {
		what string
		run  func(context.Context) error
	}{
		{"default policy", func(ctx context.Context) error { return s.ensureDefaultPolicy(ctx, s.cfg.DefaultCableDriver) }},
		{"service VIPs", s.reconcileServiceVIPs},
		{"mesh addresses", s.reconcileMeshAddresses},
		{"endpoint leases", s.extendLeases},
	}
	for _, step := range steps {
		err := step.run(ctx)
		if err != nil && ctx.Err() != nil {
			// Name why it stopped: the start timeout, or the caller giving up.
			return fmt.Errorf("start-up store work (%s): %w: %w", step.what, context.Cause(ctx), err)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Serve serves on lis until ctx ends, then stops gracefully. It writes DIR/admin.yaml first if it
// does not exist, with lis's address (an unspecified host becomes 127.0.0.1).
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	if s.ha == nil {
		if err := s.writeAdminConfig(lis.Addr()); err != nil {
			return err
		}
	}
	var wg sync.WaitGroup
	loopCtx, stopLoops := context.WithCancel(ctx) // the reaper and the import tracker
	defer func() {
		stopLoops()
		wg.Wait()
	}()
	if s.ha != nil {
		// A replica's admin.yaml names every replica, and follows them as they register.
		self, err := adminAddress(lis.Addr())
		if err != nil {
			return err
		}
		if err := s.ha.serveAdminConfig(loopCtx, s, self, s.ha.advertise(lis.Addr()), &wg); err != nil {
			return err
		}
		wg.Go(func() { s.shareLinkReportsLoop(loopCtx) }) // the link reports, to etcd
	}
	wg.Add(2)
	go func() {
		defer wg.Done()
		s.reapLoop(loopCtx)
	}()
	go func() {
		defer wg.Done()
		s.caLoop(loopCtx) // ends a CA rotation's overlap when it is due
	}()
	// The tracker subscribes before the first watch can start, so every watch is at a revision
	// it will apply.
	if err := s.imports.start(loopCtx, s.store, &wg); err != nil {
		return err
	}

	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(lis) }()
	close(s.ready)
	s.log.Info("broker ready", "listen", lis.Addr().String(), "adminConfig", s.AdminConfigPath(), "ca", s.currentPKI().CAHash())
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.log.Info("broker stopping")
	s.stoppingOnce.Do(func() { close(s.stopping) })
	done := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		s.grpc.Stop()
		<-done
	}
	<-errc
	return nil
}

// Ready is closed when Serve has written admin.yaml and is accepting connections.
func (s *Server) Ready() <-chan struct{} { return s.ready }

// Close closes the store (and the etcd client of a replica). Call after Serve returned.
func (s *Server) Close() error {
	err := s.store.Close()
	if s.ha != nil {
		if cerr := s.ha.close(); err == nil {
			err = cerr
		}
	}
	return err
}

func (s *Server) writeAdminConfig(addr net.Addr) error {
	path := s.AdminConfigPath()
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return fmt.Errorf("admin config: listener address %q: %v", addr, err)
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	p := s.currentPKI()
	c := &adminconfig.Config{
		Broker:      net.JoinHostPort(host, port),
		CA:          string(p.CAPEM),
		Certificate: string(p.AdminCert),
		Key:         string(p.AdminKey),
	}
	b, err := c.Marshal()
	if err != nil {
		return fmt.Errorf("encode admin config: %w", err)
	}
	if err := pki.WriteFile(path, b); err != nil {
		return err
	}
	s.log.Info("wrote admin credential", "path", path, "broker", c.Broker)
	return nil
}

// leases are the endpoint lease settings admission applies.
func (s *Server) leases() admission.Leases {
	return admission.Leases{Default: s.cfg.Lease, Max: s.cfg.MaxLease}
}

// extendLeases gives every stored endpoint a full lease from now: after broker downtime every
// lease would otherwise have expired and the reaper would withdraw all gateways at once, before
// their agents had a chance to reconnect and heartbeat.
func (s *Server) extendLeases(ctx context.Context) error {
	now := s.cfg.Now()
	_, err := s.store.Update(ctx, func(tx store.Tx) error {
		eps, err := tx.Endpoints()
		if err != nil {
			return err
		}
		for _, e := range admission.ExtendLeases(eps, s.cfg.Lease, now) {
			if err := tx.TouchEndpoint(e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("extend endpoint leases at start: %w", err)
	}
	return nil
}

// minReapInterval bounds how often the reaper lists the endpoints, however short a lease.
const minReapInterval = 100 * time.Millisecond

// reapInterval is the wait before the next reap: cfg.ReapInterval when set, else a tenth of the
// shortest lease among the endpoints (shortest, 0 when none) or of the default lease when none
// is shorter, at least minReapInterval. Every replica computes it from the stored endpoints, so
// a replica that did not grant a short lease still reaps it in time.
func reapInterval(configured, lease, shortest time.Duration) time.Duration {
	if configured > 0 {
		return configured
	}
	if shortest > 0 && shortest < lease {
		lease = shortest
	}
	return max(lease/10, minReapInterval)
}

// reapLoop withdraws expired endpoints until ctx ends, at reapInterval.
func (s *Server) reapLoop(ctx context.Context) {
	t := time.NewTimer(reapInterval(s.cfg.ReapInterval, s.cfg.Lease, 0))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			shortest, err := s.reapExpired(ctx, s.cfg.Now())
			if err != nil && ctx.Err() == nil {
				s.log.Error("reap expired endpoints", "err", err)
			}
			t.Reset(reapInterval(s.cfg.ReapInterval, s.cfg.Lease, shortest))
		}
	}
}

// reapExpired withdraws every endpoint whose lease has expired at now, and returns the shortest
// lease among those left (0 when none). The reap loop calls it with the clock's time; tests call
// it directly. The endpoints are read in a read transaction: only when one has expired does it
// take a write one (through the store's single committer, which registrations wait for),
// checking each again there, since a heartbeat may have renewed it meanwhile.
func (s *Server) reapExpired(ctx context.Context, now time.Time) (time.Duration, error) {
	var expired bool
	var shortest time.Duration
	err := s.store.View(ctx, func(tx store.ReadTx) error {
		eps, err := tx.Endpoints()
		if err != nil {
			return err
		}
		expired = len(admission.Expired(eps, now)) > 0
		shortest = admission.ShortestLease(eps, now)
		return nil
	})
	if err != nil || !expired {
		return shortest, err
	}
	var reaped []*apiv1.Endpoint
	_, err = s.store.Update(ctx, func(tx store.Tx) error {
		eps, err := tx.Endpoints()
		if err != nil {
			return err
		}
		reaped = admission.Expired(eps, now)
		for _, e := range reaped {
			if err := tx.DeleteEndpoint(e.Cluster, e.Node); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	for _, e := range reaped {
		s.log.Info("endpoint lease expired, withdrawn", "cluster", e.Cluster, "node", e.Node)
	}
	return shortest, nil
}
