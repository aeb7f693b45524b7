// Package xds is the agent's xDS server for the gateway's ingress Envoy and for
// proxyless gRPC clients: Build turns the agent's state (local exports, their ready endpoints,
// the ingress port of every exported service port, the node's mesh certificate) into a
// go-control-plane snapshot, a pure function; Server serves it (LDS, RDS, CDS, EDS, SDS;
// state-of-the-world and delta; ADS and the per-type services) with one snapshot per node that
// connects, and tracks every node's ACKs and NACKs per resource type.
//
// Resource names, the contract Envoy and gRPC clients see:
//
//   - cluster and EDS ClusterLoadAssignment per exported service port:
//     "<svc>.<ns>.svc.clusterset.local:<port>", endpoints the ready ones at their target port,
//     round robin, outlier detection on;
//   - listener "ingress-tcp-<ingressPort>" per TCP service port: a TCP proxy to that cluster;
//   - listener "ingress-sni" on the SNI port: a TLS passthrough filter chain per service port,
//     matched by the server name "<port>.<svc>.<ns>.svc.<cluster>.<meshDomain>" and, for the
//     service's lowest TCP port, also "<svc>.<ns>.svc.<cluster>.<meshDomain>"; the TLS session
//     is proxied untouched, so mesh mTLS stays end to end;
//   - listener "ingress-http" on the HTTP port with route configuration "ingress-http": mTLS
//     (the caller presents a certificate of the mesh CA; certificate and CA through SDS, secrets
//     "cablemesh-ingress-cert" and "cablemesh-mesh-ca"), a virtual host per service port for
//     "<svc>.<ns>.svc.clusterset.local:<port>" (the lowest TCP port also without ":<port>"),
//     path prefix "/", retries on 5xx, reset and connect failure;
//   - for gRPC's xDS client, an API listener and a route configuration per service port, both
//     named "<svc>.<ns>.svc.clusterset.local:<port>", the name grpc-go asks for when dialled at
//     "xds:///<svc>.<ns>.svc.clusterset.local:<port>".
//
// Every resource passes its generated ValidateAll() before it is served; a snapshot's version of
// each type is a hash of that type's content, so an unchanged state yields unchanged versions and
// Envoy is not pushed anything.
package xds

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"time"

	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	route "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	router "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	tlsinspector "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	hcm "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	tcpproxy "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/tcp_proxy/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	"github.com/envoyproxy/go-control-plane/pkg/wellknown"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Names of the shared resources.
const (
	TCPListenerPrefix = "ingress-tcp-"
	SNIListener       = "ingress-sni"
	HTTPListener      = "ingress-http"
	HTTPRoute         = "ingress-http"
	CertSecret        = "cablemesh-ingress-cert"
	CASecret          = "cablemesh-mesh-ca"
	// ClustersetDomain is the MCS zone the HTTP virtual hosts and gRPC listeners are named in.
	ClustersetDomain = "svc.clusterset.local"
)

// State is what a snapshot is built from.
type State struct {
	// Cluster is this node's cluster (the SNI names carry it).
	Cluster string
	// MeshDomain ends the SNI names.
	MeshDomain string
	// ListenAddress is the address the ingress listeners bind; default 0.0.0.0.
	ListenAddress string
	// MeshAddress is the gateway's mesh address (gateway mode) once the node holds it
	// on cbl-mesh0; "" when it has none. The per-port listeners ("ingress-tcp-<ingressPort>")
	// bind it: ingress ports serve only gateway-mode pairs, whose callers arrive SNATed from
	// their gateway's mesh address to this one, so binding it keeps them off the node's other
	// addresses (underlay, pod link). The SNI and HTTP listeners stay on ListenAddress: callers
	// of direct pairs reach them at the node's own addresses, and the wildcard covers the mesh
	// address too.
	MeshAddress string
	// SNIPort and HTTPPort are the shared listeners' ports; 0 leaves that listener out.
	SNIPort, HTTPPort uint32
	Services          []Service
	// Certs is the node's mesh certificate, key and CA bundle (PEM); nil leaves out the secrets
	// and the HTTP listener, which must not serve without its mTLS.
	Certs *Certs
}

// Certs is a mesh certificate with its key and the mesh CA bundle, PEM.
type Certs struct {
	CertPEM, KeyPEM, CAPEM []byte
}

