// Package agent is the cable-agent: it joins the broker (once), keeps the broker's state in a
// cache on disk, registers and heartbeats this node's endpoint on gateways, watches the broker,
// and reconciles the host (cable connections on gateways, routes via the gateway elsewhere)
// against that state. It serves its status over a unix socket and, optionally, Prometheus
// metrics.
//
// The agent never tears anything down because the broker is unreachable: it keeps running on
// the last state it received, and starts on the cached state when the broker is down.
package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/routes"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/policy"
)

// DriverFactory builds the cable driver name (one of the config's cableDrivers) once the agent
// knows the subnets behind this node (from the config, or after joining, from the cluster
// record). It only validates and builds; Init is the agent's call.
type DriverFactory func(name string, localSubnets []netip.Prefix) (cable.Driver, error)

// DefaultRepairInterval is how often at most the agent re-asserts (re-runs the driver's
// idempotent Connect for) a connection whose health probes keep failing.
const DefaultRepairInterval = 30 * time.Second

// Options wire an Agent.
type Options struct {
	Config *config.Config
	// NewDriver builds each of the config's cableDrivers on gateway nodes; unused elsewhere.
	NewDriver DriverFactory
	Log       *slog.Logger
	// ApplyRoutes applies the routes of a non-gateway node; default routes.Apply.
	ApplyRoutes func([]routes.Route) error
	// Backoff bounds of broker reconnects; defaults 1s and 15s.
	MinBackoff, MaxBackoff time.Duration
	// Ready, if set, is called once the agent serves status and has reconciled from its cache.
	Ready func()
	// NewPinger opens the health probes' sockets; default health.ICMPPinger (tests fake it).
	NewPinger health.NewPinger
	// InterfaceAddrs lists this node's addresses, for its health-check address; default the
	// host's interface addresses (tests pin them).
	InterfaceAddrs func() []netip.Addr
	// RepairInterval bounds how often a connection whose probes failed failureThreshold times
	// is re-asserted; default DefaultRepairInterval.
	RepairInterval time.Duration
	// MSS, if set, is called once on gateways before the first reconcile to install the TCP MSS
	// clamp for the tunnels (cable/mss.Ensure in the binary); a failure is logged, not fatal.
	MSS func() error
}

// Agent is one node's agent. Build with New, run with Run.
type Agent struct {
	cfg  *config.Config
	opts Options
	log  *slog.Logger

	drivers    []cable.Driver    // the configured drivers whose Init succeeded, in config order
	driverErrs reconcile.Drivers // every configured driver: nil, or why it does not run
	reconciler *reconcile.Reconciler
	trigger    chan struct{}
	wakeWatch  chan struct{} // a successful register wakes a watch loop waiting out its backoff
	redial     func()        // makes the broker connection retry now; set before the loops start

	mu           sync.Mutex
	state        *brokerstate.State
	joinCluster  *apiv1.Cluster // cluster record from Join, until the watch brings one
	watchUp      bool
	beatOK       bool
	lastContact  time.Time
	lastErr      string
	cached       bool // running on state loaded from disk, not yet resynced
	lastProblems string

	resKey     string           // policy.Resolver cache: PolicyKey of the policies it was built from
	res        *policy.Resolver // nil until first built
	lastRepair map[string]time.Time

	health        *health.Manager   // nil unless a gateway with healthCheck enabled, once Run started
	healthReasons map[string]string // wanted connections not probed, and why
	metrics       *healthMetrics
}

// New checks options; it creates nothing.
func New(opts Options) (*Agent, error) {
	if opts.Config == nil {
		return nil, errors.New("agent: no config")
	}
	if opts.Config.Gateway && opts.NewDriver == nil {
		return nil, errors.New("agent: gateway without a cable driver factory")
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.ApplyRoutes == nil {
		log := opts.Log
		opts.ApplyRoutes = func(r []routes.Route) error { return routes.Apply(r, log) }
	}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = time.Second
	}
	if opts.MaxBackoff == 0 {
		opts.MaxBackoff = 15 * time.Second
	}
	if opts.NewPinger == nil {
		opts.NewPinger = health.ICMPPinger
	}
	if opts.InterfaceAddrs == nil {
		opts.InterfaceAddrs = interfaceAddrs
	}
	if opts.RepairInterval == 0 {
		opts.RepairInterval = DefaultRepairInterval
	}
	return &Agent{
		cfg:        opts.Config,
		opts:       opts,
		log:        opts.Log.With("cluster", opts.Config.Cluster, "node", opts.Config.Node),
		trigger:    make(chan struct{}, 1),
		wakeWatch:  make(chan struct{}, 1),
		state:      brokerstate.New(),
		metrics:    newHealthMetrics(),
		lastRepair: map[string]time.Time{},
	}, nil
}

