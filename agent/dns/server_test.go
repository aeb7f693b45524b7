package dns

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// startServer starts a server on a free loopback port and stops it when the test ends.
func startServer(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := s.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
	})
	return s
}

func exchange(t *testing.T, network, addr string, req *mdns.Msg) *mdns.Msg {
	t.Helper()
	c := &mdns.Client{Net: network, Timeout: 5 * time.Second, UDPSize: mdns.MaxMsgSize}
	resp, _, err := c.Exchange(req, addr)
	if err != nil {
		t.Fatalf("%s exchange %s: %v", network, req.Question[0].Name, err)
	}
	return resp
}

// upstream is a fake upstream server on loopback that counts the queries it gets.
type upstream struct {
	addr    string
	queries atomic.Int64
	lastOPT atomic.Int32 // UDP size of the last query's OPT, -1 without one
	tcp     atomic.Int64
}

// bigName is answered by the fake upstream with more records than fit in 512 bytes.
const bigName = "big.example."

func startUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{}
	handler := mdns.HandlerFunc(func(w mdns.ResponseWriter, r *mdns.Msg) {
		u.queries.Add(1)
		if _, ok := w.RemoteAddr().(*net.TCPAddr); ok {
			u.tcp.Add(1)
		}
		if opt := r.IsEdns0(); opt != nil {
			u.lastOPT.Store(int32(opt.UDPSize()))
		} else {
			u.lastOPT.Store(-1)
		}
		m := new(mdns.Msg).SetReply(r)
		q := r.Question[0]
		switch strings.ToLower(q.Name) {
		case "example.com.":
			m.Answer = append(m.Answer, &mdns.A{Hdr: mdns.RR_Header{Name: q.Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, 1)})
		case bigName:
			for i := range 60 {
				m.Answer = append(m.Answer, &mdns.A{Hdr: mdns.RR_Header{Name: q.Name, Rrtype: mdns.TypeA, Class: mdns.ClassINET, Ttl: 60}, A: net.IPv4(192, 0, 2, byte(i))})
			}
		default:
			m.Rcode = mdns.RcodeNameError
		}
		if opt := r.IsEdns0(); opt != nil {
			m.SetEdns0(opt.UDPSize(), false)
		}
		if _, ok := w.RemoteAddr().(*net.UDPAddr); ok {
			m.Truncate(udpSize(r))
		}
		_ = w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", pc.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	for _, srv := range []*mdns.Server{{PacketConn: pc, Handler: handler}, {Listener: ln, Handler: handler}} {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go func() { _ = srv.ActivateAndServe() }()
		<-started
		t.Cleanup(func() { _ = srv.Shutdown() })
	}
	return u
}

// blackhole is a UDP and TCP address that accepts and never answers.
func blackhole(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc.LocalAddr().String()
}

func TestServerAnswersOverUDPAndTCP(t *testing.T) {
	s := startServer(t, Config{})
	if err := s.Update(fixture()); err != nil {
		t.Fatal(err)
	}
	for _, network := range []string{"udp", "tcp"} {
		t.Run(network, func(t *testing.T) {
			req := query(cart, mdns.TypeA)
			resp := exchange(t, network, s.Addr().String(), req)
			check(t, req, resp, ok(cart+" 5 IN A 241.0.0.1"))
			if resp.RecursionAvailable {
				t.Error("RA set by a server without upstream")
			}
			req = query("nope.shop.svc.clusterset.local.", mdns.TypeA)
			resp = exchange(t, network, s.Addr().String(), req)
			if resp.Rcode != mdns.RcodeNameError || len(resp.Ns) != 1 {
				t.Errorf("unknown service: %s with %d authority records, want NXDOMAIN with the SOA", mdns.RcodeToString[resp.Rcode], len(resp.Ns))
			}
		})
	}
}

func TestServerIsServfailUntilItsFirstUpdate(t *testing.T) {
	s := startServer(t, Config{})
	resp := exchange(t, "udp", s.Addr().String(), query(cart, mdns.TypeA))
	if resp.Rcode != mdns.RcodeServerFailure {
		t.Fatalf("before any update: %s, want SERVFAIL", mdns.RcodeToString[resp.Rcode])
	}
	if err := s.Update(nil); err != nil {
		t.Fatal(err)
	}
	resp = exchange(t, "udp", s.Addr().String(), query(cart, mdns.TypeA))
	if resp.Rcode != mdns.RcodeNameError {
		t.Fatalf("after an empty update: %s, want NXDOMAIN", mdns.RcodeToString[resp.Rcode])
	}
}

