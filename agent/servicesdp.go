package agent

import (
	"net/netip"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/cables"
	"github.com/cablemesh/cablemesh/agent/clusterpolicy"
	"github.com/cablemesh/cablemesh/agent/exports"
	"github.com/cablemesh/cablemesh/agent/servicedp"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/mcs"
)

// newDatapath is the services datapath (DNS, the socket load balancer, the counters); Run
// starts it. Until then it answers status, triggers and reloads with nothing.
func (a *Agent) newDatapath() *servicedp.Datapath {
	return servicedp.New(a.cfg, servicedp.Deps{
		Log: a.log, Registry: a.registry, Live: a.liveConfig, LocalCluster: a.link.LocalCluster,
		InterfaceAddrs: a.opts.Host.InterfaceAddrs, OpenLB: a.opts.Host.OpenLB, OpenCounters: a.opts.Host.OpenCounters,
		ListLinks: a.opts.Host.ListLinks, Plan: a.plan, Observe: a.cables.Observe,
		TunnelLinks: func() []string { return cables.TunnelLinks(a.cables.Running()) },
	})
}

// TriggerServices asks for a services pass soon; triggers coalesce.
func (a *Agent) TriggerServices() { a.dp.Trigger() }

// servicesStatus is the services section of the status document.
func (a *Agent) servicesStatus() *statusapi.Services {
	out := &statusapi.Services{
		ImportSelector: a.liveConfig().Imports.EffectiveSelector(),
		ImportsKnown:   a.plan().State.HasImports,
		Imports:        []statusapi.ServiceImport{},
	}
	out.Exports, out.Sync = a.exports.Status()
	a.dp.Status(out)
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