// Drivers are the cable drivers that initialised once Run has built them (none before, and on
// non-gateway nodes), in the config's order.
func (a *Agent) Drivers() []cable.Driver {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.drivers)
}

// driverSet says, for every configured driver, whether it runs (nil) or why not.
func (a *Agent) driverSet() reconcile.Drivers {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.driverErrs)
}

// startDrivers builds every configured driver, then initialises each. A driver that cannot be
// built is a configuration error and ends the agent before anything is created; one whose Init
// fails (strongSwan not installed, no VXLAN in the kernel) is logged loudly and left out: the
// node does not publish it, and pairs the policies put on it report why.
func (a *Agent) startDrivers(ctx context.Context) error {
	subnets := a.localSubnets()
	built := make([]cable.Driver, 0, len(a.cfg.CableDrivers))
	for _, name := range a.cfg.CableDrivers {
		d, err := a.opts.NewDriver(name, subnets)
		if err != nil {
			return fmt.Errorf("build cable driver %s: %w", name, err)
		}
		if d.Name() != name {
			return fmt.Errorf("build cable driver %s: got a driver named %q", name, d.Name())
		}
		built = append(built, d)
	}
	var running []cable.Driver
	errs := reconcile.Drivers{}
	for _, d := range built {
		if err := d.Init(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			errs[d.Name()] = err
			a.log.Error("CABLE DRIVER UNAVAILABLE: initialisation failed; this node will not offer it and pairs that need it stay down",
				"driver", d.Name(), "err", err)
			continue
		}
		errs[d.Name()] = nil
		running = append(running, d)
		a.log.Info("cable driver ready", "driver", d.Name(), "port", d.LocalEndpoint().Port)
	}
	a.mu.Lock()
	a.drivers, a.driverErrs = running, errs
	// The reconciler logs the remote cluster and node under the keys cluster and node, so it
	// gets the local identity under other keys.
	a.reconciler = reconcile.NewReconciler(running, a.opts.Log.With("localCluster", a.cfg.Cluster, "localNode", a.cfg.Node))
	a.mu.Unlock()
	return nil
}

// Run runs the agent until ctx ends. It returns an error only when the agent cannot work at
// all: it has no identity and cannot join (a refused token, a wrong broker), or the driver or
// the status socket cannot be set up.
func (a *Agent) Run(ctx context.Context) error {
	id, err := a.identity(ctx)
	if err != nil {
		return err
	}

	if st, err := brokerstate.Load(a.cfg.StateDir); err != nil {
		a.log.Warn("ignoring unreadable broker state cache; waiting for the broker", "err", err)
	} else if st != nil {
		a.mu.Lock()
		a.state, a.cached = st, true
		a.mu.Unlock()
		a.log.Info("loaded cached broker state", "revision", st.Revision, "clusters", len(st.Clusters), "endpoints", len(st.Endpoints))
	}

	if a.cfg.Gateway {
		if err := a.startDrivers(ctx); err != nil {
			return err
		}
		if a.opts.MSS != nil {
			if err := a.opts.MSS(); err != nil {
				a.log.Error("TCP MSS clamping not installed; TCP through the tunnels may stall on large segments", "err", err)
			}
		}
		if a.cfg.HealthCheck.IsEnabled() {
			m := health.NewManager(a.healthSettings(), a.opts.NewPinger, a.metrics,
				a.opts.Log.With("localCluster", a.cfg.Cluster, "localNode", a.cfg.Node))
			defer m.Close()
			a.mu.Lock()
			a.health = m
			a.mu.Unlock()
		}
	}

	statusSrv, err := a.serveStatus(ctx)
	if err != nil {
		return err
	}
	defer statusSrv.close()
	if a.cfg.MetricsAddress != "" {
		m, err := a.serveMetrics(ctx)
		if err != nil {
			return err
		}
		defer m.close()
	}

	// Reconcile from the cache before the broker answers (or when it never does).
	a.reconcileOnce(ctx)
	a.log.Info("agent ready", "gateway", a.cfg.Gateway, "statusSocket", a.cfg.StatusSocket, "broker", a.cfg.Broker, "cachedRevision", a.revision())
	if a.opts.Ready != nil {
		a.opts.Ready()
	}

	conn, err := brokerclient.Dial(a.cfg.Broker, id)
	if err != nil {
		return err
	}
	defer conn.Close()
	client := apiv1.NewAgentClient(conn)
	// Our loops pace the retries (watch backoff 1s..15s, heartbeat interval); gRPC's own
	// reconnect backoff would otherwise add its wait on top and delay the resync after an outage.
	a.redial = conn.ResetConnectBackoff

	var wg sync.WaitGroup
	wg.Go(func() { a.reconcileLoop(ctx) })
	wg.Go(func() { a.watchLoop(ctx, client) })
	if a.cfg.Gateway {
		wg.Go(func() { a.registerLoop(ctx, client) })
	}
	wg.Wait()
	return nil
}

