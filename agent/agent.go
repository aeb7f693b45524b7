// Package agent is the cable-agent: it wires the components that make it, each a package that
// owns its state, goroutines and locks, and runs them (see docs/architecture.md):
//
//	brokerlink  join, watch, registration and heartbeat, renewal, the cached broker state
//	plan        one plan per (broker state, drivers, guard), read by all below
//	cables      a gateway's drivers, MSS clamp, reconcile, repair and probes
//	routes      a non-gateway node's routes via its gateways (routes.Worker)
//	servicedp   DNS, the socket load balancer and the traffic counters
//	exports     the node's exports and their sync; clusterpolicy the cluster's policies
//	ingress     ingress ports, xDS, the ingress certificate, the gateway-mode data plane
//	reload      the config file's live changes; metrics and statusapi what it reports
//	linkreport  a gateway's links, reported to the broker (cablectl links --all)
//	host        the hooks onto the node (drivers, probes, eBPF, nftables), faked by tests
//
// Data flows one way: watch -> state -> plan -> consumers -> status. The agent never tears
// anything down because the broker is unreachable: it runs on the last state it received.
package agent

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cablemesh/cablemesh/agent/brokerlink"
	"github.com/cablemesh/cablemesh/agent/cables"
	"github.com/cablemesh/cablemesh/agent/clusterpolicy"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/exports"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/host"
	"github.com/cablemesh/cablemesh/agent/ingress"
	"github.com/cablemesh/cablemesh/agent/kube"
	"github.com/cablemesh/cablemesh/agent/linkreport"
	"github.com/cablemesh/cablemesh/agent/mcsimport"
	"github.com/cablemesh/cablemesh/agent/metrics"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/preflight"
	"github.com/cablemesh/cablemesh/agent/reload"
	"github.com/cablemesh/cablemesh/agent/routes"
	"github.com/cablemesh/cablemesh/agent/servicedp"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
	"github.com/cablemesh/cablemesh/internal/version"
)

// DefaultRepairInterval is how often at most the agent re-asserts (re-runs the driver's
// idempotent Connect for) a connection whose health probes keep failing.
const DefaultRepairInterval = 30 * time.Second

// Options wire an Agent.
type Options struct {
	Config *config.Config
	// Host are the agent's ways onto its node (drivers, probes, addresses, eBPF, nftables);
	// each defaults to the kernel's, tests fake them.
	Host host.Hooks
	Log  *slog.Logger
	// Backoff bounds of broker reconnects; defaults 1s and 15s.
	MinBackoff, MaxBackoff time.Duration
	// Ready, if set, is called once the agent serves status and has reconciled from its cache.
	Ready func()
	// RepairInterval bounds how often a connection whose probes failed failureThreshold times
	// is re-asserted; default DefaultRepairInterval.
	RepairInterval time.Duration
	// CleanupOnExit makes Run, as it ends, remove what the agent made on the host (links,
	// routes, sockets, the MSS clamp, the eBPF programs and pins). By default they stay, so that a
	// restart neither flaps the tunnels nor breaks a connection through a VIP.
	CleanupOnExit bool
	// CleanupOnStop, when set and CleanupOnExit is not, is asked once as Run ends whether to
	// clean up all the same: on Kubernetes, whether the install is being removed (agent/uninstall).
	CleanupOnStop func() bool
	// TakeOver, when set, is called in Run before the agent reads its cache and touches the node's
	// datapath: a running agent hands the node over there (agent/handover).
	TakeOver func(ctx context.Context)
	// StopProcessesOnStop, when set, is asked as Run ends without a cleanup whether to end the
	// helper daemons (charon) left for the next run: it cannot adopt them (agent/handover).
	StopProcessesOnStop func() bool
	// Kubernetes is the export source used when the config sets kubernetes.enabled; it must be
	// set then (cmd/cable-agent builds it from the in-cluster config).
	Kubernetes exports.Source
	// ConfigPath is the file Config was loaded from: Run watches it and applies its changes
	// (reload.go). Empty: no reload.
	ConfigPath string
	// LogLevel, when set, is the level of Log's handler: a reload changes it. LogLevelFlag is a
	// level given on the command line, which wins over the file's logLevel, on reload too.
	LogLevel     *slog.LevelVar
	LogLevelFlag string
	// NodeAddresses follows this node's Node object on Kubernetes (kube.NodeWatcher): a
	// gateway's endpoint takes its private IP from the Node's InternalIP when the config sets no
	// advertiseAddress, its public IP from the ExternalIP. nil: none.
	NodeAddresses  kube.AddressSource
	ServiceImports *mcsimport.Writer // a gateway's writer of the cluster's MCS ServiceImports (Kubernetes); nil: none
}

