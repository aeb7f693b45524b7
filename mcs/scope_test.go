package mcs

import (
	"net/netip"
	"strconv"
	"strings"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func eastCluster(gateway bool) *apiv1.Cluster {
	return &apiv1.Cluster{Name: "east", PodCidrs: []string{"10.1.0.0/16", "fd00:1::/64"}, ServiceCidrs: []string{"10.101.0.0/16"}, GatewayMode: gateway}
}

func TestEndpointScopeCheck(t *testing.T) {
	plain := ScopeOf(eastCluster(false), []string{"242.0.0.7"})
	gw := ScopeOf(eastCluster(true), []string{"242.0.0.7", "not-an-ip", "242.0.0.7"})
	tests := []struct {
		name    string
		scope   EndpointScope
		ip      string
		wantErr string // empty: accepted
	}{
		{name: "a pod IP", scope: plain, ip: "10.1.2.3"},
		{name: "a service IP", scope: plain, ip: "10.101.0.10"},
		{name: "an IPv6 pod IP", scope: plain, ip: "fd00:1::5"},
		{name: "an IPv4-mapped pod IP", scope: plain, ip: "::ffff:10.1.2.3"},
		{name: "loopback", scope: plain, ip: "127.0.0.1",
			wantErr: "export.endpoints[0].ip 127.0.0.1 is not in cluster east's pod CIDRs [10.1.0.0/16 fd00:1::/64] or service CIDRs [10.101.0.0/16]"},
		{name: "IPv6 loopback", scope: plain, ip: "::1", wantErr: "::1 is not in cluster east's"},
		{name: "IPv4-mapped loopback", scope: plain, ip: "::ffff:127.0.0.1", wantErr: "::ffff:127.0.0.1 is not in"},
		{name: "the metadata service", scope: plain, ip: "169.254.169.254", wantErr: "169.254.169.254 is not in"},
		{name: "another cluster's pod", scope: plain, ip: "10.2.0.5", wantErr: "10.2.0.5 is not in"},
		{name: "a clusterset VIP", scope: plain, ip: "242.1.0.1", wantErr: "242.1.0.1 is not in"},
		{name: "a mesh address outside gateway mode", scope: plain, ip: "242.0.0.7", wantErr: "242.0.0.7 is not in cluster east's pod CIDRs [10.1.0.0/16 fd00:1::/64] or service CIDRs [10.101.0.0/16]"},
		{name: "its gateway's mesh address in gateway mode", scope: gw, ip: "242.0.0.7"},
		{name: "another mesh address in gateway mode", scope: gw, ip: "242.0.0.8",
			wantErr: "242.0.0.8 is not in cluster east's pod CIDRs [10.1.0.0/16 fd00:1::/64] or service CIDRs [10.101.0.0/16], nor a mesh address of its gateways [242.0.0.7]"},
		{name: "not an address", scope: plain, ip: "web-1", wantErr: `export.endpoints[0].ip "web-1" is not an IP address`},
		{name: "empty", scope: plain, ip: "", wantErr: `"" is not an IP address`},
		{name: "a zone", scope: plain, ip: "fd00:1::5%eth0", wantErr: "fd00:1::5%eth0 is not in"},
		{name: "unspecified", scope: ScopeOf(&apiv1.Cluster{Name: "x", PodCidrs: []string{"0.0.0.0/0"}}, nil), ip: "0.0.0.0", wantErr: "0.0.0.0 is not in"},
		{name: "loopback inside a CIDR that holds it", scope: ScopeOf(&apiv1.Cluster{Name: "x", PodCidrs: []string{"0.0.0.0/0"}}, nil), ip: "127.0.0.1", wantErr: "127.0.0.1 is not in"},
		{name: "no CIDRs at all", scope: ScopeOf(&apiv1.Cluster{Name: "x"}, nil), ip: "10.1.2.3", wantErr: "10.1.2.3 is not in cluster x's pod CIDRs [] or service CIDRs []"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.scope.Check("export.endpoints[0].ip", tt.ip)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Check(%q) = %v, want accepted", tt.ip, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("Check(%q) = %v, want an error containing %q", tt.ip, err, tt.wantErr)
			}
		})
	}
}

