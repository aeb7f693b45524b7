package admission

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/cablemesh/cablemesh/api/limits"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/policy"
)

// Outcomes of applying a policy, as kubectl apply prints them.
const (
	OutcomeCreated    = "created"
	OutcomeConfigured = "configured"
	OutcomeUnchanged  = "unchanged"
)

// CanonicalPolicy puts a policy in the one form the broker stores: kind and apiVersion in their
// output spelling, no status (the broker computes it), and the origin the broker decides.
func CanonicalPolicy(p policy.ClusterConnectionPolicy, origin string) (policy.ClusterConnectionPolicy, []byte, error) {
	p = p.DeepCopy()
	p.Kind, p.APIVersion = policy.Kind, policy.APIVersion
	p.Status = nil
	p.Origin = origin
	b, err := policy.EncodeJSON(&p)
	return p, b, err
}

// StoredPolicy decodes a policy the broker stored itself.
func StoredPolicy(sp *apiv1.Policy) (policy.ClusterConnectionPolicy, error) {
	p, err := policy.DecodeJSON(sp.Json)
	if err != nil {
		return p, fmt.Errorf("stored policy %q: %w", sp.Name, err)
	}
	return p, nil
}

// MeshPolicies decodes the stored policies and splits off the mesh default, as the resolver
// wants them.
func MeshPolicies(stored []*apiv1.Policy) (others []policy.ClusterConnectionPolicy, def policy.ClusterConnectionPolicy, err error) {
	for _, sp := range stored {
		p, err := StoredPolicy(sp)
		if err != nil {
			return nil, def, err
		}
		if sp.IsDefault {
			def = p
			continue
		}
		others = append(others, p)
	}
	return others, def, nil
}

// ResolverClusters are clusters as the resolver sees them: names and labels.
func ResolverClusters(cs []*apiv1.Cluster) []policy.Cluster {
	out := make([]policy.Cluster, 0, len(cs))
	for _, c := range cs {
		out = append(out, policy.Cluster{Name: c.Name, Labels: c.Labels})
	}
	return out
}

// DefaultPolicy is the record of the mesh default policy the broker creates at first start: full
// mesh over driver, and the policy it holds.
func DefaultPolicy(driver string) (*apiv1.Policy, policy.ClusterConnectionPolicy, error) {
	p, b, err := CanonicalPolicy(policy.DefaultPolicy(driver), policy.OriginMesh)
	if err != nil {
		return nil, p, err
	}
	if err := p.Validate(); err != nil {
		return nil, p, fmt.Errorf("default policy: %w", err)
	}
	return &apiv1.Policy{Name: p.Metadata.Name, Json: b, IsDefault: true}, p, nil
}

// Canonical is a policy an apply request gives, validated and in its canonical form.
type Canonical struct {
	Policy policy.ClusterConnectionPolicy
	JSON   []byte
}

// ParsePolicies validates every policy of an apply request, and refuses the whole request with
// one *InvalidError that lists every problem, naming the policy and the field, when any is bad:
// one bad policy fails the whole call.
//
// These are the mesh admin's: a policy labelled cablemesh.io/origin: cluster is refused (only a
// cluster's agent writes those, with SetClusterPolicies).
func ParsePolicies(in []*apiv1.Policy) ([]Canonical, error) {
	return parsePolicies(in, "")
}

