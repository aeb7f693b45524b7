package services

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/dns"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/bpf"
)

func ep(ip string, ready bool) *apiv1.ServiceEndpoint {
	return &apiv1.ServiceEndpoint{Ip: ip, Ready: ready}
}

func port(name string, n uint32, proto string) *apiv1.ServicePort {
	return &apiv1.ServicePort{Name: name, Port: n, Protocol: proto}
}

func cluster(name string, id uint32, affinity string, ports []*apiv1.ServicePort, eps ...*apiv1.ServiceEndpoint) *apiv1.ImportedCluster {
	return &apiv1.ImportedCluster{Cluster: name, ClusterId: id, Affinity: affinity, Ports: ports, Endpoints: eps}
}

// web is exported by east (10.1.0.10, 10.1.0.11 not ready) and west (10.2.0.10) on port http
// 80/TCP at east and 8080/TCP at west.
func web(eastAffinity string, clusters ...*apiv1.ImportedCluster) *apiv1.ServiceImport {
	if clusters == nil {
		clusters = []*apiv1.ImportedCluster{
			cluster("east", 1, eastAffinity, []*apiv1.ServicePort{port("http", 80, "TCP")}, ep("10.1.0.10", true), ep("10.1.0.11", false)),
			cluster("west", 2, "local", []*apiv1.ServicePort{port("http", 8080, "TCP")}, ep("10.2.0.10", true)),
		}
	}
	return &apiv1.ServiceImport{Namespace: "shop", Name: "web", Type: "ClusterSetIP", Vips: []string{"241.0.0.1"},
		Ports: []*apiv1.ServicePort{port("http", 80, "TCP")}, Clusters: clusters}
}

func backends(s bpf.Service) []string {
	var out []string
	for _, b := range s.Backends {
		out = append(out, netip.AddrPortFrom(b.Addr, b.Port).String())
	}
	return out
}

func usable(names ...string) map[string]Reach {
	out := map[string]Reach{}
	for _, n := range names {
		out[n] = Reach{Usable: true}
	}
	return out
}

