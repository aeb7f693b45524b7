package broker

import (
	"cmp"
	"maps"
	"slices"
	"strings"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/mcs"
)

// clusterMeshAddresses are the mesh addresses of cluster's gateways as tx holds them.
func clusterMeshAddresses(tx store.ReadTx, cluster string) ([]string, error) {
	eps, err := tx.Endpoints()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range eps {
		if e.GetCluster() == cluster && e.GetMeshAddress() != "" {
			out = append(out, e.GetMeshAddress())
		}
	}
	return out, nil
}

// exportsInScope is exports without the endpoints that lie outside their cluster's scope
// (mcs.EndpointScope), and, by service (namespace/name), a conflict (field "endpoints") per
// export that lost some, for the import's status. The broker refuses such endpoints when they are written, but an export stored
// before that check, or before its cluster's CIDRs changed, may hold them: importers must never
// be sent there. clusters are by name; mesh are the mesh addresses by cluster/node. An export of
// a cluster not in clusters is left as it is (mcs.Merge leaves it out).
func exportsInScope(exports []*apiv1.ServiceExport, clusters map[string]*apiv1.Cluster, mesh map[string]string) ([]*apiv1.ServiceExport, map[string][]*apiv1.ServiceConflict) {
	scopes := map[string]mcs.EndpointScope{}
	var conflicts map[string][]*apiv1.ServiceConflict
	out := make([]*apiv1.ServiceExport, 0, len(exports))
	for _, e := range exports {
		c := clusters[e.GetCluster()]
		if c == nil {
			out = append(out, e)
			continue
		}
		scope, ok := scopes[c.GetName()]
		if !ok {
			var gateways []string
			if c.GetGatewayMode() {
				gateways = meshOfCluster(mesh, c.GetName())
			}
			scope = mcs.ScopeOf(c, gateways)
			scopes[c.GetName()] = scope
		}
		kept, dropped := scope.InScope(e)
		out = append(out, kept)
		if len(dropped) > 0 {
			if conflicts == nil {
				conflicts = map[string][]*apiv1.ServiceConflict{}
			}
			k := mcs.Key(e.GetNamespace(), e.GetName())
			conflicts[k] = append(conflicts[k], &apiv1.ServiceConflict{Cluster: e.GetCluster(), Field: "endpoints",
				Message: "node " + e.GetNode() + ": left out: " + strings.Join(dropped, "; ")})
		}
	}
	return out, conflicts
}

// meshOfCluster are the mesh addresses of cluster's nodes in mesh (by cluster/node).
func meshOfCluster(mesh map[string]string, cluster string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(mesh)) {
		if strings.HasPrefix(k, cluster+"/") {
			out = append(out, mesh[k])
		}
	}
	return out
}

// addScopeConflicts adds conflicts to imp's (just merged, not shared yet), in cluster then
// message order, so that every merge of the same exports is equal.
func addScopeConflicts(imp *apiv1.ServiceImport, conflicts []*apiv1.ServiceConflict) {
	if len(conflicts) == 0 {
		return
	}
	conflicts = slices.Clone(conflicts)
	slices.SortFunc(conflicts, func(a, b *apiv1.ServiceConflict) int {
		return cmp.Or(cmp.Compare(a.Cluster, b.Cluster), cmp.Compare(a.Message, b.Message))
	})
	imp.Conflicts = append(imp.Conflicts, conflicts...)
	slices.SortStableFunc(imp.Conflicts, func(a, b *apiv1.ServiceConflict) int { return cmp.Compare(a.Cluster, b.Cluster) })
}

// clustersByName indexes clusters by name.
func clustersByName(clusters []*apiv1.Cluster) map[string]*apiv1.Cluster {
	out := make(map[string]*apiv1.Cluster, len(clusters))
	for _, c := range clusters {
		out[c.GetName()] = c
	}
	return out
}

// scopeChanged says whether a cluster's change can change which of its endpoints are in scope.
func scopeChanged(old, c *apiv1.Cluster) bool {
	return old == nil || c == nil || old.GetGatewayMode() != c.GetGatewayMode() ||
		!slices.Equal(old.GetPodCidrs(), c.GetPodCidrs()) || !slices.Equal(old.GetServiceCidrs(), c.GetServiceCidrs())
}

// markClusterDirty marks every service cluster exports to be merged again: its scope changed.
func (s *importState) markClusterDirty(cluster string) bool {
	marked := false
	for node, svcs := range s.nodeServices {
		if strings.HasPrefix(node, cluster+"/") {
			for svc := range svcs {
				s.dirty[svc], marked = true, true
			}
		}
	}
	return marked
}
