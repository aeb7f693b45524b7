package ingress

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
)

func TestIngressConfig(t *testing.T) {
	own := netip.MustParseAddr("242.0.0.1")
	wants := []reconcile.Want{
		{Remote: remoteOf("b"), GatewayMode: true, RemoteMesh: netip.MustParseAddr("242.0.0.3")},
		{Remote: remoteOf("c"), GatewayMode: true, RemoteMesh: netip.MustParseAddr("242.0.0.2")},
		{Remote: remoteOf("d")}, // a direct pair: nothing to translate
	}
	exports := []*apiv1.ServiceExport{{
		Namespace: "demo", Name: "hello",
		Ports: []*apiv1.ServicePort{
			{Name: "tcp", Port: 80, TargetPort: 8080, Protocol: "TCP", IngressPort: 15000},
			{Name: "udp", Port: 53, Protocol: "UDP", IngressPort: 15001},
			{Name: "sctp", Port: 9, Protocol: "SCTP", IngressPort: 15002},
			{Name: "unallocated", Port: 81, Protocol: "TCP"},
		},
		Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.40.0.11", Ready: true}, {Ip: "10.40.0.10", Ready: true}, {Ip: "10.40.0.12"}, {Ip: "fd00::1", Ready: true}},
	}}
	tests := []struct {
		name string
		own  netip.Addr
		mode string
		want Config
	}{
		{"kernel mode serves every allocated TCP/UDP port at the ready IPv4 endpoints' target ports and SNATs to the gateway-mode remotes",
			own, config.IngressKernel, Config{MeshAddress: own,
				RemoteMeshAddresses: []netip.Addr{netip.MustParseAddr("242.0.0.2"), netip.MustParseAddr("242.0.0.3")},
				Services: []Service{{Namespace: "demo", Name: "hello", Ports: []Port{
					{Name: "tcp", Protocol: "TCP", IngressPort: 15000, Backends: []netip.AddrPort{netip.MustParseAddrPort("10.40.0.10:8080"), netip.MustParseAddrPort("10.40.0.11:8080")}},
					{Name: "udp", Protocol: "UDP", IngressPort: 15001, Backends: []netip.AddrPort{netip.MustParseAddrPort("10.40.0.10:53"), netip.MustParseAddrPort("10.40.0.11:53")}},
				}}}}},
		{"envoy mode leaves the TCP ports to Envoy and keeps the SNAT and the UDP ports",
			own, config.IngressEnvoy, Config{MeshAddress: own,
				RemoteMeshAddresses: []netip.Addr{netip.MustParseAddr("242.0.0.2"), netip.MustParseAddr("242.0.0.3")},
				Services: []Service{{Namespace: "demo", Name: "hello", Ports: []Port{
					{Name: "udp", Protocol: "UDP", IngressPort: 15001, Backends: []netip.AddrPort{netip.MustParseAddrPort("10.40.0.10:53"), netip.MustParseAddrPort("10.40.0.11:53")}},
				}}}}},
		{"without a mesh address nothing is served or translated",
			netip.Addr{}, config.IngressKernel, Config{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := ingressConfig(tt.own, remoteMeshAddresses(wants), exports, tt.mode)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("config =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func remoteOf(cluster string) cable.RemoteEndpoint { return cable.RemoteEndpoint{Cluster: cluster} }

// A gateway learns its mesh address from the broker, puts it on its mesh link, connects its
// gateway-mode pair with only the two mesh addresses, SNATs to the remote one, and says so in
// its status; with --cleanup-on-exit the link goes when it stops.
func TestGatewayModeUsed(t *testing.T) {
	direct := []reconcile.Want{{Remote: remoteOf("b")}}
	gw := []reconcile.Want{{Remote: remoteOf("b")}, {Remote: remoteOf("c"), GatewayMode: true}}
	tests := []struct {
		name  string
		local *apiv1.Cluster
		wants []reconcile.Want
		want  bool
	}{
		{"a direct cluster with only direct pairs does not use its mesh address", &apiv1.Cluster{Name: "a"}, direct, false},
		{"a direct cluster with one gateway-mode pair uses it", &apiv1.Cluster{Name: "a"}, gw, true},
		{"a gateway-mode cluster uses it before any pair connects", &apiv1.Cluster{Name: "a", GatewayMode: true}, nil, true},
		{"an unknown own cluster with no pairs does not", nil, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := gatewayModeUsed(tt.local, tt.wants); got != tt.want {
				t.Errorf("gatewayModeUsed = %v, want %v", got, tt.want)
			}
		})
	}
}
