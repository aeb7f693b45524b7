package mcs

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// clusterExport is one cluster's export of a service: the union of its nodes' exports.
type clusterExport struct {
	cluster string
	oldest  *apiv1.ServiceExport // the cluster's oldest node export: type, ports, labels, affinity
	eps     []*apiv1.ServiceEndpoint
}

// Merge turns every stored export into the mesh's service imports, one per namespace/name,
// sorted by namespace then name, each with its clusters sorted by name.
//
// Within a cluster, the nodes' exports are one: the oldest node export gives the type, ports,
// labels and affinity, and the endpoints are the union of all nodes' (by IP, the first seen
// wins). Across clusters, the oldest export (created, then cluster name) decides the type; an
// export of another type, or with a port that disagrees with a port already in the import (same
// name with another number or protocol, or the same number and protocol under another name), is
// left out of the import with a ServiceConflict naming the cluster. The ports of the import are
// the union of the accepted exports' ports.
//
// ids gives each cluster's ID (a cluster missing from it is left out: it is being removed); vips
// gives each namespace/name's allocated VIPs, set on ClusterSetIP imports only.
func Merge(exports []*apiv1.ServiceExport, ids map[string]uint32, vips map[string][]string) []*apiv1.ServiceImport {
	byService := map[string]map[string]*clusterExport{}
	for _, e := range exports {
		if _, ok := ids[e.GetCluster()]; !ok {
			continue
		}
		k := Key(e.GetNamespace(), e.GetName())
		cs := byService[k]
		if cs == nil {
			cs = map[string]*clusterExport{}
			byService[k] = cs
		}
		ce := cs[e.GetCluster()]
		if ce == nil {
			ce = &clusterExport{cluster: e.GetCluster()}
			cs[e.GetCluster()] = ce
		}
		if ce.oldest == nil || older(e, ce.oldest) {
			ce.oldest = e
		}
	}
	// Endpoints: every node export of the cluster whose type agrees with the cluster's oldest,
	// oldest first, so that for an address two nodes export the older node's record counts.
	byAge := slices.Clone(exports)
	slices.SortStableFunc(byAge, func(a, b *apiv1.ServiceExport) int {
		if older(a, b) {
			return -1
		}
		if older(b, a) {
			return 1
		}
		return 0
	})
	for _, e := range byAge {
		ce := byService[Key(e.GetNamespace(), e.GetName())][e.GetCluster()]
		if ce == nil || e.GetType() != ce.oldest.GetType() {
			continue
		}
		ce.eps = append(ce.eps, e.GetEndpoints()...)
	}
	out := make([]*apiv1.ServiceImport, 0, len(byService))
	for _, k := range slices.Sorted(maps.Keys(byService)) {
		out = append(out, mergeService(byService[k], ids, vips[k]))
	}
	return out
}

// older orders exports by creation time, then cluster and node name, so the outcome does not
// depend on map or store order.
func older(a, b *apiv1.ServiceExport) bool {
	return cmp.Or(
		a.GetCreated().AsTime().Compare(b.GetCreated().AsTime()),
		cmp.Compare(a.GetCluster(), b.GetCluster()),
		cmp.Compare(a.GetNode(), b.GetNode()),
	) < 0
}

func mergeService(cs map[string]*clusterExport, ids map[string]uint32, vips []string) *apiv1.ServiceImport {
	order := slices.Collect(maps.Values(cs))
	slices.SortFunc(order, func(a, b *clusterExport) int {
		if older(a.oldest, b.oldest) {
			return -1
		}
		if older(b.oldest, a.oldest) {
			return 1
		}
		return 0
	})
	first := order[0].oldest
	imp := &apiv1.ServiceImport{Namespace: first.GetNamespace(), Name: first.GetName(), Type: first.GetType()}
	if imp.Type == TypeClusterSetIP {
		imp.Vips = slices.Clone(vips)
	}
	var ports []*apiv1.ServicePort
	for _, ce := range order {
		e := ce.oldest
		if e.GetType() != imp.Type {
			imp.Conflicts = append(imp.Conflicts, &apiv1.ServiceConflict{Cluster: ce.cluster, Field: "type",
				Message: fmt.Sprintf("exported as %s, but the oldest export (cluster %s) is %s", e.GetType(), order[0].cluster, imp.Type)})
			continue
		}
		merged, why := unionPorts(ports, e.GetPorts())
		if why != "" {
			imp.Conflicts = append(imp.Conflicts, &apiv1.ServiceConflict{Cluster: ce.cluster, Field: "ports", Message: why})
			continue
		}
		ports = merged
		imp.Clusters = append(imp.Clusters, &apiv1.ImportedCluster{
			Cluster:   ce.cluster,
			ClusterId: ids[ce.cluster],
			Endpoints: dedupeEndpoints(ce.eps),
			Ports:     clonePorts(e.GetPorts()),
			Labels:    maps.Clone(e.GetLabels()),
			Affinity:  e.GetAffinity(),
		})
	}
	imp.Ports = ports
	slices.SortFunc(imp.Clusters, func(a, b *apiv1.ImportedCluster) int { return cmp.Compare(a.Cluster, b.Cluster) })
	slices.SortFunc(imp.Conflicts, func(a, b *apiv1.ServiceConflict) int { return cmp.Compare(a.Cluster, b.Cluster) })
	return imp
}

