package nftables

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/ingress"
)

func TestRuleset(t *testing.T) {
	mesh := ad("242.0.0.2")
	tests := []struct {
		name string
		cfg  ingress.Config
		want []string // Ruleset.Lines(); nil = no table
	}{
		{name: "no mesh address: no table", cfg: ingress.Config{RemoteMeshAddresses: []netip.Addr{ad("242.0.0.1")}}},
		{
			name: "envoy mode (no services): only the SNAT, and the jumps to an empty services chain",
			cfg:  ingress.Config{MeshAddress: mesh, RemoteMeshAddresses: []netip.Addr{ad("242.0.0.1")}},
			want: []string{
				"prerouting: ip daddr 242.0.0.2 jump services",
				"output: ip daddr 242.0.0.2 jump services",
				"postrouting: ip daddr @remote_mesh snat to 242.0.0.2",
			},
		},
		{
			name: "one backend is a plain dnat, several a numgen verdict map, none a reject",
			cfg: ingress.Config{MeshAddress: mesh, RemoteMeshAddresses: []netip.Addr{ad("242.0.0.1")}, Services: []ingress.Service{
				{Namespace: "ns", Name: "web", Ports: []ingress.Port{
					{Name: "http", Protocol: "TCP", IngressPort: 30001, Backends: []netip.AddrPort{ap("10.1.0.6:80"), ap("10.1.0.5:80")}},
					{Name: "dns", Protocol: "UDP", IngressPort: 30002, Backends: []netip.AddrPort{ap("10.1.0.5:53")}},
					{Name: "gone", Protocol: "TCP", IngressPort: 30003},
					{Name: "goneu", Protocol: "UDP", IngressPort: 30004},
				}},
			}},
			want: []string{
				"services: tcp dport 30001 numgen random mod 2 vmap @lb-tcp-30001",
				"services: udp dport 30002 dnat to 10.1.0.5:53",
				"prerouting: ip daddr 242.0.0.2 jump services",
				"output: ip daddr 242.0.0.2 jump services",
				"input: ip daddr 242.0.0.2 tcp dport 30003 reject with tcp reset",
				"input: ip daddr 242.0.0.2 udp dport 30004 reject with icmp port-unreachable",
				"postrouting: ip daddr @remote_mesh snat to 242.0.0.2",
				"be-tcp-30001-0: dnat to 10.1.0.5:80",
				"be-tcp-30001-1: dnat to 10.1.0.6:80",
				"map lb-tcp-30001: 0: goto be-tcp-30001-0, 1: goto be-tcp-30001-1",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := NewPlan(tt.cfg)
			if err != nil {
				t.Fatal(err)
			}
			rs := p.Ruleset()
			if rs.Present != (tt.want != nil) {
				t.Fatalf("Present = %v, want %v", rs.Present, tt.want != nil)
			}
			if got := rs.Lines(); !slices.Equal(got, tt.want) {
				t.Errorf("Lines =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(tt.want, "\n"))
			}
			// Nothing is ever masqueraded or SNATed but traffic to the remote mesh set: the
			// backend must see the calling gateway's address.
			for _, c := range rs.Chains {
				for _, r := range c.Rules {
					if r.SNAT.IsValid() && (!r.DaddrInRemote || c.Hook != HookPostrouting) {
						t.Errorf("SNAT outside postrouting to @remote_mesh: %s: %s", c.Name, r)
					}
				}
			}
		})
	}
}
