package cables

import (
	"fmt"
	"maps"
	"time"

	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/reconcile"
)

// A connection whose health probes fail is re-asserted: the driver's idempotent Connect runs
// again, which restores what the device cannot show as missing (routes lost when their source
// address went away and came back). It happens at most once per repair interval per pair. The
// decisions are pure functions (unhealthyPairs, planRepairs); the agent feeds them the probe
// results, its record of past repairs and the time.

// unhealthyPairs returns the wanted pairs whose probes, aimed at the wanted remote node, failed
// threshold times in a row, with the count. result is a cluster's latest probe result. It is
// pure.
func unhealthyPairs(wants map[string]reconcile.Want, result func(cluster string) (health.Result, bool), threshold int) map[string]int {
	out := map[string]int{}
	for c, w := range wants {
		r, ok := result(c)
		if ok && r.Target.Node == w.Remote.Node && !r.Healthy(threshold) {
			out[c] = r.ConsecutiveFailures
		}
	}
	return out
}

// planRepairs decides which connections to re-assert at now. It is pure.
//
// unhealthy are the pairs whose probes keep failing (unhealthyPairs), last when each pair was
// last re-asserted, wanted the pairs this node wants connected. A pair is due when it is
// unhealthy, wanted, and was not re-asserted within interval; due maps it to the reason.
// nextLast is last with the due pairs stamped now and the pairs no longer wanted forgotten (a
// pair wanted again later starts afresh). last is not modified.
func planRepairs(unhealthy map[string]int, last map[string]time.Time, wanted map[string]bool, now time.Time, interval time.Duration) (due map[string]string, nextLast map[string]time.Time) {
	nextLast = map[string]time.Time{}
	for c, t := range last {
		if wanted[c] {
			nextLast[c] = t
		}
	}
	for c, n := range unhealthy {
		if !wanted[c] {
			continue
		}
		if t, ok := last[c]; ok && now.Sub(t) < interval {
			continue
		}
		if due == nil {
			due = map[string]string{}
		}
		due[c] = fmt.Sprintf("health probes failed %d times in a row; re-asserting the connection", n)
		nextLast[c] = now
	}
	return due, nextLast
}

// unhealthy applies unhealthyPairs to the health manager's results; nil without probes.
func (c *Cables) unhealthy(wants map[string]reconcile.Want) map[string]int {
	m := c.Health()
	if m == nil {
		return nil
	}
	return unhealthyPairs(wants, m.Result, m.Settings().FailureThreshold)
}

// repairs picks the pairs to re-assert in this pass and records that they were.
func (c *Cables) repairs(wants []reconcile.Want) map[string]string {
	byCluster := map[string]reconcile.Want{}
	for _, w := range wants {
		byCluster[w.Remote.Cluster] = w
	}
	bad := c.unhealthy(byCluster)
	c.mu.Lock()
	defer c.mu.Unlock()
	due, next := planRepairs(bad, c.lastRepair, clusterSet(byCluster), time.Now(), c.deps.RepairInterval)
	c.lastRepair = next
	return due
}

// repairDue reports whether some pair of wants may be re-asserted now.
func (c *Cables) repairDue(wants map[string]reconcile.Want) bool {
	bad := c.unhealthy(wants)
	if len(bad) == 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	due, _ := planRepairs(bad, c.lastRepair, clusterSet(wants), time.Now(), c.deps.RepairInterval)
	return len(due) > 0
}

func clusterSet(wants map[string]reconcile.Want) map[string]bool {
	set := make(map[string]bool, len(wants))
	for c := range maps.Keys(wants) {
		set[c] = true
	}
	return set
}
