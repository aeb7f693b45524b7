package dns

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

func TestBuildZoneSkipsBadInput(t *testing.T) {
	ip := netip.MustParseAddr
	good := Service{Namespace: "shop", Name: "cart", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.1")}}
	tests := []struct {
		name    string
		svc     Service
		errHas  []string // substrings of the error
		exists  []string // names that must exist afterwards
		missing []string // names that must not
	}{
		{"a namespace that is not a DNS label skips the service",
			Service{Namespace: "Shop_1", Name: "x", Type: ClusterSetIP}, []string{`"Shop_1/x"`, `namespace "Shop_1"`}, nil, []string{"x.shop_1.svc.clusterset.local."}},
		{"a name with a dot skips the service",
			Service{Namespace: "shop", Name: "a.b", Type: ClusterSetIP}, []string{`name "a.b"`}, nil, []string{"a.b.shop.svc.clusterset.local."}},
		{"an empty name skips the service",
			Service{Namespace: "shop", Type: ClusterSetIP}, []string{`name ""`}, nil, nil},
		{"a name longer than 63 skips the service",
			Service{Namespace: "shop", Name: strings.Repeat("a", 64), Type: ClusterSetIP}, []string{"name"}, nil, nil},
		{"a name ending with a dash skips the service",
			Service{Namespace: "shop", Name: "web-", Type: ClusterSetIP}, []string{`name "web-"`}, nil, nil},
		{"an unknown type skips the service",
			Service{Namespace: "shop", Name: "odd", Type: Type(7)}, []string{`type "Type(7)"`}, nil, []string{"odd.shop.svc.clusterset.local."}},
		{"a duplicate service is skipped and the first one answered",
			Service{Namespace: "SHOP", Name: "Cart", Type: Headless}, []string{`"SHOP/Cart"`, "duplicate"}, []string{"cart.shop.svc.clusterset.local."}, nil},
		{"upper case is folded to lower case",
			Service{Namespace: "Web", Name: "Front", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.9")}}, nil, []string{"front.web.svc.clusterset.local."}, nil},
		{"a bad port name skips the port only",
			Service{Namespace: "shop", Name: "p", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.2")},
				Ports: []Port{{Name: "ht_tp", Port: 80}, {Name: "ok", Port: 81}}},
			[]string{`ports[0].name "ht_tp"`}, []string{"p.shop.svc.clusterset.local.", "_ok._tcp.p.shop.svc.clusterset.local."}, []string{"_ht_tp._tcp.p.shop.svc.clusterset.local."}},
		{"an unknown protocol skips the port",
			Service{Namespace: "shop", Name: "q", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.3")}, Ports: []Port{{Name: "x", Port: 80, Protocol: "QUIC"}}},
			[]string{`ports[0].protocol "QUIC"`}, []string{"q.shop.svc.clusterset.local."}, []string{"_x._quic.q.shop.svc.clusterset.local."}},
		{"port 0 skips the port",
			Service{Namespace: "shop", Name: "r", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.4")}, Ports: []Port{{Name: "x"}}},
			[]string{`ports[0].port "0"`}, nil, []string{"_x._tcp.r.shop.svc.clusterset.local."}},
		{"an invalid VIP is skipped, the service kept",
			Service{Namespace: "shop", Name: "s", Type: ClusterSetIP, VIPs: []netip.Addr{{}, ip("0.0.0.0"), ip("fe80::1%eth0")}},
			[]string{`vips[0] "invalid IP"`, `vips[1] "0.0.0.0"`, `vips[2] "fe80::1%eth0"`}, []string{"s.shop.svc.clusterset.local."}, nil},
		{"an endpoint with a bad cluster id is skipped",
			Service{Namespace: "shop", Name: "h", Type: Headless, Endpoints: []Endpoint{{Cluster: "east.1", IP: ip("10.0.0.1"), Ready: true}, {Cluster: "west", IP: ip("10.0.0.2"), Ready: true}}},
			[]string{`endpoints[0].cluster "east.1"`}, []string{"10-0-0-2.west.h.shop.svc.clusterset.local."}, []string{"10-0-0-1.east.1.h.shop.svc.clusterset.local."}},
		{"an endpoint with a bad hostname is skipped",
			Service{Namespace: "shop", Name: "h2", Type: Headless, Endpoints: []Endpoint{{Cluster: "east", Hostname: "-db", IP: ip("10.0.0.1"), Ready: true}}},
			[]string{`endpoints[0].hostname "-db"`}, nil, []string{"h2.shop.svc.clusterset.local."}},
		{"an endpoint whose name would exceed 255 octets is skipped",
			Service{Namespace: strings.Repeat("n", 63), Name: strings.Repeat("s", 63), Type: Headless,
				Endpoints: []Endpoint{{Cluster: strings.Repeat("c", 63), Hostname: strings.Repeat("h", 63), IP: ip("10.0.0.1"), Ready: true}}},
			[]string{"longer than 255 octets"}, nil, nil},
		{"an IPv4-mapped IPv6 endpoint is answered as IPv4",
			Service{Namespace: "shop", Name: "m", Type: Headless, Endpoints: []Endpoint{{Cluster: "east", IP: ip("::ffff:10.0.0.7"), Ready: true}}},
			nil, []string{"10-0-0-7.east.m.shop.svc.clusterset.local."}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			z, err := BuildZone([]Service{good, tt.svc}, ZoneOptions{})
			if z == nil {
				t.Fatal("nil zone")
			}
			if len(tt.errHas) == 0 && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if len(tt.errHas) > 0 {
				if !errors.Is(err, ErrInvalidInput) {
					t.Fatalf("error %v does not wrap ErrInvalidInput", err)
				}
				for _, s := range tt.errHas {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("error %q does not name %s", err, s)
					}
				}
			}
			if !z.Exists("cart.shop.svc.clusterset.local.") {
				t.Error("the good service was lost")
			}
			for _, n := range tt.exists {
				if !z.Exists(n) {
					t.Errorf("%s does not exist", n)
				}
			}
			for _, n := range tt.missing {
				if z.Exists(n) {
					t.Errorf("%s exists", n)
				}
			}
			checkZone(t, z)
		})
	}
}

func TestBuildZoneOptions(t *testing.T) {
	z, err := BuildZone(fixture(), ZoneOptions{TTL: 30 * time.Second, Serial: 7})
	if err != nil {
		t.Fatal(err)
	}
	if z.Serial() != 7 {
		t.Errorf("serial %d, want 7", z.Serial())
	}
	for _, rr := range z.RRs() {
		want := uint32(30)
		if rr.Header().Rrtype == mdns.TypeTXT {
			want = versionTTL
		}
		if rr.Header().Ttl != want {
			t.Errorf("%s: TTL %d, want %d", rr, rr.Header().Ttl, want)
		}
	}
	if soa := z.soa[0].(*mdns.SOA); soa.Minttl != 30 {
		t.Errorf("SOA minimum %d, want the TTL 30", soa.Minttl)
	}
	if z.Services() != len(fixture()) {
		t.Errorf("%d services, want %d", z.Services(), len(fixture()))
	}
	// Without NS addresses the name server's name exists without address records.
	if !z.Exists(nsName) || len(z.nodes[nsName].a) != 0 {
		t.Error("ns.dns.clusterset.local should exist, without addresses")
	}
}

func TestHeadlessEndpointsWithOneHostnameShareItsName(t *testing.T) {
	ip := netip.MustParseAddr
	z, err := BuildZone([]Service{{Namespace: "ns", Name: "h", Type: Headless, Ports: []Port{{Name: "p", Port: 1}},
		Endpoints: []Endpoint{
			{Cluster: "a", Hostname: "x", IP: ip("10.0.0.1"), Ready: true},
			{Cluster: "a", Hostname: "x", IP: ip("10.0.0.2"), Ready: true},
			{Cluster: "a", Hostname: "x", IP: ip("10.0.0.2"), Ready: true}, // duplicate
		}}}, ZoneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	name := "x.a.h.ns.svc.clusterset.local."
	if got := len(z.nodes[name].a); got != 2 {
		t.Errorf("%s has %d A records, want 2", name, got)
	}
	srv := z.nodes["_p._tcp.h.ns.svc.clusterset.local."].srv
	if len(srv) != 1 || srv[0].(*mdns.SRV).Weight != 100 {
		t.Errorf("SRV %v, want one record of weight 100 for the shared name", srv)
	}
	checkZone(t, z)
}

// checkZone verifies the invariants the answers rely on: every name is a valid, lower-case
// name in the zone whose ancestors all exist (no NXDOMAIN above an existing name, RFC 8020);
// every record is owned by its node's name and packs; every SRV target exists with an
// address, which the additional section carries.
func checkZone(t testing.TB, z *Zone) {
	t.Helper()
	buf := make([]byte, mdns.MaxMsgSize)
	for name, n := range z.nodes {
		if !inZone(name) {
			t.Fatalf("name %q outside the zone", name)
		}
		if name != asciiLower(name) {
			t.Fatalf("name %q not lower case", name)
		}
		if _, ok := mdns.IsDomainName(name); !ok {
			t.Fatalf("name %q is not a domain name", name)
		}
		for p := name; p != Origin; {
			p = p[strings.IndexByte(p, '.')+1:]
			if _, ok := z.nodes[p]; !ok {
				t.Fatalf("%q exists but its ancestor %q does not", name, p)
			}
		}
		for _, set := range [][]mdns.RR{n.a, n.aaaa, n.txt, n.soa, n.srv, n.ns} {
			if len(set) != cap(set) {
				t.Fatalf("%s: record slice not clipped (len %d cap %d)", name, len(set), cap(set))
			}
			for _, rr := range set {
				if rr.Header().Name != name {
					t.Fatalf("%s owns a record of %s", name, rr.Header().Name)
				}
				if _, err := mdns.PackRR(rr, buf, 0, nil, false); err != nil {
					t.Fatalf("%s does not pack: %v", rr, err)
				}
			}
		}
		for _, rr := range n.srv {
			target := rr.(*mdns.SRV).Target
			tn, ok := z.nodes[target]
			if !ok || len(tn.a)+len(tn.aaaa) == 0 {
				t.Fatalf("SRV %s: target has no address", rr)
			}
			for _, a := range append(append([]mdns.RR{}, tn.a...), tn.aaaa...) {
				found := false
				for _, e := range n.srvExtra {
					found = found || e.String() == a.String()
				}
				if !found {
					t.Fatalf("SRV %s: additional lacks %s", rr, a)
				}
			}
		}
	}
}
