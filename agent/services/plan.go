// Package services is the agent's planner for cross-cluster services: from the service imports
// the broker sent, and from which clusters this node can reach right now, it computes what the
// DNS server answers (agent/dns) and what the eBPF socket load balancer translates (bpf). It is
// pure: no I/O, no clock. The agent applies its result (dns.Update, LB.Sync, then
// LB.DestroySockets of the backends that went) and shows its rows in `cablectl status`.
//
// # Rules
//
// A cluster is usable (Reachability) when it is this node's own cluster, or a remote cluster
// that the connection policies connect to this one, that has a live gateway endpoint (the broker
// withdraws an endpoint whose lease expired), and whose connection from this gateway is not down:
// no planner problem (e.g. a driver missing at either end), probes not failing
// failureThreshold times in a row, and a device that does not report the connection in error or
// missing. A non-gateway node reaches remote clusters through its gateway and trusts the policies
// and the endpoints.
//
// For every ClusterSetIP import with a VIP, every VIP and every port of the import is one
// load-balanced service. Its eligible backends are the ready endpoints of the usable clusters
// that export a port of the same name and protocol, at that cluster's port number, of the VIP's
// address family. With affinity local (the local cluster's export's affinity; local by default)
// the local cluster's backends alone are used while there is one, else the other clusters';
// with affinity none all of them. A service with no eligible backend stays in the maps without
// backends, so that connect() to it fails at once.
//
// DNS: a ClusterSetIP import answers its VIPs and ports whatever its backends; a Headless import
// answers the endpoints that are ready and whose cluster is usable.
//
// Gateway mode: a remote cluster whose pair with this one is in gateway mode is reached
// only through its gateway's ingress. Its backends are "mesh address : ingress port" of the remote
// gateway this node's cable connects to (Reach.RemoteNode; any gateway serving it when unknown),
// from the import's ingresses (ImportedCluster.ingresses), one per such gateway, never the
// cluster's pod IPs (they may overlap ours and are not routed). A cluster whose import has no
// ingress for the port yet has no backend there, and says so in its status row. Its headless
// endpoints are pod IPs and are not answered in DNS.
package services

import (
	"cmp"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/cablemesh/cablemesh/agent/dns"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/bpf"
	"github.com/cablemesh/cablemesh/mcs"
)

// Reach says whether this node can use a cluster's backends now, and why (not). GatewayMode and
// RemoteNode are the pair's (see Pair): a gateway-mode cluster's backends are its gateway's
// ingress, not its endpoints.
type Reach struct {
	Usable      bool
	Reason      string
	GatewayMode bool
	RemoteNode  string
}

// Plan is what the agent applies: the DNS zone's services, the load balancer's services, the
// rows of the status, and the inputs left out (logged).
type Plan struct {
	DNS      []dns.Service
	LB       []bpf.Service
	Imports  []statusapi.ServiceImport
	Problems []string
	// LBImports and LBOwners say whose LB[i] is: the import's namespace/name, and the cluster
	// it counts against when the maps are full (see FitOrder).
	LBImports, LBOwners []string
}