// parsePolicies is ParsePolicies for the mesh admin (cluster "") or for a node of cluster, whose
// policies must each be that cluster's, as policy.CheckSyncedClusterPolicy says, and are stored
// with that cluster as their origin.
func parsePolicies(in []*apiv1.Policy, cluster string) ([]Canonical, error) {
	if len(in) == 0 && cluster != "" {
		return nil, nil // a cluster with no policies of its own
	}
	if len(in) == 0 {
		return nil, invalid("policies", "", errors.New("no policies to apply"))
	}
	if len(in) > MaxPoliciesPerApply {
		return nil, invalidf("policies", "", "policies: %d policies in one apply, at most %d: apply them in several parts", len(in), MaxPoliciesPerApply)
	}
	total := 0
	for _, sp := range in {
		total += len(sp.GetJson())
	}
	if total > MaxApplyBytes {
		return nil, invalidf("policies", "", "policies: %d bytes of policies in one apply, at most %d: apply them in several parts", total, MaxApplyBytes)
	}
	var (
		out   []Canonical
		errs  []string
		names = map[string]int{}
	)
	for i, sp := range in {
		label := policyLabel(i, sp.GetName())
		if n := len(sp.GetJson()); n > MaxPolicyJSONBytes {
			errs = append(errs, fmt.Sprintf("%s: the policy is %d bytes of JSON, at most %d", label, n, MaxPolicyJSONBytes))
			continue
		}
		if n := len(sp.GetName()); n > 253 {
			errs = append(errs, fmt.Sprintf("policy %d: name is %d bytes, at most 253", i+1, n))
			continue
		}
		p, err := policy.DecodeJSON(sp.GetJson())
		if err != nil {
			errs = append(errs, label+": "+err.Error())
			continue
		}
		if p.Metadata.Name != sp.GetName() {
			errs = append(errs, fmt.Sprintf("%s: metadata.name %q differs from the name %q the request gives it", label, p.Metadata.Name, sp.GetName()))
			continue
		}
		if err := p.Validate(); err != nil {
			for _, e := range fieldErrors(err) {
				errs = append(errs, label+": "+e)
			}
			continue
		}
		if bad := limits.PolicyBounds(p); len(bad) > 0 {
			for _, e := range bad {
				errs = append(errs, label+": "+e)
			}
			continue
		}
		if err := CheckCableDriver(p); err != nil {
			errs = append(errs, label+": "+err.Error())
			continue
		}
		if first, dup := names[p.Metadata.Name]; dup {
			errs = append(errs, fmt.Sprintf("%s: metadata.name %q is also the name of policy %d of the request", label, p.Metadata.Name, first))
			continue
		}
		origin := policy.OriginMesh
		if cluster == "" && p.IsClusterScoped() {
			errs = append(errs, fmt.Sprintf("%s: metadata.labels.%s: %q marks a policy applied in a cluster; apply it in that cluster (a ClusterConnectionPolicy object, or a file in the agent's policyDir), or remove the label to apply it to the whole mesh",
				label, policy.LabelOrigin, policy.OriginClusterLabel))
			continue
		}
		if cluster != "" {
			if err := policy.CheckSyncedClusterPolicy(p, cluster); err != nil {
				errs = append(errs, label+": "+err.Error())
				continue
			}
			origin = cluster
		}
		names[p.Metadata.Name] = i + 1
		cp, b, err := CanonicalPolicy(p, origin)
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: encode: %v", label, err))
			continue
		}
		out = append(out, Canonical{Policy: cp, JSON: b})
	}
	if len(errs) > 0 {
		return nil, invalidf("policies", "", "nothing applied: %s", strings.Join(errs, "; "))
	}
	return out, nil
}

// CheckCableDriver refuses a policy whose cable driver is not one of the mesh's drivers (the
// broker links them all, as every agent does: cable/drivers), or whose options that driver's
// own validation refuses; the error names the field, the option and the value.
func CheckCableDriver(p policy.ClusterConnectionPolicy) error {
	d := p.Spec.CableDriver
	if d == nil || !p.Spec.Connects() {
		return nil
	}
	if _, ok := cable.LookupSpec(d.Name); !ok {
		return fmt.Errorf("spec.cableDriver.name: %q is not a cable driver of this mesh (have %s)", d.Name, strings.Join(cable.Names(), ", "))
	}
	// mode is the policy package's pair option (validated by p.Validate), never the driver's.
	if err := cable.ValidateOptions(d.Name, cable.Options(policy.DriverOptions(d.Options))); err != nil {
		return fmt.Errorf("spec.cableDriver.options: %w", err)
	}
	return nil
}

