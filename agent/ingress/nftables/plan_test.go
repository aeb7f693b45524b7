package nftables

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/ingress"
)

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }
func ad(s string) netip.Addr     { return netip.MustParseAddr(s) }

func TestNewPlan(t *testing.T) {
	mesh := ad("242.0.0.2")
	tests := []struct {
		name    string
		cfg     ingress.Config
		want    Plan
		wantErr string // substring; "" = no error
	}{
		{name: "the zero config plans no table", cfg: ingress.Config{}, want: Plan{}},
		{
			name: "without a mesh address nothing is planned even with services",
			cfg: ingress.Config{RemoteMeshAddresses: []netip.Addr{ad("242.0.0.3")}, Services: []ingress.Service{{
				Namespace: "ns", Name: "web", Ports: []ingress.Port{{Protocol: "TCP", IngressPort: 30001, Backends: []netip.AddrPort{ap("10.1.0.5:80")}}},
			}}},
			want: Plan{},
		},
		{
			name: "ports are sorted by protocol then port and backends sorted and deduplicated",
			cfg: ingress.Config{
				MeshAddress:         mesh,
				RemoteMeshAddresses: []netip.Addr{ad("242.0.0.9"), ad("242.0.0.3"), ad("242.0.0.9")},
				Services: []ingress.Service{
					{Namespace: "ns", Name: "dns", Ports: []ingress.Port{{Name: "dns", Protocol: "UDP", IngressPort: 30000, Backends: []netip.AddrPort{ap("10.1.0.7:53")}}}},
					{Namespace: "ns", Name: "web", Ports: []ingress.Port{
						{Name: "https", Protocol: "TCP", IngressPort: 30002},
						{Name: "http", Protocol: "TCP", IngressPort: 30001, Backends: []netip.AddrPort{ap("10.1.0.6:80"), ap("10.1.0.5:80"), ap("10.1.0.6:80")}},
					}},
				},
			},
			want: Plan{
				Mesh:   mesh,
				Remote: []netip.Addr{ad("242.0.0.3"), ad("242.0.0.9")},
				Ports: []PortPlan{
					{Proto: protoTCP, Port: 30001, Label: "ns/web:http", Backends: []netip.AddrPort{ap("10.1.0.5:80"), ap("10.1.0.6:80")}},
					{Proto: protoTCP, Port: 30002, Label: "ns/web:https"},
					{Proto: protoUDP, Port: 30000, Label: "ns/dns:dns", Backends: []netip.AddrPort{ap("10.1.0.7:53")}},
				},
			},
		},
		{
			name: "the same port number on TCP and UDP is two ports",
			cfg: ingress.Config{MeshAddress: mesh, Services: []ingress.Service{{Namespace: "a", Name: "b", Ports: []ingress.Port{
				{Protocol: "UDP", IngressPort: 30000}, {Protocol: "TCP", IngressPort: 30000},
			}}}},
			want: Plan{Mesh: mesh, Ports: []PortPlan{{Proto: protoTCP, Port: 30000, Label: "a/b:"}, {Proto: protoUDP, Port: 30000, Label: "a/b:"}}},
		},
		{name: "an IPv6 mesh address is refused", cfg: ingress.Config{MeshAddress: ad("fd00::1")}, wantErr: "MeshAddress fd00::1: must be IPv4"},
		{name: "a loopback mesh address is refused", cfg: ingress.Config{MeshAddress: ad("127.0.0.1")}, wantErr: "MeshAddress 127.0.0.1"},
		{name: "an IPv6 remote mesh address is refused", cfg: ingress.Config{MeshAddress: mesh, RemoteMeshAddresses: []netip.Addr{ad("242.0.0.3"), ad("fd00::2")}}, wantErr: `RemoteMeshAddresses[1] "fd00::2"`},
		{name: "an invalid remote mesh address is refused", cfg: ingress.Config{MeshAddress: mesh, RemoteMeshAddresses: []netip.Addr{{}}}, wantErr: `RemoteMeshAddresses[0] "invalid IP"`},
		{name: "the own mesh address as a remote is refused", cfg: ingress.Config{MeshAddress: mesh, RemoteMeshAddresses: []netip.Addr{mesh}}, wantErr: "RemoteMeshAddresses[0] 242.0.0.2: is this gateway's own"},
		{
			name: "a duplicate ingress port is refused naming both",
			cfg: ingress.Config{MeshAddress: mesh, Services: []ingress.Service{
				{Namespace: "a", Name: "one", Ports: []ingress.Port{{Protocol: "TCP", IngressPort: 30001}}},
				{Namespace: "a", Name: "two", Ports: []ingress.Port{{Protocol: "TCP", IngressPort: 30001}}},
			}},
			wantErr: "Services[1](a/two).Ports[0].IngressPort 30001/TCP: already used by Services[0](a/one).Ports[0]",
		},
		{
			name:    "port 0 is refused",
			cfg:     ingress.Config{MeshAddress: mesh, Services: []ingress.Service{{Namespace: "a", Name: "b", Ports: []ingress.Port{{Protocol: "TCP"}}}}},
			wantErr: "Services[0](a/b).Ports[0].IngressPort 0",
		},
		{
			name:    "SCTP is refused",
			cfg:     ingress.Config{MeshAddress: mesh, Services: []ingress.Service{{Namespace: "a", Name: "b", Ports: []ingress.Port{{Protocol: "SCTP", IngressPort: 1}}}}},
			wantErr: `Services[0](a/b).Ports[0].Protocol "SCTP": must be TCP or UDP`,
		},
		{
			name:    "a lower-case protocol is refused",
			cfg:     ingress.Config{MeshAddress: mesh, Services: []ingress.Service{{Namespace: "a", Name: "b", Ports: []ingress.Port{{Protocol: "tcp", IngressPort: 1}}}}},
			wantErr: `Protocol "tcp"`,
		},
		{
			name: "an IPv6 backend is refused",
			cfg: ingress.Config{MeshAddress: mesh, Services: []ingress.Service{{Namespace: "a", Name: "b", Ports: []ingress.Port{
				{Protocol: "TCP", IngressPort: 1, Backends: []netip.AddrPort{ap("10.0.0.1:80"), ap("[fd00::5]:80")}},
			}}}},
			wantErr: `Services[0](a/b).Ports[0].Backends[1] "[fd00::5]:80"`,
		},
		{
			name: "a backend with port 0 is refused",
			cfg: ingress.Config{MeshAddress: mesh, Services: []ingress.Service{{Namespace: "a", Name: "b", Ports: []ingress.Port{
				{Protocol: "UDP", IngressPort: 1, Backends: []netip.AddrPort{ap("10.0.0.1:0")}},
			}}}},
			wantErr: "Backends[0] 10.0.0.1:0: port 0",
		},
		{
			name: "a bad config is refused even without a mesh address",
			cfg: ingress.Config{Services: []ingress.Service{{Namespace: "a", Name: "b", Ports: []ingress.Port{
				{Protocol: "TCP", IngressPort: 0},
			}}}},
			wantErr: "IngressPort 0",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := NewPlan(tt.cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("NewPlan error = %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("NewPlan: %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("NewPlan =\n%+v\nwant\n%+v", got, tt.want)
			}
		})
	}
}