func TestLoadBalancerBackends(t *testing.T) {
	down := map[string]Reach{"west": {Reason: "connection down"}, "north": {Usable: true}}
	tests := []struct {
		name    string
		imp     *apiv1.ServiceImport
		local   string
		reach   map[string]Reach
		want    []string
		wantIDs []uint32
	}{
		{"a caller in a cluster that does not export spreads over every ready backend of the usable clusters",
			web("local"), "north", usable("east", "west"), []string{"10.1.0.10:80", "10.2.0.10:8080"}, []uint32{1, 2}},
		{"each backend takes its own cluster's port number of the same port name",
			web("local"), "north", usable("west"), []string{"10.2.0.10:8080"}, []uint32{2}},
		{"an endpoint that is not ready is never a backend",
			web("local"), "north", usable("east"), []string{"10.1.0.10:80"}, []uint32{1}},
		{"a cluster whose connection is down has no backends in the maps",
			web("local"), "north", down, []string{}, nil},
		{"a cluster absent from the reachability (no live gateway endpoint) has no backends",
			web("local"), "north", map[string]Reach{}, []string{}, nil},
		{"with affinity local a caller in an exporting cluster uses its own ready backends only",
			web("local"), "east", usable("west"), []string{"10.1.0.10:80"}, []uint32{1}},
		{"with affinity none a caller in an exporting cluster uses every cluster's backends",
			web("none"), "east", usable("west"), []string{"10.1.0.10:80", "10.2.0.10:8080"}, []uint32{1, 2}},
		{"with affinity local and no ready local backend the caller spreads over the other clusters",
			web("local", cluster("east", 1, "local", []*apiv1.ServicePort{port("http", 80, "TCP")}, ep("10.1.0.11", false)),
				cluster("west", 2, "local", []*apiv1.ServicePort{port("http", 8080, "TCP")}, ep("10.2.0.10", true))),
			"east", usable("west"), []string{"10.2.0.10:8080"}, []uint32{2}},
		{"the local cluster is usable even when the reachability does not name it",
			web("local"), "east", map[string]Reach{}, []string{"10.1.0.10:80"}, []uint32{1}},
		{"a cluster that serves the port under another protocol is no backend of it",
			web("local", cluster("west", 2, "local", []*apiv1.ServicePort{port("http", 8080, "UDP")}, ep("10.2.0.10", true))),
			"north", usable("west"), []string{}, nil},
		{"an IPv6 endpoint is no backend of an IPv4 VIP",
			web("local", cluster("west", 2, "local", []*apiv1.ServicePort{port("http", 80, "TCP")}, ep("fd00::10", true), ep("10.2.0.10", true))),
			"north", usable("west"), []string{"10.2.0.10:80"}, []uint32{2}},
		{"a backend listens on its cluster's target port (a Kubernetes Service's targetPort)",
			web("local", cluster("west", 2, "local", []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP", TargetPort: 8443}}, ep("10.2.0.10", true))),
			"north", usable("west"), []string{"10.2.0.10:8443"}, []uint32{2}},
		{"the same address exported by two clusters is one backend",
			web("local", cluster("east", 1, "", []*apiv1.ServicePort{port("http", 80, "TCP")}, ep("10.9.0.1", true)),
				cluster("west", 2, "", []*apiv1.ServicePort{port("http", 80, "TCP")}, ep("10.9.0.1", true))),
			"north", usable("east", "west"), []string{"10.9.0.1:80"}, []uint32{1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Compute([]*apiv1.ServiceImport{tt.imp}, tt.local, tt.reach)
			if len(p.LB) != 1 {
				t.Fatalf("LB services %v", p.LB)
			}
			s := p.LB[0]
			if s.VIP != netip.MustParseAddr("241.0.0.1") || s.Port != 80 || s.Proto != bpf.TCP {
				t.Errorf("service %s", s)
			}
			if got := backends(s); !slices.Equal(got, tt.want) && !(len(got) == 0 && len(tt.want) == 0) {
				t.Errorf("backends %v, want %v", got, tt.want)
			}
			var ids []uint32
			for _, b := range s.Backends {
				ids = append(ids, b.ClusterID)
			}
			if !slices.Equal(ids, tt.wantIDs) {
				t.Errorf("cluster IDs %v, want %v", ids, tt.wantIDs)
			}
		})
	}
}

func TestEveryVIPAndPortIsOneService(t *testing.T) {
	imp := &apiv1.ServiceImport{Namespace: "shop", Name: "echo", Type: "ClusterSetIP", Vips: []string{"241.0.0.2", "fd00:241::2"},
		Ports: []*apiv1.ServicePort{port("dns", 53, "UDP"), port("web", 80, "TCP")},
		Clusters: []*apiv1.ImportedCluster{cluster("west", 2, "", []*apiv1.ServicePort{port("dns", 5353, "udp"), port("web", 80, "TCP")},
			ep("10.2.0.10", true), ep("fd00:2::10", true))}}
	p := Compute([]*apiv1.ServiceImport{imp}, "north", usable("west"))
	var got []string
	for _, s := range p.LB {
		got = append(got, s.String()+"="+strings.Join(backends(s), ","))
	}
	want := []string{"241.0.0.2:53/udp=10.2.0.10:5353", "241.0.0.2:80/tcp=10.2.0.10:80",
		"[fd00:241::2]:53/udp=[fd00:2::10]:5353", "[fd00:241::2]:80/tcp=[fd00:2::10]:80"}
	if !slices.Equal(got, want) {
		t.Errorf("services\n%v\nwant\n%v", got, want)
	}
}

func TestDNSServices(t *testing.T) {
	db := &apiv1.ServiceImport{Namespace: "shop", Name: "db", Type: "Headless", Ports: []*apiv1.ServicePort{port("pg", 5432, "TCP")},
		Clusters: []*apiv1.ImportedCluster{
			cluster("east", 1, "", nil, &apiv1.ServiceEndpoint{Ip: "10.1.0.20", Hostname: "db-0", Ready: true}, ep("10.1.0.21", false)),
			cluster("west", 2, "", nil, ep("10.2.0.20", true)),
		}}
	t.Run("a ClusterSetIP import answers its VIPs and ports whatever its backends", func(t *testing.T) {
		p := Compute([]*apiv1.ServiceImport{web("local")}, "north", map[string]Reach{})
		s := p.DNS[0]
		if s.Type != dns.ClusterSetIP || !slices.Equal(s.VIPs, []netip.Addr{netip.MustParseAddr("241.0.0.1")}) || len(s.Ports) != 1 || s.Ports[0].Port != 80 {
			t.Errorf("dns service %+v", s)
		}
	})
	t.Run("a headless import's endpoints are ready only when ready and of a usable cluster", func(t *testing.T) {
		p := Compute([]*apiv1.ServiceImport{db}, "north", map[string]Reach{"east": {Usable: true}, "west": {Reason: "down"}})
		got := map[string]bool{}
		for _, e := range p.DNS[0].Endpoints {
			got[e.Cluster+"/"+e.IP.String()+"/"+e.Hostname] = e.Ready
		}
		want := map[string]bool{"east/10.1.0.20/db-0": true, "east/10.1.0.21/": false, "west/10.2.0.20/": false}
		if len(got) != len(want) {
			t.Fatalf("endpoints %v", got)
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s ready %v, want %v", k, got[k], v)
			}
		}
		if len(p.LB) != 0 {
			t.Errorf("a headless service is load-balanced: %v", p.LB)
		}
	})
	t.Run("a bad VIP is reported and left out", func(t *testing.T) {
		bad := web("local")
		bad.Vips = []string{"not-an-ip"}
		p := Compute([]*apiv1.ServiceImport{bad}, "north", usable("east"))
		if len(p.DNS[0].VIPs) != 0 || len(p.LB) != 0 || len(p.Problems) != 1 || !strings.Contains(p.Problems[0], "not-an-ip") {
			t.Errorf("plan %+v", p)
		}
	})
	t.Run("two imports claiming one VIP and port keep the first", func(t *testing.T) {
		other := web("local")
		other.Name = "web2"
		p := Compute([]*apiv1.ServiceImport{other, web("local")}, "north", usable("east"))
		if len(p.LB) != 1 || len(p.Problems) != 1 || !strings.Contains(p.Problems[0], "shop/web2") {
			t.Errorf("LB %v problems %v", p.LB, p.Problems)
		}
	})
}

func TestStatusRows(t *testing.T) {
	p := Compute([]*apiv1.ServiceImport{web("local")}, "east", map[string]Reach{"west": {Reason: "connection down: x"}})
	if len(p.Imports) != 1 {
		t.Fatalf("rows %v", p.Imports)
	}
	r := p.Imports[0]
	if r.Namespace != "shop" || r.Name != "web" || r.Affinity != "local" || len(r.Clusters) != 2 {
		t.Fatalf("row %+v", r)
	}
	e, w := r.Clusters[0], r.Clusters[1]
	if !e.Local || !e.Usable || e.ReadyEndpoints != 1 || len(e.Endpoints) != 2 || w.Usable || w.Reason != "connection down: x" {
		t.Errorf("clusters %+v", r.Clusters)
	}
	AnnotateBackends(p.Imports, Backends(p.LB))
	if !slices.Equal(p.Imports[0].Clusters[0].Backends, []string{"10.1.0.10:80/tcp"}) || len(p.Imports[0].Clusters[1].Backends) != 0 {
		t.Errorf("backends %+v", p.Imports[0].Clusters)
	}
}

func TestReachability(t *testing.T) {
	failing := &Probe{Healthy: false, ConsecutiveFailures: 3, LastError: "timeout"}
	ok := &Probe{Healthy: true}
	tests := []struct {
		name    string
		gateway bool
		pair    Pair
		usable  bool
		reason  string
	}{
		{"a pair the policies do not connect is not usable", true, Pair{Policy: "split"}, false, "no-connect by policy split"},
		{"a pair with a planner problem is not usable", true, Pair{Connect: true, Problem: "remote gateway does not run driver vxlan"}, false, "does not run driver vxlan"},
		{"a pair whose probes fail is down even when its device looks connected", true, Pair{Connect: true, Probe: failing, Device: "connected"}, false, "failed 3 times"},
		{"a pair whose device is in error is down", true, Pair{Connect: true, Device: "error", DeviceMessage: "last handshake 200s ago"}, false, "last handshake"},
		{"a pair missing on its device is not established", true, Pair{Connect: true, Device: DeviceMissing}, false, "does not have it"},
		{"a connecting pair with answering probes is usable", true, Pair{Connect: true, Probe: ok, Device: "connecting"}, true, "probes answer"},
		{"a connected pair that is not probed is usable", true, Pair{Connect: true, Device: "connected"}, true, "not probed"},
		{"a non-gateway node trusts the policy and its gateway", false, Pair{Connect: true, Probe: failing}, true, "gateway"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Reachability("east", tt.gateway, map[string]Pair{"west": tt.pair})
			if got["west"].Usable != tt.usable || !strings.Contains(got["west"].Reason, tt.reason) {
				t.Errorf("reach %+v, want usable %v with %q", got["west"], tt.usable, tt.reason)
			}
			if !got["east"].Usable {
				t.Error("the local cluster is not usable")
			}
		})
	}
}

