package dns

import (
	"net"
	"net/netip"
	"testing"

	mdns "github.com/miekg/dns"
)

// recorder is a mdns.ResponseWriter that keeps what the handler wrote.
type recorder struct {
	remote net.Addr
	msg    *mdns.Msg
	writes int
}

func (r *recorder) LocalAddr() net.Addr         { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 53} }
func (r *recorder) RemoteAddr() net.Addr        { return r.remote }
func (r *recorder) WriteMsg(m *mdns.Msg) error  { r.msg = m; r.writes++; return nil }
func (r *recorder) Write(b []byte) (int, error) { return len(b), nil }
func (r *recorder) Close() error                { return nil }
func (r *recorder) TsigStatus() error           { return nil }
func (r *recorder) TsigTimersOnly(bool)         {}
func (r *recorder) Hijack()                     {}
func (r *recorder) Network() string             { return r.remote.Network() }
func udpRemote() net.Addr                       { return &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 5300} }
func tcpRemote() net.Addr                       { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 5300} }
func packed(t testing.TB, m *mdns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// FuzzServeDNS feeds arbitrary wire messages to the handler, over UDP and TCP, with and
// without state. Whatever arrives, the handler must not panic, must write at most one
// response, and that response must pack, carry the request's id and, over UDP, fit the size
// the client allows.
func FuzzServeDNS(f *testing.F) {
	for _, q := range []struct {
		name  string
		qtype uint16
	}{
		{cart, mdns.TypeA}, {db, mdns.TypeSRV}, {"_pg._tcp." + db, mdns.TypeSRV}, {"clusterset.local.", mdns.TypeNS},
		{"dns-version.clusterset.local.", mdns.TypeTXT}, {"nope.shop.svc.clusterset.local.", mdns.TypeAAAA},
		{"example.com.", mdns.TypeA}, {"CaRt.shop.svc.clusterset.local.", mdns.TypeANY},
	} {
		f.Add(packed(f, query(q.name, q.qtype)))
		f.Add(packed(f, query(q.name, q.qtype).SetEdns0(4096, true)))
	}
	m := query(cart, mdns.TypeA).SetEdns0(1232, false)
	m.IsEdns0().SetVersion(3)
	f.Add(packed(f, m))
	f.Add([]byte{})
	f.Add([]byte{0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0})

	z := fixtureZone(f)
	withState, err := NewServer(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		f.Fatal(err)
	}
	withState.zone.Store(z)
	noState, err := NewServer(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		req := new(mdns.Msg)
		if err := req.Unpack(wire); err != nil {
			return // the server drops what does not unpack
		}
		// Answer must not modify the request.
		before, _ := req.Pack()
		for _, s := range []*Server{withState, noState} {
			for _, remote := range []net.Addr{udpRemote(), tcpRemote()} {
				w := &recorder{remote: remote}
				s.ServeDNS(w, req)
				if w.writes > 1 {
					t.Fatalf("%d responses", w.writes)
				}
				if w.msg == nil {
					if !req.Response {
						t.Fatal("a query got no response")
					}
					continue
				}
				buf, err := w.msg.Pack()
				if err != nil {
					t.Fatalf("response does not pack: %v\n%v", err, w.msg)
				}
				if w.msg.Id != req.Id || !w.msg.Response {
					t.Fatalf("response id %d QR %v to request %d", w.msg.Id, w.msg.Response, req.Id)
				}
				if _, udp := remote.(*net.UDPAddr); udp && len(buf) > udpSize(req) {
					t.Fatalf("UDP response of %d bytes, client allows %d", len(buf), udpSize(req))
				}
				var back mdns.Msg
				if err := back.Unpack(buf); err != nil {
					t.Fatalf("response does not unpack: %v", err)
				}
			}
		}
		if after, _ := req.Pack(); string(before) != string(after) {
			t.Fatal("the handler modified the request")
		}
	})
}

// FuzzBuildZone builds zones from arbitrary services (decoded from the fuzzer's bytes) and
// checks the zone's invariants and that every name answers with a response that packs.
func FuzzBuildZone(f *testing.F) {
	f.Add([]byte("\x00\x04shop\x04cart\x04\xf1\x00\x00\x01\x01\x04http\x00\x50\x03TCP\x00"))
	f.Add([]byte("\x01\x04shop\x02db\x00\x01\x02pg\x15\x38\x00\x02\x04east\x04db-0\x04\x0a\x01\x00\x0a\x01\x04west\x00\x10\xfd\x00\x00\x02\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x10\x01"))
	f.Add([]byte("\x00\x04Shop\x05a.b.c\x00\x00\x01\x01\x05_http\x00\x00\x04QUIC"))
	f.Fuzz(func(t *testing.T, data []byte) {
		services := decodeServices(data)
		z, _ := BuildZone(services, ZoneOptions{Serial: 1, NSAddrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}})
		if z == nil {
			t.Fatal("nil zone")
		}
		checkZone(t, z)
		for name := range z.nodes {
			for _, qt := range []uint16{mdns.TypeA, mdns.TypeAAAA, mdns.TypeSRV, mdns.TypeTXT} {
				req := query(name, qt).SetEdns0(1232, false)
				resp := Answer(z, req)
				resp.Truncate(udpSize(req))
				if _, err := resp.Pack(); err != nil {
					t.Fatalf("%s %s: %v", name, mdns.TypeToString[qt], err)
				}
			}
		}
	})
}

// decodeServices reads services from b: for each, a type byte, namespace and name (length-
// prefixed), a VIP count and VIPs (a length byte then 4 or 16 bytes, or anything), a port
// count and ports (name, 2-byte number, protocol), an endpoint count and endpoints (cluster,
// hostname, IP, ready byte). Running out of bytes ends the list.
func decodeServices(b []byte) []Service {
	r := &byteReader{b: b}
	var out []Service
	for r.more() && len(out) < 64 {
		s := Service{Type: Type(r.byte() % 3)}
		s.Namespace, s.Name = r.str(), r.str()
		for n := r.byte() % 4; n > 0 && r.more(); n-- {
			s.VIPs = append(s.VIPs, r.addr())
		}
		for n := r.byte() % 8; n > 0 && r.more(); n-- {
			s.Ports = append(s.Ports, Port{Name: r.str(), Port: uint16(r.byte())<<8 | uint16(r.byte()), Protocol: r.str()})
		}
		for n := r.byte() % 16; n > 0 && r.more(); n-- {
			s.Endpoints = append(s.Endpoints, Endpoint{Cluster: r.str(), Hostname: r.str(), IP: r.addr(), Ready: r.byte()%2 == 1})
		}
		out = append(out, s)
	}
	return out
}

type byteReader struct {
	b []byte
	i int
}

func (r *byteReader) more() bool { return r.i < len(r.b) }

func (r *byteReader) byte() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

func (r *byteReader) str() string {
	n := int(r.byte()) % 80
	if r.i+n > len(r.b) {
		n = len(r.b) - r.i
	}
	s := string(r.b[r.i : r.i+n])
	r.i += n
	return s
}

func (r *byteReader) addr() netip.Addr {
	raw := []byte(r.str())
	a, _ := netip.AddrFromSlice(raw)
	if len(raw) == 5 { // an IPv6 zone, to exercise its rejection
		a = netip.AddrFrom16([16]byte{0xfe, 0x80, 15: raw[4]}).WithZone("eth0")
	}
	return a
}