// Agent is one node's agent. Build with New, run with Run.
type Agent struct {
	// cfg is what a reload never changes, handed to the components; what a reload changes is
	// the reloader's (liveConfig), and opts.Config is cleared once split into the two.
	cfg  config.Static
	opts Options
	// cleanupDecision answers, once, whether stopping removes what the agent made.
	cleanupDecision func() bool
	// log carries this node's identity (cluster, node); pairLog carries it as localCluster and
	// localNode, for the lines about a remote pair, which name the remote side as cluster and
	// node (the reconciler, the drivers, the probes).
	log, pairLog *slog.Logger

	link *brokerlink.Link // join, watch, heartbeat, renewal and the cached broker state

	guards  *plan.Guards  // what no cable route may cover: built at start and when the address moves
	planner *plan.Planner // the one plan per input change that every consumer reads

	cables  *cables.Cables // the cable connections (gateways); the reconcile loop (all nodes)
	metrics *metrics.Probes
	worker  *routes.Worker // a non-gateway node's routes via its gateways

	registry *prometheus.Registry // the agent's metrics (served on metricsAddress)
	dp       *servicedp.Datapath  // DNS, the socket load balancer, the counters
	exports  *exports.Exports

	clusterPolicies *clusterpolicy.Sync // cluster-scoped policies and their sync

	ingress *ingress.Gateway // ingress ports, the xDS server, the mesh address and data plane

	ready *metrics.Readiness // the first full sync, for /readyz

	reload *reload.Reloader // the config in force and its reloads
	addrs  *kube.Addresses  // this node's addresses (the config's, or its Node's on Kubernetes)

	linkReports *linkreport.Reporter // a gateway's links, reported to the broker
}