// identity loads the agent's certificate or joins to get one. Transient failures (broker not
// up yet) are retried with backoff; a refusal or a wrong broker ends the agent.
func (a *Agent) identity(ctx context.Context) (*brokerclient.Identity, error) {
	id, err := brokerclient.LoadIdentity(a.cfg.StateDir)
	if err == nil {
		return id, nil
	}
	if !errors.Is(err, brokerclient.ErrNoIdentity) {
		return nil, fmt.Errorf("load agent identity from %s: %w", a.cfg.StateDir, err)
	}
	a.log.Info("no agent certificate in the state dir; joining the broker", "broker", a.cfg.Broker, "stateDir", a.cfg.StateDir)
	bo := a.newBackoff()
	for {
		id, cl, err := brokerclient.Join(ctx, brokerclient.JoinParams{
			Broker: a.cfg.Broker, Cluster: a.cfg.Cluster, Node: a.cfg.Node,
			TokenFile: a.cfg.JoinTokenFile, StateDir: a.cfg.StateDir,
		})
		if err == nil {
			a.mu.Lock()
			a.joinCluster = cl
			a.mu.Unlock()
			a.log.Info("joined the broker; certificate stored", "stateDir", a.cfg.StateDir, "clusterID", cl.GetId())
			return id, nil
		}
		if brokerclient.Permanent(err) {
			return nil, fmt.Errorf("cannot join the mesh: %w", err)
		}
		a.setBrokerError(err)
		a.log.Warn("join failed; retrying", "broker", a.cfg.Broker, "err", err)
		if !sleep(ctx, bo.next()) {
			return nil, ctx.Err() // stopped while waiting for the broker: not a failure
		}
	}
}

// localCluster is our own cluster record: from the broker state, else from the Join answer.
func (a *Agent) localCluster() *apiv1.Cluster {
	a.mu.Lock()
	defer a.mu.Unlock()
	if c := a.state.Clusters[a.cfg.Cluster]; c != nil {
		return c
	}
	return a.joinCluster
}

// localSubnets are the CIDRs behind this node: the config's, else the cluster's at the broker.
func (a *Agent) localSubnets() []netip.Prefix {
	cidrs := append(slices.Clone(a.cfg.PodCIDRs), a.cfg.ServiceCIDRs...)
	if len(cidrs) == 0 {
		if c := a.localCluster(); c != nil {
			cidrs = append(slices.Clone(c.GetPodCidrs()), c.GetServiceCidrs()...)
		}
	}
	return config.Prefixes(cidrs)
}

// localPodCIDRs are the pod CIDRs behind this node: the config's, else the cluster's.
func (a *Agent) localPodCIDRs() []netip.Prefix {
	if len(a.cfg.PodCIDRs) > 0 {
		return config.Prefixes(a.cfg.PodCIDRs)
	}
	if c := a.localCluster(); c != nil {
		return config.Prefixes(c.GetPodCidrs())
	}
	return nil
}

func (a *Agent) revision() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state.Revision
}

// snapshot returns a copy of the broker state for planning without holding the lock. Until the
// watch brings our own cluster record, the one from Join stands in (its labels matter to the
// policies).
func (a *Agent) snapshot() *brokerstate.State {
	a.mu.Lock()
	defer a.mu.Unlock()
	st := a.state.Clone()
	if st.Clusters[a.cfg.Cluster] == nil && a.joinCluster != nil {
		st.Clusters[a.cfg.Cluster] = proto.Clone(a.joinCluster).(*apiv1.Cluster)
	}
	return st
}

