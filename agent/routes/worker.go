package routes

import (
	"fmt"
	"log/slog"
	"net/netip"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// gatewayProbeSettings are a non-gateway node's probes of its own cluster's gateways, over the
// underlay to each gateway's private IP: an ICMP echo every 300ms, a gateway unhealthy after 3
// unanswered in a row, so a dead gateway is passed over 0.9-1.2s after it died, the same time the
// remote gateways take to detect it through the tunnel (health.DefaultPeriod and threshold) and
// move the pair to the next gateway: both ends switch together, and traffic resumes well inside
// 2s, long before the broker withdraws the dead gateway at its lease expiry. Cost: 3.3 echoes and
// replies of 36 bytes a second per worker and gateway (a gateway of a 1,000-node cluster answers
// 3,300 small packets a second). The timeout equals the period so one slow answer never delays
// the next probe. A gateway that answers again is used again only after it answered for
// health.DefaultRecoveryHold, the hold the remote gateways apply before they move back to it.
var gatewayProbeSettings = health.Settings{
	Period:           300 * time.Millisecond,
	Timeout:          300 * time.Millisecond,
	FailureThreshold: 3,
	Window:           32,
	RecoveryHold:     health.DefaultRecoveryHold,
}

// WorkerDeps are what a non-gateway node's routes take from the rest of the agent.
type WorkerDeps struct {
	Log     *slog.Logger
	PairLog *slog.Logger // this node's identity as localCluster/localNode: the probes name the gateway
	// NewPinger opens a probe's socket; Apply applies the routes (default Apply).
	NewPinger health.NewPinger
	Apply     func([]Route) error
	// OnChange asks for a pass now: a gateway's probes crossed the threshold.
	OnChange func()
}

// Worker is a non-gateway node's routes via its cluster's gateways: it probes the gateways, picks
// for every remote cluster the first gateway that carries the pair and answers, applies the
// routes, and reports them in the status. mu guards probes and choices; no other lock is taken
// under it.
type Worker struct {
	cluster string
	deps    WorkerDeps

	mu      sync.Mutex
	probes  *health.Manager // nil until Start
	choices []Choice        // how the last pass routed each remote cluster
}

// NewWorker returns the routes of a non-gateway node of cluster.
func NewWorker(cluster string, deps WorkerDeps) *Worker {
	if deps.Apply == nil {
		log := deps.Log
		deps.Apply = func(r []Route) error { return Apply(r, log) }
	}
	return &Worker{cluster: cluster, deps: deps}
}

// Once applies the routes of plan p.
func (w *Worker) Once(p *plan.Plan) {
	if err := w.deps.Apply(w.routes(p)); err != nil {
		w.deps.Log.Warn("routes via the gateway not applied", "err", err)
	}
}

// Cleanup removes the routes via the gateway.
func (w *Worker) Cleanup() error { return w.deps.Apply(nil) }

// Start starts the probes of a non-gateway node (their targets follow the broker state at
// every pass, Once) and returns what stops them. A gateway that
// crosses the threshold either way triggers a pass at once, so the routes move within one probe
// period, not at the next resync.
func (w *Worker) Start() (stop func()) {
	// The probers' lines name the gateway as cluster/node: pairLog keeps this node's own identity
	// under localCluster and localNode, so the keys do not clash.
	m := health.NewManager(gatewayProbeSettings, w.gatewayPinger, nil, w.deps.PairLog)
	m.SetSubject("local gateway")
	m.OnChange(func(key string, healthy bool) {
		_, node, _ := strings.Cut(key, "/")
		if healthy {
			w.deps.Log.Info("local gateway answers this node's probes again; routes may move back", "gateway", node)
		} else {
			w.deps.Log.Warn("local gateway does not answer this node's probes; routes move to the next gateway that carries each pair", "gateway", node)
		}
		w.deps.OnChange()
	})
	w.mu.Lock()
	w.probes = m
	w.mu.Unlock()
	return m.Close
}

// gatewayPinger opens a probe of a local gateway from the address this node's routing picks for
// it (a worker has no configured underlay address; the kernel knows which one reaches the
// gateway), then hands it to the agent's pinger (ICMP, or the tests' fake).
func (w *Worker) gatewayPinger(t health.Target) (health.Pinger, error) {
	if !t.Source.IsValid() {
		src, err := health.RouteSource(t.Destination)
		if err != nil {
			return nil, fmt.Errorf("probe gateway %s at %s: %w", t.Node, t.Destination, err)
		}
		t.Source = src
	}
	return w.deps.NewPinger(t)
}

// gatewayTargets are the probe targets of a non-gateway node: every gateway of its cluster in st
// with a parseable private IP, keyed by endpoint key (cluster/node).
func gatewayTargets(st *brokerstate.State, cluster string) []health.Target {
	var out []health.Target
	for _, e := range st.Endpoints {
		if e.GetCluster() != cluster {
			continue
		}
		ip, err := netip.ParseAddr(e.GetPrivateIp())
		if err != nil {
			continue
		}
		out = append(out, health.Target{Cluster: brokerstate.EndpointKey(cluster, e.GetNode()), Node: e.GetNode(), Destination: ip.Unmap()})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
	return out
}

// routes points the probes at the gateways of st and returns the routes of this
// non-gateway node: each remote cluster via the first gateway that carries the pair and answers
// the probes (Plan). The choices are kept for the status.
func (w *Worker) routes(p *plan.Plan) []Route {
	st := p.State
	w.mu.Lock()
	m := w.probes
	w.mu.Unlock()
	var healthy Healthy
	if m != nil {
		m.Sync(gatewayTargets(st, w.cluster))
		s := m.Settings()
		now := time.Now()
		healthy = func(node string) bool {
			r, ok := m.Result(brokerstate.EndpointKey(w.cluster, node))
			return !ok || r.Usable(s.FailureThreshold, s.RecoveryHold, now)
		}
	}
	out, choices := Plan(st, w.cluster, p.Resolver, p.Guard(), healthy)
	w.mu.Lock()
	prev := w.choices
	w.choices = choices
	w.mu.Unlock()
	w.logRouteMoves(prev, choices)
	return out
}

// logRouteMoves logs every remote cluster whose gateway changed since the last pass.
func (w *Worker) logRouteMoves(prev, next []Choice) {
	was := map[string]string{}
	for _, c := range prev {
		was[c.Cluster] = c.Via
	}
	for _, c := range next {
		if old, ok := was[c.Cluster]; ok && old != c.Via {
			w.deps.Log.Info("remote cluster routed via another local gateway", "cluster", c.Cluster, "from", old, "to", c.Via, "reason", c.Reason)
		}
	}
}

// Status is the Worker section of a non-gateway node's status: its probes and its routes
// as the last reconcile pass chose them.
func (w *Worker) Status(p *plan.Plan) *statusapi.Worker {
	w.mu.Lock()
	m := w.probes
	choices := w.choices
	w.mu.Unlock()
	st := p.State
	s := gatewayProbeSettings.WithDefaults()
	if m != nil {
		s = m.Settings()
	}
	out := &statusapi.Worker{
		ProbePeriodMs:    s.Period.Milliseconds(),
		FailureThreshold: s.FailureThreshold,
		Gateways:         []statusapi.WorkerGateway{},
		Routes:           []statusapi.WorkerRoute{},
	}
	for _, t := range gatewayTargets(st, w.cluster) {
		g := statusapi.WorkerGateway{Node: t.Node, Address: t.Destination.String(), Healthy: true}
		if m != nil {
			if r, ok := m.Result(t.Cluster); ok {
				g.Probing = true
				g.Healthy = r.Healthy(s.FailureThreshold)
				g.ProbesSent, g.ProbesFailed = r.Sent, r.Failed
				g.ConsecutiveFailures = r.ConsecutiveFailures
				g.LastError = r.LastError
				g.LastSuccess = statusapi.UTCTime(r.LastSuccess)
				if r.HasRTT {
					g.RTTMs = statusapi.Millis(r.RTT.Last)
				}
			}
		}
		out.Gateways = append(out.Gateways, g)
	}
	for _, c := range choices {
		r := statusapi.WorkerRoute{Cluster: c.Cluster, Via: c.Via, Carriers: c.Carriers, Reason: c.Reason}
		if c.Address.IsValid() {
			r.Address = c.Address.String()
		}
		for _, p := range c.Subnets {
			r.Subnets = append(r.Subnets, p.String())
		}
		out.Routes = append(out.Routes, r)
	}
	return out
}
