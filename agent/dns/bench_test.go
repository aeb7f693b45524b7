package dns

import (
	"testing"

	mdns "github.com/miekg/dns"
)

// BenchmarkServeDNS measures the handler alone (no sockets): unpacked request in, packed
// response out, for the common kinds of question.
func BenchmarkServeDNS(b *testing.B) {
	s, err := NewServer(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		b.Fatal(err)
	}
	s.zone.Store(fixtureZone(b))
	for _, q := range []struct {
		name  string
		qname string
		qtype uint16
	}{
		{"ClusterSetIP A", cart, mdns.TypeA},
		{"AAAA NODATA", cart, mdns.TypeAAAA},
		{"NXDOMAIN", "nope.shop.svc.clusterset.local.", mdns.TypeA},
		{"headless SRV", "_pg._tcp." + db, mdns.TypeSRV},
		{"mixed case A", "CART.shop.svc.clusterset.local.", mdns.TypeA},
	} {
		b.Run(q.name, func(b *testing.B) {
			wire := packed(b, query(q.qname, q.qtype))
			w := &recorder{remote: udpRemote()}
			b.ReportAllocs()
			for b.Loop() {
				req := new(mdns.Msg)
				if err := req.Unpack(wire); err != nil {
					b.Fatal(err)
				}
				s.ServeDNS(w, req)
				if _, err := w.msg.Pack(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