// resolver returns the policy resolver for st's policies, rebuilt only when they changed.
func (a *Agent) resolver(st *brokerstate.State) *policy.Resolver {
	key := reconcile.PolicyKey(st)
	a.mu.Lock()
	if a.res != nil && a.resKey == key {
		r := a.res
		a.mu.Unlock()
		return r
	}
	a.mu.Unlock()
	r, problems := reconcile.Resolver(st)
	for _, p := range problems {
		a.log.Warn("ignoring connection policy", "policy", p.Policy, "reason", p.Message)
	}
	a.log.Info("connection policies loaded", "policies", len(st.Policies), "revision", st.Revision)
	a.mu.Lock()
	a.res, a.resKey = r, key
	a.mu.Unlock()
	return r
}

// desired is the planner's view for this gateway: wanted connections, problems, decisions.
func (a *Agent) desired(st *brokerstate.State) ([]reconcile.Want, []reconcile.Problem, []reconcile.PairDecision) {
	return reconcile.Desired(st, a.cfg.Cluster, a.resolver(st), a.driverSet())
}

// Trigger asks for a reconcile pass soon; triggers coalesce.
func (a *Agent) Trigger() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

func (a *Agent) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.ResyncInterval)
	defer t.Stop()
	// Health checks: a connection whose probes fail is re-asserted soon, not at the next resync.
	var healthTick <-chan time.Time
	if a.healthManager() != nil {
		ht := time.NewTicker(a.cfg.HealthCheck.Period)
		defer ht.Stop()
		healthTick = ht.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.trigger:
		case <-t.C:
		case <-healthTick:
			if !a.repairDue(a.currentWants()) {
				continue
			}
		}
		a.reconcileOnce(ctx)
	}
}

// currentWants is what the reconciler last applied, for the health repair check.
func (a *Agent) currentWants() map[string]reconcile.Want {
	a.mu.Lock()
	r := a.reconciler
	a.mu.Unlock()
	if r == nil {
		return nil
	}
	out := map[string]reconcile.Want{}
	for k, v := range r.Applied() {
		out[k] = v.Want
	}
	return out
}

// unhealthy returns the wanted pairs whose probes (aimed at the wanted endpoint) failed
// failureThreshold times in a row, with the count.
func (a *Agent) unhealthy(wants map[string]reconcile.Want) map[string]int {
	m := a.healthManager()
	if m == nil {
		return nil
	}
	th := m.Settings().FailureThreshold
	out := map[string]int{}
	for c, w := range wants {
		r, ok := m.Result(c)
		if ok && r.Target.Node == w.Remote.Node && !r.Healthy(th) {
			out[c] = r.ConsecutiveFailures
		}
	}
	return out
}

// repairDue reports whether some unhealthy pair may be re-asserted now.
func (a *Agent) repairDue(wants map[string]reconcile.Want) bool {
	bad := a.unhealthy(wants)
	now := time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	for c := range bad {
		if now.Sub(a.lastRepair[c]) >= a.opts.RepairInterval {
			return true
		}
	}
	return false
}

// repairs picks the pairs to re-assert this pass: unhealthy ones not re-asserted within the
// repair interval. Re-running the driver's idempotent Connect restores what the device cannot
// show as missing (routes lost when their source address went away and came back).
func (a *Agent) repairs(wants []reconcile.Want) map[string]string {
	byCluster := map[string]reconcile.Want{}
	for _, w := range wants {
		byCluster[w.Remote.Cluster] = w
	}
	bad := a.unhealthy(byCluster)
	if len(bad) == 0 {
		return nil
	}
	now := time.Now()
	out := map[string]string{}
	a.mu.Lock()
	defer a.mu.Unlock()
	for c, n := range bad {
		if now.Sub(a.lastRepair[c]) < a.opts.RepairInterval {
			continue
		}
		a.lastRepair[c] = now
		out[c] = fmt.Sprintf("health probes failed %d times in a row; re-asserting the connection", n)
	}
	for c := range a.lastRepair {
		if _, ok := byCluster[c]; !ok {
			delete(a.lastRepair, c)
		}
	}
	return out
}

// reconcileOnce is one observe → desire → diff → apply pass.
func (a *Agent) reconcileOnce(ctx context.Context) {
	st := a.snapshot()
	if !a.cfg.Gateway {
		if err := a.opts.ApplyRoutes(routes.Desired(st, a.cfg.Cluster, a.resolver(st))); err != nil {
			a.log.Warn("routes via the gateway not applied", "err", err)
		}
		return
	}
	desired, problems, _ := a.desired(st)
	a.logProblems(problems)
	a.mu.Lock()
	r := a.reconciler
	a.mu.Unlock()
	if r == nil {
		return
	}
	if _, err := r.Reconcile(ctx, desired, st.Revision, a.repairs(desired)); err != nil && ctx.Err() == nil {
		a.log.Warn("reconcile incomplete; retrying at the next pass", "err", err)
	}
	a.syncHealth(st, desired)
}

