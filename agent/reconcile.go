package agent

import (
	"context"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Trigger asks for a reconcile pass soon; triggers coalesce.
func (a *Agent) Trigger() {
	a.trigger.Fire()
}

// reconcileLoop runs a pass on every trigger (a broker message), every resyncInterval (drift),
// and at a health tick when some unhealthy connection is due to be re-asserted.
func (a *Agent) reconcileLoop(ctx context.Context) {
	t := time.NewTicker(a.cfg.ResyncInterval)
	defer t.Stop()
	// Health checks: a connection whose probes fail is re-asserted soon, not at the next resync.
	// The check follows the probe period in force: a reload may change it (repairticker.go).
	repair := repairTicker{armed: &a.reload.repairEvery}
	defer repair.stop()
	for {
		healthTick := repair.follow(a.repairPeriod())
		select {
		case <-ctx.Done():
			return
		case <-a.trigger.C():
		case <-t.C:
		case <-healthTick:
			if !a.repairDue(a.currentWants()) {
				continue
			}
		}
		a.reconcileOnce(ctx)
	}
}

// reconcileOnce is one observe → desire → diff → apply pass.
func (a *Agent) reconcileOnce(ctx context.Context) {
	p := a.plan()
	st := p.State
	// A pass over a full state (cached, or the broker's snapshot) makes the agent ready (/readyz).
	defer a.markSynced(st.Revision)
	if !a.cfg.Gateway {
		if err := a.opts.ApplyRoutes(a.nonGatewayRoutes(p)); err != nil {
			a.log.Warn("routes via the gateway not applied", "err", err)
		}
		return
	}
	desired := p.Wants
	a.logProblems(p.Problems)
	a.mu.Lock()
	r := a.reconciler
	a.mu.Unlock()
	if r == nil {
		return
	}
	actions, err := r.Reconcile(ctx, desired, st.Revision, a.repairs(desired))
	if err != nil && ctx.Err() == nil {
		a.log.Warn("reconcile incomplete; retrying at the next pass", "err", err)
	}
	a.syncHealth(st, desired)
	// The SNAT set follows the gateway-mode pairs (debounced, idempotent).
	a.triggerMesh()
	if len(actions) > 0 {
		// A connection came or went: its cluster's backends follow.
		a.TriggerServices()
	}
}

// currentWants is what the reconciler last applied, by cluster, for the health repair check.
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

// logProblems logs skipped clusters and subnets left out when the set changes, not at every
// resync.
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
		if p.Partial {
			a.pairLog.Warn("remote cluster connected without one of its subnets", "cluster", p.Cluster, "driver", p.Driver, "policy", p.Policy, "reason", p.Message)
			continue
		}
		a.pairLog.Warn("remote cluster not connected", "cluster", p.Cluster, "driver", p.Driver, "policy", p.Policy, "reason", p.Message)
	}
}

// plan is the plan for the inputs in force (plan.Planner computes it once per change).
func (a *Agent) plan() *plan.Plan {
	in := plan.Inputs{Cluster: a.cfg.Cluster, StandInNode: a.cfg.Node, Guard: a.currentGuard()}
	if a.cfg.Gateway {
		in.Node, in.Drivers = a.cfg.Node, a.driverSet()
	}
	return a.planner.Get(a.planKey(), in, a.stateCopy)
}

// planKey names the broker-side inputs of the plan without copying them.
func (a *Agent) planKey() plan.Key {
	// Lock order: a.mu, then a.mesh.mu.
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.planKeyLocked()
}

func (a *Agent) planKeyLocked() plan.Key {
	a.mesh.mu.Lock()
	reg := a.mesh.registered
	a.mesh.mu.Unlock()
	return plan.Key{State: a.state, Revision: a.state.Revision, Join: a.joinCluster, Registered: reg}
}

// stateCopy is a copy of the broker state for the planner, with the key it was taken at.
func (a *Agent) stateCopy() (plan.Key, *brokerstate.State) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.planKeyLocked(), a.state.Clone()
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
