package xds

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"google.golang.org/protobuf/proto"
)

func testState() State {
	return State{
		Cluster: "east", MeshDomain: "cablemesh.local", SNIPort: 16443, HTTPPort: 16080,
		Certs: &Certs{CertPEM: []byte("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"), KeyPEM: []byte("k"), CAPEM: []byte("ca")},
		Services: []Service{
			{Namespace: "demo", Name: "web", Ports: []Port{
				{Name: "https", Port: 443, TargetPort: 8443, Protocol: "TCP", IngressPort: 15001},
				{Name: "http", Port: 80, TargetPort: 8080, Protocol: "TCP", IngressPort: 15000},
				{Name: "dns", Port: 53, Protocol: "UDP", IngressPort: 15002},
			}, Endpoints: []Endpoint{{IP: "10.1.0.5", Ready: true}, {IP: "10.1.0.4", Ready: true}, {IP: "10.1.0.6", Ready: false}}},
			{Namespace: "demo", Name: "grpc", Ports: []Port{{Name: "grpc", Port: 50051, Protocol: "TCP"}},
				Endpoints: []Endpoint{{IP: "fd00::7", Ready: true}}},
		},
	}
}

func names(rs []types.Resource) []string {
	var out []string
	for _, r := range rs {
		out = append(out, cache.GetResourceName(r))
	}
	return out
}

func TestBuildProducesTheDocumentedResources(t *testing.T) {
	r, err := BuildResources(testState())
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		got  []types.Resource
		want []string
	}{
		{"listeners", r.Listeners, []string{"grpc.demo.svc.clusterset.local:50051", HTTPListener, SNIListener, "ingress-tcp-15000", "ingress-tcp-15001",
			"web.demo.svc.clusterset.local:443", "web.demo.svc.clusterset.local:80"}},
		{"routes", r.Routes, []string{"grpc.demo.svc.clusterset.local:50051", HTTPRoute, "web.demo.svc.clusterset.local:443", "web.demo.svc.clusterset.local:80"}},
		{"clusters", r.Clusters, []string{"grpc.demo.svc.clusterset.local:50051", "web.demo.svc.clusterset.local:443", "web.demo.svc.clusterset.local:80"}},
		{"endpoints", r.Endpoints, []string{"grpc.demo.svc.clusterset.local:50051", "web.demo.svc.clusterset.local:443", "web.demo.svc.clusterset.local:80"}},
		{"secrets", r.Secrets, []string{CertSecret, CASecret}},
	} {
		if got := names(tc.got); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %q, want %q", tc.what, got, tc.want)
		}
		for _, res := range tc.got {
			if err := res.(validator).ValidateAll(); err != nil {
				t.Errorf("%s %s: ValidateAll: %v", tc.what, cache.GetResourceName(res), err)
			}
		}
	}
	// The load assignment holds the ready endpoints alone, at the target port, in one locality
	// with a weight (gRPC needs both).
	cla := r.Endpoints[2].(*endpoint.ClusterLoadAssignment)
	if len(cla.Endpoints) != 1 || cla.Endpoints[0].GetLoadBalancingWeight().GetValue() == 0 || cla.Endpoints[0].GetLocality().GetRegion() != "east" {
		t.Fatalf("locality: %v", cla.Endpoints)
	}
	var addrs []string
	for _, e := range cla.Endpoints[0].LbEndpoints {
		sa := e.GetEndpoint().GetAddress().GetSocketAddress()
		addrs = append(addrs, sa.GetAddress()+":"+strconv.Itoa(int(sa.GetPortValue())))
	}
	if want := []string{"10.1.0.4:8080", "10.1.0.5:8080"}; !slices.Equal(addrs, want) {
		t.Errorf("endpoints of web:80: %v, want %v (ready only, target port)", addrs, want)
	}
	c := r.Clusters[1].(*cluster.Cluster)
	if c.GetOutlierDetection() == nil || c.GetEdsClusterConfig().GetEdsConfig().GetAds() == nil {
		t.Errorf("cluster %s: outlier detection %v, EDS over ADS %v", c.Name, c.GetOutlierDetection(), c.GetEdsClusterConfig())
	}
}