// Applied is what applying one policy does.
type Applied struct {
	Outcome string
	// Policy is the record to store (created, configured: a configured one carries the revision
	// of the record it replaces) or the stored one (unchanged: nothing is written).
	Policy *apiv1.Policy
}

// PlanApply decides, for each of ps in order, what applying it to the stored policies does. A
// policy whose canonical form is what is stored is unchanged, even when the stored JSON was
// spelled differently (by an older broker).
func PlanApply(ps []Canonical, stored []*apiv1.Policy) ([]Applied, error) {
	out := make([]Applied, 0, len(ps))
	created := 0
	for _, c := range ps {
		if !slices.ContainsFunc(stored, func(sp *apiv1.Policy) bool { return sp.Name == c.Policy.Metadata.Name }) {
			created++
		}
	}
	if n := len(stored) + created; n > MaxPolicies {
		return nil, invalidf("policies", "", "policies: the mesh would hold %d policies, at most %d", n, MaxPolicies)
	}
	for _, c := range ps {
		name := c.Policy.Metadata.Name
		np := &apiv1.Policy{Name: name, Json: c.JSON, IsDefault: name == policy.DefaultPolicyName}
		i := slices.IndexFunc(stored, func(sp *apiv1.Policy) bool { return sp.Name == name })
		if i < 0 {
			out = append(out, Applied{Outcome: OutcomeCreated, Policy: np})
			continue
		}
		old := stored[i]
		op, err := StoredPolicy(old)
		if err != nil {
			return nil, err
		}
		_, ob, err := CanonicalPolicy(op, op.Origin)
		if err != nil {
			return nil, err
		}
		if bytes.Equal(ob, c.JSON) && old.IsDefault == np.IsDefault {
			out = append(out, Applied{Outcome: OutcomeUnchanged, Policy: old})
			continue
		}
		np.Revision = old.Revision
		out = append(out, Applied{Outcome: OutcomeConfigured, Policy: np})
	}
	return out, nil
}