// Service is one exported service.
type Service struct {
	Namespace, Name string
	Ports           []Port
	Endpoints       []Endpoint
}

// Port is one service port.
type Port struct {
	Name string
	Port uint32
	// TargetPort is where the endpoints listen; 0 means Port.
	TargetPort uint32
	// Protocol: TCP, UDP or SCTP. Only TCP ports get Envoy resources: Envoy's ingress is a TCP
	// and HTTP proxy; UDP is served by the kernel ingress.
	Protocol string
	// IngressPort is the port allocated to this service port; 0: no TCP listener.
	IngressPort uint32
}

// Endpoint is one backend; only ready ones are served.
type Endpoint struct {
	IP    string
	Ready bool
}

// HostName is a service's clusterset name, "<svc>.<ns>.svc.clusterset.local".
func HostName(namespace, name string) string {
	return name + "." + namespace + "." + ClustersetDomain
}

// ClusterName is the cluster, EDS, gRPC listener and gRPC route name of a service port.
func ClusterName(namespace, name string, port uint32) string {
	return fmt.Sprintf("%s:%d", HostName(namespace, name), port)
}

// SNIName is the server name that selects a service on the SNI listener:
// "<svc>.<ns>.svc.<cluster>.<meshDomain>"; with port != 0, "<port>." in front.
func SNIName(namespace, name, clusterName, meshDomain string, port uint32) string {
	s := fmt.Sprintf("%s.%s.svc.%s.%s", name, namespace, clusterName, meshDomain)
	if port != 0 {
		s = fmt.Sprintf("%d.%s", port, s)
	}
	return s
}

// IngressPortAddress is the address the per-port ingress listeners of st bind: its mesh
// address when it has one, else its ListenAddress (default 0.0.0.0).
func IngressPortAddress(st State) string {
	return cmp.Or(st.MeshAddress, st.ListenAddress, "0.0.0.0")
}

// TCPListenerName is the listener of one ingress port.
func TCPListenerName(ingressPort uint32) string {
	return fmt.Sprintf("%s%d", TCPListenerPrefix, ingressPort)
}

// Resources are a snapshot's resources by type, each sorted by name.
type Resources struct {
	Listeners, Routes, Clusters, Endpoints, Secrets []types.Resource
	// wire holds the deterministic encoding of resources reused from an earlier build, so that
	// hashing does not encode them again; Snapshot adds the others.
	wire map[types.Resource][]byte
}

// Build is the snapshot of st. Every resource passes its ValidateAll(); an input that produces
// an invalid resource (an endpoint IP that does not parse, two services on one ingress port) is
// an error naming it.
func Build(st State) (*cache.Snapshot, error) {
	r, err := BuildResources(st)
	if err != nil {
		return nil, err
	}
	return r.Snapshot()
}

// Snapshot assembles the resources, each type versioned by the hash of its content.
func (r *Resources) Snapshot() (*cache.Snapshot, error) {
	snap := &cache.Snapshot{}
	for typ, items := range map[types.ResponseType][]types.Resource{
		types.Listener: r.Listeners, types.Route: r.Routes, types.Cluster: r.Clusters,
		types.Endpoint: r.Endpoints, types.Secret: r.Secrets,
	} {
		v, err := hashVersion(items, r.wire)
		if err != nil {
			return nil, err
		}
		snap.Resources[typ] = cache.NewResources(v, items)
	}
	// No snap.Consistent(): it counts only the routes of listeners' filter chains, not those
	// of API listeners, and would refuse the gRPC route configurations.
	return snap, nil
}

