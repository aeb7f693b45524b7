package broker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"

	"github.com/cablemesh/cablemesh/api/validation"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/policy"
)

// Outcomes of ApplyPolicies, as kubectl apply prints them.
const (
	OutcomeCreated    = "created"
	OutcomeConfigured = "configured"
	OutcomeUnchanged  = "unchanged"
)

// CableDrivers are the drivers --default-cable-driver accepts: the ones every agent ships. Other
// policies may name any driver (policy.Validate checks only its form): whether a node runs it is
// the agent's business.
var CableDrivers = []string{"wireguard", "vxlan", "ipsec"}

// ValidateDefaultCableDriver checks a --default-cable-driver value.
func ValidateDefaultCableDriver(name string) error {
	if !slices.Contains(CableDrivers, name) {
		return fmt.Errorf("default cable driver %q is not one of %s", name, strings.Join(CableDrivers, ", "))
	}
	return nil
}

// decodePolicyJSON reads one policy as policy.ClusterConnectionPolicy JSON, strictly: unknown
// fields and trailing data are errors.
func decodePolicyJSON(b []byte) (policy.ClusterConnectionPolicy, error) {
	var p policy.ClusterConnectionPolicy
	if len(bytes.TrimSpace(b)) == 0 {
		return p, errors.New("json is empty")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&p); err != nil {
		return p, fmt.Errorf("json: %v", strings.TrimPrefix(err.Error(), "json: "))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return p, errors.New("json: data after the policy object")
	}
	return p, nil
}

// canonicalPolicy puts a policy in the one form the broker stores: kind and apiVersion in their
// output spelling, no status (the broker computes it), and the origin the broker decides.
func canonicalPolicy(p policy.ClusterConnectionPolicy, origin string) (policy.ClusterConnectionPolicy, []byte, error) {
	p = p.DeepCopy()
	p.Kind, p.APIVersion = policy.Kind, policy.APIVersion
	p.Status = nil
	p.Origin = origin
	b, err := json.Marshal(&p)
	return p, b, err
}

// storedPolicy decodes a policy the broker stored itself.
func storedPolicy(sp *apiv1.Policy) (policy.ClusterConnectionPolicy, error) {
	p, err := decodePolicyJSON(sp.Json)
	if err != nil {
		return p, fmt.Errorf("stored policy %q: %w", sp.Name, err)
	}
	return p, nil
}

// fieldErrors flattens errors.Join trees into one line per problem.
func fieldErrors(err error) []string {
	var out []string
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		out = append(out, strings.ReplaceAll(e.Error(), "\n", "; "))
	}
	walk(err)
	return out
}

func policyLabel(i int, name string) string {
	if name == "" {
		return fmt.Sprintf("policy %d (no name)", i+1)
	}
	return fmt.Sprintf("policy %q", name)
}

// meshPolicies reads every stored policy and splits off the mesh default, as the resolver wants
// them. stored is in name order.
func meshPolicies(tx store.ReadTx) (others []policy.ClusterConnectionPolicy, def policy.ClusterConnectionPolicy, stored []*apiv1.Policy, err error) {
	stored, err = tx.Policies()
	if err != nil {
		return nil, def, nil, err
	}
	for _, sp := range stored {
		p, err := storedPolicy(sp)
		if err != nil {
			return nil, def, nil, err
		}
		if sp.IsDefault {
			def = p
			continue
		}
		others = append(others, p)
	}
	return others, def, stored, nil
}

func resolverClusters(cs []*apiv1.Cluster) []policy.Cluster {
	out := make([]policy.Cluster, 0, len(cs))
	for _, c := range cs {
		out = append(out, policy.Cluster{Name: c.Name, Labels: c.Labels})
	}
	return out
}

// ensureDefaultPolicy creates the mesh default policy (full mesh over driver) on first start. A
// later start keeps the stored one, which an operator may have changed with apply since; a flag
// that disagrees with it is logged, not applied.
func (s *Server) ensureDefaultPolicy(ctx context.Context, driver string) error {
	explicit := driver != ""
	if driver == "" {
		driver = policy.DefaultDriver
	}
	if err := ValidateDefaultCableDriver(driver); err != nil {
		return err
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
			stored, err = storedPolicy(sp)
			return err
		}
		p, b, err := canonicalPolicy(policy.DefaultPolicy(driver), policy.OriginMesh)
		if err != nil {
			return err
		}
		if err := p.Validate(); err != nil {
			return fmt.Errorf("default policy: %w", err)
		}
		created, stored = true, p
		return tx.PutPolicy(&apiv1.Policy{Name: p.Metadata.Name, Json: b, IsDefault: true})
	})
	if err != nil {
		return fmt.Errorf("create the mesh default policy: %w", err)
	}
	storedDriver := ""
	if stored.Spec.Connects() && stored.Spec.CableDriver != nil {
		storedDriver = stored.Spec.CableDriver.Name
	}
	switch {
	case created:
		s.log.Info("created the mesh default policy", "policy", policy.DefaultPolicyName, "driver", driver)
	case explicit && storedDriver != driver:
		s.log.Warn("--default-cable-driver differs from the stored mesh default policy, which is kept (it is set only at first start; change it with `cablectl apply`)",
			"flag", driver, "policy", policy.DefaultPolicyName, "connection_policy", connectionPolicyOf(stored), "driver", storedDriver)
	}
	return nil
}