func TestServerTruncatesLargeUDPAnswers(t *testing.T) {
	var eps []Endpoint
	for i := range 200 {
		eps = append(eps, Endpoint{Cluster: fmt.Sprintf("c%d", i%3), IP: netip.AddrFrom4([4]byte{10, 9, byte(i / 250), byte(i%250 + 1)}), Ready: true})
	}
	s := startServer(t, Config{})
	if err := s.Update([]Service{{Namespace: "ns", Name: "big", Type: Headless, Ports: []Port{{Name: "p", Port: 1}}, Endpoints: eps}}); err != nil {
		t.Fatal(err)
	}
	name := "big.ns.svc.clusterset.local."
	tests := []struct {
		name      string
		network   string
		req       *mdns.Msg
		truncated bool
		maxLen    int
		answers   int // exact count when not truncated
	}{
		{"UDP without EDNS0 is cut at 512 bytes with TC", "udp", query(name, mdns.TypeA), true, 512, 0},
		{"UDP with a 1232-byte EDNS0 size is cut there with TC", "udp", query(name, mdns.TypeA).SetEdns0(1232, false), true, 1232, 0},
		{"UDP with a 65000-byte EDNS0 size is still cut at 1232 bytes with TC (no amplification)", "udp", query(name, mdns.TypeA).SetEdns0(65000, false), true, MaxUDPResponse, 0},
		{"TCP gets everything", "tcp", query(name, mdns.TypeA), false, mdns.MaxMsgSize, 200},
		{"an SRV answer over UDP is cut with TC", "udp", query("_p._tcp."+name, mdns.TypeSRV).SetEdns0(1232, false), true, 1232, 0},
		{"an SRV answer over TCP carries every target's address", "tcp", query("_p._tcp."+name, mdns.TypeSRV), false, mdns.MaxMsgSize, 200},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp := exchange(t, tt.network, s.Addr().String(), tt.req)
			if resp.Truncated != tt.truncated {
				t.Errorf("TC %v, want %v", resp.Truncated, tt.truncated)
			}
			resp.Compress = true // as it was sent
			if n := resp.Len(); n > tt.maxLen {
				t.Errorf("%d bytes, want at most %d", n, tt.maxLen)
			}
			if tt.answers > 0 && len(resp.Answer) != tt.answers {
				t.Errorf("%d answers, want %d", len(resp.Answer), tt.answers)
			}
			if tt.answers > 0 && resp.Question[0].Qtype == mdns.TypeSRV && len(resp.Extra) != tt.answers {
				t.Errorf("%d additional records, want %d", len(resp.Extra), tt.answers)
			}
			if tt.req.IsEdns0() != nil && resp.IsEdns0() == nil {
				t.Error("the OPT record was dropped")
			}
		})
	}
}

