package dns

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	mdns "github.com/miekg/dns"
)

// fixture is the zone every table test answers from.
func fixture() []Service {
	ip := netip.MustParseAddr
	return []Service{
		{Namespace: "shop", Name: "cart", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.1")},
			Ports: []Port{{Name: "http", Port: 80, Protocol: "TCP"}, {Name: "grpc", Port: 9090}, {Port: 8080, Protocol: "TCP"}}},
		{Namespace: "shop", Name: "dual", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.2"), ip("fd00::2")},
			Ports: []Port{{Name: "http", Port: 80}}},
		{Namespace: "shop", Name: "v6only", Type: ClusterSetIP, VIPs: []netip.Addr{ip("fd00::3")}},
		{Namespace: "shop", Name: "pending", Type: ClusterSetIP, Ports: []Port{{Name: "http", Port: 80}}},
		{Namespace: "shop", Name: "db", Type: Headless, Ports: []Port{{Name: "pg", Port: 5432}},
			Endpoints: []Endpoint{
				{Cluster: "east", Hostname: "db-0", IP: ip("10.1.0.10"), Ready: true},
				{Cluster: "east", Hostname: "db-1", IP: ip("10.1.0.11"), Ready: true},
				{Cluster: "west", IP: ip("10.2.0.10"), Ready: true},
				{Cluster: "west", IP: ip("fd00:2::10"), Ready: true},
				{Cluster: "west", Hostname: "db-2", IP: ip("10.2.0.11"), Ready: false},
			}},
		{Namespace: "shop", Name: "gone", Type: Headless, Ports: []Port{{Name: "pg", Port: 5432}},
			Endpoints: []Endpoint{{Cluster: "east", Hostname: "gone-0", IP: ip("10.1.0.20"), Ready: false}}},
		{Namespace: "shop", Name: "noports", Type: Headless,
			Endpoints: []Endpoint{{Cluster: "east", IP: ip("10.1.0.40"), Ready: true}}},
		{Namespace: "lonely", Name: "idle", Type: Headless,
			Endpoints: []Endpoint{{Cluster: "east", IP: ip("10.1.0.30"), Ready: false}}},
		{Namespace: "kube-system", Name: "kube-dns", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.53")},
			Ports: []Port{{Name: "dns", Port: 53, Protocol: "UDP"}, {Name: "dns", Port: 53, Protocol: "TCP"}}},
	}
}

