package kubestatus

import (
	"fmt"
	"maps"
	"slices"

	"github.com/cablemesh/cablemesh/agent/linkreport"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// States of a ClusterLink besides a connection's own (connected, connecting, error).
const (
	// StateNotConnected: the policies decide that the pair does not connect.
	StateNotConnected = "not-connected"
	// StateNotHere: the pair connects, but the writer's gateway carries no link to the cluster
	// (another gateway of this cluster does, or none yet).
	StateNotHere = "unknown"
)

// LinkStatus is a ClusterLink's status: the link to one remote cluster as the writer's gateway
// sees it (its connection row, as cablectl status and links show it) and as the plan decides it.
type LinkStatus struct {
	// Connect is the policies' decision for the pair; Policy names the deciding policy.
	Connect bool   `json:"connect"`
	Policy  string `json:"policy,omitempty"`
	// Mode is the pair's mode: gateway or direct.
	Mode   string `json:"mode,omitempty"`
	Driver string `json:"driver,omitempty"`
	// State is connected | connecting | error (the connection's), not-connected (the policies
	// say so) or unknown (the writer's gateway has no link to the cluster).
	State string `json:"state"`
	// Alive: connected on the device and, where probed, the probes answer (cablectl links' ALIVE).
	Alive bool `json:"alive"`
	// The probes' round-trip percentiles over their window, as "0.42ms"; absent without samples.
	LatencyP50 string `json:"latencyP50,omitempty"`
	LatencyP95 string `json:"latencyP95,omitempty"`
	LatencyP99 string `json:"latencyP99,omitempty"`
	// Services counts the services this cluster imports from that cluster.
	Services int `json:"services"`
	// Gateway is the node whose view this is (the cluster's elected writer).
	Gateway string `json:"gateway"`
	Message string `json:"message,omitempty"`
}

// sameButLatency reports whether a and b differ at most in their latency figures: such a change
// is written less often than one of state.
func (a LinkStatus) sameButLatency(b LinkStatus) bool {
	a.LatencyP50, a.LatencyP95, a.LatencyP99 = b.LatencyP50, b.LatencyP95, b.LatencyP99
	return a == b
}

// DesiredLinks is the status of each remote cluster's ClusterLink, by cluster name: every cluster
// the plan decides a pair with (decisions), and every cluster the gateway has a connection row
// of. st is the gateway's status document (its connections and imports); gateway names it. It is
// pure.
func DesiredLinks(st statusapi.Status, decisions []reconcile.PairDecision, gateway string) map[string]LinkStatus {
	out := map[string]LinkStatus{}
	for _, d := range decisions {
		if d.Cluster == "" || d.Cluster == st.Cluster {
			continue
		}
		ls := LinkStatus{Connect: d.Connect, Policy: d.Policy, Mode: d.Mode, Gateway: gateway, State: StateNotConnected}
		if d.Connect {
			ls.Driver = d.Driver
			ls.State = StateNotHere
			ls.Message = fmt.Sprintf("gateway %s has no link to this cluster", gateway)
		}
		out[d.Cluster] = ls
	}
	for _, r := range linkreport.Reports(st.Connections) {
		ls := out[r.RemoteCluster]
		ls.Gateway, ls.State, ls.Alive, ls.Message = gateway, r.State, r.Alive, r.Message
		if r.Driver != "" {
			ls.Driver = r.Driver
		}
		if r.Policy != "" {
			ls.Policy = r.Policy
		}
		if r.HasLatency {
			ls.LatencyP50, ls.LatencyP95, ls.LatencyP99 = ms(r.LatencyP50Ms), ms(r.LatencyP95Ms), ms(r.LatencyP99Ms)
		}
		out[r.RemoteCluster] = ls
	}
	if st.Services != nil {
		for _, imp := range st.Services.Imports {
			for _, c := range imp.Clusters {
				if ls, ok := out[c.Cluster]; ok {
					ls.Services++
					out[c.Cluster] = ls
				}
			}
		}
	}
	return out
}

// ms formats a latency in milliseconds with two decimals: finer steps would be noise, and would
// make every probe window a change to write.
func ms(v float64) string { return fmt.Sprintf("%.2fms", v) }

// sortedNames are m's keys in order.
func sortedNames[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }
