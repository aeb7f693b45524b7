package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/cable"
	_ "github.com/cablemesh/cablemesh/cable/specs" // every driver's spec: policies' drivers and options are checked with their own validation
	"github.com/cablemesh/cablemesh/policy"
)

// ValidateDefaultCableDriver checks a --default-cable-driver value against the registered cable
// drivers: the ones every agent ships (cable/drivers), whose specs the broker links
// (cable/specs) without their datapaths. Applied policies are held to the same drivers, and to each driver's own option
// validation (admission.CheckCableDriver).
func ValidateDefaultCableDriver(name string) error {
	if names := cable.Names(); !slices.Contains(names, name) {
		return fmt.Errorf("default cable driver %q is not one of %s", name, strings.Join(names, ", "))
	}
	return nil
}

// ensureDefaultPolicy creates the mesh default policy (full mesh over driver) on first start. A
// later start keeps the stored one, which an operator may have changed with apply since; a flag
// that disagrees with it is logged, not applied. New has validated an explicit driver; an empty
// one is policy.DefaultDriver, taken without asking the driver registry, so that a program that
// links the broker without the drivers (cablectl's tests) still starts one.
func (s *Server) ensureDefaultPolicy(ctx context.Context, driver string) error {
	explicit := driver != ""
	if !explicit {
		driver = policy.DefaultDriver
	}
	var (
		created bool
		stored  policy.ClusterConnectionPolicy
	)
	_, err := s.store.Update(ctx, func(tx store.Tx) error {
		created = false
		sp, err := tx.Policy(policy.DefaultPolicyName)
		if err != nil {
			return err
		}
		if sp != nil {
			stored, err = admission.StoredPolicy(sp)
			return err
		}
		rec, p, err := admission.DefaultPolicy(driver)
		if err != nil {
			return err
		}
		created, stored = true, p
		return tx.PutPolicy(rec)
	})
	if err != nil {
		return fmt.Errorf("create the mesh default policy: %w", err)
	}
	storedDriver, connection := "", policy.NoConnect
	if stored.Spec.Connects() {
		connection = policy.Connect
		if stored.Spec.CableDriver != nil {
			storedDriver = stored.Spec.CableDriver.Name
		}
	}
	switch {
	case created:
		s.log.Info("created the mesh default policy", "policy", policy.DefaultPolicyName, "driver", driver)
	case explicit && storedDriver != driver:
		s.log.Warn("--default-cable-driver differs from the stored mesh default policy, which is kept (it is set only at first start; change it with `cablectl apply`)",
			"flag", driver, "policy", policy.DefaultPolicyName, "connectionPolicy", connection, "driver", storedDriver)
	}
	return nil
}

func (a *adminService) ApplyPolicies(ctx context.Context, req *apiv1.ApplyPoliciesRequest) (*apiv1.ApplyPoliciesResponse, error) {
	// Everything is checked before anything is stored: one bad policy fails the whole call.
	ps, err := admission.ParsePolicies(req.Policies)
	if err != nil {
		return nil, rpcError("apply policies", err)
	}
	resp := &apiv1.ApplyPoliciesResponse{}
	plan := func(tx store.ReadTx) ([]admission.Applied, error) {
		stored, err := tx.Policies()
		if err != nil {
			return nil, err
		}
		if err := admission.CheckAdminOverwrite(ps, stored); err != nil {
			return nil, err
		}
		return admission.PlanApply(ps, stored)
	}
	report := func(applied []admission.Applied) {
		resp.Policies, resp.Outcomes = resp.Policies[:0], resp.Outcomes[:0]
		for _, ap := range applied {
			resp.Policies = append(resp.Policies, ap.Policy)
			resp.Outcomes = append(resp.Outcomes, ap.Outcome)
		}
	}
	if req.DryRun {
		err = a.s.store.View(ctx, func(tx store.ReadTx) error {
			applied, err := plan(tx)
			report(applied)
			return err
		})
	} else {
		_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
			applied, err := plan(tx)
			if err != nil {
				return err
			}
			for i, ap := range applied {
				if ap.Outcome == admission.OutcomeUnchanged {
					continue
				}
				if err := tx.PutPolicy(ap.Policy); err != nil {
					return err
				}
				if applied[i].Policy, err = tx.Policy(ap.Policy.Name); err != nil {
					return err
				}
			}
			report(applied)
			return nil
		})
	}
	if err != nil {
		return nil, rpcError("apply policies", err)
	}
	for i, p := range resp.Policies {
		if resp.Outcomes[i] != admission.OutcomeUnchanged {
			a.s.log.Info("policy applied", "policy", p.Name, "outcome", resp.Outcomes[i], "revision", p.Revision, "dryRun", req.DryRun)
		}
	}
	return resp, nil
}

