package cables

import (
	"fmt"
	"net/netip"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cable"
)

// Health is the prober manager; nil on non-gateways, with probing disabled, or before Run.
func (c *Cables) Health() *health.Manager {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.health
}

// syncHealth points the probers at the remote gateways of the connections this node wants.
func (c *Cables) syncHealth(st *brokerstate.State, wants []reconcile.Want) {
	m := c.Health()
	if m == nil {
		return
	}
	// Probes go through whatever cable the pair runs: they only need the two health addresses.
	desired := make([]cable.RemoteEndpoint, 0, len(wants))
	for _, w := range wants {
		desired = append(desired, w.Remote)
	}
	targets, reasons := healthTargets(st, desired, c.deps.LocalPodCIDRs(), c.deps.InterfaceAddrs())
	c.mu.Lock()
	c.healthReasons = reasons
	c.mu.Unlock()
	m.Sync(targets)
}

// healthTargets returns one probe target per wanted connection whose two ends have a
// health-check address, and for the others why they are not probed. It is pure.
//
// The source is this node's first address inside its pod CIDRs of the destination's family (the
// address the cable's routes carry as source, so the remote end accepts the probe); the
// destination is the health_check_ip the remote gateway published in its endpoint.
//
// A gateway-mode pair (its connection has LocalSubnets: this gateway's mesh /32, and Subnets: the
// remote gateway's) carries nothing but the two mesh addresses, so it is probed from this
// gateway's mesh address to the remote one's; the kernel answers the echo on the remote
// gateway's cbl-mesh0 address.
func healthTargets(st *brokerstate.State, desired []cable.RemoteEndpoint, pods []netip.Prefix, addrs []netip.Addr) ([]health.Target, map[string]string) {
	var targets []health.Target
	reasons := map[string]string{}
	for _, d := range desired {
		if src, dst, ok := meshProbe(d); ok {
			targets = append(targets, health.Target{Cluster: d.Cluster, Node: d.Node, Source: src, Destination: dst})
			continue
		}
		ep := st.Endpoints[d.Cluster+"/"+d.Node]
		raw := ep.GetHealthCheckIp()
		if raw == "" {
			reasons[d.Cluster] = fmt.Sprintf("remote endpoint %s/%s publishes no health_check_ip", d.Cluster, d.Node)
			continue
		}
		dst, err := netip.ParseAddr(raw)
		if err != nil || dst.Zone() != "" {
			reasons[d.Cluster] = fmt.Sprintf("remote endpoint %s/%s: health_check_ip %q is not an IP address", d.Cluster, d.Node, raw)
			continue
		}
		dst = dst.Unmap()
		src := probeSource(pods, addrs, dst.Is4())
		if !src.IsValid() {
			reasons[d.Cluster] = fmt.Sprintf("this node has no IPv%d address inside its pod CIDRs to probe %s from", map[bool]int{true: 4, false: 6}[dst.Is4()], dst)
			continue
		}
		targets = append(targets, health.Target{Cluster: d.Cluster, Node: d.Node, Source: src, Destination: dst})
	}
	return targets, reasons
}

// meshProbe is the source and destination of a gateway-mode pair's probes: the two mesh
// addresses (see healthTargets).
func meshProbe(d cable.RemoteEndpoint) (src, dst netip.Addr, ok bool) {
	if len(d.LocalSubnets) != 1 || len(d.Subnets) != 1 || !d.LocalSubnets[0].IsSingleIP() || !d.Subnets[0].IsSingleIP() {
		return netip.Addr{}, netip.Addr{}, false
	}
	return d.LocalSubnets[0].Addr(), d.Subnets[0].Addr(), true
}

// probeSource is the first of addrs inside pods, of the wanted family, skipping loopback and
// link-local addresses as the cable does when it picks its route source.
func probeSource(pods []netip.Prefix, addrs []netip.Addr, v4 bool) netip.Addr {
	for _, a := range addrs {
		a = a.Unmap()
		if a.Is4() != v4 || a.IsLoopback() || a.IsLinkLocalUnicast() {
			continue
		}
		for _, p := range pods {
			if p.Contains(a) {
				return a
			}
		}
	}
	return netip.Addr{}
}

