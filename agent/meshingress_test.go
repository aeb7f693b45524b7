package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/ingress"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
)

// fakeIngress records what the agent applies; it never touches the host.
type fakeIngress struct {
	mu      sync.Mutex
	applied []ingress.Config
	links   []netip.Addr
	removed bool
}

func (f *fakeIngress) Apply(_ context.Context, cfg ingress.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, cfg)
	return nil
}
func (f *fakeIngress) Status() ingress.Status        { return ingress.Status{Programmed: true} }
func (f *fakeIngress) Cleanup(context.Context) error { return nil }
func (f *fakeIngress) Close() error                  { return nil }
func (f *fakeIngress) Ensure(a netip.Addr) error {
	f.mu.Lock()
	f.links = append(f.links, a)
	f.mu.Unlock()
	return nil
}
func (f *fakeIngress) Remove() error { f.mu.Lock(); f.removed = true; f.mu.Unlock(); return nil }
func (f *fakeIngress) last() (ingress.Config, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return ingress.Config{}, false
	}
	return f.applied[len(f.applied)-1], true
}

// fakeMeshIngress makes an agent's options use f for the data plane and the mesh link.
func fakeMeshIngress(o *Options, f *fakeIngress) {
	o.OpenIngress = func(*slog.Logger) (ingress.Dataplane, error) { return f, nil }
	o.MeshLink = f
}

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
		want ingress.Config
	}{
		{"kernel mode serves every allocated TCP/UDP port at the ready IPv4 endpoints' target ports and SNATs to the gateway-mode remotes",
			own, config.IngressKernel, ingress.Config{MeshAddress: own,
				RemoteMeshAddresses: []netip.Addr{netip.MustParseAddr("242.0.0.2"), netip.MustParseAddr("242.0.0.3")},
				Services: []ingress.Service{{Namespace: "demo", Name: "hello", Ports: []ingress.Port{
					{Name: "tcp", Protocol: "TCP", IngressPort: 15000, Backends: []netip.AddrPort{netip.MustParseAddrPort("10.40.0.10:8080"), netip.MustParseAddrPort("10.40.0.11:8080")}},
					{Name: "udp", Protocol: "UDP", IngressPort: 15001, Backends: []netip.AddrPort{netip.MustParseAddrPort("10.40.0.10:53"), netip.MustParseAddrPort("10.40.0.11:53")}},
				}}}}},
		{"envoy mode leaves the TCP ports to Envoy and keeps the SNAT and the UDP ports",
			own, config.IngressEnvoy, ingress.Config{MeshAddress: own,
				RemoteMeshAddresses: []netip.Addr{netip.MustParseAddr("242.0.0.2"), netip.MustParseAddr("242.0.0.3")},
				Services: []ingress.Service{{Namespace: "demo", Name: "hello", Ports: []ingress.Port{
					{Name: "udp", Protocol: "UDP", IngressPort: 15001, Backends: []netip.AddrPort{netip.MustParseAddrPort("10.40.0.10:53"), netip.MustParseAddrPort("10.40.0.11:53")}},
				}}}}},
		{"without a mesh address nothing is served or translated",
			netip.Addr{}, config.IngressKernel, ingress.Config{}},
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
func TestGatewayModeAgent(t *testing.T) {
	b := newBroker(t)
	b.UpsertCluster(&apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.1.0.0/16"}, GatewayMode: true})
	west := remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5")
	west.MeshAddress = "242.0.0.2"
	b.UpsertEndpoint(west)
	cfg := testConfig(t, b, true)
	d := fakedriver.New()
	f := &fakeIngress{}
	r := startAgentWith(t, cfg, d, func(o *Options) { fakeMeshIngress(o, f); o.CleanupOnExit = true })
	eventually(t, "the agent registered", func() bool { return b.Endpoint("east", cfg.Node) != nil })
	// The broker allocates the mesh address (the fake one is told to).
	own := proto.Clone(b.Endpoint("east", cfg.Node)).(*apiv1.Endpoint)
	own.MeshAddress = "242.0.0.1"
	b.UpsertEndpoint(own)

	eventually(t, "west is connected carrying only the mesh addresses", func() bool {
		for _, c := range d.Calls() {
			if c.Op == "connect" && c.Cluster == "west" && len(c.Remote.Subnets) == 1 && c.Remote.Subnets[0] == netip.MustParsePrefix("242.0.0.2/32") &&
				len(c.Remote.LocalSubnets) == 1 && c.Remote.LocalSubnets[0] == netip.MustParsePrefix("242.0.0.1/32") {
				return true
			}
		}
		return false
	})
	eventually(t, "the data plane SNATs to west's mesh address", func() bool {
		cfg, ok := f.last()
		return ok && cfg.MeshAddress == netip.MustParseAddr("242.0.0.1") && reflect.DeepEqual(cfg.RemoteMeshAddresses, []netip.Addr{netip.MustParseAddr("242.0.0.2")})
	})
	f.mu.Lock()
	links := slices.Clone(f.links)
	f.mu.Unlock()
	if len(links) == 0 || links[len(links)-1] != netip.MustParseAddr("242.0.0.1") {
		t.Errorf("mesh link holds %v, want 242.0.0.1", links)
	}
	st, _ := getStatus(t, cfg.StatusSocket)
	if st.MeshAddress != "242.0.0.1" {
		t.Errorf("status meshAddress = %q", st.MeshAddress)
	}
	if c, ok := connOf(st, "west"); !ok || c.Mode != reconcile.ModeGateway {
		t.Errorf("west = %+v, want mode gateway", c)
	}
	if c, ok := connOf(st, "north"); !ok || c.Mode != reconcile.ModeDirect || len(c.Subnets) != 1 || c.Subnets[0] != "10.3.0.0/16" {
		t.Errorf("north = %+v, want a direct pair with its pod CIDR", c)
	}
	if st.Ingress == nil || st.Ingress.Dataplane == nil || st.Ingress.Dataplane.MeshLink != ingress.MeshLinkName {
		t.Errorf("ingress = %+v, want the data plane with its mesh link", st.Ingress)
	}
	f.mu.Lock()
	f.removed = false // only the stop counts from here
	f.mu.Unlock()
	r.stop()
	f.mu.Lock()
	removed := f.removed
	f.mu.Unlock()
	if !removed {
		t.Error("--cleanup-on-exit left the mesh link")
	}
}

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
