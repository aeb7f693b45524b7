package kubestatus

import (
	"encoding/json"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/clusterpolicy"
	"github.com/cablemesh/cablemesh/policy"
)

// MaxDecidedPairs bounds PolicyStatus.Decided: the counts stay exact, the list is a sample.
const MaxDecidedPairs = 50

// PolicyStatus is a ClusterConnectionPolicy's status as the cluster's writer sees the mesh: what
// the broker's copy of the policy decides (policy.Status, computed by the policy package over
// every cluster the broker knows) and the generation of the object that copy is of.
type PolicyStatus struct {
	// ObservedGeneration is the object's generation whose spec the broker holds and the figures
	// are of.
	ObservedGeneration int64 `json:"observedGeneration"`
	// SyncedAs is the name of the broker's copy (<name>-<hash>, cablectl policy list shows it).
	SyncedAs       string `json:"syncedAs,omitempty"`
	PairsDecided   int    `json:"pairsDecided"`
	PairsConnected int    `json:"pairsConnected"`
	ConflictsLost  int    `json:"conflictsLost"`
	// Decided lists the pairs it decides (the first MaxDecidedPairs, in pair order).
	Decided []DecidedPair `json:"decided,omitempty"`
	// Conflicts lists pairs it lost, and to which policy (the first policy.MaxStatusConflicts).
	Conflicts []policy.Conflict `json:"conflicts,omitempty"`
	// Error says why the policy is refused (the agent's checks): it decides nothing.
	Error string `json:"error,omitempty"`
}

// DecidedPair is one pair a policy decides.
type DecidedPair struct {
	ClusterA string `json:"clusterA"`
	ClusterB string `json:"clusterB"`
	Connect  bool   `json:"connect"`
	Driver   string `json:"driver,omitempty"`
}

// Resolution is the mesh-wide resolution of the plan's state: its resolver (the plan's, never
// rebuilt here) over every cluster the broker knows.
func Resolution(st *brokerstate.State, res *policy.Resolver) *policy.Result {
	clusters := make([]policy.Cluster, 0, len(st.Clusters))
	for _, n := range slices.Sorted(maps.Keys(st.Clusters)) {
		clusters = append(clusters, policy.Cluster{Name: n, Labels: st.Clusters[n].GetLabels()})
	}
	return res.ResolveAll(clusters)
}

// DesiredPolicyStatus is the status of the ClusterConnectionPolicy object obj of cluster, given
// the broker state st and its resolution res. ok is false while the broker does not hold the
// object's current spec (not synced yet, or an older generation): the object's status then stays
// as it is rather than describe a spec that is not the object's. It is pure.
func DesiredPolicyStatus(cluster string, obj *unstructured.Unstructured, st *brokerstate.State, res *policy.Result) (PolicyStatus, bool) {
	out := PolicyStatus{ObservedGeneration: obj.GetGeneration()}
	item := clusterpolicy.ObjectItem(obj)
	if item.Err != nil {
		out.Error = item.Err.Error()
		return out, true
	}
	synced, err := policy.ClusterScoped(item.Policy, cluster)
	if err != nil {
		out.Error = err.Error()
		return out, true
	}
	out.SyncedAs = synced.Metadata.Name
	rec := st.Policies[synced.Metadata.Name]
	if rec == nil {
		return out, false
	}
	held, err := policy.DecodeJSON(rec.GetJson())
	if err != nil || !sameJSON(held.Spec, synced.Spec) {
		return out, false
	}
	s := res.Status[synced.Metadata.Name]
	out.PairsDecided, out.PairsConnected, out.ConflictsLost, out.Error = s.PairsDecided, s.PairsConnected, s.ConflictsLost, s.Error
	out.Conflicts = slices.Clone(s.Conflicts)
	for _, p := range res.Pairs {
		if p.Decision.Policy != synced.Metadata.Name {
			continue
		}
		if len(out.Decided) == MaxDecidedPairs {
			break
		}
		out.Decided = append(out.Decided, DecidedPair{ClusterA: p.A, ClusterB: p.B, Connect: p.Decision.Connect, Driver: p.Decision.Driver})
	}
	return out, true
}

// sameJSON compares two values by their JSON.
func sameJSON(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}
