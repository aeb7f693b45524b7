// Package cables is a gateway's cable connections: it builds and initialises the cable drivers
// the config names, clamps the TCP MSS on their links, reconciles the connections against the
// plan (agent/plan), re-asserts those whose health probes keep failing, probes the remote
// gateways, and reports the drivers and the connection rows of the status. A reload rebuilds the
// drivers whose settings changed (Rebuild) and starts, stops or retunes the probes (SetHealth).
//
// Locks: mu guards the fields below it. It is never held while a driver, the reconciler or the
// health manager is called, and no other lock is taken under it.
package cables

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/internal/syncloop"
)

// DriverFactory builds the cable driver name for this node with its settings (the config's block
// for it); cable.New, the registry, is the default. It only validates and builds; Init is the
// component's call.
type DriverFactory func(name string, node cable.LocalNode, settings cable.Settings) (cable.Driver, error)

// Deps are what the cables take from the rest of the agent.
type Deps struct {
	// Log carries this node's identity; PairLog carries it as localCluster and localNode, for the
	// lines about a remote pair.
	Log, PairLog *slog.Logger
	NewDriver    DriverFactory
	// LocalNode is this node as the drivers see it (cluster, node, state dir, advertise address,
	// local subnets), asked at every build: the Node's address may change on Kubernetes.
	LocalNode func() cable.LocalNode
	MSS       MSSClamp
	// NewPinger opens the probes' sockets; Metrics observe them.
	NewPinger health.NewPinger
	Metrics   health.Observer
	// RepairInterval bounds how often one pair is re-asserted.
	RepairInterval time.Duration
	// LocalPodCIDRs and InterfaceAddrs give the probes their source address.
	LocalPodCIDRs  func() []netip.Prefix
	InterfaceAddrs func() []netip.Addr
	// OnHealthChange is called when a pair's health flips (the services follow).
	OnHealthChange func()
	// Live is the live config in force: Start builds the drivers it lists with their blocks (a
	// reload hands a new one to Rebuild and SetHealth).
	Live func() config.Live
	// OnDriverReady is called after a driver whose Init had failed initialised on a retry
	// (initretry.go) and runs: the agent registers its endpoint again (the broker publishes only
	// running drivers) and reconciles. Optional.
	OnDriverReady func(ctx context.Context)
}

// Cables is the component. Build with New.
type Cables struct {
	cfg     config.Static // cluster, node, gateway, resyncInterval
	deps    Deps
	log     *slog.Logger
	pairLog *slog.Logger
	trigger syncloop.Trigger
	// repairEvery is the period (ns) the loop's repair check runs at, 0 for none: what the loop
	// really does, for the reload's tests.
	repairEvery atomic.Int64

	// driversMu serialises the drivers' Init retries with Rebuild: neither touches a driver
	// the other is initialising or tearing down. Taken before mu, never under it.
	driversMu sync.Mutex
	// retries are the running Init retries (initretry.go), under retryCtx until stopRetries.
	retries sync.WaitGroup

	mu            sync.Mutex
	retryCtx      context.Context
	cancelRetries context.CancelFunc
	built         []cable.Driver    // every driver built, in config order; closed by Close
	running       []cable.Driver    // the built drivers whose Init succeeded, in config order
	driverErrs    reconcile.Drivers // every configured driver: nil, or why it does not run
	reconciler    *reconcile.Reconciler
	lastRepair    map[string]time.Time
	lastProblems  string
	health        *health.Manager   // nil unless a gateway with healthCheck enabled
	failover      *failover         // the remote gateways the probes found dead; with health
	healthReasons map[string]string // wanted connections not probed, and why
	// publishedHealthIP is the health_check_ip of the last endpoint built (WatchHealthCheckIP).
	publishedHealthIP netip.Addr
}

// New returns the cables of cfg; Start builds the drivers.
func New(cfg config.Static, deps Deps) *Cables {
	if deps.NewDriver == nil {
		deps.NewDriver = cable.New
	}
	if deps.MSS == nil {
		deps.MSS = KernelMSS{}
	}
	return &Cables{cfg: cfg, deps: deps, log: deps.Log, pairLog: deps.PairLog, lastRepair: map[string]time.Time{}}
}

// RepairEvery is the period the repair check runs at now (0: none).
func (c *Cables) RepairEvery() time.Duration { return time.Duration(c.repairEvery.Load()) }

// Trigger asks for a reconcile pass soon; triggers coalesce.
func (c *Cables) Trigger() { c.trigger.Fire() }

// Run runs pass on every trigger (a broker message), every resyncInterval (drift), and at a
// health tick when some unhealthy connection is due to be re-asserted. pass is the agent's whole
// pass (on other nodes it applies the routes via the gateway; on gateways it calls Once).
func (c *Cables) Run(ctx context.Context, pass func(context.Context)) {
	t := time.NewTicker(c.cfg.ResyncInterval)
	defer t.Stop()
	// Health checks: a connection whose probes fail is re-asserted soon, not at the next resync.
	// The check follows the probe period in force: a reload may change it (repairticker.go).
	repair := repairTicker{armed: &c.repairEvery}
	defer repair.stop()
	for {
		healthTick := repair.follow(c.repairPeriod())
		select {
		case <-ctx.Done():
			return
		case <-c.trigger.C():
		case <-t.C:
		case <-healthTick:
			if !c.repairDue(c.currentWants()) {
				continue
			}
		}
		pass(ctx)
	}
}

// Once reconciles the connections with p. It reports whether a reconciler ran (none before Start
// and while a reload rebuilds drivers) and whether some connection came or went.
func (c *Cables) Once(ctx context.Context, p *plan.Plan) (ran, changed bool) {
	desired := p.Wants
	c.logProblems(p.Problems)
	c.mu.Lock()
	r := c.reconciler
	c.mu.Unlock()
	if r == nil {
		return false, false
	}
	actions, err := r.Reconcile(ctx, desired, p.Revision(), c.repairs(desired))
	if err != nil && ctx.Err() == nil {
		c.log.Warn("reconcile incomplete; retrying at the next pass", "err", err)
	}
	c.syncHealth(p.State, desired)
	if f := c.failoverSet(); f != nil {
		f.observe(p)
	}
	return true, len(actions) > 0
}

// currentWants is what the reconciler last applied, by cluster, for the health repair check.
func (c *Cables) currentWants() map[string]reconcile.Want {
	c.mu.Lock()
	r := c.reconciler
	c.mu.Unlock()
	if r == nil {
		return nil
	}
	out := map[string]reconcile.Want{}
	for k, v := range r.Applied() {
		out[k] = v.Want
	}
	return out
}

// logProblems logs skipped clusters and subnets left out when the set changes, not at every
// resync.
func (c *Cables) logProblems(problems []reconcile.Problem) {
	var lines []string
	for _, p := range problems {
		lines = append(lines, p.Cluster+" "+p.Driver+": "+p.Message)
	}
	slices.Sort(lines)
	joined := strings.Join(lines, "\n")
	c.mu.Lock()
	changed := joined != c.lastProblems
	c.lastProblems = joined
	c.mu.Unlock()
	if !changed {
		return
	}
	for _, p := range problems {
		if p.Partial {
			c.pairLog.Warn("remote cluster connected without one of its subnets", "cluster", p.Cluster, "driver", p.Driver, "policy", p.Policy, "reason", p.Message)
			continue
		}
		c.pairLog.Warn("remote cluster not connected", "cluster", p.Cluster, "driver", p.Driver, "policy", p.Policy, "reason", p.Message)
	}
}