func findListener(t *testing.T, rs []types.Resource, name string) *listener.Listener {
	t.Helper()
	for _, r := range rs {
		if l := r.(*listener.Listener); l.Name == name {
			return l
		}
	}
	t.Fatalf("no listener %s in %v", name, names(rs))
	return nil
}

func TestSNIAndHTTPListeners(t *testing.T) {
	r, err := BuildResources(testState())
	if err != nil {
		t.Fatal(err)
	}
	CheckSNIListener(t, findListener(t, r.Listeners, SNIListener), map[string]string{
		"80.web.demo.svc.east.cablemesh.local":     "web.demo.svc.clusterset.local:80",
		"web.demo.svc.east.cablemesh.local":        "web.demo.svc.clusterset.local:80",
		"443.web.demo.svc.east.cablemesh.local":    "web.demo.svc.clusterset.local:443",
		"50051.grpc.demo.svc.east.cablemesh.local": "grpc.demo.svc.clusterset.local:50051",
		"grpc.demo.svc.east.cablemesh.local":       "grpc.demo.svc.clusterset.local:50051",
	})
	h := findListener(t, r.Listeners, HTTPListener)
	ts := h.FilterChains[0].GetTransportSocket()
	var dtc tlsv3.DownstreamTlsContext
	if ts == nil || ts.GetTypedConfig().UnmarshalTo(&dtc) != nil {
		t.Fatalf("http listener has no TLS transport socket: %v", ts)
	}
	if !dtc.GetRequireClientCertificate().GetValue() || dtc.GetCommonTlsContext().GetTlsCertificateSdsSecretConfigs()[0].GetName() != CertSecret ||
		dtc.GetCommonTlsContext().GetValidationContextSdsSecretConfig().GetName() != CASecret {
		t.Errorf("http TLS is not mTLS through SDS: %v", &dtc)
	}
	var rc *route.RouteConfiguration
	for _, x := range r.Routes {
		if x.(*route.RouteConfiguration).Name == HTTPRoute {
			rc = x.(*route.RouteConfiguration)
		}
	}
	domains := map[string]string{}
	for _, vh := range rc.VirtualHosts {
		for _, d := range vh.Domains {
			domains[d] = vh.Routes[0].GetRoute().GetCluster()
		}
		if vh.Routes[0].GetMatch().GetPrefix() != "/" || vh.Routes[0].GetRoute().GetRetryPolicy().GetNumRetries().GetValue() == 0 {
			t.Errorf("vhost %s: match %v retries %v", vh.Name, vh.Routes[0].GetMatch(), vh.Routes[0].GetRoute().GetRetryPolicy())
		}
	}
	if domains["web.demo.svc.clusterset.local"] != "web.demo.svc.clusterset.local:80" || domains["web.demo.svc.clusterset.local:443"] != "web.demo.svc.clusterset.local:443" {
		t.Errorf("http virtual hosts: %v", domains)
	}
	// The gRPC API listener: an HttpConnectionManager over RDS whose last filter is the router.
	api := findListener(t, r.Listeners, "grpc.demo.svc.clusterset.local:50051")
	var m hcm.HttpConnectionManager
	if err := api.GetApiListener().GetApiListener().UnmarshalTo(&m); err != nil {
		t.Fatal(err)
	}
	if m.GetRds().GetRouteConfigName() != api.Name || m.HttpFilters[len(m.HttpFilters)-1].Name != "envoy.filters.http.router" {
		t.Errorf("api listener: %v", &m)
	}
}