func TestEndpointScopeCheckEndpointsNamesTheFirstOutside(t *testing.T) {
	s := ScopeOf(eastCluster(false), nil)
	e := &apiv1.ServiceExport{Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.1"}, {Ip: "127.0.0.1"}, {Ip: "169.254.169.254"}}}
	err := s.CheckEndpoints("exports[3]", e)
	if err == nil || !strings.HasPrefix(err.Error(), "exports[3].endpoints[1].ip 127.0.0.1 is not in cluster east's") {
		t.Fatalf("CheckEndpoints = %v, want exports[3].endpoints[1].ip 127.0.0.1 named", err)
	}
	if err := s.CheckEndpoints("exports[0]", &apiv1.ServiceExport{Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.1"}}}); err != nil {
		t.Fatalf("CheckEndpoints of a pod IP = %v", err)
	}
}

func TestEndpointScopeInScope(t *testing.T) {
	s := ScopeOf(eastCluster(false), nil)
	in := &apiv1.ServiceExport{Cluster: "east", Name: "api", Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.1", Ready: true}, {Ip: "127.0.0.1", Ready: true}, {Ip: "10.101.0.9"}}}
	got, dropped := s.InScope(in)
	if len(got.GetEndpoints()) != 2 || got.Endpoints[0].Ip != "10.1.0.1" || got.Endpoints[1].Ip != "10.101.0.9" {
		t.Fatalf("kept %v, want 10.1.0.1 and 10.101.0.9", got.GetEndpoints())
	}
	if len(dropped) != 1 || !strings.Contains(dropped[0], "endpoints[1].ip 127.0.0.1 is not in") {
		t.Fatalf("dropped %q, want endpoints[1] 127.0.0.1", dropped)
	}
	if len(in.Endpoints) != 3 {
		t.Fatalf("InScope modified its input: %v", in.Endpoints)
	}
	clean := &apiv1.ServiceExport{Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.1"}}}
	if got, dropped := s.InScope(clean); got != clean || dropped != nil {
		t.Fatalf("an export in scope was copied or reported: %v %v", got, dropped)
	}
}

// FuzzEndpointScope feeds the scope arbitrary CIDRs, mesh addresses and endpoint text. It must not
// panic; an accepted endpoint parses, is no loopback, link-local, unspecified or multicast
// address, and lies in one of the CIDRs or (gateway mode) is one of the mesh addresses; a refusal
// names the field and the value.
func FuzzEndpointScope(f *testing.F) {
	f.Add("10.1.0.0/16", "10.101.0.0/16", "242.0.0.7", false, "10.1.2.3")
	f.Add("10.1.0.0/16", "", "242.0.0.7", true, "242.0.0.7")
	f.Add("0.0.0.0/0", "::/0", "", false, "::ffff:127.0.0.1")
	f.Add("fd00::/8", "", "", false, "fe80::1%eth0")
	f.Add("10.1.0.0/16 ", "x", "::1", true, "169.254.169.254")
	f.Fuzz(func(t *testing.T, pod, svc, mesh string, gateway bool, ip string) {
		c := &apiv1.Cluster{Name: "c", PodCidrs: []string{pod}, ServiceCidrs: []string{svc}, GatewayMode: gateway}
		s := ScopeOf(c, []string{mesh})
		err := s.Check("f", ip)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "f ") || !(strings.Contains(err.Error(), ip) || strings.Contains(err.Error(), strconv.Quote(ip))) {
				t.Fatalf("refusal %q does not name the field and the value %q", err, ip)
			}
			return
		}
		a, perr := netip.ParseAddr(ip)
		if perr != nil {
			t.Fatalf("accepted %q, which does not parse: %v", ip, perr)
		}
		a = a.Unmap()
		if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsUnspecified() || a.IsMulticast() || a.Zone() != "" {
			t.Fatalf("accepted %q", ip)
		}
		inside := false
		for _, p := range append(slicesOf(s.Pods), s.Services...) {
			inside = inside || p.Contains(a)
		}
		if !inside && !(gateway && len(s.Mesh) == 1 && s.Mesh[0] == a) {
			t.Fatalf("accepted %q outside pods %v services %v mesh %v", ip, s.Pods, s.Services, s.Mesh)
		}
	})
}

func slicesOf(ps []netip.Prefix) []netip.Prefix { return append([]netip.Prefix(nil), ps...) }
