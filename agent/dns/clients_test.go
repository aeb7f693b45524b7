package dns

import (
	"bytes"
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	mdns "github.com/miekg/dns"
)

// TestServerAnswersOnlyItsClients: the server answers loopback, the node's own addresses and
// the client prefixes; every other source is REFUSED, for forwarded and clusterset.local names
// alike, and never reaches the upstream.
func TestServerAnswersOnlyItsClients(t *testing.T) {
	up := startUpstream(t)
	node := netip.MustParseAddr("172.31.0.10")
	s := startServer(t, Config{
		Upstreams:  []string{up.addr},
		Clients:    []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00:1::/64")},
		LocalAddrs: func() ([]netip.Addr, error) { return []netip.Addr{node}, nil },
	})
	if err := s.Update(nil); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		src     string
		allowed bool
	}{
		{"loopback", "127.0.0.1", true},
		{"IPv6 loopback", "::1", true},
		{"a pod of the cluster", "10.1.4.20", true},
		{"a pod of the cluster, IPv6", "fd00:1::20", true},
		{"the node's own address", "172.31.0.10", true},
		{"the node's own address, IPv4-mapped", "::ffff:172.31.0.10", true},
		{"another host of the underlay", "172.31.0.1", false},
		{"an address next to the pod CIDR", "10.2.0.1", false},
		{"an outside IPv6 host", "2001:db8::1", false},
	}
	for _, tt := range tests {
		for _, name := range []string{"example.com.", "dns-version.clusterset.local."} {
			t.Run(tt.name+" asks "+name, func(t *testing.T) {
				before := up.queries.Load()
				w := &recorder{remote: &net.UDPAddr{IP: net.ParseIP(tt.src), Port: 4000}}
				s.ServeDNS(w, query(name, mdns.TypeTXT).SetEdns0(4096, false))
				if w.msg == nil {
					t.Fatal("no response")
				}
				refused := w.msg.Rcode == mdns.RcodeRefused
				if refused == tt.allowed {
					t.Fatalf("rcode %s, want allowed=%v", mdns.RcodeToString[w.msg.Rcode], tt.allowed)
				}
				if !tt.allowed && (len(w.msg.Answer) > 0 || up.queries.Load() != before) {
					t.Errorf("a refused client got %d answers, %d upstream queries", len(w.msg.Answer), up.queries.Load()-before)
				}
			})
		}
	}
	t.Run("a refused TCP client is refused too", func(t *testing.T) {
		w := &recorder{remote: &net.TCPAddr{IP: net.ParseIP("172.31.0.1"), Port: 4000}}
		s.ServeDNS(w, query("example.com.", mdns.TypeA))
		if w.msg == nil || w.msg.Rcode != mdns.RcodeRefused {
			t.Fatalf("got %v, want REFUSED", w.msg)
		}
	})
	t.Run("SetClients replaces the client prefixes at once", func(t *testing.T) {
		s.SetClients([]netip.Prefix{netip.MustParsePrefix("10.2.0.0/24")})
		t.Cleanup(func() { s.SetClients([]netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}) })
		if s.ClientAllowed(netip.MustParseAddr("10.1.4.20")) || !s.ClientAllowed(netip.MustParseAddr("10.2.0.1")) {
			t.Fatalf("clients %v: 10.1.4.20 still allowed or 10.2.0.1 not", s.Clients())
		}
	})
}

// TestServerRereadsTheNodesAddressesAtMostOncePerPeriod: an address added to the node is
// found, and a flood of outside sources does not make the server list addresses per query.
func TestServerRereadsTheNodesAddressesAtMostOncePerPeriod(t *testing.T) {
	var reads atomic.Int64
	addrs := []netip.Addr{netip.MustParseAddr("172.31.0.10")}
	s, err := NewServer(Config{Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler), LocalAddrs: func() ([]netip.Addr, error) {
		reads.Add(1)
		return addrs, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !s.ClientAllowed(netip.MustParseAddr("172.31.0.10")) {
		t.Fatal("the node's address is not allowed")
	}
	for i := range 1000 {
		if s.ClientAllowed(netip.AddrFrom4([4]byte{192, 0, 2, byte(i)})) {
			t.Fatal("an outside address is allowed")
		}
	}
	if n := reads.Load(); n != 1 {
		t.Fatalf("%d reads of the node's addresses for 1001 queries within a second, want 1", n)
	}
	s.local.Store(&localAddrs{addrs: map[netip.Addr]bool{}}) // the last read is old
	addrs = []netip.Addr{netip.MustParseAddr("172.31.0.99")}
	if !s.ClientAllowed(netip.MustParseAddr("172.31.0.99")) {
		t.Fatal("an address added to the node is not found after the refresh period")
	}
	failing, err := NewServer(Config{Listen: "127.0.0.1:0", Logger: slog.New(slog.DiscardHandler),
		LocalAddrs: func() ([]netip.Addr, error) { return nil, errors.New("netlink down") }})
	if err != nil {
		t.Fatal(err)
	}
	if failing.ClientAllowed(netip.MustParseAddr("172.31.0.10")) || !failing.ClientAllowed(netip.MustParseAddr("127.0.0.1")) {
		t.Fatal("with the node's addresses unreadable, only loopback and the client prefixes are answered")
	}
}

// TestServerWarnsOnAWildcardListen: 0.0.0.0 and :: are accepted, with a warning logged and kept
// for status; a specific address gets none.
func TestServerWarnsOnAWildcardListen(t *testing.T) {
	for _, tt := range []struct {
		listen string
		warn   bool
	}{{"0.0.0.0:53", true}, {"[::]:53", true}, {"10.1.0.1:53", false}, {"127.0.0.1:53", false}} {
		var logs bytes.Buffer
		s, err := NewServer(Config{Listen: tt.listen, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if err != nil {
			t.Fatal(err)
		}
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), tt.listen)
		if warned != tt.warn || (len(s.Warnings()) > 0) != tt.warn {
			t.Errorf("%s: logged %q, warnings %q; want a warning: %v", tt.listen, logs.String(), s.Warnings(), tt.warn)
		}
		if tt.warn && !slices.ContainsFunc(s.Warnings(), func(w string) bool { return strings.Contains(w, "dns.listen") }) {
			t.Errorf("%s: the warning %q does not name dns.listen", tt.listen, s.Warnings())
		}
	}
}
