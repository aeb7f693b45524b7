package agent

import (
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/routes"
	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// gatewayProbeSettings are a non-gateway node's probes of its own cluster's gateways, over the
// underlay to each gateway's private IP: an ICMP echo every 500ms, a gateway unhealthy after 3
// unanswered in a row, so a dead gateway is passed over 1.5-2s after it died, well inside the
// 5s an operator of Submariner or Cilium expects, and before the broker can withdraw it with the
// shortest lease it grants (2s), so the worker never waits on the probes. Cost: 2 echoes and 2
// replies of 36 bytes a second per worker and gateway (a gateway of a 1,000-node cluster answers
// 2,000 small packets a second). The timeout equals the period so one slow answer never delays
// the next probe.
var gatewayProbeSettings = health.Settings{
	Period:           500 * time.Millisecond,
	Timeout:          500 * time.Millisecond,
	FailureThreshold: 3,
	Window:           32,
}

// startGatewayProbes starts the probes of a non-gateway node (their targets follow the broker
// state at every reconcile pass, nonGatewayRoutes) and returns what stops them. A gateway that
// crosses the threshold either way triggers a pass at once, so the routes move within one probe
// period, not at the next resync.
func (a *Agent) startGatewayProbes() (stop func()) {
	// The probers' lines name the gateway as cluster/node: pairLog keeps this node's own identity
	// under localCluster and localNode, so the keys do not clash.
	m := health.NewManager(gatewayProbeSettings, a.gatewayPinger, nil, a.pairLog)
	m.SetSubject("local gateway")
	m.OnChange(func(key string, healthy bool) {
		_, node, _ := strings.Cut(key, "/")
		if healthy {
			a.log.Info("local gateway answers this node's probes again; routes may move back", "gateway", node)
		} else {
			a.log.Warn("local gateway does not answer this node's probes; routes move to the next gateway that carries each pair", "gateway", node)
		}
		a.Trigger()
	})
	a.mu.Lock()
	a.gwProbes = m
	a.mu.Unlock()
	return m.Close
}

// gatewayPinger opens a probe of a local gateway from the address this node's routing picks for
// it (a worker has no configured underlay address; the kernel knows which one reaches the
// gateway), then hands it to the agent's pinger (ICMP, or the tests' fake).
func (a *Agent) gatewayPinger(t health.Target) (health.Pinger, error) {
	if !t.Source.IsValid() {
		src, err := sourceFor(t.Destination)
		if err != nil {
			return nil, fmt.Errorf("probe gateway %s at %s: %w", t.Node, t.Destination, err)
		}
		t.Source = src
	}
	return a.opts.NewPinger(t)
}

// sourceFor is the source address the kernel picks for packets to dst: connecting a UDP socket
// sends nothing but runs the route lookup.
func sourceFor(dst netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %s: %w", dst, err)
	}
	defer func() { _ = c.Close() }()
	la, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("no source address towards %s", dst)
	}
	return la.AddrPort().Addr().Unmap(), nil
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

// nonGatewayRoutes points the probes at the gateways of st and returns the routes of this
// non-gateway node: each remote cluster via the first gateway that carries the pair and answers
// the probes (routes.Plan). The choices are kept for the status.
func (a *Agent) nonGatewayRoutes(p *plan.Plan) []routes.Route {
	st := p.State
	a.mu.Lock()
	m := a.gwProbes
	a.mu.Unlock()
	var healthy routes.Healthy
	if m != nil {
		m.Sync(gatewayTargets(st, a.cfg.Cluster))
		threshold := m.Settings().FailureThreshold
		healthy = func(node string) bool {
			r, ok := m.Result(brokerstate.EndpointKey(a.cfg.Cluster, node))
			return !ok || r.Healthy(threshold)
		}
	}
	out, choices := routes.Plan(st, a.cfg.Cluster, p.Resolver, p.Guard(), healthy)
	a.mu.Lock()
	prev := a.gwChoices
	a.gwChoices = choices
	a.mu.Unlock()
	a.logRouteMoves(prev, choices)
	return out
}

// logRouteMoves logs every remote cluster whose gateway changed since the last pass.
func (a *Agent) logRouteMoves(prev, next []routes.Choice) {
	was := map[string]string{}
	for _, c := range prev {
		was[c.Cluster] = c.Via
	}
	for _, c := range next {
		if old, ok := was[c.Cluster]; ok && old != c.Via {
			a.log.Info("remote cluster routed via another local gateway", "cluster", c.Cluster, "from", old, "to", c.Via, "reason", c.Reason)
		}
	}
}

// workerStatus is the Worker section of a non-gateway node's status: its probes and its routes
// as the last reconcile pass chose them.
func (a *Agent) workerStatus() *statusapi.Worker {
	a.mu.Lock()
	m := a.gwProbes
	choices := a.gwChoices
	a.mu.Unlock()
	st := a.plan().State
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
	for _, t := range gatewayTargets(st, a.cfg.Cluster) {
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