func TestServerForwardsOtherNames(t *testing.T) {
	up := startUpstream(t)
	s := startServer(t, Config{Upstreams: []string{up.addr}})
	if err := s.Update(fixture()); err != nil {
		t.Fatal(err)
	}
	addr := s.Addr().String()

	t.Run("a name outside the zone is answered by the upstream", func(t *testing.T) {
		resp := exchange(t, "udp", addr, query("example.com.", mdns.TypeA))
		if resp.Rcode != mdns.RcodeSuccess || len(resp.Answer) != 1 || !resp.RecursionAvailable {
			t.Fatalf("got %v, want the upstream's A record with RA", resp)
		}
	})
	t.Run("the upstream's NXDOMAIN is passed on", func(t *testing.T) {
		resp := exchange(t, "udp", addr, query("nope.example.", mdns.TypeA))
		if resp.Rcode != mdns.RcodeNameError {
			t.Fatalf("got %s, want NXDOMAIN", mdns.RcodeToString[resp.Rcode])
		}
	})
	t.Run("the client's EDNS0 size is passed to the upstream", func(t *testing.T) {
		exchange(t, "udp", addr, query("example.com.", mdns.TypeA).SetEdns0(3000, false))
		if got := up.lastOPT.Load(); got != 3000 {
			t.Fatalf("upstream saw EDNS0 size %d, want 3000", got)
		}
	})
	t.Run("a truncated upstream answer is fetched again over TCP, then cut to the client's size", func(t *testing.T) {
		tcpBefore := up.tcp.Load()
		resp := exchange(t, "udp", addr, query(bigName, mdns.TypeA))
		if up.tcp.Load() != tcpBefore+1 {
			t.Fatalf("%d TCP queries reached the upstream, want 1", up.tcp.Load()-tcpBefore)
		}
		resp.Compress = true
		if !resp.Truncated || resp.Len() > 512 || len(resp.Answer) == 0 {
			t.Fatalf("TC %v, %d bytes, %d answers; want TC within 512 bytes with some answers", resp.Truncated, resp.Len(), len(resp.Answer))
		}
	})
	t.Run("a forwarded answer is as large as the client's EDNS0 size allows", func(t *testing.T) {
		resp := exchange(t, "udp", addr, query(bigName, mdns.TypeA).SetEdns0(4096, false))
		if len(resp.Answer) != 60 || resp.Truncated {
			t.Fatalf("%d answers, TC %v; want all 60 without TC", len(resp.Answer), resp.Truncated)
		}
	})
	t.Run("a forwarded answer advertises this server's UDP size, not the upstream's", func(t *testing.T) {
		resp := exchange(t, "udp", addr, query("example.com.", mdns.TypeA).SetEdns0(65000, false))
		if opt := resp.IsEdns0(); opt == nil || opt.UDPSize() != MaxUDPResponse {
			t.Fatalf("OPT %v, want UDP size %d", opt, MaxUDPResponse)
		}
	})
	t.Run("a client over TCP is forwarded over TCP", func(t *testing.T) {
		tcpBefore := up.tcp.Load()
		resp := exchange(t, "tcp", addr, query(bigName, mdns.TypeA))
		if len(resp.Answer) != 60 || up.tcp.Load() != tcpBefore+1 {
			t.Fatalf("%d answers, %d TCP queries upstream; want 60 and 1", len(resp.Answer), up.tcp.Load()-tcpBefore)
		}
	})
	t.Run("names in the zone are never forwarded", func(t *testing.T) {
		before := up.queries.Load()
		for _, n := range []string{cart, "nope.clusterset.local.", "CLUSTERSET.LOCAL."} {
			exchange(t, "udp", addr, query(n, mdns.TypeA))
		}
		if up.queries.Load() != before {
			t.Fatal("a zone name reached the upstream")
		}
	})
}

func TestServerUpstreamFailures(t *testing.T) {
	up := startUpstream(t)
	tests := []struct {
		name      string
		upstreams []string
		rcode     int
	}{
		{"an upstream that never answers is SERVFAIL after the timeout", []string{blackhole(t)}, mdns.RcodeServerFailure},
		{"the next upstream answers when the first one does not", []string{blackhole(t), up.addr}, mdns.RcodeSuccess},
		{"no upstream at all is REFUSED", nil, mdns.RcodeRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := startServer(t, Config{Upstreams: tt.upstreams, UpstreamTimeout: 200 * time.Millisecond})
			req := query("example.com.", mdns.TypeA).SetEdns0(1232, false)
			resp := exchange(t, "udp", s.Addr().String(), req)
			if resp.Rcode != tt.rcode {
				t.Fatalf("got %s, want %s", mdns.RcodeToString[resp.Rcode], mdns.RcodeToString[tt.rcode])
			}
			if resp.IsEdns0() == nil {
				t.Error("the response lost the OPT record")
			}
		})
	}
}

