package services

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/mcs"
)

// InScope is imports without the endpoints that lie outside their exporting cluster's pod and
// service CIDRs (or, for a cluster in gateway mode, its gateways' mesh addresses): see
// mcs.EndpointScope. The broker refuses such endpoints and leaves them out of what it sends;
// this is the importer's own guard, so that no broker (an older one, or one whose store holds
// exports from before the check) can point this node's callers at its own loopback, a metadata
// service or another cluster's addresses. clusters (by name) and endpoints (by cluster/node) are
// the broker state of the watch. An endpoint of a cluster this node does not know is left out:
// its scope cannot be checked. Each endpoint left out is a problem message; imports without any
// are returned as they are, not copied.
func InScope(imports []*apiv1.ServiceImport, clusters map[string]*apiv1.Cluster, endpoints map[string]*apiv1.Endpoint) ([]*apiv1.ServiceImport, []string) {
	scopes := map[string]mcs.EndpointScope{}
	scopeOf := func(cluster string) (mcs.EndpointScope, bool) {
		c := clusters[cluster]
		if c == nil {
			return mcs.EndpointScope{}, false
		}
		if s, ok := scopes[cluster]; ok {
			return s, true
		}
		var mesh []string
		for _, ep := range endpoints {
			if c.GetGatewayMode() && ep.GetCluster() == cluster && ep.GetMeshAddress() != "" {
				mesh = append(mesh, ep.GetMeshAddress())
			}
		}
		s := mcs.ScopeOf(c, mesh)
		scopes[cluster] = s
		return s, true
	}
	var problems []string
	out, copied := imports, false
	for i, imp := range imports {
		kept, msgs := importInScope(imp, scopeOf)
		if len(msgs) == 0 {
			continue
		}
		if !copied {
			out, copied = slices.Clone(imports), true
		}
		out[i] = kept
		problems = append(problems, msgs...)
	}
	return out, problems
}

// importInScope is imp without its clusters' endpoints outside their scope (a copy when it
// loses one), and a message for each endpoint left out.
func importInScope(imp *apiv1.ServiceImport, scopeOf func(string) (mcs.EndpointScope, bool)) (*apiv1.ServiceImport, []string) {
	key := mcs.Key(imp.GetNamespace(), imp.GetName())
	var out *apiv1.ServiceImport
	var msgs []string
	for ci, c := range imp.GetClusters() {
		scope, known := scopeOf(c.GetCluster())
		var keep []*apiv1.ServiceEndpoint
		dropped := false
		for j, ep := range c.GetEndpoints() {
			field := fmt.Sprintf("cluster %s endpoints[%d].ip", c.GetCluster(), j)
			err := fmt.Errorf("%s %s: cluster %s is not known to this node", field, ep.GetIp(), c.GetCluster())
			if known {
				err = scope.Check(field, ep.GetIp())
			}
			if err != nil {
				msgs = append(msgs, fmt.Sprintf("service %s: %v; left out", key, err))
				dropped = true
				continue
			}
			keep = append(keep, ep)
		}
		if !dropped {
			continue
		}
		if out == nil {
			out = proto.Clone(imp).(*apiv1.ServiceImport)
		}
		out.Clusters[ci].Endpoints = nil
		for _, ep := range keep {
			out.Clusters[ci].Endpoints = append(out.Clusters[ci].Endpoints, proto.Clone(ep).(*apiv1.ServiceEndpoint))
		}
	}
	if out == nil {
		return imp, nil
	}
	return out, msgs
}
