package exports

import (
	"fmt"
	"net/netip"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/mcs"
)

// checkExportScope refuses a runtime export, named field, when one of its endpoints (v's, in
// the order the caller gave them, so that the index is the caller's) lies outside this cluster
// (the broker would refuse the node's whole set of exports for it): the error names the field,
// the value and the CIDRs.
func (x *Exports) checkScope(field string, v statusapi.Export) error {
	scope, known := x.deps.Scope()
	if !known {
		return nil
	}
	for i, ep := range v.Endpoints {
		if err := scope.Check(fmt.Sprintf("%s.endpoints[%d].ip", field, i), ep.IP); err != nil {
			return err
		}
	}
	return nil
}

// kubeExportsInScope is the Kubernetes source's exports without their endpoints outside scope
// (known false: all of them, unchanged), and a message per endpoint left out. Kubernetes decides
// those endpoints (a hostNetwork pod's is its node's address), so one of them leaves that
// endpoint out rather than the whole service, and never makes the broker refuse the node's set.
func kubeExportsInScope(scope mcs.EndpointScope, known bool, list []*apiv1.ServiceExport) ([]*apiv1.ServiceExport, []string) {
	if !known {
		return list, nil
	}
	out := make([]*apiv1.ServiceExport, 0, len(list))
	var msgs []string
	for _, e := range list {
		kept, dropped := scope.InScope(e)
		for _, d := range dropped {
			msgs = append(msgs, fmt.Sprintf("Kubernetes export %s: %s", mcs.Key(e.GetNamespace(), e.GetName()), d))
		}
		out = append(out, kept)
	}
	return out, msgs
}

// ScopeOf is where the endpoints of cluster's exports may lie (mcs.EndpointScope): its pod and
// service CIDRs as the broker's cluster record has them (st's, else join, the Join answer's), and
// in gateway mode its gateways' mesh addresses (registered: this node's from its registration).
// false until the record is known (from the watch, its cache, or Join): the broker then decides
// alone.
func ScopeOf(st *brokerstate.State, join *apiv1.Cluster, cluster string, registered netip.Addr) (mcs.EndpointScope, bool) {
	c := st.Clusters[cluster]
	if c == nil {
		c = join
	}
	if c == nil {
		return mcs.EndpointScope{}, false
	}
	var mesh []string
	if c.GetGatewayMode() {
		for _, ep := range st.Endpoints {
			if ep.GetCluster() == cluster && ep.GetMeshAddress() != "" {
				mesh = append(mesh, ep.GetMeshAddress())
			}
		}
		if registered.IsValid() {
			mesh = append(mesh, registered.String())
		}
	}
	return mcs.ScopeOf(c, mesh), true
}