// logProblems logs skipped clusters when the set changes, not at every resync.
func (a *Agent) logProblems(problems []reconcile.Problem) {
	var lines []string
	for _, p := range problems {
		lines = append(lines, p.Cluster+" "+p.Driver+": "+p.Message)
	}
	sort.Strings(lines)
	joined := strings.Join(lines, "\n")
	a.mu.Lock()
	changed := joined != a.lastProblems
	a.lastProblems = joined
	a.mu.Unlock()
	if !changed {
		return
	}
	for _, p := range problems {
		a.log.Warn("remote cluster not connected", "cluster", p.Cluster, "driver", p.Driver, "policy", p.Policy, "reason", p.Message)
	}
}

// watchLoop keeps one watch stream open, resuming from the last applied revision.
func (a *Agent) watchLoop(ctx context.Context, client apiv1.AgentClient) {
	bo := a.newBackoff()
	var quiet repeatFilter
	for {
		got, err := a.watchOnce(ctx, client)
		if ctx.Err() != nil {
			return
		}
		if got {
			bo.reset()
			quiet.reset()
		}
		a.mu.Lock()
		a.watchUp = false
		a.mu.Unlock()
		a.setBrokerError(err)
		d := bo.next()
		level := slog.LevelWarn
		if quiet.repeated(err) {
			level = slog.LevelDebug
		}
		a.log.Log(ctx, level, "broker watch ended; keeping current state and retrying", "err", err, "retryIn", d.Round(time.Millisecond).String())
		// Drop a stale wake-up: only a register that succeeds from now on should cut the wait.
		select {
		case <-a.wakeWatch:
		default:
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-a.wakeWatch:
			t.Stop()
		}
		a.redial()
	}
}

// watchOnce runs one stream until it fails. got says whether any message arrived.
func (a *Agent) watchOnce(ctx context.Context, client apiv1.AgentClient) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	since := a.revision()
	stream, err := client.Watch(ctx, &apiv1.WatchRequest{SinceRevision: since})
	if err != nil {
		return false, fmt.Errorf("open watch: %w", err)
	}
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, fmt.Errorf("watch: %w", err)
		}
		got = true
		if err := a.apply(resp); err != nil {
			return got, err
		}
	}
}

// apply applies one watch message, persists the state and triggers a reconcile.
func (a *Agent) apply(resp *apiv1.WatchResponse) error {
	a.mu.Lock()
	next := a.state.Clone()
	if err := next.Apply(resp); err != nil {
		// Ask for a full snapshot on the next stream rather than resuming past a message we
		// could not apply.
		a.state.Revision = 0
		a.mu.Unlock()
		return fmt.Errorf("apply broker message at revision %d: %w", resp.GetRevision(), err)
	}
	a.state = next
	a.cached = false
	a.watchUp = true
	a.lastContact = time.Now()
	if !a.cfg.Gateway || a.beatOK {
		a.lastErr = ""
	}
	a.mu.Unlock()
	if err := next.Save(a.cfg.StateDir, time.Now()); err != nil {
		a.log.Error("cannot persist broker state; running on memory", "err", err)
	}
	a.log.Debug("applied broker message", "revision", next.Revision, "snapshot", resp.GetSnapshot(), "events", len(resp.GetEvents()))
	a.Trigger()
	return nil
}

// registerLoop registers this gateway's endpoint and renews its lease every heartbeatInterval,
// registering again whenever a heartbeat fails (lease lost, broker restarted without it, ...).
func (a *Agent) registerLoop(ctx context.Context, client apiv1.AgentClient) {
	registered := false
	var quiet repeatFilter
	for {
		var err error
		if !registered {
			err = a.register(ctx, client)
			registered = err == nil
		} else if err = a.heartbeat(ctx, client); err != nil {
			registered = false
			if status.Code(err) == codes.NotFound {
				a.log.Info("broker lost this endpoint; registering again")
				if err = a.register(ctx, client); err == nil {
					registered = true
				}
			}
		}
		if ctx.Err() != nil {
			return
		}
		a.mu.Lock()
		a.beatOK = err == nil
		watchUp := a.watchUp
		if err == nil {
			a.lastContact = time.Now()
			if a.watchUp {
				a.lastErr = ""
			}
		}
		a.mu.Unlock()
		if err != nil {
			a.setBrokerError(err)
			level := slog.LevelWarn
			if quiet.repeated(err) {
				level = slog.LevelDebug
			}
			a.log.Log(ctx, level, "endpoint registration or heartbeat failed", "err", err)
		} else {
			quiet.reset()
			if !watchUp {
				// The broker answers: do not leave the watch waiting out a long backoff.
				select {
				case a.wakeWatch <- struct{}{}:
				default:
				}
			}
		}
		if !sleep(ctx, a.cfg.HeartbeatInterval) {
			return
		}
		if err != nil {
			a.redial()
		}
	}
}