// New checks options; it creates nothing.
func New(opts Options) (*Agent, error) {
	if opts.Config == nil {
		return nil, errors.New("agent: no config")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = time.Second
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 15 * time.Second
	}
	opts.Host = opts.Host.WithDefaults()
	if opts.RepairInterval == 0 {
		opts.RepairInterval = DefaultRepairInterval
	}
	cfg := opts.Config.Static()
	if cfg.Kubernetes.Enabled && opts.Kubernetes == nil {
		return nil, errors.New("agent: kubernetes.enabled is set but no Kubernetes export source was given")
	}
	a := &Agent{
		cfg:             cfg,
		opts:            opts,
		cleanupDecision: newCleanupDecision(opts),
		log:             opts.Log.With("cluster", cfg.Cluster, "node", cfg.Node),
		pairLog:         opts.Log.With("localCluster", cfg.Cluster, "localNode", cfg.Node),
		metrics:         metrics.NewProbes(),
		registry:        prometheus.NewRegistry(),
		planner:         plan.New(opts.Log.With("cluster", cfg.Cluster, "node", cfg.Node)),
	}
	a.reload = reload.New(opts.ConfigPath, opts.Config, reload.Options{Log: a.log, LogLevelFlag: opts.LogLevelFlag, Apply: a.applyConfig,
		ImportsChanged: func() { a.link.ReopenWatch() }})
	a.opts.Config = nil
	var src kube.AddressSource
	if cfg.Gateway {
		src = opts.NodeAddresses
	}
	a.addrs = kube.NewAddresses(src, cfg.AdvertiseAddr(), cfg.Node, a.log)
	a.guards = plan.NewGuards(func() plan.GuardSources {
		return plan.GuardSources{Broker: cfg.Broker, Advertise: a.addrs.Private(), Log: a.log, LookupHost: opts.Host.LookupHost, Underlay: opts.Host.Underlay}
	})
	a.link = brokerlink.New(cfg, brokerlink.Deps{Log: a.log, Backoff: a.newBackoff, Live: a.liveConfig,
		Endpoint: a.endpoint, OnRegistered: func(ep *apiv1.Endpoint) { a.ingress.ObserveRegistered(ep) },
		OnState: func() { a.Trigger(); a.TriggerServices(); opts.ServiceImports.Trigger() }, OnFirstMessage: func() { a.exports.Trigger() }})
	a.cables = cables.New(cfg, cables.Deps{
		Log: a.log, PairLog: a.pairLog, NewDriver: opts.Host.NewDriver, LocalNode: a.localNode, MSS: opts.Host.MSS,
		NewPinger: opts.Host.NewPinger, Metrics: a.metrics, RepairInterval: opts.RepairInterval,
		LocalPodCIDRs: a.link.LocalPodCIDRs, InterfaceAddrs: opts.Host.InterfaceAddrs, OnHealthChange: a.TriggerServices, Live: a.liveConfig,
		OnDriverReady: func(ctx context.Context) { a.Trigger(); a.link.ReregisterNow(ctx) },
	})
	a.worker = routes.NewWorker(cfg.Cluster, routes.WorkerDeps{Log: a.log, PairLog: a.pairLog, NewPinger: opts.Host.NewPinger,
		Apply: opts.Host.ApplyRoutes, OnChange: a.Trigger})
	a.exports = exports.New(cfg, exports.Deps{Log: a.log, Live: a.liveConfig, Scope: a.ownExportScope, Stamp: func(set []*apiv1.ServiceExport) { a.ingress.StampPorts(set) },
		OnChange: func() { a.ingress.Changed() }, Backoff: a.newBackoff, Link: a.link})
	a.clusterPolicies = clusterpolicy.NewSync(clusterpolicy.SyncDeps{Log: a.log, Cluster: cfg.Cluster, PolicyDir: cfg.PolicyDir,
		Resync: cfg.ResyncInterval, Backoff: a.newBackoff, CertificateRefused: a.link.CertificateRefused})
	a.ingress = ingress.New(cfg, ingress.Deps{Log: a.log, Exports: func() []*apiv1.ServiceExport { set, _, _ := a.exports.Effective(); return set }, Plan: a.plan, OpenDataplane: opts.Host.OpenIngress,
		MeshLink: opts.Host.MeshLink, CleanupOnExit: opts.CleanupOnExit, CleanupDecision: a.cleanupDecision, CABundle: a.link.CABundle, CAs: func() *x509.CertPool { return a.link.Keyring().Identity().CAs },
		Backoff: a.newBackoff, OnRegistered: a.Trigger})
	a.dp = a.newDatapath()
	a.ready = &metrics.Readiness{Log: a.log}
	a.linkReports = linkreport.New(linkreport.Deps{Log: a.log, Version: version.String(), Gateways: func() int { return len(a.plan().State.Endpoints) },
		Links: func(ctx context.Context) []statusapi.Connection { return a.cables.Connections(ctx, a.plan()) }})
	opts.ServiceImports.Follow(a.link)
	a.registry.MustRegister(&metrics.Collector{Status: a.Status, Probes: a.metrics})
	return a, nil
}