// ParseDeleteNames validates the names of a delete request and drops repeats. The mesh default
// policy cannot be deleted (*ProtectedError): it can only be changed.
func ParseDeleteNames(names []string) ([]string, error) {
	if len(names) == 0 {
		return nil, invalid("names", "", errors.New("no policy names to delete"))
	}
	if len(names) > MaxPoliciesPerApply {
		return nil, invalidf("names", "", "names: %d policies in one delete, at most %d", len(names), MaxPoliciesPerApply)
	}
	var out []string
	for _, n := range names {
		if n == "" {
			return nil, invalid("names", "", errors.New("a policy name is empty"))
		}
		if n == policy.DefaultPolicyName {
			return nil, &ProtectedError{Kind: "policy", Name: n,
				Err: fmt.Errorf("policy %q is the mesh default policy and cannot be deleted (change it with apply); nothing deleted", n)}
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}

// CheckPoliciesExist refuses a delete of names when any is not among the stored policies: a
// delete removes all of them or none.
func CheckPoliciesExist(names []string, stored []*apiv1.Policy) error {
	var missing, quoted []string
	for _, n := range names {
		if !slices.ContainsFunc(stored, func(sp *apiv1.Policy) bool { return sp.Name == n }) {
			missing = append(missing, n)
			quoted = append(quoted, fmt.Sprintf("%q", n))
		}
	}
	if len(missing) > 0 {
		return &NotFoundError{Kind: "policy", Names: missing, Err: fmt.Errorf("policy %s not found; nothing deleted", strings.Join(quoted, ", "))}
	}
	return nil
}

// CheckExplainRequest validates the pair of an explain request.
func CheckExplainRequest(req *apiv1.ExplainConnectionRequest) error {
	if err := CheckClusterName("cluster_a", req.ClusterA); err != nil {
		return err
	}
	if err := CheckClusterName("cluster_b", req.ClusterB); err != nil {
		return err
	}
	if req.ClusterA == req.ClusterB {
		return invalidf("cluster_b", req.ClusterB, "cluster_a and cluster_b are both %q: a cluster does not connect to itself", req.ClusterA)
	}
	return nil
}

// RequireClusters refuses when a cluster of names is missing: found[i] is names[i] as stored,
// nil when there is none.
func RequireClusters(names []string, found []*apiv1.Cluster) error {
	var missing, quoted []string
	for i, n := range names {
		if found[i] == nil {
			missing = append(missing, n)
			quoted = append(quoted, fmt.Sprintf("%q", n))
		}
	}
	if len(missing) > 0 {
		return &NotFoundError{Kind: "cluster", Names: missing, Err: fmt.Errorf("cluster %s not found", strings.Join(quoted, " and "))}
	}
	return nil
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

// CheckAdminOverwrite refuses an admin apply that would replace a policy a cluster applied
// (seed 003): that policy is its cluster's, and changes where it was applied.
func CheckAdminOverwrite(ps []Canonical, stored []*apiv1.Policy) error {
	for _, c := range ps {
		name := c.Policy.Metadata.Name
		i := slices.IndexFunc(stored, func(sp *apiv1.Policy) bool { return sp.Name == name })
		if i < 0 {
			continue
		}
		old, err := StoredPolicy(stored[i])
		if err != nil {
			return err
		}
		if cl := old.ClusterOf(); cl != "" {
			return &ConflictError{Kind: "policy", Name: name,
				Err: fmt.Errorf("policy %q was applied in cluster %q and is changed there (its ClusterConnectionPolicy object or policyDir file); nothing applied", name, cl)}
		}
	}
	return nil
}

// ParseClusterPolicies validates the policies a node of cluster sends (SetClusterPolicies): each
// must be a valid policy labelled as cluster's, under cluster's naming; a node cannot write a mesh
// policy or another cluster's. One bad policy refuses the whole set, naming it and the field.
func ParseClusterPolicies(in []*apiv1.Policy, cluster string) ([]Canonical, error) {
	if cluster == "" {
		return nil, errors.New("cluster policies: no cluster")
	}
	return parsePolicies(in, cluster)
}

// ClusterPlan is what SetClusterPolicies of one cluster writes.
type ClusterPlan struct {
	Applied []Applied
	// Delete names the cluster's stored policies the new set no longer has.
	Delete []string
}

// PlanClusterPolicies plans replacing cluster's cluster-scoped policies among stored with ps
// (from ParseClusterPolicies). A name held by a mesh policy or by another cluster's is refused
// (*ConflictError): a node never overwrites what is not its cluster's.
func PlanClusterPolicies(cluster string, ps []Canonical, stored []*apiv1.Policy) (ClusterPlan, error) {
	var plan ClusterPlan
	want := map[string]bool{}
	for _, c := range ps {
		name := c.Policy.Metadata.Name
		want[name] = true
		i := slices.IndexFunc(stored, func(sp *apiv1.Policy) bool { return sp.Name == name })
		if i < 0 {
			continue
		}
		old, err := StoredPolicy(stored[i])
		if err != nil {
			return plan, err
		}
		if old.ClusterOf() != cluster || stored[i].IsDefault {
			owner := "the mesh"
			if cl := old.ClusterOf(); cl != "" {
				owner = "cluster " + cl
			}
			return plan, &ConflictError{Kind: "policy", Name: name,
				Err: fmt.Errorf("policy %q is %s's; cluster %q may not replace it; nothing applied", name, owner, cluster)}
		}
	}
	applied, err := PlanApply(ps, stored)
	if err != nil {
		return plan, err
	}
	plan.Applied = applied
	for _, sp := range stored {
		if want[sp.Name] {
			continue
		}
		p, err := StoredPolicy(sp)
		if err != nil {
			return plan, err
		}
		if p.ClusterOf() == cluster {
			plan.Delete = append(plan.Delete, sp.Name)
		}
	}
	slices.Sort(plan.Delete)
	return plan, nil
}