func (a *Agent) register(ctx context.Context, client apiv1.AgentClient) error {
	ep := a.endpoint()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := client.RegisterEndpoint(cctx, &apiv1.RegisterEndpointRequest{Endpoint: ep, LeaseSeconds: int64(a.cfg.LeaseSeconds)})
	if err != nil {
		return fmt.Errorf("register endpoint: %w", err)
	}
	a.log.Info("endpoint registered", "drivers", strings.Join(ep.GetDrivers(), ","), "address", ep.GetPrivateIp(), "subnets", strings.Join(ep.GetSubnets(), ","))
	return nil
}

func (a *Agent) heartbeat(ctx context.Context, client apiv1.AgentClient) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := client.Heartbeat(cctx, &apiv1.HeartbeatRequest{Node: a.cfg.Node})
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// endpoint is this gateway's record for the broker.
func (a *Agent) endpoint() *apiv1.Endpoint {
	subnets := a.localSubnets()
	ep := &apiv1.Endpoint{
		Cluster:   a.cfg.Cluster,
		Node:      a.cfg.Node,
		PrivateIp: a.cfg.AdvertiseAddress,
	}
	for _, p := range subnets {
		ep.Subnets = append(ep.Subnets, p.String())
	}
	// Only the drivers that run are published: the node does not claim a cable it cannot carry.
	for _, d := range a.Drivers() {
		le := d.LocalEndpoint()
		ep.Drivers = append(ep.Drivers, d.Name())
		if ep.CablePorts == nil {
			ep.CablePorts = map[string]uint32{}
		}
		ep.CablePorts[d.Name()] = uint32(le.Port)
		ep.SetAttributes(d.Name(), le.Attributes)
	}
	if ip := healthCheckIP(a.localPodCIDRs(), a.opts.InterfaceAddrs()); ip.IsValid() {
		ep.HealthCheckIp = ip.String()
	}
	return ep
}

// healthCheckIP is the first of this node's addresses inside its pod CIDRs.
func healthCheckIP(pods []netip.Prefix, addrs []netip.Addr) netip.Addr {
	for _, a := range addrs {
		for _, p := range pods {
			if p.Contains(a) {
				return a
			}
		}
	}
	return netip.Addr{}
}

func interfaceAddrs() []netip.Addr {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, ifa := range ifas {
		if n, ok := ifa.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}

func (a *Agent) setBrokerError(err error) {
	if err == nil {
		return
	}
	msg := err.Error()
	if s, ok := status.FromError(errors.Unwrap(err)); ok && s.Code() != codes.OK {
		msg = s.Message()
	}
	a.mu.Lock()
	a.lastErr = msg
	a.mu.Unlock()
}

// brokerStatus returns the broker part of the status document.
func (a *Agent) brokerStatus() (connected bool, rev uint64, last time.Time, errMsg string, cached bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	connected = a.watchUp && (!a.cfg.Gateway || a.beatOK)
	return connected, a.state.Revision, a.lastContact, a.lastErr, a.cached
}

// repeatFilter tells a failure that repeats the previous one, so a broker that stays down is
// logged once at warn level and then at debug level, not every few seconds.
type repeatFilter struct{ last string }

func (f *repeatFilter) repeated(err error) bool {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	r := msg == f.last
	f.last = msg
	return r
}

func (f *repeatFilter) reset() { f.last = "" }

// backoff is exponential with jitter between min and max.
type backoff struct {
	min, max, cur time.Duration
}

func (a *Agent) newBackoff() *backoff {
	return &backoff{min: a.opts.MinBackoff, max: a.opts.MaxBackoff}
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	// Jitter of up to half the step, so a restarted broker is not hit by every agent at once.
	return min(b.cur+time.Duration(rand.Int64N(int64(b.cur/2)+1)), b.max)
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits d or until ctx ends; it reports whether the wait completed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