// hashVersion is the version of one type: the first 16 hex digits of a SHA-256 over the
// deterministic encoding of its resources (in name order), so equal content, equal version.
func hashVersion(items []types.Resource, wire map[types.Resource][]byte) (string, error) {
	h := sha256.New()
	opts := proto.MarshalOptions{Deterministic: true}
	for _, it := range items {
		b, ok := wire[it]
		if !ok {
			var err error
			if b, err = opts.Marshal(it); err != nil {
				return "", fmt.Errorf("xds: encode %s: %w", cache.GetResourceName(it), err)
			}
			if wire != nil {
				wire[it] = b
			}
		}
		fmt.Fprintf(h, "%d:", len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

// validator is what every generated envoy message has.
type validator interface{ ValidateAll() error }

// BuildResources is Build without the snapshot: the resources, validated.
func BuildResources(st State) (*Resources, error) {
	r, _, err := buildResources(st, nil)
	return r, err
}

// portOut are the resources of one service port.
type portOut struct {
	cluster, cla, api, rc, tcp types.Resource // tcp nil without an ingress port
	chain                      *listener.FilterChain
	vhost                      *route.VirtualHost
}

// memo are the per-port resources of the last build, by their inputs, and the encodings of
// those resources: a build reuses what an unchanged service port produced before (already
// validated, already encoded), so that one changed endpoint among 1,000 services costs the
// work of one service, not of all (bench/xds).
type memo struct {
	ports map[string]*portOut
	wire  map[types.Resource][]byte
}

// portKey is every input the resources of one service port depend on.
func portKey(st *State, svc *Service, p Port, first bool) string {
	return fmt.Sprintf("%q|%q|%q|%q|%q|%q|%v|%+v|%+v", st.Cluster, st.MeshDomain, st.ListenAddress, st.MeshAddress, svc.Namespace, svc.Name, first, p, svc.Endpoints)
}

// Builder builds snapshots, reusing the unchanged service ports of its previous build. Not safe
// for concurrent use.
type Builder struct{ last *memo }

// Build is Build(st), faster when little changed since the previous call.
func (b *Builder) Build(st State) (*cache.Snapshot, error) {
	r, m, err := buildResources(st, b.last)
	if err != nil {
		return nil, err
	}
	snap, err := r.Snapshot()
	if err != nil {
		return nil, err
	}
	// Keep only the encodings of this build's per-port resources: the memo stays bounded.
	keep := make(map[types.Resource][]byte, len(m.ports)*5)
	for _, po := range m.ports {
		for _, res := range []types.Resource{po.cluster, po.cla, po.api, po.rc, po.tcp} {
			if b, ok := r.wire[res]; ok && res != nil {
				keep[res] = b
			}
		}
	}
	m.wire = keep
	b.last = m
	return snap, nil
}

func buildResources(st State, old *memo) (*Resources, *memo, error) {
	if st.ListenAddress == "" {
		st.ListenAddress = "0.0.0.0"
	}
	if st.MeshAddress != "" {
		// Refused before anything is built: Envoy would NACK a listener it cannot bind, and
		// the mesh address is a single IPv4 host address (broker/meshaddr).
		a, err := netip.ParseAddr(st.MeshAddress)
		if err != nil || !a.Is4() || a.IsUnspecified() {
			return nil, nil, fmt.Errorf("xds state: meshAddress %q is not an IPv4 host address", st.MeshAddress)
		}
	}
	services := slices.Clone(st.Services)
	slices.SortFunc(services, func(a, b Service) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	r := &Resources{wire: map[types.Resource][]byte{}}
	next := &memo{ports: map[string]*portOut{}}
	reused := map[types.Resource]bool{}
	var sniChains []*listener.FilterChain
	var vhosts []*route.VirtualHost
	ingressOwner := map[uint32]string{}
	for _, svc := range services {
		ports := slices.Clone(svc.Ports)
		slices.SortFunc(ports, func(a, b Port) int { return cmp.Compare(a.Port, b.Port) })
		first := true
		for _, p := range ports {
			if p.Protocol != "" && p.Protocol != "TCP" {
				continue
			}
			name := ClusterName(svc.Namespace, svc.Name, p.Port)
			if p.IngressPort != 0 {
				if o, dup := ingressOwner[p.IngressPort]; dup {
					return nil, nil, fmt.Errorf("service %s/%s port %d: ingress port %d is also %s's", svc.Namespace, svc.Name, p.Port, p.IngressPort, o)
				}
				if p.IngressPort == st.SNIPort || p.IngressPort == st.HTTPPort {
					return nil, nil, fmt.Errorf("service %s/%s port %d: ingress port %d is the SNI or HTTP listener's", svc.Namespace, svc.Name, p.Port, p.IngressPort)
				}
				ingressOwner[p.IngressPort] = name
			}
			key := portKey(&st, &svc, p, first)
			po := (*portOut)(nil)
			if old != nil {
				po = old.ports[key]
			}
			if po != nil {
				for _, res := range []types.Resource{po.cluster, po.cla, po.api, po.rc, po.tcp} {
					if res != nil {
						reused[res] = true
						if b, ok := old.wire[res]; ok {
							r.wire[res] = b
						}
					}
				}
			} else {
				var err error
				if po, err = buildPort(&st, &svc, p, first); err != nil {
					return nil, nil, err
				}
			}
			first = false
			next.ports[key] = po
			r.Clusters = append(r.Clusters, po.cluster)
			r.Endpoints = append(r.Endpoints, po.cla)
			r.Listeners = append(r.Listeners, po.api)
			r.Routes = append(r.Routes, po.rc)
			if po.tcp != nil {
				r.Listeners = append(r.Listeners, po.tcp)
			}
			sniChains = append(sniChains, po.chain)
			vhosts = append(vhosts, po.vhost)
		}
	}
	if st.SNIPort != 0 && len(sniChains) > 0 {
		r.Listeners = append(r.Listeners, &listener.Listener{
			Name:    SNIListener,
			Address: socketAddress(st.ListenAddress, st.SNIPort),
			ListenerFilters: []*listener.ListenerFilter{{
				Name:       wellknown.TLSInspector,
				ConfigType: &listener.ListenerFilter_TypedConfig{TypedConfig: mustAny(&tlsinspector.TlsInspector{})},
			}},
			FilterChains: sniChains,
		})
	}
	if st.Certs != nil {
		r.Secrets = append(r.Secrets,
			&tlsv3.Secret{Name: CertSecret, Type: &tlsv3.Secret_TlsCertificate{TlsCertificate: &tlsv3.TlsCertificate{
				CertificateChain: inline(st.Certs.CertPEM), PrivateKey: inline(st.Certs.KeyPEM),
			}}},
			&tlsv3.Secret{Name: CASecret, Type: &tlsv3.Secret_ValidationContext{ValidationContext: &tlsv3.CertificateValidationContext{
				TrustedCa: inline(st.Certs.CAPEM),
			}}})
		if st.HTTPPort != 0 {
			r.Routes = append(r.Routes, &route.RouteConfiguration{Name: HTTPRoute, VirtualHosts: vhosts})
			r.Listeners = append(r.Listeners, httpListener(st.ListenAddress, st.HTTPPort))
		}
	}
	for _, list := range [][]types.Resource{r.Listeners, r.Routes, r.Clusters, r.Endpoints, r.Secrets} {
		slices.SortFunc(list, func(a, b types.Resource) int { return cmp.Compare(cache.GetResourceName(a), cache.GetResourceName(b)) })
		for _, res := range list {
			if reused[res] {
				continue // validated by the build that made it
			}
			if err := res.(validator).ValidateAll(); err != nil {
				return nil, nil, fmt.Errorf("xds resource %s is invalid: %w", cache.GetResourceName(res), err)
			}
		}
	}
	return r, next, nil
}

// buildPort builds the resources of one TCP service port; first: the service's lowest TCP port,
// which also answers to the service's bare SNI and host names.
func buildPort(st *State, svc *Service, p Port, first bool) (*portOut, error) {
	name := ClusterName(svc.Namespace, svc.Name, p.Port)
	cla, err := loadAssignment(name, st.Cluster, svc.Endpoints, cmp.Or(p.TargetPort, p.Port))
	if err != nil {
		return nil, fmt.Errorf("service %s/%s port %d: %w", svc.Namespace, svc.Name, p.Port, err)
	}
	po := &portOut{cluster: edsCluster(name), cla: cla,
		// The gRPC API listener and its route configuration, both under the name grpc-go asks
		// for.
		api: apiListener(name),
		rc: &route.RouteConfiguration{Name: name, VirtualHosts: []*route.VirtualHost{{
			Name: name, Domains: []string{"*"}, Routes: []*route.Route{prefixRoute(name, false)},
		}}},
	}
	if p.IngressPort != 0 {
		po.tcp = tcpListener(TCPListenerName(p.IngressPort), IngressPortAddress(*st), p.IngressPort, name)
	}
	sni := []string{SNIName(svc.Namespace, svc.Name, st.Cluster, st.MeshDomain, p.Port)}
	hosts := []string{name}
	if first {
		sni = append(sni, SNIName(svc.Namespace, svc.Name, st.Cluster, st.MeshDomain, 0))
		hosts = append(hosts, HostName(svc.Namespace, svc.Name))
	}
	po.chain = &listener.FilterChain{
		Name:             name,
		FilterChainMatch: &listener.FilterChainMatch{ServerNames: sni, TransportProtocol: "tls"},
		Filters:          []*listener.Filter{tcpProxyFilter("sni_"+name, name)},
	}
	po.vhost = &route.VirtualHost{Name: name, Domains: hosts, Routes: []*route.Route{prefixRoute(name, true)}}
	return po, nil
}

// ads is the config source of every dependent resource: the same ADS stream, so Envoy and gRPC
// fetch them over the connection they already have to the agent.
func ads() *core.ConfigSource {
	return &core.ConfigSource{
		ResourceApiVersion:    core.ApiVersion_V3,
		ConfigSourceSpecifier: &core.ConfigSource_Ads{Ads: &core.AggregatedConfigSource{}},
	}
}

func edsCluster(name string) *cluster.Cluster {
	return &cluster.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_EDS},
		EdsClusterConfig:     &cluster.Cluster_EdsClusterConfig{EdsConfig: ads(), ServiceName: name},
		ConnectTimeout:       durationpb.New(2 * time.Second),
		LbPolicy:             cluster.Cluster_ROUND_ROBIN,
		// Outlier detection on by default: an endpoint that keeps failing (5xx, or connect
		// failures for TCP) leaves the rotation for a while instead of taking a share of the
		// calls until the next export change.
		OutlierDetection: &cluster.OutlierDetection{
			Consecutive_5Xx:           wrapperspb.UInt32(5),
			Interval:                  durationpb.New(5 * time.Second),
			BaseEjectionTime:          durationpb.New(15 * time.Second),
			MaxEjectionPercent:        wrapperspb.UInt32(50),
			ConsecutiveGatewayFailure: wrapperspb.UInt32(5),
		},
	}
}

func loadAssignment(name, clusterName string, eps []Endpoint, port uint32) (*endpoint.ClusterLoadAssignment, error) {
	cla := &endpoint.ClusterLoadAssignment{ClusterName: name}
	var lb []*endpoint.LbEndpoint
	seen := map[netip.Addr]bool{}
	for _, ep := range eps {
		if !ep.Ready {
			continue
		}
		a, err := netip.ParseAddr(ep.IP)
		if err != nil || a.Zone() != "" {
			return nil, fmt.Errorf("endpoint ip %q is not an IP address", ep.IP)
		}
		if seen[a] {
			continue
		}
		seen[a] = true
		lb = append(lb, &endpoint.LbEndpoint{
			HostIdentifier:      &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: socketAddress(a.String(), port)}},
			HealthStatus:        core.HealthStatus_HEALTHY,
			LoadBalancingWeight: wrapperspb.UInt32(1),
		})
	}
	slices.SortFunc(lb, func(a, b *endpoint.LbEndpoint) int {
		return cmp.Compare(a.GetEndpoint().GetAddress().GetSocketAddress().GetAddress(), b.GetEndpoint().GetAddress().GetSocketAddress().GetAddress())
	})
	if len(lb) > 0 {
		// gRPC's xDS client needs a locality with a weight above 0.
		cla.Endpoints = []*endpoint.LocalityLbEndpoints{{
			Locality:            &core.Locality{Region: clusterName},
			LoadBalancingWeight: wrapperspb.UInt32(1),
			LbEndpoints:         lb,
		}}
	}
	return cla, nil
}