// Compute plans imports for a node of cluster local; reach gives each cluster's Reach (a
// cluster absent from it is not usable: it has no live gateway endpoint).
func Compute(imports []*apiv1.ServiceImport, local string, reach map[string]Reach) Plan {
	p := Plan{DNS: []dns.Service{}, LB: []bpf.Service{}, Imports: []statusapi.ServiceImport{}}
	reachOf := func(cluster string) Reach {
		if r, ok := reach[cluster]; ok {
			return r
		}
		return Reach{Reason: "no live gateway endpoint (never registered, or its lease expired)"}
	}
	seenLB := map[string]string{} // VIP:port/proto → the service that has it
	for _, imp := range sortedImports(imports) {
		key := mcs.Key(imp.GetNamespace(), imp.GetName())
		row := statusapi.ServiceImport{
			Namespace: imp.GetNamespace(), Name: imp.GetName(), Type: imp.GetType(),
			VIPs: slices.Clone(imp.GetVips()), Affinity: affinityOf(imp, local),
			Ports: []statusapi.ServicePort{}, Clusters: []statusapi.ImportedCluster{},
		}
		for _, pt := range imp.GetPorts() {
			row.Ports = append(row.Ports, statusapi.ServicePort{Name: pt.GetName(), Port: pt.GetPort(), Protocol: pt.GetProtocol()})
		}
		for _, c := range imp.GetConflicts() {
			row.Conflicts = append(row.Conflicts, statusapi.ServiceConflict{Cluster: c.GetCluster(), Field: c.GetField(), Message: c.GetMessage()})
		}
		for _, c := range imp.GetClusters() {
			r := reachOf(c.GetCluster())
			if c.GetCluster() == local {
				r = Reach{Usable: true, Reason: "local cluster"}
			}
			ic := statusapi.ImportedCluster{Cluster: c.GetCluster(), ClusterID: c.GetClusterId(), Local: c.GetCluster() == local,
				Usable: r.Usable, Reason: r.Reason, Endpoints: []statusapi.ServiceEndpoint{}}
			if c.GetCluster() != local && r.GatewayMode {
				ic.GatewayMode = true
				ic.Reason = joinReason(ic.Reason, gatewayReason(imp, c, r))
			}
			for _, ep := range c.GetEndpoints() {
				ic.Endpoints = append(ic.Endpoints, statusapi.ServiceEndpoint{IP: ep.GetIp(), Hostname: ep.GetHostname(), Ready: ep.GetReady()})
				if ep.GetReady() {
					ic.ReadyEndpoints++
				}
			}
			row.Clusters = append(row.Clusters, ic)
		}
		usable := func(cluster string) bool {
			return cluster == local || reachOf(cluster).Usable
		}
		gatewayOf := func(cluster string) (bool, string) {
			if cluster == local {
				return false, ""
			}
			r := reachOf(cluster)
			return r.GatewayMode, r.RemoteNode
		}
		svc, problems := dnsService(imp, usable, gatewayOf)
		p.Problems = append(p.Problems, problems...)
		p.DNS = append(p.DNS, svc)
		if imp.GetType() == mcs.TypeClusterSetIP {
			lb, problems := lbServices(imp, local, row.Affinity, usable, gatewayOf)
			p.Problems = append(p.Problems, problems...)
			for _, s := range lb {
				k := s.String()
				if other, dup := seenLB[k]; dup {
					p.Problems = append(p.Problems, fmt.Sprintf("service %s: %s is also %s's; left out of the load balancer", key, k, other))
					continue
				}
				seenLB[k] = key
				p.LB = append(p.LB, s)
				p.LBImports = append(p.LBImports, key)
				p.LBOwners = append(p.LBOwners, owner(imp, local))
			}
		}
		p.Imports = append(p.Imports, row)
	}
	return p
}