func fixtureZone(t testing.TB) *Zone {
	t.Helper()
	z, err := BuildZone(fixture(), ZoneOptions{Serial: 42, NSAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
	if err != nil {
		t.Fatalf("fixture zone: %v", err)
	}
	return z
}

const soaRR = "clusterset.local. 5 IN SOA ns.dns.clusterset.local. hostmaster.clusterset.local. 42 7200 1800 86400 5"

// result is what a test expects of a response: the rcode, the answer and additional
// sections (RRs in presentation format, any order) and whether the SOA is in the authority
// section.
type result struct {
	rcode  int
	answer []string
	extra  []string
	soa    bool
}

func nxdomain() result        { return result{rcode: mdns.RcodeNameError, soa: true} }
func nodata() result          { return result{rcode: mdns.RcodeSuccess, soa: true} }
func refused() result         { return result{rcode: mdns.RcodeRefused} }
func ok(rrs ...string) result { return result{rcode: mdns.RcodeSuccess, answer: rrs} }

func (r result) with(extra ...string) result { r.extra = extra; return r }

func query(name string, qtype uint16) *mdns.Msg {
	m := new(mdns.Msg)
	m.SetQuestion(name, qtype)
	return m
}

// canon parses and re-prints RRs so that expectations can be written loosely.
func canon(t *testing.T, rrs []string) []string {
	t.Helper()
	out := make([]string, 0, len(rrs))
	for _, s := range rrs {
		rr, err := mdns.NewRR(s)
		if err != nil {
			t.Fatalf("bad expected RR %q: %v", s, err)
		}
		out = append(out, rr.String())
	}
	slices.Sort(out)
	return out
}

func printed(rrs []mdns.RR) []string {
	out := make([]string, 0, len(rrs))
	for _, rr := range rrs {
		if rr.Header().Rrtype == mdns.TypeOPT {
			continue
		}
		out = append(out, rr.String())
	}
	slices.Sort(out)
	return out
}

func check(t *testing.T, req, resp *mdns.Msg, want result) {
	t.Helper()
	if resp == nil {
		t.Fatal("no response")
	}
	if resp.Rcode != want.rcode {
		t.Errorf("rcode %s, want %s", mdns.RcodeToString[resp.Rcode], mdns.RcodeToString[want.rcode])
	}
	if resp.Id != req.Id || !resp.Response {
		t.Errorf("response id %d response %v, want id %d and QR set", resp.Id, resp.Response, req.Id)
	}
	if got, w := printed(resp.Answer), canon(t, want.answer); !slices.Equal(got, w) {
		t.Errorf("answer:\n got  %s\n want %s", strings.Join(got, "\n      "), strings.Join(w, "\n      "))
	}
	if got, w := printed(resp.Extra), canon(t, want.extra); !slices.Equal(got, w) {
		t.Errorf("additional:\n got  %s\n want %s", strings.Join(got, "\n      "), strings.Join(w, "\n      "))
	}
	hasSOA := len(resp.Ns) == 1 && resp.Ns[0].Header().Rrtype == mdns.TypeSOA
	if hasSOA != want.soa || (!want.soa && len(resp.Ns) > 0) {
		t.Errorf("authority %v, want the SOA: %v", resp.Ns, want.soa)
	}
	if hasSOA && !strings.EqualFold(resp.Ns[0].String(), canon(t, []string{soaRR})[0]) {
		t.Errorf("authority SOA %s, want %s", resp.Ns[0], soaRR)
	}
	if want.rcode == mdns.RcodeSuccess || want.rcode == mdns.RcodeNameError {
		if !resp.Authoritative {
			t.Error("AA not set on an authoritative answer")
		}
	}
	// Every response must pack.
	if _, err := resp.Pack(); err != nil {
		t.Errorf("response does not pack: %v", err)
	}
}

const (
	cart = "cart.shop.svc.clusterset.local."
	db   = "db.shop.svc.clusterset.local."
)

// TestAnswer is the NXDOMAIN / NODATA table of the zone, from KEP-1645's DNS specification
// and CoreDNS's multicluster plugin; doc.go repeats it.
func TestAnswer(t *testing.T) {
	z := fixtureZone(t)
	tests := []struct {
		name  string
		qname string
		qtype uint16
		want  result
	}{
		// The zone's own records.
		{"dns-version answers its TXT record with the schema version", "dns-version.clusterset.local.", mdns.TypeTXT,
			ok(`dns-version.clusterset.local. 28800 IN TXT "1.0.0"`)},
		{"dns-version has no A record, so an A query is NODATA", "dns-version.clusterset.local.", mdns.TypeA, nodata()},
		{"the apex answers SOA", "clusterset.local.", mdns.TypeSOA, ok(soaRR)},
		{"the apex answers NS with ns.dns.clusterset.local and its address", "clusterset.local.", mdns.TypeNS,
			ok("clusterset.local. 5 IN NS ns.dns.clusterset.local.").with("ns.dns.clusterset.local. 5 IN A 127.0.0.1")},
		{"the apex has no A record, so an A query is NODATA", "clusterset.local.", mdns.TypeA, nodata()},
		{"the name server's own name answers its address", "ns.dns.clusterset.local.", mdns.TypeA,
			ok("ns.dns.clusterset.local. 5 IN A 127.0.0.1")},
		{"dns.clusterset.local is an empty non-terminal, so NODATA", "dns.clusterset.local.", mdns.TypeA, nodata()},
		{"svc.clusterset.local is an empty non-terminal, so NODATA", "svc.clusterset.local.", mdns.TypeA, nodata()},
		{"an SOA query below the apex is NODATA", cart, mdns.TypeSOA, nodata()},
		{"pod.clusterset.local does not exist in the multicluster schema, so NXDOMAIN", "pod.clusterset.local.", mdns.TypeA, nxdomain()},
		{"any other name under the apex is NXDOMAIN", "nope.clusterset.local.", mdns.TypeA, nxdomain()},

		// Namespaces.
		{"a namespace with imported services is an empty non-terminal, so NODATA", "shop.svc.clusterset.local.", mdns.TypeA, nodata()},
		{"a namespace whose only service has no ready endpoint still exists, so NODATA", "lonely.svc.clusterset.local.", mdns.TypeA, nodata()},
		{"a namespace with no imported service is NXDOMAIN", "nope.svc.clusterset.local.", mdns.TypeA, nxdomain()},
		{"an unknown service in a known namespace is NXDOMAIN", "nope.shop.svc.clusterset.local.", mdns.TypeA, nxdomain()},
		{"an unknown service in an unknown namespace is NXDOMAIN", "cart.nope.svc.clusterset.local.", mdns.TypeA, nxdomain()},

		// ClusterSetIP services.
		{"a ClusterSetIP service answers A with its VIP", cart, mdns.TypeA, ok(cart + " 5 IN A 241.0.0.1")},
		{"an AAAA query for an IPv4-only service is NODATA", cart, mdns.TypeAAAA, nodata()},
		{"a TXT query for a service is NODATA", cart, mdns.TypeTXT, nodata()},
		{"an MX query for a service is NODATA", cart, mdns.TypeMX, nodata()},
		{"an ANY query for a service is NODATA, as CoreDNS answers it", cart, mdns.TypeANY, nodata()},
		{"a dual-stack service answers A with its IPv4 VIP", "dual.shop.svc.clusterset.local.", mdns.TypeA,
			ok("dual.shop.svc.clusterset.local. 5 IN A 241.0.0.2")},
		{"a dual-stack service answers AAAA with its IPv6 VIP", "dual.shop.svc.clusterset.local.", mdns.TypeAAAA,
			ok("dual.shop.svc.clusterset.local. 5 IN AAAA fd00::2")},
		{"an IPv6-only service answers AAAA", "v6only.shop.svc.clusterset.local.", mdns.TypeAAAA,
			ok("v6only.shop.svc.clusterset.local. 5 IN AAAA fd00::3")},
		{"an A query for an IPv6-only service is NODATA", "v6only.shop.svc.clusterset.local.", mdns.TypeA, nodata()},
		{"a named port answers SRV with the service as target and its VIP in additional", "_http._tcp." + cart, mdns.TypeSRV,
			ok("_http._tcp." + cart + " 5 IN SRV 0 100 80 " + cart).with(cart + " 5 IN A 241.0.0.1")},
		{"a named port without a protocol is TCP", "_grpc._tcp." + cart, mdns.TypeSRV,
			ok("_grpc._tcp." + cart + " 5 IN SRV 0 100 9090 " + cart).with(cart + " 5 IN A 241.0.0.1")},
		{"an SRV query for the service name lists every port, unnamed ones too", cart, mdns.TypeSRV,
			ok(cart+" 5 IN SRV 0 33 80 "+cart, cart+" 5 IN SRV 0 33 9090 "+cart, cart+" 5 IN SRV 0 33 8080 "+cart).
				with(cart + " 5 IN A 241.0.0.1")},
		{"a dual-stack service's SRV has both VIPs in additional", "_http._tcp.dual.shop.svc.clusterset.local.", mdns.TypeSRV,
			ok("_http._tcp.dual.shop.svc.clusterset.local. 5 IN SRV 0 100 80 dual.shop.svc.clusterset.local.").
				with("dual.shop.svc.clusterset.local. 5 IN A 241.0.0.2", "dual.shop.svc.clusterset.local. 5 IN AAAA fd00::2")},
		{"one port number over UDP and TCP is one SRV record for the service name", "kube-dns.kube-system.svc.clusterset.local.", mdns.TypeSRV,
			ok("kube-dns.kube-system.svc.clusterset.local. 5 IN SRV 0 100 53 kube-dns.kube-system.svc.clusterset.local.").
				with("kube-dns.kube-system.svc.clusterset.local. 5 IN A 241.0.0.53")},
		{"the same port name over UDP has its own SRV name", "_dns._udp.kube-dns.kube-system.svc.clusterset.local.", mdns.TypeSRV,
			ok("_dns._udp.kube-dns.kube-system.svc.clusterset.local. 5 IN SRV 0 100 53 kube-dns.kube-system.svc.clusterset.local.").
				with("kube-dns.kube-system.svc.clusterset.local. 5 IN A 241.0.0.53")},
		{"a named port under another protocol is NXDOMAIN", "_http._udp." + cart, mdns.TypeSRV, nxdomain()},
		{"an unknown port name is NXDOMAIN", "_nope._tcp." + cart, mdns.TypeSRV, nxdomain()},
		{"an unnamed port has no SRV name, so its number is NXDOMAIN", "_8080._tcp." + cart, mdns.TypeSRV, nxdomain()},
		{"the protocol label above an SRV name is an empty non-terminal, so NODATA", "_tcp." + cart, mdns.TypeSRV, nodata()},
		{"an A query for an SRV name is NODATA", "_http._tcp." + cart, mdns.TypeA, nodata()},
		{"a cluster id under a ClusterSetIP service is NXDOMAIN (spec 2.3.4)", "east." + cart, mdns.TypeA, nxdomain()},
		{"an endpoint name under a ClusterSetIP service is NXDOMAIN", "db-0.east." + cart, mdns.TypeA, nxdomain()},
		{"a service without a VIP yet exists but answers no A (NODATA)", "pending.shop.svc.clusterset.local.", mdns.TypeA, nodata()},
		{"a service without a VIP yet answers no SRV (NODATA)", "pending.shop.svc.clusterset.local.", mdns.TypeSRV, nodata()},
		{"a named port of a service without a VIP yet is NODATA", "_http._tcp.pending.shop.svc.clusterset.local.", mdns.TypeSRV, nodata()},

		// Headless services.
		{"a headless service answers A with every ready IPv4 endpoint", db, mdns.TypeA,
			ok(db+" 5 IN A 10.1.0.10", db+" 5 IN A 10.1.0.11", db+" 5 IN A 10.2.0.10")},
		{"a headless service answers AAAA with every ready IPv6 endpoint", db, mdns.TypeAAAA, ok(db + " 5 IN AAAA fd00:2::10")},
		{"an endpoint's hostname and cluster id name its A record", "db-0.east." + db, mdns.TypeA,
			ok("db-0.east." + db + " 5 IN A 10.1.0.10")},
		{"an endpoint without hostname is named after its IPv4 address with dashes", "10-2-0-10.west." + db, mdns.TypeA,
			ok("10-2-0-10.west." + db + " 5 IN A 10.2.0.10")},
		{"an endpoint without hostname is named after its IPv6 address with dashes", "fd00-2--10.west." + db, mdns.TypeAAAA,
			ok("fd00-2--10.west." + db + " 5 IN AAAA fd00:2::10")},
		{"an AAAA query for an IPv4 endpoint is NODATA", "db-0.east." + db, mdns.TypeAAAA, nodata()},
		{"an endpoint under another cluster id is NXDOMAIN", "db-0.west." + db, mdns.TypeA, nxdomain()},
		{"an endpoint that is not ready has no name (NXDOMAIN)", "db-2.west." + db, mdns.TypeA, nxdomain()},
		{"a cluster id with ready endpoints is an empty non-terminal, so NODATA (RFC 8020)", "east." + db, mdns.TypeA, nodata()},
		{"a cluster id without ready endpoints is NXDOMAIN", "north." + db, mdns.TypeA, nxdomain()},
		{"a named port of a headless service answers one SRV per ready endpoint, addresses in additional", "_pg._tcp." + db, mdns.TypeSRV,
			ok("_pg._tcp."+db+" 5 IN SRV 0 25 5432 db-0.east."+db,
				"_pg._tcp."+db+" 5 IN SRV 0 25 5432 db-1.east."+db,
				"_pg._tcp."+db+" 5 IN SRV 0 25 5432 10-2-0-10.west."+db,
				"_pg._tcp."+db+" 5 IN SRV 0 25 5432 fd00-2--10.west."+db).
				with("db-0.east."+db+" 5 IN A 10.1.0.10", "db-1.east."+db+" 5 IN A 10.1.0.11",
					"10-2-0-10.west."+db+" 5 IN A 10.2.0.10", "fd00-2--10.west."+db+" 5 IN AAAA fd00:2::10")},
		{"an SRV query for a headless service name lists every ready endpoint and port", db, mdns.TypeSRV,
			ok("db.shop.svc.clusterset.local. 5 IN SRV 0 25 5432 db-0.east."+db,
				db+" 5 IN SRV 0 25 5432 db-1.east."+db,
				db+" 5 IN SRV 0 25 5432 10-2-0-10.west."+db,
				db+" 5 IN SRV 0 25 5432 fd00-2--10.west."+db).
				with("db-0.east."+db+" 5 IN A 10.1.0.10", "db-1.east."+db+" 5 IN A 10.1.0.11",
					"10-2-0-10.west."+db+" 5 IN A 10.2.0.10", "fd00-2--10.west."+db+" 5 IN AAAA fd00:2::10")},
		{"an SRV query for an endpoint name lists its ports, as CoreDNS answers", "db-0.east." + db, mdns.TypeSRV,
			ok("db-0.east." + db + " 5 IN SRV 0 100 5432 db-0.east." + db).with("db-0.east." + db + " 5 IN A 10.1.0.10")},
		{"a headless service without a ready endpoint is NXDOMAIN (spec 2.4.1)", "gone.shop.svc.clusterset.local.", mdns.TypeA, nxdomain()},
		{"the SRV name of a headless service without a ready endpoint is NXDOMAIN", "_pg._tcp.gone.shop.svc.clusterset.local.", mdns.TypeSRV, nxdomain()},
		{"a headless service without ports answers no SRV (NODATA)", "noports.shop.svc.clusterset.local.", mdns.TypeSRV, nodata()},
		{"a headless service without ports still answers A", "noports.shop.svc.clusterset.local.", mdns.TypeA,
			ok("noports.shop.svc.clusterset.local. 5 IN A 10.1.0.40")},

		// Names and classes.
		{"names are case-insensitive and answered with the case asked", "CaRt.Shop.SVC.clusterset.LOCAL.", mdns.TypeA,
			ok("CaRt.Shop.SVC.clusterset.LOCAL. 5 IN A 241.0.0.1")},
		{"a name outside the zone is REFUSED when there is no upstream", "example.com.", mdns.TypeA, refused()},
		{"a name that only ends like the zone is outside it", "notclusterset.local.", mdns.TypeA, refused()},
		{"an escaped dot before the zone is not a label boundary", `cart\.clusterset.local.`, mdns.TypeA, refused()},
		{"a zone transfer is REFUSED", "clusterset.local.", mdns.TypeAXFR, refused()},
		{"an incremental zone transfer is REFUSED", "clusterset.local.", mdns.TypeIXFR, refused()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := query(tt.qname, tt.qtype)
			check(t, req, Answer(z, req), tt.want)
		})
	}
}

func TestAnswerMessages(t *testing.T) {
	z := fixtureZone(t)
	tests := []struct {
		name  string
		req   func() *mdns.Msg
		rcode int // -1: no response at all
		check func(t *testing.T, resp *mdns.Msg)
	}{
		{"a response is never answered", func() *mdns.Msg { m := query(cart, mdns.TypeA); m.Response = true; return m }, -1, nil},
		{"a query without question is FORMERR", func() *mdns.Msg { return &mdns.Msg{MsgHdr: mdns.MsgHdr{Id: 7}} }, mdns.RcodeFormatError, nil},
		{"a query with two questions is FORMERR", func() *mdns.Msg {
			m := query(cart, mdns.TypeA)
			m.Question = append(m.Question, m.Question[0])
			return m
		}, mdns.RcodeFormatError, func(t *testing.T, resp *mdns.Msg) {
			if len(resp.Question) != 0 {
				t.Errorf("FORMERR echoes %d questions, want none", len(resp.Question))
			}
		}},
		{"an UPDATE is NOTIMP", func() *mdns.Msg { m := query(cart, mdns.TypeA); m.Opcode = mdns.OpcodeUpdate; return m }, mdns.RcodeNotImplemented, nil},
		{"a NOTIFY is NOTIMP", func() *mdns.Msg { m := query(cart, mdns.TypeA); m.Opcode = mdns.OpcodeNotify; return m }, mdns.RcodeNotImplemented, nil},
		{"two OPT records are FORMERR", func() *mdns.Msg {
			m := query(cart, mdns.TypeA).SetEdns0(1232, false)
			m.Extra = append(m.Extra, m.Extra[0])
			return m
		}, mdns.RcodeFormatError, nil},
		{"EDNS version 1 is BADVERS with an OPT record", func() *mdns.Msg {
			m := query(cart, mdns.TypeA).SetEdns0(1232, false)
			m.IsEdns0().SetVersion(1)
			return m
		}, mdns.RcodeBadVers, func(t *testing.T, resp *mdns.Msg) {
			if resp.IsEdns0() == nil {
				t.Error("BADVERS without OPT")
			}
			if _, err := resp.Pack(); err != nil {
				t.Errorf("BADVERS does not pack: %v", err)
			}
		}},
		{"an EDNS0 query gets the DO bit back and the server's UDP size (1232 at most, RFC 6891 6.2.5)", func() *mdns.Msg { return query(cart, mdns.TypeA).SetEdns0(4096, true) },
			mdns.RcodeSuccess, func(t *testing.T, resp *mdns.Msg) {
				opt := resp.IsEdns0()
				if opt == nil || opt.UDPSize() != MaxUDPResponse || !opt.Do() {
					t.Errorf("OPT %v, want size %d and DO", opt, MaxUDPResponse)
				}
			}},
		{"an EDNS0 size between 512 and 1232 is advertised back as is", func() *mdns.Msg { return query(cart, mdns.TypeA).SetEdns0(1000, false) },
			mdns.RcodeSuccess, func(t *testing.T, resp *mdns.Msg) {
				if opt := resp.IsEdns0(); opt == nil || opt.UDPSize() != 1000 {
					t.Errorf("OPT %v, want size 1000", opt)
				}
			}},
		{"an EDNS0 size below 512 is answered as 512", func() *mdns.Msg { return query(cart, mdns.TypeA).SetEdns0(100, false) },
			mdns.RcodeSuccess, func(t *testing.T, resp *mdns.Msg) {
				if opt := resp.IsEdns0(); opt == nil || opt.UDPSize() != 512 {
					t.Errorf("OPT %v, want size 512", opt)
				}
			}},
		{"a query without EDNS0 gets no OPT", func() *mdns.Msg { return query(cart, mdns.TypeA) }, mdns.RcodeSuccess,
			func(t *testing.T, resp *mdns.Msg) {
				if resp.IsEdns0() != nil {
					t.Error("OPT in the response to a query without one")
				}
			}},
		{"a CHAOS query in the zone is REFUSED", func() *mdns.Msg { m := query(cart, mdns.TypeTXT); m.Question[0].Qclass = mdns.ClassCHAOS; return m },
			mdns.RcodeRefused, nil},
		{"a class ANY query in the zone is answered", func() *mdns.Msg { m := query(cart, mdns.TypeA); m.Question[0].Qclass = mdns.ClassANY; return m },
			mdns.RcodeSuccess, nil},
		{"the RD and CD bits are copied", func() *mdns.Msg { m := query(cart, mdns.TypeA); m.CheckingDisabled = true; return m },
			mdns.RcodeSuccess, func(t *testing.T, resp *mdns.Msg) {
				if !resp.RecursionDesired || !resp.CheckingDisabled {
					t.Error("RD or CD not copied")
				}
			}},
		{"a negative answer in another case has the SOA in that case", func() *mdns.Msg { return query("nope.CLUSTERSET.local.", mdns.TypeA) },
			mdns.RcodeNameError, func(t *testing.T, resp *mdns.Msg) {
				if len(resp.Ns) != 1 || resp.Ns[0].Header().Name != "CLUSTERSET.local." {
					t.Errorf("authority %v, want the SOA owned by CLUSTERSET.local.", resp.Ns)
				}
				if z.soa[0].Header().Name != Origin {
					t.Error("the zone's SOA was modified")
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := tt.req()
			resp := Answer(z, req)
			if tt.rcode == -1 {
				if resp != nil {
					t.Fatalf("answered %v", resp)
				}
				return
			}
			if resp == nil {
				t.Fatal("no response")
			}
			if resp.Rcode != tt.rcode {
				t.Errorf("rcode %s, want %s", mdns.RcodeToString[resp.Rcode], mdns.RcodeToString[tt.rcode])
			}
			if resp.Id != req.Id {
				t.Errorf("id %d, want %d", resp.Id, req.Id)
			}
			if tt.check != nil {
				tt.check(t, resp)
			}
		})
	}
}

// Before its first update the server has no state: what would be NXDOMAIN is SERVFAIL (a
// resolver must not cache a name's absence the agent has not been told about), as CoreDNS
// answers before it has synced; the zone's fixed names still answer.
func TestAnswerBeforeState(t *testing.T) {
	tests := []struct {
		name  string
		qname string
		qtype uint16
		want  result
	}{
		{"a service name is SERVFAIL, not NXDOMAIN", cart, mdns.TypeA, result{rcode: mdns.RcodeServerFailure, soa: true}},
		{"a namespace is SERVFAIL, not NXDOMAIN", "shop.svc.clusterset.local.", mdns.TypeA, result{rcode: mdns.RcodeServerFailure, soa: true}},
		{"dns-version still answers", "dns-version.clusterset.local.", mdns.TypeTXT, ok(`dns-version.clusterset.local. 28800 IN TXT "1.0.0"`)},
		{"svc.clusterset.local is still NODATA", "svc.clusterset.local.", mdns.TypeA, nodata()},
		{"names outside the zone are still REFUSED without an upstream", "example.com.", mdns.TypeA, refused()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := query(tt.qname, tt.qtype)
			resp := Answer(nil, req)
			if tt.want.soa {
				// The unsynced zone's SOA has serial 0.
				for i, rr := range resp.Ns {
					if s, ok := rr.(*mdns.SOA); ok && s.Serial == 0 {
						c := *s
						c.Serial = 42
						resp.Ns[i] = &c
					}
				}
			}
			check(t, req, resp, tt.want)
		})
	}
}

// The zone's records are shared by every response: answering must never change them, even
// when a response gets an OPT appended or is truncated.
func TestAnswerDoesNotModifyTheZone(t *testing.T) {
	z := fixtureZone(t)
	before := printed(z.RRs())
	for _, q := range []struct {
		name  string
		qtype uint16
	}{{db, mdns.TypeSRV}, {"_pg._tcp." + db, mdns.TypeSRV}, {cart, mdns.TypeSRV}, {"clusterset.local.", mdns.TypeNS}, {"DB.shop.svc.clusterset.local.", mdns.TypeA}} {
		for range 3 {
			req := query(q.name, q.qtype).SetEdns0(512, false)
			resp := Answer(z, req)
			resp.Truncate(100)
			if _, err := resp.Pack(); err != nil {
				t.Fatal(err)
			}
		}
		n := z.nodes[asciiLower(q.name)]
		for _, rr := range append(append([]mdns.RR{}, n.srvExtra...), n.nsExtra...) {
			if rr.Header().Rrtype == mdns.TypeOPT {
				t.Fatalf("%s: an OPT record leaked into the zone's additional records", q.name)
			}
		}
	}
	if after := printed(z.RRs()); !slices.Equal(before, after) {
		t.Fatalf("zone changed by answering:\nbefore %v\nafter  %v", before, after)
	}
}

func TestInZone(t *testing.T) {
	tests := []struct {
		name string
		in   bool
	}{
		{"clusterset.local.", true},
		{"clusterset.local", true},
		{"CLUSTERSET.LOCAL.", true},
		{"a.b.svc.clusterset.local.", true},
		{"local.", false},
		{".", false},
		{"", false},
		{"xclusterset.local.", false},
		{`a\.clusterset.local.`, false},
		{`a\\.clusterset.local.`, true},
		{"clusterset.local.example.", false},
	}
	for _, tt := range tests {
		if got := InZone(tt.name); got != tt.in {
			t.Errorf("InZone(%q) = %v, want %v", tt.name, got, tt.in)
		}
	}
}