func socketAddress(ip string, port uint32) *core.Address {
	return &core.Address{Address: &core.Address_SocketAddress{SocketAddress: &core.SocketAddress{
		Protocol: core.SocketAddress_TCP, Address: ip, PortSpecifier: &core.SocketAddress_PortValue{PortValue: port},
	}}}
}

func inline(b []byte) *core.DataSource {
	return &core.DataSource{Specifier: &core.DataSource_InlineBytes{InlineBytes: b}}
}

func tcpProxyFilter(stat, clusterName string) *listener.Filter {
	return &listener.Filter{
		Name: wellknown.TCPProxy,
		ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(&tcpproxy.TcpProxy{
			StatPrefix:       stat,
			ClusterSpecifier: &tcpproxy.TcpProxy_Cluster{Cluster: clusterName},
		})},
	}
}

func tcpListener(name, addr string, port uint32, clusterName string) *listener.Listener {
	return &listener.Listener{
		Name:         name,
		Address:      socketAddress(addr, port),
		FilterChains: []*listener.FilterChain{{Filters: []*listener.Filter{tcpProxyFilter(name, clusterName)}}},
		// Explicit, not Envoy's platform default: when the mesh address appears the listener
		// moves from 0.0.0.0:<port> to <mesh>:<port> under the same name, and Envoy binds the
		// new socket while the old one still drains; on Linux that bind succeeds only with
		// SO_REUSEPORT on both.
		EnableReusePort: wrapperspb.Bool(true),
	}
}