// applyHealth adds the probes' findings to the status rows: RTT, the health block, and the
// final state (health.Merge of the device's state and the probes'). It is pure: probe returns a
// cluster's probe result, reasons say why a wanted connection is not probed.
func applyHealth(conns []statusapi.Connection, probe func(cluster string) (health.Result, bool), reasons map[string]string, s health.Settings) []statusapi.Connection {
	for i := range conns {
		c := &conns[i]
		r, ok := probe(c.Cluster)
		if ok && c.Node != "" && r.Target.Node != c.Node {
			// The prober still aims at a previous endpoint of the cluster; until the next pass
			// moves it, its figures say nothing about this connection.
			ok = false
		}
		if !ok {
			if why, has := reasons[c.Cluster]; has {
				c.Health = &statusapi.Health{Probing: false, Reason: why, Healthy: true}
			}
			continue
		}
		h := &statusapi.Health{
			Probing:             true,
			Healthy:             r.Healthy(s.FailureThreshold),
			Source:              r.Target.Source.String(),
			Target:              r.Target.Destination.String(),
			ProbesSent:          r.Sent,
			ProbesFailed:        r.Failed,
			ConsecutiveFailures: r.ConsecutiveFailures,
			FailureThreshold:    s.FailureThreshold,
			PeriodMs:            s.Period.Milliseconds(),
			LastError:           r.LastError,
			LastProbe:           statusapi.UTCTime(r.LastProbe),
			LastSuccess:         statusapi.UTCTime(r.LastSuccess),
		}
		if r.HasRTT {
			h.Samples = r.RTT.Samples
			c.RTT = &statusapi.RTT{
				LastMs: statusapi.Millis(r.RTT.Last), MinMs: statusapi.Millis(r.RTT.Min), AvgMs: statusapi.Millis(r.RTT.Avg), MaxMs: statusapi.Millis(r.RTT.Max),
				P50Ms: statusapi.Millis(r.RTT.P50), P95Ms: statusapi.Millis(r.RTT.P95), P99Ms: statusapi.Millis(r.RTT.P99),
			}
		}
		c.Health = h
		st, msg := health.Merge(cable.State(c.State), c.Message, &r, s.FailureThreshold)
		c.State, c.Message = string(st), msg
	}
	return conns
}

// failoverSet is the failover of the probes in force; nil without probes.
func (c *Cables) failoverSet() *failover {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.failover
}

// Avoided are the remote gateways (endpoint keys, sorted) this gateway's probes found dead and
// that the plan must connect no pair to while their cluster has another (plan.Inputs.Avoid).
func (c *Cables) Avoided() []string {
	if f := c.failoverSet(); f != nil {
		return f.Avoided()
	}
	return nil
}

// pinger is the probes' socket opener: the agent's, else ICMP.
func (c *Cables) pinger() health.NewPinger {
	if c.deps.NewPinger != nil {
		return c.deps.NewPinger
	}
	return health.ICMPPinger
}

// SetHealth starts the gateway's probers with settings when enabled (healthCheck.enabled) and
// none run, or stops the ones that run when not. Run calls it at start and, with false, at its
// end; a reload that changes healthCheck.enabled calls it too (applyConfig, which then wakes
// the passes that follow it). A non-gateway has no probers of its own to start (its probes of
// the local gateways, nongateway.go, do not depend on this setting).
func (c *Cables) SetHealth(enabled bool, settings health.Settings) {
	c.mu.Lock()
	m := c.health
	switch {
	case enabled && m == nil && c.cfg.Gateway:
		m = health.NewManager(settings, c.deps.NewPinger, c.deps.Metrics, c.pairLog)
		f := newFailover(c.pairLog, underlayPinger(c.pinger()), c.trigger.Fire, underlaySettings)
		// A pair whose probes cross the threshold leaves the service maps now, not at the
		// next pass; when its remote gateway died, the pair moves to that cluster's next
		// gateway (failover.go).
		m.OnChange(func(cluster string, healthy bool) {
			if r, ok := m.Result(cluster); ok {
				f.tunnelChanged(c.cfg.Cluster, c.cfg.Node, r, healthy)
			}
			c.deps.OnHealthChange()
		})
		c.health, c.failover = m, f
		c.mu.Unlock()
	case !enabled && m != nil:
		f := c.failover
		c.health, c.failover = nil, nil
		c.mu.Unlock()
		// Outside c.mu: Close waits for the probers, whose callbacks may take it.
		m.Close()
		f.Close()
		// The pairs it moved go back to the gateways the broker state alone picks.
		c.trigger.Fire()
	default:
		c.mu.Unlock()
	}
}