func TestServerMaxForwardsRefusesTheExcess(t *testing.T) {
	s, err := NewServer(Config{Listen: "127.0.0.1:0", Upstreams: []string{blackhole(t)}, MaxForwards: 1, UpstreamTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.fwdSlots <- struct{}{} // one forward in flight
	w := &recorder{remote: udpRemote()}
	s.ServeDNS(w, query("example.com.", mdns.TypeA))
	if w.msg == nil || w.msg.Rcode != mdns.RcodeRefused {
		t.Fatalf("got %v, want REFUSED", w.msg)
	}
}

// Updates swap the zone while queries run: every answer comes whole from one zone or the
// other, never SERVFAIL, NXDOMAIN or a mix. Run with -race.
func TestServerUpdateUnderLoad(t *testing.T) {
	ip := netip.MustParseAddr
	zoneA := []Service{{Namespace: "ns", Name: "web", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.1")}, Ports: []Port{{Name: "http", Port: 80}}}}
	zoneB := []Service{{Namespace: "ns", Name: "web", Type: ClusterSetIP, VIPs: []netip.Addr{ip("241.0.0.2")}, Ports: []Port{{Name: "http", Port: 80}}}}
	s := startServer(t, Config{})
	if err := s.Update(zoneA); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var answered atomic.Int64
	errs := make(chan error, 8)
	for range 4 {
		wg.Go(func() {
			c := &mdns.Client{Net: "udp", Timeout: 2 * time.Second}
			for i := 0; i < 300 && ctx.Err() == nil; i++ {
				qt := mdns.TypeA
				if i%2 == 1 {
					qt = mdns.TypeSRV
				}
				// A resolver retries a UDP query that got no answer; so does this client (three
				// tries), since what is under test is that no answer is ever wrong while the zone
				// is swapped, not that a loaded machine never drops a datagram.
				var resp *mdns.Msg
				var err error
				for try := 0; try < 3; try++ {
					if resp, _, err = c.Exchange(query("web.ns.svc.clusterset.local.", qt), s.Addr().String()); err == nil {
						break
					}
				}
				if err != nil {
					errs <- err
					return
				}
				if resp.Rcode != mdns.RcodeSuccess || len(resp.Answer) != 1 {
					errs <- fmt.Errorf("answer %v", resp)
					return
				}
				if qt == mdns.TypeSRV && len(resp.Extra) != 1 {
					errs <- fmt.Errorf("SRV without its address: %v", resp)
					return
				}
				answered.Add(1)
			}
		})
	}
	updates := 0
	for ctx.Err() == nil && answered.Load() < 1200 && len(errs) == 0 {
		next := zoneA
		if updates%2 == 0 {
			next = zoneB
		}
		if err := s.Update(next); err != nil {
			t.Fatal(err)
		}
		updates++
		time.Sleep(time.Millisecond)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if updates < 2 {
		t.Fatalf("only %d updates ran", updates)
	}
	t.Logf("%d answers during %d updates", answered.Load(), updates)
}

func TestServerSerialIncreases(t *testing.T) {
	s, err := NewServer(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	var last uint32
	for range 3 {
		if err := s.Update(nil); err != nil {
			t.Fatal(err)
		}
		if got := s.Zone().Serial(); got <= last {
			t.Fatalf("serial %d after %d", got, last)
		}
		last = s.Zone().Serial()
	}
}

func TestServerUpdateReportsSkippedInput(t *testing.T) {
	s, err := NewServer(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Update([]Service{{Namespace: "ok", Name: "bad name", Type: ClusterSetIP}, {Namespace: "ok", Name: "good", Type: ClusterSetIP}})
	if err == nil || !strings.Contains(err.Error(), `"bad name"`) {
		t.Fatalf("error %v, want one naming \"bad name\"", err)
	}
	if !s.Zone().Exists("good.ok.svc.clusterset.local") {
		t.Fatal("the good service was not served")
	}
}

func TestServerRunStopsWithItsContext(t *testing.T) {
	s, err := NewServer(Config{Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for !s.Addr().IsValid() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	addr := s.Addr().String()
	exchange(t, "tcp", addr, query(cart, mdns.TypeA))
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Fatal("still listening after Run returned")
	}
	if err := s.Start(); err == nil {
		t.Fatal("a stopped server started again")
	}
}

func TestServerMetrics(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	s := startServer(t, Config{Registerer: reg})
	if err := s.Update(fixture()); err != nil {
		t.Fatal(err)
	}
	exchange(t, "udp", s.Addr().String(), query(cart, mdns.TypeA))
	exchange(t, "udp", s.Addr().String(), query("nope.clusterset.local.", mdns.TypeA))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			key := f.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			values[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	for key, want := range map[string]float64{
		"cablemesh_dns_requests_total,rcode=NOERROR,source=zone":  1,
		"cablemesh_dns_requests_total,rcode=NXDOMAIN,source=zone": 1,
		"cablemesh_dns_zone_services":                             float64(len(fixture())),
	} {
		if values[key] != want {
			t.Errorf("%s = %v, want %v", key, values[key], want)
		}
	}
}

func TestNewServerValidatesItsConfig(t *testing.T) {
	dir := t.TempDir()
	resolv := filepath.Join(dir, "resolv.conf")
	if err := os.WriteFile(resolv, []byte("nameserver 127.0.0.53\nnameserver ::1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		cfg       Config
		errHas    string
		upstreams []string
	}{
		{"a listen address is required", Config{}, "dns.listen", nil},
		{"a listen address must be ip:port", Config{Listen: "localhost:53"}, `"localhost:53"`, nil},
		{"an upstream must be an address", Config{Listen: "127.0.0.1:0", Upstreams: []string{"dns.google"}}, `dns.upstream[0]: "dns.google"`, nil},
		{"an upstream without port uses 53", Config{Listen: "127.0.0.1:0", Upstreams: []string{"10.0.0.10", "[fd00::a]:5353"}}, "", []string{"10.0.0.10:53", "[fd00::a]:5353"}},
		{"a resolv.conf path gives its nameservers", Config{Listen: "127.0.0.1:0", Upstreams: []string{resolv}}, "", []string{"127.0.0.53:53", "[::1]:53"}},
		{"a missing resolv.conf is an error", Config{Listen: "127.0.0.1:0", Upstreams: []string{filepath.Join(dir, "none")}}, "dns.upstream[0]", nil},
		{"a TTL under a second is an error", Config{Listen: "127.0.0.1:0", TTL: time.Millisecond}, "dns.ttl", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewServer(tt.cfg)
			if tt.errHas != "" {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("error %v, want one containing %s", err, tt.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if strings.Join(s.ups(), ",") != strings.Join(tt.upstreams, ",") {
				t.Fatalf("upstreams %v, want %v", s.ups(), tt.upstreams)
			}
		})
	}
}

func TestSetForwardingChangesUpstreamsAndTTLOfARunningServer(t *testing.T) {
	s, err := NewServer(Config{Listen: "127.0.0.1:0", Upstreams: []string{"10.0.0.53"}, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetForwarding([]string{"10.0.0.54:5353", "10.0.0.55"}, 9*time.Second); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.ups(), ","); got != "10.0.0.54:5353,10.0.0.55:53" {
		t.Errorf("upstreams %s", got)
	}
	if err := s.Update(nil); err != nil {
		t.Fatal(err)
	}
	if err := s.SetForwarding([]string{"not an address"}, 9*time.Second); err == nil {
		t.Error("a bad upstream was accepted")
	}
	if err := s.SetForwarding(nil, 10*time.Millisecond); err == nil || !strings.Contains(err.Error(), "dns.ttl") {
		t.Errorf("a TTL under 1s: %v", err)
	}
	if got := strings.Join(s.ups(), ","); got != "10.0.0.54:5353,10.0.0.55:53" {
		t.Errorf("bad input changed the upstreams to %s", got)
	}
	if s.cfg.TTL != 9*time.Second {
		t.Errorf("TTL %s", s.cfg.TTL)
	}
}

// A fixed port whose TCP side is taken fails with the address; any port (0) gives UDP and TCP
// the same port.
func TestListenUDPAndTCPTakeOnePort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	if pc, ln, err := listenUDPAndTCP(taken.Addr().String()); err == nil {
		pc.Close()
		ln.Close()
		t.Fatalf("listen on %s, whose TCP port is taken: no error", taken.Addr())
	} else if !strings.Contains(err.Error(), "listen tcp "+taken.Addr().String()) {
		t.Errorf("error %q does not name the TCP address %s", err, taken.Addr())
	}
	for range 20 {
		pc, ln, err := listenUDPAndTCP("127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		udp, tcp := pc.LocalAddr().(*net.UDPAddr).Port, ln.Addr().(*net.TCPAddr).Port
		pc.Close()
		ln.Close()
		if udp != tcp || udp == 0 {
			t.Fatalf("UDP port %d, TCP port %d: want one port", udp, tcp)
		}
	}
}