func FuzzCompute(f *testing.F) {
	f.Add("241.0.0.1", "10.1.0.1", uint32(80), "TCP", "http", true)
	f.Add("fd00::1", "10.1.0.1", uint32(0), "udp", "", false)
	f.Fuzz(func(t *testing.T, vip, ip string, n uint32, proto, name string, ready bool) {
		imp := &apiv1.ServiceImport{Namespace: "a", Name: "b", Type: "ClusterSetIP", Vips: []string{vip},
			Ports:    []*apiv1.ServicePort{port(name, n, proto)},
			Clusters: []*apiv1.ImportedCluster{cluster("c", 1, "", []*apiv1.ServicePort{port(name, n, proto)}, ep(ip, ready))}}
		p := Compute([]*apiv1.ServiceImport{imp}, "c", nil)
		for _, s := range p.LB {
			if !s.VIP.IsValid() || s.VIP.IsUnspecified() || s.VIP.IsMulticast() || s.Port == 0 {
				t.Fatalf("invalid service %s from %q %d", s, vip, n)
			}
			for _, b := range s.Backends {
				if b.Addr.Is4() != s.VIP.Is4() || b.Port == 0 || b.Addr.IsUnspecified() || b.Addr.IsMulticast() {
					t.Fatalf("invalid backend %s of %s", b, s)
				}
			}
		}
	})
}