func routerFilter() *hcm.HttpFilter {
	return &hcm.HttpFilter{Name: wellknown.Router, ConfigType: &hcm.HttpFilter_TypedConfig{TypedConfig: mustAny(&router.Router{})}}
}

func rdsManager(stat, routeName string) *hcm.HttpConnectionManager {
	return &hcm.HttpConnectionManager{
		StatPrefix: stat,
		CodecType:  hcm.HttpConnectionManager_AUTO,
		RouteSpecifier: &hcm.HttpConnectionManager_Rds{Rds: &hcm.Rds{
			ConfigSource: ads(), RouteConfigName: routeName,
		}},
		// The router must be the last filter (gRPC's xDS client refuses anything else).
		HttpFilters: []*hcm.HttpFilter{routerFilter()},
	}
}

func apiListener(name string) *listener.Listener {
	return &listener.Listener{
		Name:        name,
		ApiListener: &listener.ApiListener{ApiListener: mustAny(rdsManager(name, name))},
	}
}

func httpListener(addr string, port uint32) *listener.Listener {
	tlsCtx := &tlsv3.DownstreamTlsContext{
		// Callers must present a certificate of the mesh CA.
		RequireClientCertificate: wrapperspb.Bool(true),
		CommonTlsContext: &tlsv3.CommonTlsContext{
			TlsCertificateSdsSecretConfigs: []*tlsv3.SdsSecretConfig{{Name: CertSecret, SdsConfig: ads()}},
			ValidationContextType: &tlsv3.CommonTlsContext_ValidationContextSdsSecretConfig{
				ValidationContextSdsSecretConfig: &tlsv3.SdsSecretConfig{Name: CASecret, SdsConfig: ads()},
			},
		},
	}
	return &listener.Listener{
		Name:    HTTPListener,
		Address: socketAddress(addr, port),
		FilterChains: []*listener.FilterChain{{
			Filters: []*listener.Filter{{
				Name:       wellknown.HTTPConnectionManager,
				ConfigType: &listener.Filter_TypedConfig{TypedConfig: mustAny(rdsManager(HTTPListener, HTTPRoute))},
			}},
			TransportSocket: &core.TransportSocket{
				Name:       wellknown.TransportSocketTLS,
				ConfigType: &core.TransportSocket_TypedConfig{TypedConfig: mustAny(tlsCtx)},
			},
		}},
	}
}

// prefixRoute routes every path to clusterName; with retries for the ingress's HTTP listener.
func prefixRoute(clusterName string, retries bool) *route.Route {
	action := &route.RouteAction{ClusterSpecifier: &route.RouteAction_Cluster{Cluster: clusterName}}
	if retries {
		// On by default: a call that met a failing or vanished endpoint is tried again on
		// another one (outlier detection keeps the failing one out afterwards).
		action.RetryPolicy = &route.RetryPolicy{
			RetryOn:    "5xx,reset,connect-failure,refused-stream",
			NumRetries: wrapperspb.UInt32(2),
		}
	}
	return &route.Route{
		Match:  &route.RouteMatch{PathSpecifier: &route.RouteMatch_Prefix{Prefix: "/"}},
		Action: &route.Route_Route{Route: action},
	}
}

// mustAny packs a message built here; it cannot fail for a registered message type.
func mustAny(m proto.Message) *anypb.Any {
	a, err := anypb.New(m)
	if err != nil {
		panic(fmt.Sprintf("xds: pack %T: %v", m, err))
	}
	return a
}
