package netns

import (
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// dnsUpstream is a DNS server the test runs inside a namespace of the mesh (its sockets are
// created there): the agent's upstream. It answers www.example. A, and big.example. TXT with
// 16 strings of 250 bytes (about 4 KB), and counts the queries it gets per name.
type dnsUpstream struct {
	mu      sync.Mutex
	queries map[string]int
	servers []*mdns.Server
}

const (
	upstreamSmall = "www.example."
	upstreamBig   = "big.example."
)

func startDNSUpstream(t *testing.T, ns string, addr netip.AddrPort) *dnsUpstream {
	t.Helper()
	u := &dnsUpstream{queries: map[string]int{}}
	handler := mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		m := new(mdns.Msg).SetReply(r)
		if len(r.Question) != 1 {
			m.Rcode = mdns.RcodeFormatError
			_ = w.WriteMsg(m)
			return
		}
		q := r.Question[0]
		name := strings.ToLower(q.Name)
		u.mu.Lock()
		u.queries[name]++
		u.mu.Unlock()
		hdr := mdns.RR_Header{Name: q.Name, Rrtype: q.Qtype, Class: mdns.ClassINET, Ttl: 60}
		switch {
		case name == upstreamSmall && q.Qtype == mdns.TypeA:
			m.Answer = append(m.Answer, &mdns.A{Hdr: hdr, A: net.IPv4(10, 99, 0, 1)})
		case name == upstreamBig && q.Qtype == mdns.TypeTXT:
			for i := range 16 {
				m.Answer = append(m.Answer, &mdns.TXT{Hdr: hdr, Txt: []string{fmt.Sprintf("%02d%s", i, strings.Repeat("x", 248))}})
			}
		default:
			m.Rcode = mdns.RcodeNameError
		}
		if opt := r.IsEdns0(); opt != nil {
			m.SetEdns0(opt.UDPSize(), false)
			if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
				m.Truncate(int(opt.UDPSize()))
			}
		} else if _, udp := w.RemoteAddr().(*net.UDPAddr); udp {
			m.Truncate(mdns.MinMsgSize)
		}
		_ = w.WriteMsg(m)
	})
	var pc net.PacketConn
	var ln net.Listener
	err := nstest.Within(ns, func() error {
		var err error
		if pc, err = net.ListenPacket("udp", addr.String()); err != nil {
			return err
		}
		ln, err = net.Listen("tcp", addr.String())
		return err
	})
	if err != nil {
		if pc != nil {
			pc.Close()
		}
		t.Fatalf("upstream DNS server in %s: %v", ns, err)
	}
	u.servers = []*mdns.Server{{PacketConn: pc, Handler: handler, UDPSize: mdns.MaxMsgSize}, {Listener: ln, Handler: handler}}
	for _, s := range u.servers {
		go func() { _ = s.ActivateAndServe() }()
	}
	t.Cleanup(func() {
		for _, s := range u.servers {
			_ = s.Shutdown()
		}
		pc.Close()
		ln.Close()
	})
	return u
}

func (u *dnsUpstream) count(name string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.queries[name]
}

// dnsReply is one answer as a client in a namespace received it.
type dnsReply struct {
	msg  *mdns.Msg
	wire int // bytes of the message on the wire
}

