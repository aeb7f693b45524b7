package cables

import (
	"context"
	"time"

	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/services"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/bpf"
	"github.com/cablemesh/cablemesh/cable"
)

// Status fills in the cables' part of a gateway's status: its drivers (those of the config in
// force, drivers), one row per remote cluster of the plan with what the device, the probes and
// the counters (traffic, nil without them) say, the decisions and the problems. Connection state,
// counters and handshakes come from the driver; a wanted connection the device does not have is
// in state error; a connection whose probes failed healthCheck.failureThreshold times in a row is
// in error whatever the device says (health.Merge).
func (c *Cables) Status(ctx context.Context, p *plan.Plan, out *statusapi.Status, drivers []string, traffic map[uint32]bpf.ClusterCounters) {
	c.mu.Lock()
	r := c.reconciler
	c.mu.Unlock()
	if r == nil {
		return
	}
	st := p.State
	for _, name := range drivers {
		ds := statusapi.DriverStatus{Name: name}
		if err, ok := c.DriverSet()[name]; ok && err == nil {
			ds.Running = true
		} else if err != nil {
			ds.Error = err.Error()
		}
		for _, d := range c.Running() {
			if d.Name() == name {
				ds.Port = int(d.LocalEndpoint().Port)
				ds.Daemon = driverDaemon(ctx, d)
			}
		}
		out.Drivers = append(out.Drivers, ds)
	}
	desired, problems, decisions := p.Wants, p.Problems, p.Decisions
	octx, cancel := context.WithTimeout(ctx, 3*time.Second)
	observed, obsErrs := r.Observe(octx)
	cancel()
	out.Connections = BuildConnections(desired, problems, observed, obsErrs, r.Applied(), r.Failures(), func(name string) uint32 {
		return st.Clusters[name].GetId()
	})
	for _, d := range decisions {
		out.Decisions = append(out.Decisions, statusapi.Decision{Cluster: d.Cluster, Connect: d.Connect, Driver: d.Driver, Policy: d.Policy, Default: d.Default, Mode: d.Mode})
	}
	if m := c.Health(); m != nil {
		c.mu.Lock()
		reasons := c.healthReasons
		c.mu.Unlock()
		out.Connections = applyHealth(out.Connections, m.Result, reasons, m.Settings())
	}
	if tr := traffic; tr != nil {
		for i := range out.Connections {
			n := tr[out.Connections[i].ClusterID]
			out.Connections[i].Traffic = &statusapi.Traffic{RxPackets: n.RxPackets, RxBytes: n.RxBytes, TxPackets: n.TxPackets, TxBytes: n.TxBytes}
		}
	}
	out.Connections = withPartialProblems(out.Connections, problems)
	out.Problems = append(out.Problems, StatusProblems(problems)...)
}

// BuildConnections joins what is wanted with what the drivers report. It is pure. observed has
// an entry for every driver that could be read, obsErrs the error of those that could not;
// applied is what this process last connected (for AppliedRevision), failed the pairs whose last
// Connect failed: their state is error with the driver's own words, whatever the device shows.
func BuildConnections(desired []reconcile.Want, problems []reconcile.Problem, observed map[string][]cable.ConnectionStatus, obsErrs map[string]error, applied map[string]reconcile.Applied, failed map[string]reconcile.Failure, clusterID func(string) uint32) []statusapi.Connection {
	out := []statusapi.Connection{}
	for _, w := range desired {
		d := w.Remote
		c := statusapi.Connection{
			Cluster:   d.Cluster,
			ClusterID: d.ClusterID,
			Node:      d.Node,
			Driver:    w.Driver,
			Mode:      reconcile.ModeDirect,
			Policy:    w.Policy,
			Endpoint:  reconcile.EndpointString(d),
		}
		if w.GatewayMode {
			c.Mode = reconcile.ModeGateway
		}
		if ap, ok := applied[d.Cluster]; ok && reconcile.EqualWant(ap.Want, w) {
			c.AppliedRevision = ap.Revision
		}
		for _, p := range d.Subnets {
			c.Subnets = append(c.Subnets, p.String())
		}
		var o cable.ConnectionStatus
		ok := false
		for _, x := range observed[w.Driver] {
			if x.Cluster == d.Cluster {
				o, ok = x, true
				break
			}
		}
		if ok {
			c.RxBytes, c.TxBytes, c.MTU = o.RxBytes, o.TxBytes, o.MTU
			if o.Endpoint != "" {
				c.Endpoint = o.Endpoint
			}
			if o.Node != "" {
				c.Node = o.Node
			}
			if !o.LastHandshake.IsZero() {
				t := o.LastHandshake.UTC()
				c.LastHandshake = &t
			}
		}
		f, hasFailed := failed[d.Cluster]
		switch {
		case hasFailed && reconcile.EqualWant(f.Want, w):
			c.State = string(cable.StateError)
			c.Message = w.Driver + " could not connect the pair: " + f.Err.Error()
		case obsErrs[w.Driver] != nil:
			c.State = string(cable.StateError)
			c.Message = "cannot read the " + w.Driver + " device: " + obsErrs[w.Driver].Error()
		case !ok:
			c.State = string(cable.StateError)
			c.Message = "connection is wanted but missing on the " + w.Driver + " device"
		default:
			c.State = string(o.State)
			c.Message = o.Message
		}
		out = append(out, c)
	}
	for _, p := range problems {
		if p.Cluster == "" || p.Partial {
			continue
		}
		out = append(out, statusapi.Connection{
			Cluster:   p.Cluster,
			ClusterID: clusterID(p.Cluster),
			Driver:    p.Driver,
			Policy:    p.Policy,
			State:     string(cable.StateError),
			Message:   p.Message,
		})
	}
	return out
}