// sortedImports orders imports by namespace and name, so every plan of the same input is equal.
func sortedImports(in []*apiv1.ServiceImport) []*apiv1.ServiceImport {
	out := slices.Clone(in)
	slices.SortStableFunc(out, func(a, b *apiv1.ServiceImport) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	return out
}

// affinityOf is the affinity the local cluster's export of imp asks for: local (the default,
// also when the local cluster does not export imp) or none.
func affinityOf(imp *apiv1.ServiceImport, local string) string {
	for _, c := range imp.GetClusters() {
		if c.GetCluster() == local && c.GetAffinity() == mcs.AffinityNone {
			return mcs.AffinityNone
		}
	}
	return mcs.AffinityLocal
}

func dnsType(t string) dns.Type {
	if t == mcs.TypeHeadless {
		return dns.Headless
	}
	return dns.ClusterSetIP
}

// dnsService maps one import to the DNS server's view: VIPs and ports, and for a headless
// service every endpoint, ready only when it is ready and its cluster usable.
func dnsService(imp *apiv1.ServiceImport, usable func(string) bool, gatewayOf func(string) (bool, string)) (dns.Service, []string) {
	key := mcs.Key(imp.GetNamespace(), imp.GetName())
	var problems []string
	s := dns.Service{Namespace: imp.GetNamespace(), Name: imp.GetName(), Type: dnsType(imp.GetType())}
	for _, pt := range imp.GetPorts() {
		if pt.GetPort() < 1 || pt.GetPort() > 65535 {
			problems = append(problems, fmt.Sprintf("service %s: port %q: %d is not a port; left out of DNS", key, pt.GetName(), pt.GetPort()))
			continue
		}
		s.Ports = append(s.Ports, dns.Port{Name: pt.GetName(), Port: uint16(pt.GetPort()), Protocol: pt.GetProtocol()})
	}
	if s.Type == dns.ClusterSetIP {
		for _, v := range imp.GetVips() {
			a, err := netip.ParseAddr(v)
			if err != nil {
				problems = append(problems, fmt.Sprintf("service %s: VIP %q is not an IP address; left out", key, v))
				continue
			}
			s.VIPs = append(s.VIPs, a.Unmap())
		}
		return s, problems
	}
	for _, c := range imp.GetClusters() {
		ok := usable(c.GetCluster())
		if gw, _ := gatewayOf(c.GetCluster()); gw {
			continue // pod IPs of a gateway-mode cluster are not reachable (status says so)
		}
		for _, ep := range c.GetEndpoints() {
			a, err := netip.ParseAddr(ep.GetIp())
			if err != nil {
				problems = append(problems, fmt.Sprintf("service %s: cluster %s: endpoint %q is not an IP address; left out", key, c.GetCluster(), ep.GetIp()))
				continue
			}
			s.Endpoints = append(s.Endpoints, dns.Endpoint{Cluster: c.GetCluster(), Hostname: ep.GetHostname(), IP: a.Unmap(), Ready: ep.GetReady() && ok})
		}
	}
	return s, problems
}

// Proto maps a service port protocol to the load balancer's.
func Proto(p string) (bpf.Proto, bool) {
	switch strings.ToUpper(p) {
	case "", "TCP":
		return bpf.TCP, true
	case "UDP":
		return bpf.UDP, true
	case "SCTP":
		return bpf.SCTP, true
	}
	return 0, false
}

// lbServices returns imp's load-balanced services: one per VIP and port, with the eligible
// backends (see the package doc).
func lbServices(imp *apiv1.ServiceImport, local, affinity string, usable func(string) bool, gatewayOf func(string) (bool, string)) ([]bpf.Service, []string) {
	key := mcs.Key(imp.GetNamespace(), imp.GetName())
	var out []bpf.Service
	var problems []string
	for _, v := range imp.GetVips() {
		vip, err := netip.ParseAddr(v)
		if err != nil || vip.Zone() != "" {
			continue // reported by dnsService
		}
		vip = vip.Unmap()
		if vip.IsUnspecified() || vip.IsMulticast() {
			problems = append(problems, fmt.Sprintf("service %s: VIP %s is not a unicast address; not load-balanced", key, vip))
			continue
		}
		for _, pt := range imp.GetPorts() {
			proto, ok := Proto(pt.GetProtocol())
			if !ok || pt.GetPort() < 1 || pt.GetPort() > 65535 {
				problems = append(problems, fmt.Sprintf("service %s: port %q %d/%s cannot be load-balanced; left out", key, pt.GetName(), pt.GetPort(), pt.GetProtocol()))
				continue
			}
			s := bpf.Service{VIP: vip, Port: uint16(pt.GetPort()), Proto: proto, Backends: []bpf.Backend{}}
			var mine, others []bpf.Backend
			seen := map[netip.AddrPort]bool{}
			for _, c := range imp.GetClusters() {
				if !usable(c.GetCluster()) {
					continue
				}
				if gw, node := gatewayOf(c.GetCluster()); gw {
					for _, ap := range ingressBackends(c, pt, node) {
						if ap.Addr().Is4() != vip.Is4() || seen[ap] {
							continue
						}
						seen[ap] = true
						others = append(others, bpf.Backend{Addr: ap.Addr(), Port: ap.Port(), ClusterID: c.GetClusterId()})
					}
					continue
				}
				port, ok := clusterPort(c, pt)
				if !ok {
					continue
				}
				for _, ep := range c.GetEndpoints() {
					a, err := netip.ParseAddr(ep.GetIp())
					if !ep.GetReady() || err != nil || a.Zone() != "" {
						continue
					}
					a = a.Unmap()
					if a.Is4() != vip.Is4() || a.IsUnspecified() || a.IsMulticast() {
						continue
					}
					ap := netip.AddrPortFrom(a, port)
					if seen[ap] {
						continue
					}
					seen[ap] = true
					b := bpf.Backend{Addr: a, Port: port, ClusterID: c.GetClusterId()}
					if c.GetCluster() == local {
						mine = append(mine, b)
					} else {
						others = append(others, b)
					}
				}
			}
			if affinity == mcs.AffinityLocal && len(mine) > 0 {
				s.Backends = mine
			} else {
				s.Backends = append(mine, others...)
			}
			slices.SortFunc(s.Backends, func(a, b bpf.Backend) int {
				return cmp.Or(a.Addr.Compare(b.Addr), cmp.Compare(a.Port, b.Port))
			})
			if len(s.Backends) > bpf.MaxBackendsPerService {
				problems = append(problems, fmt.Sprintf("service %s: %s has %d eligible backends; the first %d are used", key, s, len(s.Backends), bpf.MaxBackendsPerService))
				s.Backends = s.Backends[:bpf.MaxBackendsPerService]
			}
			out = append(out, s)
		}
	}
	return out, problems
}

// clusterPort is the port cluster c's endpoints serve the import's port pt on: the target port of
// its port of the same name and protocol (a Kubernetes Service's targetPort), else that port.
func clusterPort(c *apiv1.ImportedCluster, pt *apiv1.ServicePort) (uint16, bool) {
	want, _ := Proto(pt.GetProtocol())
	for _, cp := range c.GetPorts() {
		got, ok := Proto(cp.GetProtocol())
		if ok && got == want && cp.GetName() == pt.GetName() && cp.GetPort() >= 1 && cp.GetPort() <= 65535 {
			return mcs.BackendPort(cp), true
		}
	}
	return 0, false
}

// Backends groups the backends the load balancer holds by cluster ID, as "ip:port/proto" sorted,
// for the status rows.
func Backends(services []bpf.Service) map[string]map[uint32][]string {
	out := map[string]map[uint32][]string{}
	for _, s := range services {
		k := s.String()
		for _, b := range s.Backends {
			if out[k] == nil {
				out[k] = map[uint32][]string{}
			}
			out[k][b.ClusterID] = append(out[k][b.ClusterID], netip.AddrPortFrom(b.Addr, b.Port).String()+"/"+s.Proto.String())
		}
	}
	for _, byID := range out {
		for id := range maps.Keys(byID) {
			slices.Sort(byID[id])
		}
	}
	return out
}

// AnnotateBackends fills each imported cluster's InMaps with the backends the load balancer
// holds for it (held, as Backends returns it); inMaps says whether the maps could be read.
func AnnotateBackends(rows []statusapi.ServiceImport, held map[string]map[uint32][]string) {
	for i := range rows {
		r := &rows[i]
		for j := range r.Clusters {
			c := &r.Clusters[j]
			c.Backends = []string{}
			for _, v := range r.VIPs {
				a, err := netip.ParseAddr(v)
				if err != nil {
					continue
				}
				for _, pt := range r.Ports {
					proto, ok := Proto(pt.Protocol)
					if !ok || pt.Port < 1 || pt.Port > 65535 {
						continue
					}
					k := bpf.Service{VIP: a.Unmap(), Port: uint16(pt.Port), Proto: proto}.String()
					c.Backends = append(c.Backends, held[k][c.ClusterID]...)
				}
			}
			slices.Sort(c.Backends)
			c.Backends = slices.Compact(c.Backends)
		}
	}
}

// ingressBackends are the backends of import port pt in gateway-mode cluster c: for each of its
// gateways serving pt (node's only, when node is known: the one this node's cable reaches), its
// mesh address and the ingress port of its port of the same name and protocol. Sorted.
func ingressBackends(c *apiv1.ImportedCluster, pt *apiv1.ServicePort, node string) []netip.AddrPort {
	want, _ := Proto(pt.GetProtocol())
	var out []netip.AddrPort
	for _, in := range c.GetIngresses() {
		if node != "" && in.GetNode() != node {
			continue
		}
		mesh, err := netip.ParseAddr(in.GetMeshAddress())
		if err != nil || mesh.Zone() != "" || mesh.IsUnspecified() || mesh.IsMulticast() {
			continue
		}
		for _, ip := range in.GetPorts() {
			got, ok := Proto(ip.GetProtocol())
			if ok && got == want && ip.GetName() == pt.GetName() && ip.GetIngressPort() >= 1 && ip.GetIngressPort() <= 65535 {
				out = append(out, netip.AddrPortFrom(mesh.Unmap(), uint16(ip.GetIngressPort())))
				break
			}
		}
	}
	slices.SortFunc(out, func(a, b netip.AddrPort) int { return a.Compare(b) })
	return slices.Compact(out)
}

// gatewayReason says, for the status row of gateway-mode cluster c, where its services are
// reached (or why not), and that headless endpoints are not answered.
func gatewayReason(imp *apiv1.ServiceImport, c *apiv1.ImportedCluster, r Reach) string {
	if imp.GetType() == mcs.TypeHeadless {
		return "gateway mode: its endpoints are pod IPs this node cannot reach, not answered in DNS"
	}
	var via []string
	missing := 0
	for _, pt := range imp.GetPorts() {
		bs := ingressBackends(c, pt, r.RemoteNode)
		if len(bs) == 0 {
			missing++
		}
		for _, b := range bs {
			via = append(via, b.String()+"/"+strings.ToLower(cmp.Or(pt.GetProtocol(), "TCP")))
		}
	}
	gw := "its gateway"
	if r.RemoteNode != "" {
		gw = "gateway " + r.RemoteNode
	}
	switch {
	case len(via) == 0:
		return "gateway mode: no ingress of " + gw + " serves the service yet, no backend"
	case missing > 0:
		return fmt.Sprintf("gateway mode: through the ingress of %s at %s (%d port(s) not served yet)", gw, strings.Join(via, ", "), missing)
	}
	return fmt.Sprintf("gateway mode: through the ingress of %s at %s", gw, strings.Join(via, ", "))
}

// joinReason joins two reasons with "; ".
func joinReason(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}