// unionPorts adds add to have, or says why add conflicts with it. The import's ports carry no
// ingress port: that is per cluster.
func unionPorts(have, add []*apiv1.ServicePort) ([]*apiv1.ServicePort, string) {
	out := slices.Clone(have)
	for _, p := range add {
		dup := false
		for _, h := range have {
			sameName := p.GetName() == h.GetName()
			sameNum := p.GetPort() == h.GetPort() && p.GetProtocol() == h.GetProtocol()
			switch {
			case sameName && sameNum:
				dup = true
			case sameName:
				return nil, fmt.Sprintf("port %q is %d/%s, but %d/%s in an older export", p.GetName(), p.GetPort(), p.GetProtocol(), h.GetPort(), h.GetProtocol())
			case sameNum:
				return nil, fmt.Sprintf("port %d/%s is named %q, but %q in an older export", p.GetPort(), p.GetProtocol(), p.GetName(), h.GetName())
			}
		}
		if !dup {
			out = append(out, &apiv1.ServicePort{Name: p.GetName(), Port: p.GetPort(), Protocol: p.GetProtocol()})
		}
	}
	slices.SortFunc(out, func(a, b *apiv1.ServicePort) int {
		return cmp.Or(cmp.Compare(a.Port, b.Port), cmp.Compare(a.Protocol, b.Protocol))
	})
	return out, ""
}

func clonePorts(ps []*apiv1.ServicePort) []*apiv1.ServicePort {
	out := make([]*apiv1.ServicePort, len(ps))
	for i, p := range ps {
		out[i] = proto.Clone(p).(*apiv1.ServicePort)
	}
	return out
}

// dedupeEndpoints keeps the first endpoint of each IP, sorted by IP.
func dedupeEndpoints(eps []*apiv1.ServiceEndpoint) []*apiv1.ServiceEndpoint {
	seen := map[string]bool{}
	var out []*apiv1.ServiceEndpoint
	for _, e := range eps {
		if seen[e.GetIp()] {
			continue
		}
		seen[e.GetIp()] = true
		out = append(out, proto.Clone(e).(*apiv1.ServiceEndpoint))
	}
	slices.SortFunc(out, func(a, b *apiv1.ServiceEndpoint) int {
		x, errX := netip.ParseAddr(a.GetIp())
		y, errY := netip.ParseAddr(b.GetIp())
		if errX != nil || errY != nil {
			return cmp.Compare(a.GetIp(), b.GetIp())
		}
		return x.Compare(y)
	})
	return out
}

// ConflictsOf returns the conflicts of cluster's exports in imports, each message prefixed with
// the service's key and ": " (ConflictService splits it again).
func ConflictsOf(cluster string, imports []*apiv1.ServiceImport) []*apiv1.ServiceConflict {
	var out []*apiv1.ServiceConflict
	for _, imp := range imports {
		for _, c := range imp.GetConflicts() {
			if c.GetCluster() == cluster {
				c = proto.Clone(c).(*apiv1.ServiceConflict)
				c.Message = Key(imp.GetNamespace(), imp.GetName()) + ": " + c.GetMessage()
				out = append(out, c)
			}
		}
	}
	return out
}

// ConflictService splits a conflict message of ConflictsOf into the service's key
// (namespace/name) and the reason. ok is false when message does not start with a key and ": "
// (a broker that words its conflicts otherwise): the caller then cannot tell the service.
func ConflictService(message string) (key, reason string, ok bool) {
	key, reason, found := strings.Cut(message, ": ")
	if !found {
		return "", "", false
	}
	ns, name, found := strings.Cut(key, "/")
	if !found || ns == "" || name == "" || strings.ContainsAny(name, "/ ") || strings.ContainsAny(ns, " ") {
		return "", "", false
	}
	return key, reason, true
}