// Run runs the agent until ctx ends. It returns an error only when the agent cannot work at
// all: it has no identity and cannot join (a refused token, a wrong broker), or a driver or the
// status socket cannot be set up. When it returns, the drivers are closed and, with
// Options.CleanupOnExit, what the agent made on the host is removed.
func (a *Agent) Run(ctx context.Context) error {
	defer a.stop()
	defer a.link.Close()
	if err := preflight.Run(a.cfg, a.liveConfig().JoinTokenFile, a.log); err != nil {
		return err
	}
	if err := a.exports.Load(); err != nil {
		return err
	}
	if err := a.ingress.Load(); err != nil {
		return err
	}
	if err := a.link.Identify(ctx); err != nil {
		return err
	}

	stopNodeAddrs, err := a.addrs.Start(ctx)
	if err != nil {
		return err
	}
	defer stopNodeAddrs()
	a.guards.Build(ctx)

	if a.opts.TakeOver != nil {
		a.opts.TakeOver(ctx) // before the cache: a running agent writes its last state as it stops
	}
	a.link.LoadCache()

	if a.cfg.Gateway {
		if err := a.cables.Start(ctx); err != nil {
			return err
		}
		a.cables.ClampMSS()
		// The probers; a reload may start or stop them (cables.SetHealth).
		a.cables.SetHealth(a.liveConfig().HealthCheck.IsEnabled(), cables.HealthSettings(a.liveConfig().HealthCheck))
		defer a.cables.SetHealth(false, health.Settings{})
	} else {
		defer a.worker.Start()()
	}

	if err := a.dp.Start(ctx); err != nil {
		return err
	}
	statusSrv, err := a.serveStatus(ctx)
	if err != nil {
		return err
	}
	defer statusSrv()
	stopIngress, err := a.ingress.Start(ctx)
	if err != nil {
		return err
	}
	defer stopIngress()
	if a.cfg.MetricsAddress != "" {
		stop, err := metrics.Serve(ctx, a.cfg.MetricsAddress, a.metricsHandler(), a.log)
		if err != nil {
			return err
		}
		defer stop()
	}

	// Reconcile from the cache before the broker answers (or when it never does), then program
	// the services from it: DNS answers and the maps are as they were before a restart.
	a.reconcileOnce(ctx)
	a.dp.Once(ctx)
	a.log.Info("agent ready", "gateway", a.cfg.Gateway, "statusSocket", a.cfg.StatusSocket, "broker", a.cfg.Broker, "cachedRevision", a.link.Revision())
	if a.opts.Ready != nil {
		a.opts.Ready()
	}

	client, closeConn, err := a.link.Dial()
	if err != nil {
		return err
	}
	defer closeConn()

	var wg sync.WaitGroup
	wg.Go(func() { a.cables.Run(ctx, a.reconcileOnce) })
	wg.Go(func() { a.dp.Run(ctx) })
	wg.Go(func() { a.link.RunWatch(ctx, client) })
	wg.Go(func() { a.exports.Run(ctx, client) })
	wg.Go(func() { a.link.RunCertificates(ctx, client) })
	if a.cfg.Ingress.XDS.Listen != "" {
		wg.Go(func() { a.ingress.RunCertificate(ctx, client) })
	}
	wg.Go(func() { a.clusterPolicies.Run(ctx, client) })
	if a.cfg.Kubernetes.Enabled {
		wg.Go(func() { a.exports.RunSource(ctx, a.opts.Kubernetes) })
	}
	if a.cfg.Gateway {
		wg.Go(func() { a.link.RunRegister(ctx, client) })
		wg.Go(func() { a.linkReports.Run(ctx, client) })
		wg.Go(func() { a.cables.WatchHealthCheckIP(ctx, func() { a.link.Reregister(ctx, client) }) })
	}
	wg.Go(func() { a.opts.ServiceImports.Run(ctx) })
	if a.opts.ConfigPath != "" {
		wg.Go(func() { a.reload.Run(ctx, client) })
	}
	wg.Go(func() {
		a.addrs.Run(ctx, func(ctx context.Context, moved bool) { a.nodeAddressesChanged(ctx, client, moved) })
	})
	wg.Wait()
	return nil
}

// newBackoff is the wait between attempts of one broker loop, between the options' bounds.
func (a *Agent) newBackoff() *retry.Backoff {
	return &retry.Backoff{Min: a.opts.MinBackoff, Max: a.opts.MaxBackoff}
}
