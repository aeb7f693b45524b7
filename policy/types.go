package policy

import (
	"maps"

	"github.com/cablemesh/cablemesh/cable"
)

// Names of the resource, as written in YAML. Submariner's proposal calls the kind
// ClusterConnectionPolicies; both spellings are accepted on input and the
// singular is what we store and print.
const (
	Kind     = "ClusterConnectionPolicy"
	KindSeed = "ClusterConnectionPolicies"

	// APIVersion is the apiVersion written on output. On input an empty
	// apiVersion, "v1" (as in two of the proposal's examples) and this are accepted.
	APIVersion = "cablemesh.io/v1alpha1"
)

// Topologies (spec.topology).
const (
	TopologyFullMesh     = "full-mesh"
	TopologyPointToPoint = "point-to-point"
	TopologyClientServer = "client-server"
)

// Connection policies (spec.connectionPolicy). Empty means Connect.
const (
	Connect   = "connect"
	NoConnect = "no-connect"
)

const (
	// OriginMesh marks a policy that applies to the whole mesh. A policy whose
	// origin is a cluster name was applied by that cluster and, as a Kuma zone's policies are,
	// can decide only pairs that include that cluster. An empty origin means mesh.
	OriginMesh = "mesh"

	// DefaultDriver is the cable driver used when neither a connect policy nor
	// the mesh default policy names one: the driver registry's default.
	DefaultDriver = cable.DefaultDriver

	// DefaultPolicyName is the name of the default policy built by DefaultPolicy.
	DefaultPolicyName = "default"

	// MaxStatusConflicts bounds Status.Conflicts: a policy can lose thousands
	// of pairs and the status is meant to be read by a person.
	MaxStatusConflicts = 10
)

// ClusterConnectionPolicy decides whether, and over which cable, pairs of
// clusters connect. Field names are exactly those of Submariner's connectivity proposal.
type ClusterConnectionPolicy struct {
	APIVersion string     `json:"apiVersion,omitempty" yaml:"apiVersion,omitempty"`
	Kind       string     `json:"kind" yaml:"kind"`
	Metadata   ObjectMeta `json:"metadata" yaml:"metadata"`
	Spec       Spec       `json:"spec" yaml:"spec"`
	// Origin is OriginMesh (or empty) or the name of the cluster that applied
	// the policy. Set by the broker; a value in an applied file is overwritten.
	Origin string `json:"origin,omitempty" yaml:"origin,omitempty"`
	// Status is written by the broker (see ResolveAll). DecodeYAML ignores a
	// status in its input, as kubectl apply does.
	Status *Status `json:"status,omitempty" yaml:"status,omitempty"`
}

// ObjectMeta is the part of Kubernetes' metadata a policy uses.
type ObjectMeta struct {
	// Name is a DNS label (RFC 1123, at most 63 characters).
	Name   string            `json:"name" yaml:"name"`
	Labels map[string]string `json:"labels,omitempty" yaml:"labels,omitempty"`
}

// Spec is the proposal's ClusterConnectionPolicySpec.
//
// A nil selector is absent; a non-nil empty selector is present and matches
// every cluster (the proposal's `rightClusterSelector:` with no value). Presence
// matters only to tell the two forms apart: clusterSelector (a set of
// clusters) or leftClusterSelector/rightClusterSelector (two ends), which
// cannot be mixed. An absent left or right selector, when the other is given,
// matches every cluster.
type Spec struct {
	LeftClusterSelector  *Selector `json:"leftClusterSelector,omitempty" yaml:"leftClusterSelector,omitempty"`
	RightClusterSelector *Selector `json:"rightClusterSelector,omitempty" yaml:"rightClusterSelector,omitempty"`
	ClusterSelector      *Selector `json:"clusterSelector,omitempty" yaml:"clusterSelector,omitempty"`
	// Topology is full-mesh, point-to-point or client-server. Empty means
	// point-to-point when left/right selectors are used and full-mesh otherwise.
	Topology string `json:"topology,omitempty" yaml:"topology,omitempty"`
	// Priority: higher wins. Absent means 0.
	Priority *int `json:"priority,omitempty" yaml:"priority,omitempty"`
	// ConnectionPolicy is connect or no-connect. Empty means connect.
	ConnectionPolicy string `json:"connectionPolicy,omitempty" yaml:"connectionPolicy,omitempty"`
	// CableDriver is the cable for the pairs this policy connects. Absent on a
	// connect policy means the mesh default policy's driver (and options).
	// Must be absent on a no-connect policy.
	CableDriver *CableDriver `json:"cableDriver,omitempty" yaml:"cableDriver,omitempty"`
	// Final, on a mesh policy, takes the pairs it covers out of the clusters' hands: only mesh
	// policies decide them (connect or not, driver and options), whatever any cluster-scoped
	// policy says. Ignored on a cluster-scoped policy (a cluster cannot make its own word final;
	// agent/clusterpolicy refuses it). Absent means false.
	Final bool `json:"final,omitempty" yaml:"final,omitempty"`
}

