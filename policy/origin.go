package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Cluster-scoped policies. A policy applied in a cluster (a
// ClusterConnectionPolicy object in its Kubernetes API, or a file in its
// agent's policyDir) must say so with LabelOrigin: OriginClusterLabel; an
// unlabelled one is refused, as Kuma's zone refuses a policy without
// kuma.io/managed-by: zone, so that a policy meant for the whole mesh is not
// applied in one cluster by mistake. The agent syncs it to the broker as
// ClusterScoped makes it: named ClusterPolicyName(name, cluster), labelled
// with its origin and cluster, Origin set to the cluster, which the resolver
// uses to let it decide only pairs that include that cluster.
const (
	// LabelOrigin says where a policy was applied.
	LabelOrigin = "cablemesh.io/origin"
	// OriginClusterLabel is LabelOrigin's value on a cluster-scoped policy.
	OriginClusterLabel = "cluster"
	// LabelCluster names the cluster that applied a cluster-scoped policy, on the
	// broker's copy.
	LabelCluster = "cablemesh.io/cluster"

	// clusterHashLen is the length of the hex suffix of a synced name.
	clusterHashLen = 10
	// MaxClusterPolicyNameLen is the longest name a cluster-scoped policy may
	// have: the synced name, with "-" and the hash, must stay a DNS label.
	MaxClusterPolicyNameLen = validation.DNS1123LabelMaxLength - 1 - clusterHashLen
)

// MissingOriginLabelMessage is the refusal of a policy applied in a cluster
// without LabelOrigin (Kuma's wording, with our label).
const MissingOriginLabelMessage = "if you want to apply a policy on the cluster please add `" + LabelOrigin + ": " + OriginClusterLabel + "` label"

// ClusterPolicyName is the name under which cluster's policy name is synced
// to the broker: name, "-", and a hash of (cluster, name). The hash keeps two
// clusters' policies of the same name apart at the broker, and is stable: the
// same policy of the same cluster always gets the same name, whatever its spec.
func ClusterPolicyName(name, cluster string) string {
	h := sha256.Sum256([]byte(cluster + "/" + name))
	return name + "-" + hex.EncodeToString(h[:])[:clusterHashLen]
}

// IsClusterPolicyName reports whether synced is ClusterPolicyName(n, cluster)
// for some n. The broker uses it to hold a node to the naming of its cluster.
func IsClusterPolicyName(synced, cluster string) bool {
	i := strings.LastIndexByte(synced, '-')
	return i > 0 && ClusterPolicyName(synced[:i], cluster) == synced
}

// IsClusterScoped reports whether p is labelled as applied in a cluster.
func (p *ClusterConnectionPolicy) IsClusterScoped() bool {
	return p.Metadata.Labels[LabelOrigin] == OriginClusterLabel
}

// ClusterScoped checks p, as applied in cluster, and returns the copy the
// agent syncs to the broker. It refuses, with an error naming the field and
// the value, a policy without the origin label (MissingOriginLabelMessage), one
// whose name is too long to sync, one labelled for another cluster, and an
// invalid one. p is not changed.
func ClusterScoped(p ClusterConnectionPolicy, cluster string) (ClusterConnectionPolicy, error) {
	name := p.Metadata.Name
	if msgs := validation.IsDNS1123Label(cluster); len(msgs) > 0 {
		return p, fieldErr("cluster", "%q is not a cluster name: %s", cluster, strings.Join(msgs, "; "))
	}
	if v, ok := p.Metadata.Labels[LabelOrigin]; !ok {
		return p, fieldErr("metadata.labels", "policy %q has no %s label: %s", name, LabelOrigin, MissingOriginLabelMessage)
	} else if v != OriginClusterLabel {
		return p, fieldErr("metadata.labels."+LabelOrigin, "policy %q: %q is not %q: %s", name, v, OriginClusterLabel, MissingOriginLabelMessage)
	}
	if v, ok := p.Metadata.Labels[LabelCluster]; ok && v != cluster {
		return p, fieldErr("metadata.labels."+LabelCluster, "policy %q: %q is not this cluster (%q): a cluster applies policies only for itself", name, v, cluster)
	}
	if err := p.Validate(); err != nil {
		return p, err
	}
	if p.Spec.Final {
		return p, fieldErr("spec.final", "policy %q: true is for mesh policies only: a cluster's policy cannot make its decision final (the resolver ignores it); remove it, or ask the mesh's admin for a final mesh policy", name)
	}
	if len(name) > MaxClusterPolicyNameLen {
		return p, fieldErr("metadata.name", "%q is %d characters; a policy applied in a cluster may have at most %d (its synced name adds a %d-character hash)", name, len(name), MaxClusterPolicyNameLen, clusterHashLen+1)
	}
	out := p.DeepCopy()
	out.APIVersion, out.Kind = APIVersion, Kind
	out.Status = nil
	out.Metadata.Name = ClusterPolicyName(name, cluster)
	out.Metadata.Labels = maps.Clone(p.Metadata.Labels)
	out.Metadata.Labels[LabelCluster] = cluster
	out.Origin = cluster
	return out, nil
}

// CheckSyncedClusterPolicy checks a policy a node of cluster sends to the
// broker: it must be what ClusterScoped makes of a policy of cluster (labels,
// naming, origin). The broker calls it so that a node cannot write a mesh
// policy or another cluster's.
func CheckSyncedClusterPolicy(p ClusterConnectionPolicy, cluster string) error {
	name := p.Metadata.Name
	if !p.IsClusterScoped() {
		return fieldErr("metadata.labels."+LabelOrigin, "policy %q: %q, want %q: a node writes only cluster-scoped policies", name, p.Metadata.Labels[LabelOrigin], OriginClusterLabel)
	}
	if v := p.Metadata.Labels[LabelCluster]; v != cluster {
		return fieldErr("metadata.labels."+LabelCluster, "policy %q: %q, want %q: a node writes only its own cluster's policies", name, v, cluster)
	}
	if p.Origin != "" && p.Origin != cluster {
		return fieldErr("origin", "policy %q: %q, want %q: a node writes only its own cluster's policies", name, p.Origin, cluster)
	}
	if !IsClusterPolicyName(name, cluster) {
		return fieldErr("metadata.name", "%q is not a name of cluster %q's policies (<name>-<hash of cluster and name>)", name, cluster)
	}
	if p.Spec.Final {
		return fieldErr("spec.final", "policy %q: true is for mesh policies only", name)
	}
	return nil
}

// ClusterOf returns the cluster that applied p, or "" for a mesh policy.
func (p *ClusterConnectionPolicy) ClusterOf() string {
	if p.Origin == "" || p.Origin == OriginMesh {
		return ""
	}
	return p.Origin
}

// OriginString is the origin as listed: "mesh" or "cluster/<name>".
func (p *ClusterConnectionPolicy) OriginString() string {
	if c := p.ClusterOf(); c != "" {
		return fmt.Sprintf("cluster/%s", c)
	}
	return OriginMesh
}