// askDNS sends one query from namespace ns to server over network ("udp" or "tcp"), with an
// EDNS0 size of ednsSize (0: no EDNS0), and returns the answer and its size on the wire.
func askDNS(ns, network string, server netip.AddrPort, name string, qtype uint16, ednsSize uint16) (dnsReply, error) {
	req := new(mdns.Msg).SetQuestion(name, qtype)
	if ednsSize > 0 {
		req.SetEdns0(ednsSize, false)
	}
	var conn net.Conn
	if err := nstest.Within(ns, func() error {
		var err error
		conn, err = net.DialTimeout(network, server.String(), 3*time.Second)
		return err
	}); err != nil {
		return dnsReply{}, err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	if network == "tcp" {
		c := &mdns.Conn{Conn: conn}
		if err := c.WriteMsg(req); err != nil {
			return dnsReply{}, err
		}
		raw, err := c.ReadMsgHeader(nil)
		if err != nil {
			return dnsReply{}, err
		}
		m := new(mdns.Msg)
		return dnsReply{m, len(raw)}, m.Unpack(raw)
	}
	packed, err := req.Pack()
	if err != nil {
		return dnsReply{}, err
	}
	if _, err := conn.Write(packed); err != nil {
		return dnsReply{}, err
	}
	buf := make([]byte, 65535)
	n, err := conn.Read(buf)
	if err != nil {
		return dnsReply{}, err
	}
	m := new(mdns.Msg)
	return dnsReply{m, n}, m.Unpack(buf[:n])
}

// TestDNSAnswersOnlyTheNodesClients: an agent whose DNS server listens on 0.0.0.0:53 with an
// upstream (a DNS server in the broker's namespace) is no open resolver. Its pod resolves
// outside names through it; a host of the underlay gets REFUSED, for outside and
// clusterset.local names, and its queries never reach the upstream; the gateway itself is
// answered; a UDP answer never exceeds 1,232 bytes whatever EDNS0 size the client asks for (TC
// set, the whole answer over TCP); the wildcard listen address is warned about in the log and
// in status.
func TestDNSAnswersOnlyTheNodesClients(t *testing.T) {
	harness.RequireRoot(t)
	m := harness.New(t)
	upstreamAddr := netip.AddrPortFrom(m.BrokerAddr, 53)
	up := startDNSUpstream(t, m.BrokerNS, upstreamAddr)

	east := m.NewCluster("east", "10.1.0.0/16")
	r := m.JoinToken("east", "10.1.0.0/16")
	if r.Err != nil {
		t.Fatalf("join token: %s", r)
	}
	east.WriteToken(strings.TrimSpace(r.Stdout))
	east.DNSExtra = fmt.Sprintf(`listen: "0.0.0.0:53", upstream: "%s"`, upstreamAddr)
	east.WriteConfig("")
	east.StartAgent()

	fromPod := netip.AddrPortFrom(east.GwPodIP, 53)
	fromOutside := netip.AddrPortFrom(east.GwUnderlay, 53)
	err := harness.WaitFor(60*time.Second, 300*time.Millisecond, func() (bool, string) {
		a, err := askDNS(east.PodNS, "udp", fromPod, upstreamSmall, mdns.TypeA, 0)
		if err != nil {
			return false, err.Error()
		}
		return a.msg.Rcode == mdns.RcodeSuccess && len(a.msg.Answer) == 1, a.msg.String()
	})
	if err != nil {
		t.Fatalf("east's pod cannot resolve %s through the agent: %v\n%s", upstreamSmall, err, east.Agent.LogTail(30))
	}
	m.Logf("east's pod resolves %s through its agent and the upstream", upstreamSmall)

	t.Run("a host of the underlay is refused, and its queries never reach the upstream", func(t *testing.T) {
		const outsideName = "outside.example."
		for _, q := range []struct {
			name  string
			qtype uint16
		}{{outsideName, mdns.TypeA}, {upstreamBig, mdns.TypeTXT}, {"dns-version.clusterset.local.", mdns.TypeTXT}} {
			for _, network := range []string{"udp", "tcp"} {
				a, err := askDNS(m.BrokerNS, network, fromOutside, q.name, q.qtype, 65535)
				if err != nil {
					t.Fatalf("%s %s from the underlay: %v", network, q.name, err)
				}
				if a.msg.Rcode != mdns.RcodeRefused || len(a.msg.Answer) > 0 {
					t.Errorf("%s %s from the underlay: %s with %d answers (%d bytes), want REFUSED and nothing", network, q.name,
						mdns.RcodeToString[a.msg.Rcode], len(a.msg.Answer), a.wire)
				}
			}
		}
		if n := up.count(outsideName); n != 0 {
			t.Errorf("the upstream got %d queries for %s, asked from the underlay only", n, outsideName)
		}
	})

	t.Run("the node itself is answered", func(t *testing.T) {
		a, err := askDNS(east.GwNS, "udp", fromOutside, upstreamSmall, mdns.TypeA, 0)
		if err != nil || a.msg.Rcode != mdns.RcodeSuccess || len(a.msg.Answer) != 1 {
			t.Errorf("the gateway asking its own underlay address: %v %v", a.msg, err)
		}
	})

	t.Run("a UDP answer is capped at 1232 bytes with TC; TCP gets it whole", func(t *testing.T) {
		query := new(mdns.Msg).SetQuestion(upstreamBig, mdns.TypeTXT).SetEdns0(65535, false)
		qlen := query.Len()
		a, err := askDNS(east.PodNS, "udp", fromPod, upstreamBig, mdns.TypeTXT, 65535)
		if err != nil {
			t.Fatal(err)
		}
		m.Logf("a %d-byte UDP query asking for 65535 bytes got %d bytes back (TC %v, %d answers)", qlen, a.wire, a.msg.Truncated, len(a.msg.Answer))
		if a.wire > 1232 || !a.msg.Truncated {
			t.Errorf("UDP answer of %d bytes (%.0fx the query), TC %v; want at most 1232 bytes with TC", a.wire, float64(a.wire)/float64(qlen), a.msg.Truncated)
		}
		if opt := a.msg.IsEdns0(); opt != nil && opt.UDPSize() > 1232 {
			t.Errorf("the answer advertises a UDP size of %d, want at most 1232", opt.UDPSize())
		}
		a, err = askDNS(east.PodNS, "tcp", fromPod, upstreamBig, mdns.TypeTXT, 65535)
		if err != nil {
			t.Fatal(err)
		}
		if a.msg.Truncated || len(a.msg.Answer) != 16 {
			t.Errorf("TCP answer: TC %v, %d answers, want the 16 records", a.msg.Truncated, len(a.msg.Answer))
		}
	})

	t.Run("the wildcard listen address is warned about in the log and in status", func(t *testing.T) {
		if log := east.Agent.Log(); !strings.Contains(log, "level=WARN") || !strings.Contains(log, "WILDCARD") {
			t.Errorf("east's log has no warning about dns.listen 0.0.0.0:53:\n%s", east.Agent.LogTail(40))
		}
		st, err := east.Status()
		if err != nil {
			t.Fatal(err)
		}
		if st.Services == nil || len(st.Services.DNS.Warnings) == 0 || !strings.Contains(strings.Join(st.Services.DNS.Warnings, " "), "0.0.0.0:53") {
			t.Errorf("status has no dns warning about 0.0.0.0:53: %+v", st.Services)
		}
	})
}