// withPartialProblems adds to each connection's message the problems of its pair that leave it
// connected (a subnet left out), after whatever the device and the probes said.
func withPartialProblems(conns []statusapi.Connection, problems []reconcile.Problem) []statusapi.Connection {
	for i := range conns {
		c := &conns[i]
		for _, p := range problems {
			if !p.Partial || p.Cluster != c.Cluster {
				continue
			}
			if c.Message != "" {
				c.Message += "; "
			}
			c.Message += p.Message
		}
	}
	return conns
}

// StatusProblems are the planner's problems of remote clusters as status problems.
func StatusProblems(problems []reconcile.Problem) []statusapi.Problem {
	var out []statusapi.Problem
	for _, p := range problems {
		if p.Cluster != "" {
			out = append(out, statusapi.Problem{Cluster: p.Cluster, Message: p.Message})
		}
	}
	return out
}

// Observe adds to out, the services' view of each pair of p (servicedp.PlannedPairs), what the
// probes and the devices say of each wanted connection.
func (c *Cables) Observe(ctx context.Context, p *plan.Plan, out map[string]services.Pair) {
	c.mu.Lock()
	r := c.reconciler
	c.mu.Unlock()
	var observed map[string][]cable.ConnectionStatus
	var obsErrs map[string]error
	var applied map[string]reconcile.Applied
	if r != nil {
		octx, cancel := context.WithTimeout(ctx, 2*time.Second)
		observed, obsErrs = r.Observe(octx)
		cancel()
		applied = r.Applied()
	}
	m := c.Health()
	for _, w := range p.Wants {
		cl := w.Remote.Cluster
		pr := out[cl]
		if m != nil {
			if res, ok := m.Result(cl); ok && res.Target.Node == w.Remote.Node {
				th := m.Settings().FailureThreshold
				pr.Probe = &services.Probe{Healthy: res.Healthy(th), ConsecutiveFailures: res.ConsecutiveFailures, LastError: res.LastError}
			}
		}
		// The device judges a pair only once the reconciler has applied what is wanted now: a pair
		// being connected or moved to another driver is not on its new device yet, and its
		// clients must not lose their connections for that (the probes still judge it).
		if ap, ok := applied[cl]; ok && reconcile.EqualWant(ap.Want, w) && obsErrs[w.Driver] == nil {
			pr.Device = services.DeviceMissing
			for _, o := range observed[w.Driver] {
				if o.Cluster == cl {
					pr.Device, pr.DeviceMessage = string(o.State), o.Message
				}
			}
		}
		out[cl] = pr
	}
}

// Connections are the connection rows of the status (Status's, without the drivers, the traffic
// counters and the problems): what the link reports send the broker, read often and cheaply.
func (c *Cables) Connections(ctx context.Context, p *plan.Plan) []statusapi.Connection {
	c.mu.Lock()
	r := c.reconciler
	c.mu.Unlock()
	if r == nil {
		return nil
	}
	st := p.State
	octx, cancel := context.WithTimeout(ctx, 3*time.Second)
	observed, obsErrs := r.Observe(octx)
	cancel()
	conns := BuildConnections(p.Wants, p.Problems, observed, obsErrs, r.Applied(), r.Failures(), func(name string) uint32 {
		return st.Clusters[name].GetId()
	})
	if m := c.Health(); m != nil {
		c.mu.Lock()
		reasons := c.healthReasons
		c.mu.Unlock()
		conns = applyHealth(conns, m.Result, reasons, m.Settings())
	}
	return withPartialProblems(conns, p.Problems)
}