// CableDriver names a cable driver and its options (the proposal's
// CableDriverSpec; options are the key/values the proposal keeps in a ConfigMap).
type CableDriver struct {
	Name    string            `json:"name" yaml:"name"`
	Options map[string]string `json:"options,omitempty" yaml:"options,omitempty"`
}

// Status reports what a policy decides in the current mesh.
type Status struct {
	// PairsDecided counts the cluster pairs this policy decided (it was the
	// winning policy for them), connected or not.
	PairsDecided int `json:"pairsDecided" yaml:"pairsDecided"`
	// PairsConnected counts those of PairsDecided that connect.
	PairsConnected int `json:"pairsConnected" yaml:"pairsConnected"`
	// ConflictsLost counts the pairs where this policy matched at the winning
	// priority, disagreed with the winner and lost.
	ConflictsLost int `json:"conflictsLost" yaml:"conflictsLost"`
	// Conflicts lists the first MaxStatusConflicts of those, in pair order.
	Conflicts []Conflict `json:"conflicts,omitempty" yaml:"conflicts,omitempty"`
	// Error says why the policy is ignored, when it is invalid.
	Error string `json:"error,omitempty" yaml:"error,omitempty"`
}

// Conflict is one pair a policy lost, and to which policy.
type Conflict struct {
	ClusterA string `json:"clusterA" yaml:"clusterA"`
	ClusterB string `json:"clusterB" yaml:"clusterB"`
	Winner   string `json:"winner" yaml:"winner"`
	// Reason says why a cluster-scoped policy lost to a policy of lower rank: a final mesh
	// policy, a mesh no-connect or the other cluster's no-connect (see Resolver). Empty for a
	// conflict at the winning priority.
	Reason string `json:"reason,omitempty" yaml:"reason,omitempty"`
}

// Cluster is what the resolver needs to know of a cluster.
type Cluster struct {
	Name   string
	Labels map[string]string
}

// EffectivePriority is spec.priority, or 0 when absent.
func (p *ClusterConnectionPolicy) EffectivePriority() int {
	if p.Spec.Priority == nil {
		return 0
	}
	return *p.Spec.Priority
}

// UsesLeftRight reports whether the policy is in the left/right form.
func (s *Spec) UsesLeftRight() bool {
	return s.LeftClusterSelector != nil || s.RightClusterSelector != nil
}

// EffectiveTopology is spec.topology with its default applied.
func (s *Spec) EffectiveTopology() string {
	if s.Topology != "" {
		return s.Topology
	}
	if s.UsesLeftRight() {
		return TopologyPointToPoint
	}
	return TopologyFullMesh
}

// Connects reports whether the policy is a connect policy.
func (s *Spec) Connects() bool {
	return s.ConnectionPolicy != NoConnect
}

// DefaultPolicy is the mesh default the broker creates at first start: every
// pair of clusters connects, full mesh, over driver.
func DefaultPolicy(driver string) ClusterConnectionPolicy {
	if driver == "" {
		driver = DefaultDriver
	}
	zero := 0
	return ClusterConnectionPolicy{
		APIVersion: APIVersion,
		Kind:       Kind,
		Metadata:   ObjectMeta{Name: DefaultPolicyName},
		Spec: Spec{
			Topology:         TopologyFullMesh,
			Priority:         &zero,
			ConnectionPolicy: Connect,
			CableDriver:      &CableDriver{Name: driver},
		},
		Origin: OriginMesh,
	}
}

// DeepCopy returns a copy sharing no maps, slices or pointers with p.
func (p *ClusterConnectionPolicy) DeepCopy() ClusterConnectionPolicy {
	c := *p
	c.Metadata.Labels = maps.Clone(p.Metadata.Labels)
	c.Spec.LeftClusterSelector = p.Spec.LeftClusterSelector.DeepCopy()
	c.Spec.RightClusterSelector = p.Spec.RightClusterSelector.DeepCopy()
	c.Spec.ClusterSelector = p.Spec.ClusterSelector.DeepCopy()
	if p.Spec.Priority != nil {
		v := *p.Spec.Priority
		c.Spec.Priority = &v
	}
	if p.Spec.CableDriver != nil {
		d := *p.Spec.CableDriver
		d.Options = maps.Clone(d.Options)
		c.Spec.CableDriver = &d
	}
	if p.Status != nil {
		st := *p.Status
		st.Conflicts = append([]Conflict(nil), st.Conflicts...)
		c.Status = &st
	}
	return c
}