// gwCluster is a gateway-mode exporter: pod IPs that overlap the caller's (10.40.0.10) and the
// ingresses of its gateways.
func gwCluster(name string, id uint32, ingresses ...*apiv1.GatewayIngress) *apiv1.ImportedCluster {
	c := cluster(name, id, "local", []*apiv1.ServicePort{port("http", 8080, "TCP"), port("dns", 53, "UDP")}, ep("10.40.0.10", true))
	c.Ingresses = ingresses
	return c
}

func ingressOf(node, mesh string, httpPort, dnsPort uint32) *apiv1.GatewayIngress {
	in := &apiv1.GatewayIngress{Node: node, MeshAddress: mesh}
	if httpPort > 0 {
		in.Ports = append(in.Ports, &apiv1.ServicePort{Name: "http", Port: 8080, Protocol: "TCP", IngressPort: httpPort})
	}
	if dnsPort > 0 {
		in.Ports = append(in.Ports, &apiv1.ServicePort{Name: "dns", Port: 53, Protocol: "UDP", IngressPort: dnsPort})
	}
	return in
}

func TestGatewayModeBackendsAreTheRemoteIngress(t *testing.T) {
	imp := func(clusters ...*apiv1.ImportedCluster) *apiv1.ServiceImport {
		return &apiv1.ServiceImport{Namespace: "shop", Name: "web", Type: "ClusterSetIP", Vips: []string{"241.0.0.1"},
			Ports: []*apiv1.ServicePort{port("http", 80, "TCP"), port("dns", 53, "UDP")}, Clusters: clusters}
	}
	gw := func(node string) map[string]Reach {
		return map[string]Reach{"b": {Usable: true, GatewayMode: true, RemoteNode: node}}
	}
	tests := []struct {
		name       string
		imp        *apiv1.ServiceImport
		reach      map[string]Reach
		wantTCP    []string
		wantUDP    []string
		wantReason string
	}{
		{"a gateway-mode cluster is reached at its gateway's mesh address and ingress ports, never its pod IPs",
			imp(gwCluster("b", 2, ingressOf("b1", "242.0.0.2", 30001, 30002))), gw("b1"),
			[]string{"242.0.0.2:30001"}, []string{"242.0.0.2:30002"}, "through the ingress of gateway b1 at 242.0.0.2:30001/tcp, 242.0.0.2:30002/udp"},
		{"only the remote gateway this node's cable connects to is a backend",
			imp(gwCluster("b", 2, ingressOf("b1", "242.0.0.2", 30001, 30002), ingressOf("b2", "242.0.0.3", 30005, 30006))), gw("b2"),
			[]string{"242.0.0.3:30005"}, []string{"242.0.0.3:30006"}, "gateway b2"},
		{"with the remote gateway unknown every gateway serving the service is a backend",
			imp(gwCluster("b", 2, ingressOf("b1", "242.0.0.2", 30001, 30002), ingressOf("b2", "242.0.0.3", 30005, 30006))), gw(""),
			[]string{"242.0.0.2:30001", "242.0.0.3:30005"}, []string{"242.0.0.2:30002", "242.0.0.3:30006"}, "its gateway"},
		{"an import without an ingress yet has no backend and says so",
			imp(gwCluster("b", 2)), gw("b1"), []string{}, []string{}, "no ingress of gateway b1 serves the service yet"},
		{"a port the ingress does not serve yet has no backend, the other port has",
			imp(gwCluster("b", 2, ingressOf("b1", "242.0.0.2", 30001, 0))), gw("b1"),
			[]string{"242.0.0.2:30001"}, []string{}, "1 port(s) not served yet"},
		{"a direct pair still uses the pod IPs",
			imp(gwCluster("b", 2, ingressOf("b1", "242.0.0.2", 30001, 30002))), usable("b"),
			[]string{"10.40.0.10:8080"}, []string{"10.40.0.10:53"}, ""},
		{"an unusable gateway-mode cluster has no backend",
			imp(gwCluster("b", 2, ingressOf("b1", "242.0.0.2", 30001, 30002))), map[string]Reach{"b": {GatewayMode: true, RemoteNode: "b1", Reason: "connection down"}},
			[]string{}, []string{}, "connection down"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := Compute([]*apiv1.ServiceImport{tt.imp}, "a", tt.reach)
			if len(p.LB) != 2 {
				t.Fatalf("LB = %v, want two services (TCP and UDP)", p.LB)
			}
			for _, s := range p.LB {
				want := tt.wantTCP
				if s.Proto == bpf.UDP {
					want = tt.wantUDP
				}
				if got := backends(s); !slices.Equal(got, want) && !(len(got) == 0 && len(want) == 0) {
					t.Errorf("%s backends = %v, want %v", s, got, want)
				}
				for _, b := range s.Backends {
					if b.ClusterID != 2 {
						t.Errorf("backend %v has cluster ID %d, want 2 (the counters and status group by it)", b, b.ClusterID)
					}
				}
			}
			if r := p.Imports[0].Clusters[0].Reason; !strings.Contains(r, tt.wantReason) {
				t.Errorf("reason = %q, want one containing %q", r, tt.wantReason)
			}
		})
	}
}

