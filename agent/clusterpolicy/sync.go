package clusterpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
	"github.com/cablemesh/cablemesh/internal/syncloop"
)

// Cluster-scoped policies: the agent reads this cluster's policies from its policyDir
// (config) or from the ClusterConnectionPolicy objects of its Kubernetes API (a source
// cmd/cable-agent hands to Agent.SetClusterPolicySource), and sends their complete set to the broker
// (SetClusterPolicies) whenever it changes, retrying with backoff until the broker has it, and
// again every resyncInterval. It never resolves with its local copies: every agent, this one
// included, resolves with the broker's copies that the watch brings (and the on-disk cache keeps
// through a broker outage), so both ends of a pair decide alike. A change made while the broker
// is down takes effect when it is back.

// Sync is the agent's cluster-scoped policies and what the broker acknowledged. mu guards the
// fields below it; no other lock is taken under it.
type Sync struct {
	deps SyncDeps
	log  *slog.Logger

	mu  sync.Mutex
	src Source // from SetClusterPolicySource; the config's policyDir wins
	cur Set
	// have is set once the source handed out its first set: until then nothing is sent (an
	// empty set would delete the cluster's policies at the broker).
	have bool
	// version counts sets; synced is the version the broker acknowledged.
	version, synced uint64
	sendErr         string // the broker's last refusal or failure, "" after a success
}

// SyncDeps are what the sync of the cluster's policies takes from the rest of the agent.
type SyncDeps struct {
	Log *slog.Logger
	// Cluster and PolicyDir are the config's (policyDir, when set, is the source).
	Cluster, PolicyDir string
	// Resync sends the set again at that interval (a broker that lost it gets it back).
	Resync  time.Duration
	Backoff func() *retry.Backoff
	// CertificateRefused is the broker's words once it refused this node's certificate for good:
	// the loop stops then.
	CertificateRefused func() string
}

// NewSync returns the sync of a cluster's policies to the broker.
func NewSync(deps SyncDeps) *Sync { return &Sync{deps: deps, log: deps.Log} }

// SetSource sets where the cluster's policies come from when the config has no
// policyDir (on Kubernetes: a KubeSource). Call it before Run.
func (x *Sync) SetSource(src Source) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.src = src
}

func (x *Sync) source() Source {
	if x.deps.PolicyDir != "" {
		return &DirSource{Dir: x.deps.PolicyDir, Cluster: x.deps.Cluster, Log: x.log}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.src
}

// Run runs the source and the sync to the broker until ctx ends; without a
// source it returns at once.
func (x *Sync) Run(ctx context.Context, client apiv1.AgentClient) {
	src := x.source()
	if src == nil {
		return
	}
	var loop syncloop.Loop
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() {
		syncloop.RunSource(ctx, x.log, "cluster policy source", x.deps.Backoff(), func(ctx context.Context) error {
			return src.Run(ctx, func(set Set) {
				x.set(set)
				loop.Trigger()
			})
		})
	})
	// Sent on every change, and every resyncInterval: a broker that lost its state, or an
	// admin's delete, gets the set back.
	loop.Run(ctx, "this cluster's policies", func(ctx context.Context) error {
		return x.send(ctx, client)
	}, syncloop.Options{
		Backoff: x.deps.Backoff(),
		Log:     x.log,
		Resync:  x.deps.Resync,
		// The same set cannot succeed: wait for a change or the next resync.
		Refused: func(err error) bool {
			return brokerclient.RefusedCode(err, codes.InvalidArgument, codes.PermissionDenied, codes.AlreadyExists, codes.Unimplemented)
		},
		Stop: func(error) bool { return x.deps.CertificateRefused() != "" },
	})
}

// set records a source's new set and logs what it refuses.
func (x *Sync) set(set Set) {
	x.mu.Lock()
	x.cur, x.have = set, true
	x.version++
	x.mu.Unlock()
	for _, p := range set.Problems {
		x.log.Warn("cluster policy refused", "source", p.Source, "policy", p.Policy, "reason", p.Message)
	}
	x.log.Info("cluster policies read", "policies", strings.Join(set.Names(), ","), "refused", len(set.Problems))
}

// send makes one SetClusterPolicies call with the current set, if the source has
// handed one out, and records its outcome.
func (x *Sync) send(ctx context.Context, client apiv1.AgentClient) error {
	x.mu.Lock()
	if !x.have {
		x.mu.Unlock()
		return nil
	}
	set, version := x.cur, x.version
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
			x.log.Info("cluster policy synced to the broker", "policy", p.GetName(), "outcome", resp.GetOutcomes()[i], "revision", p.GetRevision())
		}
	}
	for _, n := range resp.GetDeleted() {
		x.log.Info("cluster policy deleted at the broker", "policy", n)
	}
	return nil
}

// Problems are the status problems of the cluster's policies: each refused one, and
// a set the broker refused or has not had yet because of an error.
func (x *Sync) Problems() []statusapi.Problem {
	x.mu.Lock()
	defer x.mu.Unlock()
	var out []statusapi.Problem
	for _, p := range x.cur.Problems {
		out = append(out, statusapi.Problem{Message: "cluster policy " + p.String()})
	}
	if x.sendErr != "" {
		out = append(out, statusapi.Problem{Message: "cluster policies not synced to the broker: " + x.sendErr})
	}
	return out
}
