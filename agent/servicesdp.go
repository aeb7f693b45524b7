package agent

import (
	"context"
	"time"

	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/servicedp"
	"github.com/cablemesh/cablemesh/agent/services"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cable"
)

// LoadBalancer and TrafficCounters are the services datapath's eBPF parts (servicedp).
type (
	LoadBalancer    = servicedp.LoadBalancer
	TrafficCounters = servicedp.TrafficCounters
)

// EnsureBPFFS makes sure pinDir lies on a bpf filesystem (servicedp.EnsureBPFFS).
func EnsureBPFFS(pinDir string) (mounted bool, warning string, err error) {
	return servicedp.EnsureBPFFS(pinDir)
}

// startDatapath starts the services datapath; a.dp is nil until it runs.
func (a *Agent) startDatapath(ctx context.Context) error {
	dp := servicedp.New(a.cfg, servicedp.Deps{
		Log: a.log, Registry: a.registry, Live: a.liveConfig, LocalCluster: a.localCluster,
		InterfaceAddrs: a.opts.InterfaceAddrs, OpenLB: a.opts.OpenLB, OpenCounters: a.opts.OpenCounters,
		ListLinks: a.opts.ListLinks, Plan: a.plan, Pairs: a.pairs,
		TunnelLinks: func() []string { return tunnelLinks(a.runningDrivers()) },
	})
	if err := dp.Start(ctx); err != nil {
		return err
	}
	a.mu.Lock()
	a.dp = dp
	a.mu.Unlock()
	return nil
}

func (a *Agent) datapath() *servicedp.Datapath {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dp
}

// TriggerServices asks for a services pass soon; triggers coalesce.
func (a *Agent) TriggerServices() {
	if dp := a.datapath(); dp != nil {
		dp.Trigger()
	}
}

// servicesStatus is the services section of the status document.
func (a *Agent) servicesStatus() *statusapi.Services {
	out := &statusapi.Services{
		ImportSelector: a.importSelector(),
		ImportsKnown:   a.plan().State.HasImports,
		Imports:        []statusapi.ServiceImport{},
	}
	out.Exports, out.Sync = a.exportsStatus()
	a.datapath().Status(out)
	return out
}

// pairs is what this node knows of every remote cluster with a live gateway endpoint, for
// services.Reachability: what the plan says and, on gateways, what the devices and the probes
// say of each wanted connection.
func (a *Agent) pairs(ctx context.Context, p *plan.Plan) map[string]services.Pair {
	out := servicedp.PlannedPairs(p)
	if !a.cfg.Gateway {
		return out
	}
	wants := p.Wants
	a.mu.Lock()
	r := a.reconciler
	a.mu.Unlock()
	var observed map[string][]cable.ConnectionStatus
	var obsErrs map[string]error
	var applied map[string]reconcile.Applied
	if r != nil {
		octx, cancel := context.WithTimeout(ctx, 2*time.Second)
		observed, obsErrs = r.Observe(octx)
		cancel()
		applied = r.Applied()
	}
	m := a.healthManager()
	for _, w := range wants {
		c := w.Remote.Cluster
		pr := out[c]
		if m != nil {
			if res, ok := m.Result(c); ok && res.Target.Node == w.Remote.Node {
				th := m.Settings().FailureThreshold
				pr.Probe = &services.Probe{Healthy: res.Healthy(th), ConsecutiveFailures: res.ConsecutiveFailures, LastError: res.LastError}
			}
		}
		// The device judges a pair only once the reconciler has applied what is wanted now: a pair
		// being connected or moved to another driver is not on its new device yet, and its
		// clients must not lose their connections for that (the probes still judge it).
		if ap, ok := applied[c]; ok && reconcile.EqualWant(ap.Want, w) && obsErrs[w.Driver] == nil {
			pr.Device = services.DeviceMissing
			for _, o := range observed[w.Driver] {
				if o.Cluster == c {
					pr.Device, pr.DeviceMessage = string(o.State), o.Message
				}
			}
		}
		out[c] = pr
	}
	return out
}