func TestGatewayModeHeadlessEndpointsAreNotAnswered(t *testing.T) {
	imp := &apiv1.ServiceImport{Namespace: "shop", Name: "db", Type: "Headless",
		Ports: []*apiv1.ServicePort{port("pg", 5432, "TCP")},
		Clusters: []*apiv1.ImportedCluster{
			cluster("b", 2, "local", []*apiv1.ServicePort{port("pg", 5432, "TCP")}, ep("10.40.0.10", true)),
			cluster("c", 3, "local", []*apiv1.ServicePort{port("pg", 5432, "TCP")}, ep("10.43.0.10", true)),
		}}
	reach := map[string]Reach{"b": {Usable: true, GatewayMode: true, RemoteNode: "b1"}, "c": {Usable: true}}
	p := Compute([]*apiv1.ServiceImport{imp}, "a", reach)
	var got []string
	for _, e := range p.DNS[0].Endpoints {
		got = append(got, e.Cluster+"="+e.IP.String())
	}
	if !slices.Equal(got, []string{"c=10.43.0.10"}) {
		t.Errorf("DNS endpoints = %v, want only the direct cluster's", got)
	}
	if r := p.Imports[0].Clusters[0].Reason; !strings.Contains(r, "not answered in DNS") {
		t.Errorf("gateway-mode headless reason = %q", r)
	}
	if r := p.Imports[0].Clusters[1].Reason; strings.Contains(r, "gateway mode") {
		t.Errorf("direct cluster's reason mentions gateway mode: %q", r)
	}
}

