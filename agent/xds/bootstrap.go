package xds

import (
	"fmt"
	"net"
	"strconv"
	"time"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	cluster "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpoint "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	upstreamhttp "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
)

// XDSCluster is the bootstrap's static cluster that reaches the agent's xDS server.
const XDSCluster = "cablemesh-xds"

// BootstrapOptions are what an Envoy bootstrap pointing at the agent needs.
type BootstrapOptions struct {
	// NodeID and NodeCluster identify the Envoy to the xDS server (per-node snapshots, status).
	NodeID, NodeCluster string
	// Network and Address are the xDS server's, as config.ParseXDSListen returns them.
	Network, Address string
	// AdminAddress is Envoy's admin listener, a loopback ip:port; "" leaves admin out.
	AdminAddress string
}

// Bootstrap is an Envoy bootstrap that takes every listener and cluster from the agent over ADS
// (secrets, routes and endpoints follow on the same stream), validated.
func Bootstrap(o BootstrapOptions) (*bootstrap.Bootstrap, error) {
	var addr *core.Address
	switch o.Network {
	case "unix":
		addr = &core.Address{Address: &core.Address_Pipe{Pipe: &core.Pipe{Path: o.Address}}}
	case "tcp":
		host, port, err := net.SplitHostPort(o.Address)
		if err != nil {
			return nil, fmt.Errorf("xds address %q: %w", o.Address, err)
		}
		p, err := strconv.ParseUint(port, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("xds address %q: port %q", o.Address, port)
		}
		addr = socketAddress(host, uint32(p))
	default:
		return nil, fmt.Errorf("xds network %q is not unix or tcp", o.Network)
	}
	// xDS is gRPC: the static cluster must speak HTTP/2.
	h2, err := anypb.New(&upstreamhttp.HttpProtocolOptions{
		UpstreamProtocolOptions: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &upstreamhttp.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &core.Http2ProtocolOptions{}},
		}},
	})
	if err != nil {
		return nil, err
	}
	b := &bootstrap.Bootstrap{
		Node: &core.Node{Id: o.NodeID, Cluster: o.NodeCluster},
		DynamicResources: &bootstrap.Bootstrap_DynamicResources{
			AdsConfig: &core.ApiConfigSource{
				ApiType:             core.ApiConfigSource_GRPC,
				TransportApiVersion: core.ApiVersion_V3,
				GrpcServices: []*core.GrpcService{{TargetSpecifier: &core.GrpcService_EnvoyGrpc_{
					EnvoyGrpc: &core.GrpcService_EnvoyGrpc{ClusterName: XDSCluster},
				}}},
			},
			LdsConfig: ads(),
			CdsConfig: ads(),
		},
		StaticResources: &bootstrap.Bootstrap_StaticResources{Clusters: []*cluster.Cluster{{
			Name:                 XDSCluster,
			ClusterDiscoveryType: &cluster.Cluster_Type{Type: cluster.Cluster_STATIC},
			ConnectTimeout:       durationpb.New(time.Second),
			TypedExtensionProtocolOptions: map[string]*anypb.Any{
				"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": h2,
			},
			LoadAssignment: &endpoint.ClusterLoadAssignment{
				ClusterName: XDSCluster,
				Endpoints: []*endpoint.LocalityLbEndpoints{{LbEndpoints: []*endpoint.LbEndpoint{{
					HostIdentifier: &endpoint.LbEndpoint_Endpoint{Endpoint: &endpoint.Endpoint{Address: addr}},
				}}}},
			},
		}}},
	}
	if o.AdminAddress != "" {
		host, port, err := net.SplitHostPort(o.AdminAddress)
		if err != nil {
			return nil, fmt.Errorf("admin address %q is not ip:port", o.AdminAddress)
		}
		ip := net.ParseIP(host)
		p, perr := strconv.ParseUint(port, 10, 16)
		if ip == nil || !ip.IsLoopback() || perr != nil || p == 0 {
			// Envoy's admin interface can stop Envoy and dump its secrets: loopback only.
			return nil, fmt.Errorf("admin address %q is not a loopback ip:port", o.AdminAddress)
		}
		b.Admin = &bootstrap.Admin{Address: socketAddress(host, uint32(p))}
	}
	if err := b.ValidateAll(); err != nil {
		return nil, fmt.Errorf("envoy bootstrap is invalid: %w", err)
	}
	return b, nil
}
