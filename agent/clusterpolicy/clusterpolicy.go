// Package clusterpolicy is the agent's source of cluster-scoped ClusterConnectionPolicies (seed
// 003): policies applied in one cluster rather than at the broker, as ClusterConnectionPolicy
// objects in the cluster's Kubernetes API (KubeSource) or as files in the agent's policyDir on
// Universal hosts (DirSource).
//
// A policy applied in a cluster must carry the label cablemesh.io/origin: cluster, or it is
// refused with policy.MissingOriginLabelMessage: a policy meant for the whole mesh is not applied
// in one cluster by mistake. An accepted one becomes the copy the agent syncs to the broker
// (policy.ClusterScoped: named <name>-<hash>, labelled with its origin and cluster, deciding only
// pairs that include this cluster). The broker's copy is what every agent, this one included,
// resolves with, so both ends of a pair decide alike.
//
// The package is a pure core and a thin shell: Build decides what a list of applied policies
// comes to (the synced copies and the refusals); the sources read files or objects, call Build,
// and hand each new Set to their caller.
package clusterpolicy

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/cablemesh/cablemesh/policy"
)

// Source is a source of the cluster's policies: Run calls onChange with the complete Set first
// and whenever it changes, until ctx ends.
type Source interface {
	Run(ctx context.Context, onChange func(Set)) error
}

// Set is a source's complete view: the policies to sync and the ones refused.
type Set struct {
	// Policies are the synced copies (policy.ClusterScoped), sorted by name.
	Policies []policy.ClusterConnectionPolicy
	// Problems say, for each refused policy or unreadable file, where and why.
	Problems []Problem
}

// Problem is one refused policy or unreadable input.
type Problem struct {
	// Source is where it was applied: a file path, or "kubernetes ClusterConnectionPolicy NAME".
	Source string `json:"source"`
	// Policy is the policy's name as applied, when known.
	Policy  string `json:"policy,omitempty"`
	Message string `json:"message"`
}

func (p Problem) String() string {
	if p.Policy != "" {
		return fmt.Sprintf("%s: policy %q refused: %s", p.Source, p.Policy, p.Message)
	}
	return fmt.Sprintf("%s: %s", p.Source, p.Message)
}

// Equal reports whether two sets are the same.
func (s Set) Equal(o Set) bool {
	return slices.Equal(s.Problems, o.Problems) && slices.EqualFunc(s.Policies, o.Policies, func(a, b policy.ClusterConnectionPolicy) bool {
		return policyKey(a) == policyKey(b)
	})
}

func policyKey(p policy.ClusterConnectionPolicy) string {
	return fmt.Sprintf("%s\x00%v\x00%s", p.Metadata.Name, p.Metadata.Labels, mustJSON(p.Spec))
}

// Item is one policy as applied, or the reason a document of the source gave none.
type Item struct {
	Source string
	Policy policy.ClusterConnectionPolicy
	// Err is set when the source could not read a policy from its input (then Policy is zero).
	Err error
}

// Build turns the items of a source into the Set to sync for cluster: each policy is checked and
// made the synced copy (policy.ClusterScoped); a refused one, a name applied twice (both copies
// are refused: which one was meant is not ours to guess) and an unreadable input are Problems.
// It is pure.
func Build(cluster string, items []Item) Set {
	var set Set
	byName := map[string][]int{}
	type ok struct {
		source string
		name   string
		p      policy.ClusterConnectionPolicy
	}
	var accepted []ok
	for _, it := range items {
		if it.Err != nil {
			set.Problems = append(set.Problems, Problem{Source: it.Source, Message: oneLine(it.Err.Error())})
			continue
		}
		synced, err := policy.ClusterScoped(it.Policy, cluster)
		if err != nil {
			set.Problems = append(set.Problems, Problem{Source: it.Source, Policy: it.Policy.Metadata.Name, Message: oneLine(err.Error())})
			continue
		}
		byName[synced.Metadata.Name] = append(byName[synced.Metadata.Name], len(accepted))
		accepted = append(accepted, ok{it.Source, it.Policy.Metadata.Name, synced})
	}
	for _, a := range accepted {
		if idx := byName[a.p.Metadata.Name]; len(idx) > 1 {
			var where []string
			for _, i := range idx {
				where = append(where, accepted[i].source)
			}
			set.Problems = append(set.Problems, Problem{Source: a.source, Policy: a.name,
				Message: fmt.Sprintf("the name is applied %d times (%s): rename or remove all but one", len(idx), strings.Join(where, ", "))})
			continue
		}
		set.Policies = append(set.Policies, a.p)
	}
	slices.SortFunc(set.Policies, func(a, b policy.ClusterConnectionPolicy) int {
		return strings.Compare(a.Metadata.Name, b.Metadata.Name)
	})
	slices.SortStableFunc(set.Problems, func(a, b Problem) int {
		if c := strings.Compare(a.Source, b.Source); c != 0 {
			return c
		}
		return strings.Compare(a.Policy, b.Policy)
	})
	return set
}

func oneLine(s string) string { return strings.ReplaceAll(s, "\n", "; ") }
