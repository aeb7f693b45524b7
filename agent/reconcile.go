package agent

import (
	"context"
	"sync"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/cables"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/plan"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
)

// Trigger asks for a reconcile pass soon; triggers coalesce.
func (a *Agent) Trigger() { a.cables.Trigger() }

// reconcileOnce is one pass: the routes via the gateway on other nodes, the cable connections on
// gateways, each from the plan in force.
func (a *Agent) reconcileOnce(ctx context.Context) {
	p := a.plan()
	// A pass over a full state (cached, or the broker's snapshot) makes the agent ready (/readyz).
	defer a.markSynced(p.Revision())
	if !a.cfg.Gateway {
		a.worker.Once(p)
		return
	}
	ran, changed := a.cables.Once(ctx, p)
	if !ran {
		return
	}
	// The SNAT set follows the gateway-mode pairs (debounced, idempotent).
	a.ingress.TriggerMesh()
	if changed {
		// A connection came or went: its cluster's backends follow.
		a.TriggerServices()
	}
}

// plan is the plan for the inputs in force (plan.Planner computes it once per change).
func (a *Agent) plan() *plan.Plan {
	in := plan.Inputs{Cluster: a.cfg.Cluster, StandInNode: a.cfg.Node, Guard: a.guards.Current()}
	if a.cfg.Gateway {
		in.Node, in.Drivers, in.Avoid = a.cfg.Node, a.cables.DriverSet(), a.cables.Avoided()
	}
	reg := a.ingress.Registered
	return a.planner.Get(a.link.PlanKey(reg), in, func() (plan.Key, *brokerstate.State) { return a.link.StateCopy(reg) })
}
func (a *Agent) Plan() *plan.Plan { return a.plan() } // the published plan, for the components cmd/cable-agent builds

// stop ends what Run started on the host as Run returns: with Options.CleanupOnExit it first
// removes what the agent made (the services datapath's programs and pins, the routes via the
// gateway on other nodes, the drivers' links and the MSS clamp on gateways); the drivers close.
func (a *Agent) stop() {
	cleanup := a.cleanupDecision()
	a.dp.Stop(cleanup)
	if cleanup && !a.cfg.Gateway {
		if err := a.worker.Cleanup(); err != nil {
			a.log.Error("route cleanup failed", "err", err)
		}
		a.log.Info("cleaned up")
	}
	a.cables.Stop(cleanup && a.cfg.Gateway, !cleanup && a.opts.StopProcessesOnStop != nil && a.opts.StopProcessesOnStop())
}

// newCleanupDecision is whether the agent removes what it made as it stops:
// Options.CleanupOnExit, or the answer of Options.CleanupOnStop, asked once (both the ingress
// and stop need it).
func newCleanupDecision(opts Options) func() bool {
	return sync.OnceValue(func() bool {
		if opts.CleanupOnExit {
			return true
		}
		return opts.CleanupOnStop != nil && opts.CleanupOnStop()
	})
}

// localNode is this node as the cable drivers see it.
func (a *Agent) localNode() cable.LocalNode {
	return cable.LocalNode{Cluster: a.cfg.Cluster, Node: a.cfg.Node, StateDir: a.cfg.StateDir,
		AdvertiseAddress: a.addrs.Private(), LocalSubnets: a.link.LocalSubnets()}
}

// healthManager is the gateway's probes; nil without.
func (a *Agent) healthManager() *health.Manager { return a.cables.Health() }

// nodeAddressesChanged follows the Node's addresses: a new private address (when the config sets
// none) rebuilds the running drivers on it and the guard; any change registers the endpoint
// again.
func (a *Agent) nodeAddressesChanged(ctx context.Context, client apiv1.AgentClient, privateMoved bool) {
	if privateMoved {
		// Serialised with config reloads: both rebuild drivers.
		a.reload.Lock()
		a.cables.RebuildRunning(ctx, a.liveConfig())
		a.reload.Unlock()
		a.guards.Build(ctx)
		a.log.Info("drivers rebuilt on the node's new address; the guard against cable routes protects it", "private", a.addrs.Private().String())
		a.Trigger()
	}
	a.link.Reregister(ctx, client)
}

// endpoint is this gateway's record for the broker (cables.Cables.Endpoint).
func (a *Agent) endpoint() *apiv1.Endpoint {
	private, public := a.addrs.Endpoint() // the config's, or the Node's on Kubernetes
	return a.cables.Endpoint(cables.EndpointInputs{Cluster: a.cfg.Cluster, Node: a.cfg.Node, Private: private, Public: public,
		Subnets: a.link.LocalSubnets(), PodCIDRs: a.link.LocalPodCIDRs(), Addrs: a.opts.Host.InterfaceAddrs()})
}