// Reachability keeps the pair's mode and remote gateway, whatever it decides about usability.
func TestReachabilityCarriesTheGatewayMode(t *testing.T) {
	r := Reachability("a", true, map[string]Pair{
		"b": {Connect: true, GatewayMode: true, RemoteNode: "b1"},
		"c": {Connect: true, GatewayMode: true, RemoteNode: "c1", Problem: "gateway-mode pair not connected yet: remote gateway c1 has no mesh address from the broker yet"},
		"d": {Connect: true},
	})
	if got := r["b"]; !got.Usable || !got.GatewayMode || got.RemoteNode != "b1" {
		t.Errorf("b = %+v", got)
	}
	if got := r["c"]; got.Usable || !got.GatewayMode || !strings.Contains(got.Reason, "no mesh address") {
		t.Errorf("c = %+v: a pair without mesh addresses is not usable and says why", got)
	}
	if got := r["d"]; got.GatewayMode || got.RemoteNode != "" {
		t.Errorf("d = %+v", got)
	}
}

// The ingresses come from the broker's imports: whatever they hold, a gateway-mode cluster's
// backends are valid unicast addresses with a port, never a pod IP, and nothing panics.
func FuzzGatewayIngressBackends(f *testing.F) {
	f.Add("242.0.0.2", uint32(15000), "http", "TCP", "b1")
	f.Add("::ffff:242.0.0.2", uint32(70000), "", "UDP", "")
	f.Add("fe80::1%eth0", uint32(1), "http", "tcp", "b1")
	f.Add("0.0.0.0", uint32(15000), "http", "SCTP", "b2")
	f.Fuzz(func(t *testing.T, mesh string, ingressPort uint32, name, proto, node string) {
		c := &apiv1.ImportedCluster{Cluster: "b", ClusterId: 2, Endpoints: []*apiv1.ServiceEndpoint{ep("10.40.0.10", true)},
			Ports:     []*apiv1.ServicePort{port(name, 80, proto)},
			Ingresses: []*apiv1.GatewayIngress{{Node: node, MeshAddress: mesh, Ports: []*apiv1.ServicePort{{Name: name, Port: 80, Protocol: proto, IngressPort: ingressPort}}}}}
		imp := &apiv1.ServiceImport{Namespace: "demo", Name: "svc", Type: "ClusterSetIP", Vips: []string{"241.0.0.1"},
			Ports: []*apiv1.ServicePort{port(name, 80, proto)}, Clusters: []*apiv1.ImportedCluster{c}}
		p := Compute([]*apiv1.ServiceImport{imp}, "a", map[string]Reach{"b": {Usable: true, GatewayMode: true, RemoteNode: node}})
		for _, s := range p.LB {
			for _, b := range s.Backends {
				if b.Addr.String() == "10.40.0.10" || b.Port == 0 || !b.Addr.Is4() || b.Addr.IsUnspecified() {
					t.Fatalf("backend %v from mesh %q ingress port %d", b, mesh, ingressPort)
				}
			}
		}
	})
}