func TestPlanCountsAndNames(t *testing.T) {
	p := Plan{Mesh: ad("242.0.0.1"), Ports: []PortPlan{
		{Proto: protoTCP, Port: 30001, Backends: []netip.AddrPort{ap("10.0.0.1:80"), ap("10.0.0.2:80")}},
		{Proto: protoUDP, Port: 30002},
	}}
	ports, without, backends := p.Counts()
	if ports != 2 || without != 1 || backends != 2 {
		t.Errorf("Counts = %d, %d, %d, want 2, 1, 2", ports, without, backends)
	}
	if got := p.Ports[0].BackendChain(1); got != "be-tcp-30001-1" {
		t.Errorf("BackendChain = %q", got)
	}
	if got := p.Ports[1].ProtoName(); got != "udp" {
		t.Errorf("ProtoName = %q", got)
	}
}

// FuzzNewPlan: a Config decoded from arbitrary JSON (the shape the agent builds it from outside
// input: exports and endpoints) never panics, and an accepted one plans only IPv4 and nonzero ports.
func FuzzNewPlan(f *testing.F) {
	f.Add(`{"MeshAddress":"242.0.0.1","RemoteMeshAddresses":["242.0.0.2"],"Services":[{"Namespace":"a","Name":"b","Ports":[{"Protocol":"TCP","IngressPort":30001,"Backends":["10.0.0.1:80"]}]}]}`)
	f.Add(`{"MeshAddress":"fd00::1"}`)
	f.Add(`{"MeshAddress":"242.0.0.1","Services":[{"Ports":[{"Protocol":"UDP","IngressPort":1},{"Protocol":"UDP","IngressPort":1}]}]}`)
	f.Fuzz(func(t *testing.T, s string) {
		var cfg ingress.Config
		if json.Unmarshal([]byte(s), &cfg) != nil {
			return
		}
		p, err := NewPlan(cfg)
		if err != nil {
			return
		}
		if p.Mesh.IsValid() && !p.Mesh.Is4() {
			t.Fatalf("accepted mesh %s", p.Mesh)
		}
		for _, pp := range p.Ports {
			if pp.Port == 0 {
				t.Fatal("accepted port 0")
			}
			for _, b := range pp.Backends {
				if !b.Addr().Is4() || b.Port() == 0 {
					t.Fatalf("accepted backend %s", b)
				}
			}
		}
	})
}

// A nil *Dataplane (New failed and the nil went into an interface) errors instead of panicking.
func TestNilDataplane(t *testing.T) {
	var d *Dataplane
	var dp ingress.Dataplane = d
	if err := dp.Apply(t.Context(), ingress.Config{}); err == nil {
		t.Error("Apply on a nil data plane succeeded")
	}
	if st := dp.Status(); st.LastError == "" || st.Programmed {
		t.Errorf("Status of a nil data plane = %+v", st)
	}
	if err := dp.Cleanup(t.Context()); err == nil {
		t.Error("Cleanup on a nil data plane succeeded")
	}
	if err := dp.Close(); err != nil {
		t.Errorf("Close on a nil data plane: %v", err)
	}
}
