package agent

import (
	"context"
	"net/netip"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/cables"
	"github.com/cablemesh/cablemesh/agent/clusterpolicy"
	"github.com/cablemesh/cablemesh/agent/exports"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/servicedp"
	"github.com/cablemesh/cablemesh/agent/services"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/mcs"
)

// startDatapath starts the services datapath; a.dp is nil until it runs.
func (a *Agent) startDatapath(ctx context.Context) error {
	dp := servicedp.New(a.start, servicedp.Deps{
		Log: a.log, Registry: a.registry, Live: a.liveConfig, LocalCluster: a.link.LocalCluster,
		InterfaceAddrs: a.opts.Host.InterfaceAddrs, OpenLB: a.opts.Host.OpenLB, OpenCounters: a.opts.Host.OpenCounters,
		ListLinks: a.opts.Host.ListLinks, Plan: a.plan, Pairs: a.pairs,
		TunnelLinks: func() []string { return cables.TunnelLinks(a.cables.Running()) },
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
	out.Exports, out.Sync = a.exports.Status()
	a.datapath().Status(out)
	return out
}

// pairs is what this node knows of every remote cluster with a live gateway endpoint, for
// services.Reachability: what the plan says and, on gateways, what the devices and the probes
// say of each wanted connection.
func (a *Agent) pairs(ctx context.Context, p *plan.Plan) map[string]services.Pair {
	out := servicedp.PlannedPairs(p)
	if a.cfg.Gateway {
		a.cables.Observe(ctx, p, out)
	}
	return out
}

// ownExportScope is where this node's exports' endpoints may lie (exports.ScopeOf).
func (a *Agent) ownExportScope() (scope mcs.EndpointScope, known bool) {
	a.link.Read(func(st *brokerstate.State, join *apiv1.Cluster) {
		scope, known = exports.ScopeOf(st, join, a.cfg.Cluster, a.ingress.Registered())
	})
	return scope, known
}

// SetClusterPolicySource sets where the cluster's policies come from when the config has no
// policyDir (on Kubernetes: a clusterpolicy.KubeSource). Call it before Run.
func (a *Agent) SetClusterPolicySource(src clusterpolicy.Source) { a.clusterPolicies.SetSource(src) }

// MeshAddress is this node's mesh address (invalid when none).
func (a *Agent) MeshAddress() netip.Addr { return a.ingress.MeshAddress() }
