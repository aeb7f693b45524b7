package cablectl

import (
	"fmt"

	"github.com/cablemesh/cablemesh/policy"
)

// policyFlags are the values of `cablectl connection-policy add` (the flags of Submariner's
// `subctl connection-policy add`), as strings the way a CLI gets them.
type policyFlags struct {
	Name                 string // --name
	LeftClusterSelector  string // --left-cluster-selector, policy.ParseSelector form
	RightClusterSelector string // --right-cluster-selector
	ClusterSelector      string // --cluster-selector
	Topology             string // --topology
	Priority             *int   // --priority (nil when not given)
	ConnectionPolicy     string // --connection-policy
	CableDriver          string // --cable-driver
	// CableConfig is --cable-config. subctl names a ConfigMap there; a
	// policy has no ConfigMap beside it, so it carries the options themselves: "k=v,k=v".
	CableConfig string
	// LeftSet, RightSet and ClusterSet say whether the selector flags were
	// given at all, so that an explicitly empty selector ("" = every
	// cluster) is told apart from an absent one. With only the strings, a
	// non-empty string counts as given.
	LeftSet, RightSet, ClusterSet bool
}

// policyFromFlags builds and validates a policy from the flags of connection-policy add.
func policyFromFlags(f policyFlags) (policy.ClusterConnectionPolicy, error) {
	p := policy.ClusterConnectionPolicy{
		APIVersion: policy.APIVersion,
		Kind:       policy.Kind,
		Metadata:   policy.ObjectMeta{Name: f.Name},
		Spec: policy.Spec{
			Topology:         f.Topology,
			ConnectionPolicy: f.ConnectionPolicy,
		},
	}
	if f.Priority != nil {
		prio := *f.Priority
		p.Spec.Priority = &prio
	}
	for _, s := range []struct {
		flag  string
		value string
		set   bool
		dst   **policy.Selector
	}{
		{"--left-cluster-selector", f.LeftClusterSelector, f.LeftSet, &p.Spec.LeftClusterSelector},
		{"--right-cluster-selector", f.RightClusterSelector, f.RightSet, &p.Spec.RightClusterSelector},
		{"--cluster-selector", f.ClusterSelector, f.ClusterSet, &p.Spec.ClusterSelector},
	} {
		if !s.set && s.value == "" {
			continue
		}
		sel, err := policy.ParseSelector(s.value)
		if err != nil {
			return policy.ClusterConnectionPolicy{}, fmt.Errorf("%s: %w", s.flag, err)
		}
		*s.dst = sel
	}
	if f.CableDriver != "" || f.CableConfig != "" {
		opts, err := policy.ParseOptions(f.CableConfig)
		if err != nil {
			return policy.ClusterConnectionPolicy{}, fmt.Errorf("--cable-config: %w", err)
		}
		p.Spec.CableDriver = &policy.CableDriver{Name: f.CableDriver, Options: opts}
	}
	if err := p.Validate(); err != nil {
		return policy.ClusterConnectionPolicy{}, err
	}
	return p, nil
}