// CheckSNIListener checks that l passes every server name of want to its cluster untouched (a
// TCP proxy, no TLS termination).
func CheckSNIListener(t *testing.T, l *listener.Listener, want map[string]string) {
	t.Helper()
	if err := l.ValidateAll(); err != nil {
		t.Fatalf("%s: %v", l.Name, err)
	}
	if len(l.ListenerFilters) != 1 || l.ListenerFilters[0].Name != "envoy.filters.listener.tls_inspector" {
		t.Errorf("%s: listener filters %v, want the TLS inspector", l.Name, l.ListenerFilters)
	}
	got := map[string]string{}
	for _, fc := range l.FilterChains {
		if fc.TransportSocket != nil {
			t.Errorf("%s chain %s terminates TLS", l.Name, fc.Name)
		}
		var tp tcpproxy.TcpProxy
		if len(fc.Filters) != 1 || fc.Filters[0].GetTypedConfig().UnmarshalTo(&tp) != nil {
			t.Fatalf("%s chain %s: filters %v, want one tcp_proxy", l.Name, fc.Name, fc.Filters)
		}
		for _, sn := range fc.GetFilterChainMatch().GetServerNames() {
			got[sn] = tp.GetCluster()
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: server names %v, want %v", l.Name, got, want)
	}
	for sn, c := range want {
		if got[sn] != c {
			t.Errorf("%s: SNI %s -> %q, want %q", l.Name, sn, got[sn], c)
		}
	}
}

func TestVersionsAreContentHashes(t *testing.T) {
	a, err := Build(testState())
	if err != nil {
		t.Fatal(err)
	}
	st := testState()
	slices.Reverse(st.Services) // input order must not matter
	b, err := Build(st)
	if err != nil {
		t.Fatal(err)
	}
	if !sameVersions(a, b) {
		t.Fatalf("same content, different versions: %v %v", versions(a), versions(b))
	}
	st.Services[0].Endpoints = append(st.Services[0].Endpoints, Endpoint{IP: "10.9.9.9", Ready: true})
	c, err := Build(st)
	if err != nil {
		t.Fatal(err)
	}
	va, vc := versions(a), versions(c)
	for url, v := range va {
		changed := vc[url] != v
		if wantChanged := strings.HasSuffix(url, "ClusterLoadAssignment"); changed != wantChanged {
			t.Errorf("%s: version changed %v, want %v (only the endpoints changed)", url, changed, wantChanged)
		}
	}
}

func TestBuildRefusesBadInput(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*State)
		wants string
	}{
		{"an endpoint that is no IP", func(s *State) { s.Services[0].Endpoints[0].IP = "10.1.0.300" }, `endpoint ip "10.1.0.300"`},
		{"two service ports on one ingress port", func(s *State) { s.Services[1].Ports[0].IngressPort = 15000 }, "ingress port 15000 is also"},
		{"an ingress port that is the SNI listener's", func(s *State) { s.Services[1].Ports[0].IngressPort = 16443 }, "ingress port 16443"},
		{"a mesh address that is no IP", func(s *State) { s.MeshAddress = "242.0.0.300" }, `meshAddress "242.0.0.300"`},
		{"an IPv6 mesh address", func(s *State) { s.MeshAddress = "fd00::1" }, `meshAddress "fd00::1"`},
		{"the unspecified address as mesh address", func(s *State) { s.MeshAddress = "0.0.0.0" }, `meshAddress "0.0.0.0"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := testState()
			tc.edit(&st)
			if _, err := Build(st); err == nil || !strings.Contains(err.Error(), tc.wants) {
				t.Errorf("error %v, want one containing %q", err, tc.wants)
			}
		})
	}
}

func TestNoCertificatesNoHTTPListener(t *testing.T) {
	st := testState()
	st.Certs = nil
	r, err := BuildResources(st)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(names(r.Listeners), HTTPListener) || len(r.Secrets) != 0 {
		t.Errorf("without certificates: listeners %v secrets %v; the HTTP listener must not serve without mTLS", names(r.Listeners), names(r.Secrets))
	}
}

// TestBuilderReusesOnlyWhatIsUnchanged: a Builder's snapshots equal Build's, version for
// version, through a sequence of changes (a reused service port must never hide a change).
func TestBuilderReusesOnlyWhatIsUnchanged(t *testing.T) {
	var b Builder
	steps := []func(*State){
		func(*State) {},
		func(s *State) { s.Services[0].Endpoints[0].Ready = false },
		func(s *State) {
			s.Services[0].Endpoints = append(s.Services[0].Endpoints, Endpoint{IP: "10.1.0.9", Ready: true})
		},
		func(s *State) { s.Services[0].Ports[1].IngressPort = 15020 },
		func(s *State) { s.Services[1].Ports[0].TargetPort = 9090 },
		func(s *State) { s.Cluster = "north" },
		func(s *State) { s.MeshAddress = "242.0.0.7" },
		func(s *State) { s.MeshAddress = "242.0.0.8" },
		func(s *State) { s.MeshAddress = "" },
		func(s *State) { s.Services = s.Services[1:] },
		func(s *State) { s.Certs = nil },
	}
	st := testState()
	for i, step := range steps {
		step(&st)
		want, err := Build(st)
		if err != nil {
			t.Fatal(err)
		}
		got, err := b.Build(st)
		if err != nil {
			t.Fatal(err)
		}
		if !sameVersions(got, want) {
			t.Errorf("step %d: builder versions %v, Build %v", i, versions(got), versions(want))
		}
		for _, typ := range served {
			for name, res := range want.Resources[typ].Items {
				g, ok := got.Resources[typ].Items[name]
				if !ok || !proto.Equal(g.Resource, res.Resource) {
					t.Errorf("step %d: %s differs", i, name)
				}
			}
			if len(got.Resources[typ].Items) != len(want.Resources[typ].Items) {
				t.Errorf("step %d: type %d has %d resources, want %d", i, typ, len(got.Resources[typ].Items), len(want.Resources[typ].Items))
			}
		}
	}
}

// listenerAddr is a listener's bound address as "ip:port".
func listenerAddr(l *listener.Listener) string {
	sa := l.GetAddress().GetSocketAddress()
	return sa.GetAddress() + ":" + strconv.Itoa(int(sa.GetPortValue()))
}

// TestIngressPortListenersFollowTheMeshAddress: in gateway mode the per-port listeners bind the
// node's mesh address once it has one (and follow it when it changes, through a Builder that
// reuses unchanged ports); without one they bind the wildcard. The SNI and HTTP listeners stay
// on ListenAddress in every case. Every resource still passes ValidateAll.
func TestIngressPortListenersFollowTheMeshAddress(t *testing.T) {
	var b Builder
	for _, tc := range []struct {
		name, mesh, listen   string
		wantPort, wantShared string
	}{
		{"no mesh address yet: the wildcard", "", "", "0.0.0.0", "0.0.0.0"},
		{"a mesh address: the ingress ports bind it, the shared listeners stay on the wildcard", "242.0.0.7", "", "242.0.0.7", "0.0.0.0"},
		{"the mesh address changes: the listeners follow", "242.0.0.9", "", "242.0.0.9", "0.0.0.0"},
		{"a listen address and a mesh address: the mesh address wins for the ingress ports", "242.0.0.9", "10.1.0.1", "242.0.0.9", "10.1.0.1"},
		{"the mesh address is gone again: back to the listen address", "", "10.1.0.1", "10.1.0.1", "10.1.0.1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := testState()
			st.MeshAddress, st.ListenAddress = tc.mesh, tc.listen
			if got := IngressPortAddress(st); got != tc.wantPort {
				t.Errorf("IngressPortAddress = %q, want %q", got, tc.wantPort)
			}
			snap, err := b.Build(st)
			if err != nil {
				t.Fatal(err)
			}
			var ls []types.Resource
			for _, it := range snap.Resources[types.Listener].Items {
				ls = append(ls, it.Resource)
				if err := it.Resource.(validator).ValidateAll(); err != nil {
					t.Errorf("%s: ValidateAll: %v", cache.GetResourceName(it.Resource), err)
				}
			}
			for _, p := range []string{"15000", "15001"} {
				l := findListener(t, ls, TCPListenerPrefix+p)
				if got, want := listenerAddr(l), tc.wantPort+":"+p; got != want {
					t.Errorf("listener %s binds %s, want %s", l.Name, got, want)
				}
				// The move from the wildcard to the mesh address rebinds under the same name
				// while the old socket drains: only SO_REUSEPORT lets both coexist.
				if !l.GetEnableReusePort().GetValue() {
					t.Errorf("listener %s: enable_reuse_port not set", l.Name)
				}
			}
			if got, want := listenerAddr(findListener(t, ls, SNIListener)), tc.wantShared+":16443"; got != want {
				t.Errorf("SNI listener binds %s, want %s", got, want)
			}
			if got, want := listenerAddr(findListener(t, ls, HTTPListener)), tc.wantShared+":16080"; got != want {
				t.Errorf("HTTP listener binds %s, want %s", got, want)
			}
		})
	}
}