func (a *adminService) DeletePolicies(ctx context.Context, req *apiv1.DeletePoliciesRequest) (*apiv1.DeletePoliciesResponse, error) {
	names, err := admission.ParseDeleteNames(req.Names)
	if err != nil {
		return nil, rpcError("delete policies", err)
	}
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		stored, err := tx.Policies()
		if err != nil {
			return err
		}
		if err := admission.CheckPoliciesExist(names, stored); err != nil {
			return err
		}
		for _, n := range names {
			if err := tx.DeletePolicy(n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, rpcError("delete policies", err)
	}
	for _, n := range names {
		a.s.log.Info("policy deleted", "policy", n)
	}
	return &apiv1.DeletePoliciesResponse{Deleted: names}, nil
}

func (a *adminService) ListPolicies(ctx context.Context, _ *apiv1.ListPoliciesRequest) (*apiv1.ListPoliciesResponse, error) {
	resp := &apiv1.ListPoliciesResponse{}
	var clusters []*apiv1.Cluster
	err := a.s.store.View(ctx, func(tx store.ReadTx) error {
		var err error
		if resp.Policies, err = tx.Policies(); err != nil {
			return err
		}
		clusters, err = tx.Clusters()
		resp.Revision = tx.Revision()
		return err
	})
	if err != nil {
		return nil, rpcError("list policies", err)
	}
	others, def, err := admission.MeshPolicies(resp.Policies)
	if err != nil {
		return nil, rpcError("list policies", err)
	}
	res := policy.ResolveAll(others, def, admission.ResolverClusters(clusters))
	for _, p := range resp.Policies {
		st, ok := res.Status[p.Name]
		if !ok {
			continue
		}
		if p.StatusJson, err = json.Marshal(st); err != nil {
			return nil, rpcError(fmt.Sprintf("encode status of policy %q", p.Name), err)
		}
	}
	sort.Slice(resp.Policies, func(i, j int) bool { return resp.Policies[i].Name < resp.Policies[j].Name })
	return resp, nil
}

func (a *adminService) ExplainConnection(ctx context.Context, req *apiv1.ExplainConnectionRequest) (*apiv1.ExplainConnectionResponse, error) {
	if err := admission.CheckExplainRequest(req); err != nil {
		return nil, rpcError("explain connection", err)
	}
	names := []string{req.ClusterA, req.ClusterB}
	var (
		others []policy.ClusterConnectionPolicy
		def    policy.ClusterConnectionPolicy
		ends   = make([]*apiv1.Cluster, len(names))
	)
	err := a.s.store.View(ctx, func(tx store.ReadTx) error {
		stored, err := tx.Policies()
		if err != nil {
			return err
		}
		if others, def, err = admission.MeshPolicies(stored); err != nil {
			return err
		}
		for i, n := range names {
			if ends[i], err = tx.Cluster(n); err != nil {
				return err
			}
		}
		return admission.RequireClusters(names, ends)
	})
	if err != nil {
		return nil, rpcError("explain connection", err)
	}
	cl := admission.ResolverClusters(ends)
	b, err := json.Marshal(policy.NewResolver(others, def).Explain(cl[0], cl[1]))
	if err != nil {
		return nil, rpcError("encode explanation", err)
	}
	return &apiv1.ExplainConnectionResponse{Json: b}, nil
}

// SetClusterPolicies replaces the cluster-scoped policies (seed 003) of the caller's cluster, the
// one its certificate names, with the request's complete set: a node writes only its own
// cluster's policies, under that cluster's naming and labels, never a mesh policy or another
// cluster's (admission.ParseClusterPolicies, PlanClusterPolicies). The stored copies reach every
// agent through the watch, so both ends of a pair resolve with the same policies. An unchanged
// set writes nothing.
func (a *agentService) SetClusterPolicies(ctx context.Context, req *apiv1.SetClusterPoliciesRequest) (*apiv1.SetClusterPoliciesResponse, error) {
	id := identityFrom(ctx)
	if id.Cluster == "" || id.Admin {
		return nil, rpcError("set cluster policies", &admission.ForbiddenError{Caller: id.String(), Target: "cluster policies",
			Err: fmt.Errorf("cluster policies are written by a cluster's agent; the caller is %s", id)})
	}
	ps, err := admission.ParseClusterPolicies(req.GetPolicies(), id.Cluster)
	if err != nil {
		return nil, rpcError("set cluster policies", err)
	}
	resp := &apiv1.SetClusterPoliciesResponse{}
	var changed int
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		resp.Policies, resp.Outcomes, resp.Deleted, changed = nil, nil, nil, 0
		if err := a.s.stillGood(tx, id); err != nil {
			return err
		}
		stored, err := tx.Policies()
		if err != nil {
			return err
		}
		plan, err := admission.PlanClusterPolicies(id.Cluster, ps, stored)
		if err != nil {
			return err
		}
		for _, ap := range plan.Applied {
			if ap.Outcome != admission.OutcomeUnchanged {
				changed++
				if err := tx.PutPolicy(ap.Policy); err != nil {
					return err
				}
				if ap.Policy, err = tx.Policy(ap.Policy.Name); err != nil {
					return err
				}
			}
			resp.Policies = append(resp.Policies, ap.Policy)
			resp.Outcomes = append(resp.Outcomes, ap.Outcome)
		}
		for _, n := range plan.Delete {
			if err := tx.DeletePolicy(n); err != nil {
				return err
			}
		}
		resp.Deleted = plan.Delete
		resp.Revision = tx.Revision()
		return nil
	})
	if err != nil {
		return nil, rpcError("set cluster policies", err)
	}
	if changed > 0 || len(resp.Deleted) > 0 {
		a.s.log.Info("cluster policies set", "cluster", id.Cluster, "node", id.Node, "policies", len(resp.Policies),
			"changed", changed, "deleted", strings.Join(resp.Deleted, ","), "revision", resp.Revision)
	}
	return resp, nil
}
