package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/clusterpolicy"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/syncloop"
)

// Cluster-scoped policies (seed 003): the agent reads this cluster's policies from its policyDir
// (config) or from the ClusterConnectionPolicy objects of its Kubernetes API (a source
// cmd/cable-agent hands to SetClusterPolicySource), and sends their complete set to the broker
// (SetClusterPolicies) whenever it changes, retrying with backoff until the broker has it, and
// again every resyncInterval. It never resolves with its local copies: every agent, this one
// included, resolves with the broker's copies that the watch brings (and the on-disk cache keeps
// through a broker outage), so both ends of a pair decide alike. A change made while the broker
// is down takes effect when it is back.

// clusterPolicyState is the agent's cluster-scoped policies and what the broker acknowledged.
type clusterPolicyState struct {
	mu  sync.Mutex
	src clusterpolicy.Source // from SetClusterPolicySource; the config's policyDir wins
	set clusterpolicy.Set
	// have is set once the source handed out its first set: until then nothing is sent (an
	// empty set would delete the cluster's policies at the broker).
	have bool
	// version counts sets; synced is the version the broker acknowledged.
	version, synced uint64
	sendErr         string // the broker's last refusal or failure, "" after a success
}

// SetClusterPolicySource sets where the cluster's policies come from when the config has no
// policyDir (on Kubernetes: a clusterpolicy.KubeSource). Call it before Run.
func (a *Agent) SetClusterPolicySource(src clusterpolicy.Source) {
	a.clusterPolicies.mu.Lock()
	defer a.clusterPolicies.mu.Unlock()
	a.clusterPolicies.src = src
}

func (a *Agent) clusterPolicySource() clusterpolicy.Source {
	if a.cfg.PolicyDir != "" {
		return &clusterpolicy.DirSource{Dir: a.cfg.PolicyDir, Cluster: a.cfg.Cluster, Log: a.log}
	}
	a.clusterPolicies.mu.Lock()
	defer a.clusterPolicies.mu.Unlock()
	return a.clusterPolicies.src
}

// runClusterPolicies runs the source and the sync to the broker until ctx ends; without a
// source it returns at once.
func (a *Agent) runClusterPolicies(ctx context.Context, client apiv1.AgentClient) {
	src := a.clusterPolicySource()
	if src == nil {
		return
	}
	var loop syncloop.Loop
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		syncloop.RunSource(ctx, a.log, "cluster policy source", a.newBackoff(), func(ctx context.Context) error {
			return src.Run(ctx, func(set clusterpolicy.Set) {
				a.setClusterPolicies(set)
				loop.Trigger()
			})
		})
	})
	// Sent on every change, and every resyncInterval: a broker that lost its state, or an
	// admin's delete, gets the set back.
	loop.Run(ctx, "this cluster's policies", func(ctx context.Context) error {
		return a.sendClusterPolicies(ctx, client)
	}, syncloop.Options{
		Backoff: a.newBackoff(),
		Log:     a.log,
		Resync:  a.cfg.ResyncInterval,
		// The same set cannot succeed: wait for a change or the next resync.
		Refused: func(err error) bool {
			return brokerclient.RefusedCode(err, codes.InvalidArgument, codes.PermissionDenied, codes.AlreadyExists, codes.Unimplemented)
		},
		Stop: func(error) bool { return a.certificateRefused() != "" },
	})
}

// setClusterPolicies records a source's new set and logs what it refuses.
func (a *Agent) setClusterPolicies(set clusterpolicy.Set) {
	x := &a.clusterPolicies
	x.mu.Lock()
	x.set, x.have = set, true
	x.version++
	x.mu.Unlock()
	for _, p := range set.Problems {
		a.log.Warn("cluster policy refused", "source", p.Source, "policy", p.Policy, "reason", p.Message)
	}
	a.log.Info("cluster policies read", "policies", strings.Join(set.Names(), ","), "refused", len(set.Problems))
}

// sendClusterPolicies makes one SetClusterPolicies call with the current set, if the source has
// handed one out, and records its outcome.
func (a *Agent) sendClusterPolicies(ctx context.Context, client apiv1.AgentClient) error {
	x := &a.clusterPolicies
	x.mu.Lock()
	if !x.have {
		x.mu.Unlock()
		return nil
	}
	set, version := x.set, x.version
	x.mu.Unlock()
	req := &apiv1.SetClusterPoliciesRequest{}
	for _, p := range set.Policies {
		b, err := json.Marshal(p)
		if err != nil {
			return fmt.Errorf("encode cluster policy %q: %w", p.Metadata.Name, err)
		}
		req.Policies = append(req.Policies, &apiv1.Policy{Name: p.Metadata.Name, Json: b})
	}
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := client.SetClusterPolicies(cctx, req)
	x.mu.Lock()
	defer x.mu.Unlock()
	if err != nil {
		x.sendErr = brokerclient.RPCMessage(err)
		return fmt.Errorf("set cluster policies: %w", err)
	}
	x.sendErr, x.synced = "", version
	for i, p := range resp.GetPolicies() {
		if i < len(resp.GetOutcomes()) && resp.GetOutcomes()[i] != "unchanged" {
			a.log.Info("cluster policy synced to the broker", "policy", p.GetName(), "outcome", resp.GetOutcomes()[i], "revision", p.GetRevision())
		}
	}
	for _, n := range resp.GetDeleted() {
		a.log.Info("cluster policy deleted at the broker", "policy", n)
	}
	return nil
}

// clusterPolicyProblems are the status problems of the cluster's policies: each refused one, and
// a set the broker refused or has not had yet because of an error.
func (a *Agent) clusterPolicyProblems() []statusapi.Problem {
	x := &a.clusterPolicies
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []statusapi.Problem
	for _, p := range x.set.Problems {
		out = append(out, statusapi.Problem{Message: "cluster policy " + p.String()})
	}
	if x.sendErr != "" {
		out = append(out, statusapi.Problem{Message: "cluster policies not synced to the broker: " + x.sendErr})
	}
	return out
}
