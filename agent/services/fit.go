package services

import (
	"cmp"
	"maps"
	"math"
	"slices"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/bpf"
	"github.com/cablemesh/cablemesh/mcs"
)

// Which services the load balancer's maps hold when they cannot hold them all.
//
// The maps are of a fixed size (bpf.Options.ServiceMapEntries): when the imports need more, each
// import (all its VIPs and ports) is taken or refused as a whole, in this order, and the maps
// take what fits (bpf.LB.SyncFit). The order shares the maps between the exporting clusters:
// every import counts against one cluster (its owner: the local cluster when it exports it,
// else the cluster exporting the most endpoints of it, the first by name on a tie), and the
// imports are taken in rounds, one import of each cluster per round, the local cluster first,
// then the others by name. Within a cluster, the imports the maps hold already come first, then
// the others in the order this node first planned them, then by namespace/name. So a cluster
// that exports a great many services fills only what the other clusters leave, a newcomer of a
// cluster never evicts that cluster's services, and a cluster's new service is taken ahead of
// another cluster's hundredth.

// FitGroup is one import's load-balanced services: what the maps take or refuse together.
type FitGroup struct {
	Import   string // namespace/name
	Owner    string // the cluster the import counts against
	Services []bpf.Service
}

// FitOrder groups plan.LB by import and orders the groups as the maps should take them (see
// above). programmed holds the services (bpf.Service.String) the maps hold now; firstPlanned
// gives each import's rank in the order this node first planned it (an import absent from it
// comes after every one present).
func FitOrder(plan Plan, local string, programmed map[string]bool, firstPlanned map[string]uint64) []FitGroup {
	byImport := map[string]*FitGroup{}
	var order []string
	for i, s := range plan.LB {
		key := plan.LBImports[i]
		g, ok := byImport[key]
		if !ok {
			g = &FitGroup{Import: key, Owner: plan.LBOwners[i]}
			byImport[key] = g
			order = append(order, key)
		}
		g.Services = append(g.Services, s)
	}
	held := func(g *FitGroup) bool {
		return slices.ContainsFunc(g.Services, func(s bpf.Service) bool { return programmed[s.String()] })
	}
	rank := func(key string) uint64 {
		if r, ok := firstPlanned[key]; ok {
			return r
		}
		return math.MaxUint64
	}
	perOwner := map[string][]*FitGroup{}
	for _, key := range order {
		g := byImport[key]
		perOwner[g.Owner] = append(perOwner[g.Owner], g)
	}
	for _, gs := range perOwner {
		slices.SortFunc(gs, func(a, b *FitGroup) int {
			ha, hb := held(a), held(b)
			if ha != hb {
				if ha {
					return -1
				}
				return 1
			}
			return cmp.Or(cmp.Compare(rank(a.Import), rank(b.Import)), cmp.Compare(a.Import, b.Import))
		})
	}
	owners := slices.SortedFunc(maps.Keys(perOwner), func(a, b string) int {
		if (a == local) != (b == local) {
			if a == local {
				return -1
			}
			return 1
		}
		return cmp.Compare(a, b)
	})
	out := make([]FitGroup, 0, len(byImport))
	for round := 0; len(out) < len(byImport); round++ {
		for _, o := range owners {
			if gs := perOwner[o]; round < len(gs) {
				out = append(out, *gs[round])
			}
		}
	}
	return out
}

// owner is the cluster an import counts against: local when it exports it, else the cluster
// exporting the most endpoints of it (the first by name on a tie).
func owner(imp *apiv1.ServiceImport, local string) string {
	best, most := "", -1
	for _, c := range imp.GetClusters() {
		if c.GetCluster() == local {
			return local
		}
		if n := len(c.GetEndpoints()); n > most || n == most && c.GetCluster() < best {
			best, most = c.GetCluster(), n
		}
	}
	return best
}

// MarkRefused sets LoadBalancerRefused on the rows of the imports that refused names
// (namespace/name → why).
func MarkRefused(rows []statusapi.ServiceImport, refused map[string]string) {
	for i := range rows {
		rows[i].LoadBalancerRefused = refused[mcs.Key(rows[i].Namespace, rows[i].Name)]
	}
}