func connectionPolicyOf(p policy.ClusterConnectionPolicy) string {
	if p.Spec.Connects() {
		return policy.Connect
	}
	return policy.NoConnect
}

func (a *adminService) ApplyPolicies(ctx context.Context, req *apiv1.ApplyPoliciesRequest) (*apiv1.ApplyPoliciesResponse, error) {
	if len(req.Policies) == 0 {
		return nil, invalid(errors.New("no policies to apply"))
	}
	type item struct {
		p    policy.ClusterConnectionPolicy
		json []byte
	}
	var (
		items []item
		errs  []string
		names = map[string]int{}
	)
	// Everything is checked before anything is stored: one bad policy fails the whole call.
	for i, in := range req.Policies {
		p, err := decodePolicyJSON(in.GetJson())
		label := policyLabel(i, in.GetName())
		if err != nil {
			errs = append(errs, label+": "+err.Error())
			continue
		}
		if p.Metadata.Name != in.GetName() {
			errs = append(errs, fmt.Sprintf("%s: metadata.name %q differs from the name %q the request gives it", label, p.Metadata.Name, in.GetName()))
			continue
		}
		if err := p.Validate(); err != nil {
			for _, e := range fieldErrors(err) {
				errs = append(errs, label+": "+e)
			}
			continue
		}
		if first, dup := names[p.Metadata.Name]; dup {
			errs = append(errs, fmt.Sprintf("%s: metadata.name %q is also the name of policy %d of the request", label, p.Metadata.Name, first))
			continue
		}
		names[p.Metadata.Name] = i + 1
		// Origin: these come from the mesh admin. A policy applied by a cluster (seed 003) would
		// get that cluster's name here.
		cp, b, err := canonicalPolicy(p, policy.OriginMesh)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: encode: %v", label, err))
			continue
		}
		items = append(items, item{p: cp, json: b})
	}
	if len(errs) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "nothing applied: %s", strings.Join(errs, "; "))
	}

	resp := &apiv1.ApplyPoliciesResponse{}
	decide := func(tx store.ReadTx, put func(*apiv1.Policy) error) error {
		resp.Policies, resp.Outcomes = resp.Policies[:0], resp.Outcomes[:0]
		for _, it := range items {
			name := it.p.Metadata.Name
			old, err := tx.Policy(name)
			if err != nil {
				return err
			}
			np := &apiv1.Policy{Name: name, Json: it.json, IsDefault: name == policy.DefaultPolicyName}
			outcome := OutcomeCreated
			if old != nil {
				// Compare in today's canonical form, so a policy stored by an older broker
				// whose JSON was spelled differently is still recognised as the same.
				op, err := storedPolicy(old)
				if err != nil {
					return err
				}
				_, ob, err := canonicalPolicy(op, op.Origin)
				if err != nil {
					return err
				}
				if bytes.Equal(ob, it.json) && old.IsDefault == np.IsDefault {
					resp.Policies = append(resp.Policies, old)
					resp.Outcomes = append(resp.Outcomes, OutcomeUnchanged)
					continue
				}
				outcome = OutcomeConfigured
				np.Revision = old.Revision
			}
			if put != nil {
				if err := put(np); err != nil {
					return err
				}
				if np, err = tx.Policy(name); err != nil {
					return err
				}
			}
			resp.Policies = append(resp.Policies, np)
			resp.Outcomes = append(resp.Outcomes, outcome)
		}
		return nil
	}
	var err error
	if req.DryRun {
		err = a.s.store.View(ctx, func(tx store.ReadTx) error { return decide(tx, nil) })
	} else {
		_, err = a.s.store.Update(ctx, func(tx store.Tx) error { return decide(tx, tx.PutPolicy) })
	}
	if err != nil {
		return nil, storeErr("apply policies", err)
	}
	for i, p := range resp.Policies {
		if resp.Outcomes[i] != OutcomeUnchanged {
			a.s.log.Info("policy applied", "policy", p.Name, "outcome", resp.Outcomes[i], "revision", p.Revision, "dry_run", req.DryRun)
		}
	}
	return resp, nil
}

func (a *adminService) DeletePolicies(ctx context.Context, req *apiv1.DeletePoliciesRequest) (*apiv1.DeletePoliciesResponse, error) {
	if len(req.Names) == 0 {
		return nil, invalid(errors.New("no policy names to delete"))
	}
	var names []string
	for _, n := range req.Names {
		if n == "" {
			return nil, invalid(errors.New("a policy name is empty"))
		}
		if n == policy.DefaultPolicyName {
			return nil, status.Errorf(codes.FailedPrecondition, "policy %q is the mesh default policy and cannot be deleted (change it with apply); nothing deleted", n)
		}
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	_, err := a.s.store.Update(ctx, func(tx store.Tx) error {
		var missing []string
		for _, n := range names {
			p, err := tx.Policy(n)
			if err != nil {
				return err
			}
			if p == nil {
				missing = append(missing, fmt.Sprintf("%q", n))
			}
		}
		if len(missing) > 0 {
			return status.Errorf(codes.NotFound, "policy %s not found; nothing deleted", strings.Join(missing, ", "))
		}
		for _, n := range names {
			if err := tx.DeletePolicy(n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, storeErr("delete policies", err)
	}
	for _, n := range names {
		a.s.log.Info("policy deleted", "policy", n)
	}
	return &apiv1.DeletePoliciesResponse{Deleted: names}, nil
}

func (a *adminService) ListPolicies(ctx context.Context, _ *apiv1.ListPoliciesRequest) (*apiv1.ListPoliciesResponse, error) {
	resp := &apiv1.ListPoliciesResponse{}
	var (
		others   []policy.ClusterConnectionPolicy
		def      policy.ClusterConnectionPolicy
		clusters []*apiv1.Cluster
	)
	err := a.s.store.View(ctx, func(tx store.ReadTx) error {
		var err error
		if others, def, resp.Policies, err = meshPolicies(tx); err != nil {
			return err
		}
		clusters, err = tx.Clusters()
		resp.Revision = tx.Revision()
		return err
	})
	if err != nil {
		return nil, storeErr("list policies", err)
	}
	res := policy.ResolveAll(others, def, resolverClusters(clusters))
	for _, p := range resp.Policies {
		st, ok := res.Status[p.Name]
		if !ok {
			continue
		}
		if p.StatusJson, err = json.Marshal(st); err != nil {
			return nil, status.Errorf(codes.Internal, "encode status of policy %q: %v", p.Name, err)
		}
	}
	sort.Slice(resp.Policies, func(i, j int) bool { return resp.Policies[i].Name < resp.Policies[j].Name })
	return resp, nil
}

func (a *adminService) ExplainConnection(ctx context.Context, req *apiv1.ExplainConnectionRequest) (*apiv1.ExplainConnectionResponse, error) {
	for _, n := range []string{req.ClusterA, req.ClusterB} {
		if err := validation.ValidateClusterName(n); err != nil {
			return nil, invalid(err)
		}
	}
	if req.ClusterA == req.ClusterB {
		return nil, invalid(fmt.Errorf("cluster_a and cluster_b are both %q: a cluster does not connect to itself", req.ClusterA))
	}
	var (
		others []policy.ClusterConnectionPolicy
		def    policy.ClusterConnectionPolicy
		ends   [2]*apiv1.Cluster
	)
	err := a.s.store.View(ctx, func(tx store.ReadTx) error {
		var err error
		if others, def, _, err = meshPolicies(tx); err != nil {
			return err
		}
		var missing []string
		for i, n := range []string{req.ClusterA, req.ClusterB} {
			if ends[i], err = tx.Cluster(n); err != nil {
				return err
			}
			if ends[i] == nil {
				missing = append(missing, fmt.Sprintf("%q", n))
			}
		}
		if len(missing) > 0 {
			return status.Errorf(codes.NotFound, "cluster %s not found", strings.Join(missing, " and "))
		}
		return nil
	})
	if err != nil {
		return nil, storeErr("explain connection", err)
	}
	cl := resolverClusters(ends[:])
	e := policy.NewResolver(others, def).Explain(cl[0], cl[1])
	b, err := json.Marshal(e)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "encode explanation: %v", err)
	}
	return &apiv1.ExplainConnectionResponse{Json: b}, nil
}
