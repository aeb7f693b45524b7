package bpflb

import (
	"context"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/bpf"
)

var (
	nameA4, nameB4 = ap(backendA4, backendPort), ap(backendB4, backendPort)
	nameA6, nameB6 = ap(backendA6, backendPort), ap(backendB6, backendPort)
)

// spreadOver checks that replies came from exactly the backends names, each with at least a
// fifth of them (a fair coin over 200 tries falls below that with a chance of about 1e-18).
func spreadOver(t *testing.T, replies map[string]int, names ...string) {
	t.Helper()
	total := 0
	for _, n := range replies {
		total += n
	}
	if len(replies) != len(names) {
		t.Errorf("answers came from %v, want %v", replies, names)
		return
	}
	for _, name := range names {
		if replies[name] < total/5 {
			t.Errorf("backend %s answered %d of %d connections: not an even spread (%v)", name, replies[name], total, replies)
		}
	}
}

func TestTCPToTheVIPReachesEachBackendEvenlyAndGetpeernameShowsTheVIP(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	startBackends(t, e, backendA4, backendB4)
	svc := service(vip4, bpf.TCP, backendA4, backendB4)
	e.sync(svc)

	r := runOK(t, e, "tcp", ap(vip4, 80), "200")
	spreadOver(t, r.Replies, nameA4, nameB4)
	if !slices.Equal(r.Peers, []string{ap(vip4, 80)}) {
		t.Errorf("getpeername: %v, want only the VIP %s", r.Peers, ap(vip4, 80))
	}

	got, err := e.lb.Services()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0].String() != ap(vip4, 80)+"/tcp" || len(got[0].Backends) != 2 {
		t.Errorf("Services: %v, want the VIP with its two backends", got)
	}
	before := e.lb.Writes()
	svc.Backends = []bpf.Backend{svc.Backends[1], svc.Backends[0]}
	e.sync(svc)
	if w := e.lb.Writes() - before; w != 0 {
		t.Errorf("a second Sync with the same services (backends in another order) made %d writes, want none", w)
	}
}

func TestUDPToTheVIPKeepsOneBackendPerSocketAndRepliesComeFromTheVIP(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	startBackends(t, e, backendA4, backendB4)
	e.sync(service(vip4, bpf.UDP, backendA4, backendB4))
	vip := ap(vip4, 80)

	r := runOK(t, e, "udp", vip, "1", "10")
	if len(r.Replies) != 1 || r.Mixed != 0 {
		t.Errorf("one socket's 10 datagrams were answered by %v, want one backend", r.Replies)
	}
	if !slices.Equal(r.Sources, []string{vip}) {
		t.Errorf("recvfrom sources: %v, want only the VIP %s", r.Sources, vip)
	}

	r = runOK(t, e, "udp", vip, "60", "3")
	spreadOver(t, r.Replies, nameA4, nameB4)
	if r.Mixed != 0 {
		t.Errorf("%d of 60 sockets were answered by both backends, want each socket to keep one", r.Mixed)
	}
	if !slices.Equal(r.Sources, []string{vip}) {
		t.Errorf("recvfrom sources: %v, want only the VIP", r.Sources)
	}

	// A connected UDP socket: getpeername and the source of the answer show the VIP.
	c := startClient(t, e, "hold-udp", vip)
	first := c.must("connected", 10*time.Second)
	if !slices.Equal(first.Peers, []string{vip}) || !slices.Equal(first.Sources, []string{vip}) {
		t.Errorf("connected UDP socket: getpeername %v, answer from %v, want the VIP", first.Peers, first.Sources)
	}
	if first.Reply != nameA4 && first.Reply != nameB4 {
		t.Errorf("connected UDP socket: answer %q, want a backend", first.Reply)
	}
}

func TestAServiceWithoutBackendsFailsConnectAndSendAtOnce(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	e.sync(service(vip4, bpf.TCP), service(vip4, bpf.UDP), service(vip6, bpf.TCP))
	for _, tc := range []struct{ name, cmd, dst string }{
		{"TCP connect to an IPv4 VIP", "connect-error", ap(vip4, 80)},
		{"UDP sendto an IPv4 VIP", "send-error", ap(vip4, 80)},
		{"TCP connect to an IPv6 VIP", "connect-error", ap(vip6, 80)},
	} {
		r := run(t, e, tc.cmd, tc.dst)
		if syscall.Errno(r.Errno) != syscall.EHOSTUNREACH {
			t.Errorf("%s without backends: error %q (errno %d), want EHOSTUNREACH", tc.name, r.Error, r.Errno)
		}
		if d := time.Duration(r.Micros) * time.Microsecond; d > 100*time.Millisecond {
			t.Errorf("%s without backends took %v to fail, want it at once", tc.name, d)
		} else {
			t.Logf("%s without backends failed with %q in %v", tc.name, r.Error, d)
		}
	}
}

func TestIPv6VIPsAndIPv4VIPsReachedFromIPv6Sockets(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	startBackends(t, e, backendA4, backendB4, backendA6, backendB6)
	e.sync(service(vip6, bpf.TCP, backendA6, backendB6), service(vip6, bpf.UDP, backendA6, backendB6),
		service(vip4, bpf.TCP, backendA4, backendB4))
	vip := ap(vip6, 80)

	r := runOK(t, e, "tcp", vip, "200")
	spreadOver(t, r.Replies, nameA6, nameB6)
	if !slices.Equal(r.Peers, []string{vip}) {
		t.Errorf("getpeername: %v, want only %s", r.Peers, vip)
	}
	r = runOK(t, e, "udp", vip, "40", "2")
	if !slices.Equal(r.Sources, []string{vip}) || r.Mixed != 0 || len(r.Replies) != 2 {
		t.Errorf("UDP over IPv6: answers %v from %v (%d sockets mixed), want both backends, each socket one, all from the VIP", r.Replies, r.Sources, r.Mixed)
	}
	// A dual-stack socket connecting to the IPv4-mapped VIP goes through connect6 to the
	// IPv4 service.
	mapped := "[::ffff:" + vip4.String() + "]:80"
	r = runOK(t, e, "tcp", mapped, "100")
	spreadOver(t, r.Replies, nameA4, nameB4)
	if !slices.Equal(r.Peers, []string{mapped}) {
		t.Errorf("getpeername of the mapped VIP: %v, want %s", r.Peers, mapped)
	}
}

func TestDestroySocketsAbortsTheTranslatedSocketsOfARemovedBackend(t *testing.T) {
	for _, method := range []bpf.DestroyMethod{bpf.DestroyIterator, bpf.DestroySockDiag} {
		t.Run(string(method), func(t *testing.T) {
			e := newEnv(t, method)
			bs := startBackends(t, e, backendA4, backendB4)
			vip := ap(vip4, 80)
			withA := []bpf.Service{service(vip4, bpf.TCP, backendA4), service(vip4, bpf.UDP, backendA4)}
			withB := []bpf.Service{service(vip4, bpf.TCP, backendB4), service(vip4, bpf.UDP, backendB4)}

			// Sockets to B through the VIP, then to A through the VIP, and to A directly.
			e.sync(withB...)
			tcpB, udpB := startClient(t, e, "hold-tcp", vip), startClient(t, e, "hold-udp", vip)
			for _, c := range []*client{tcpB, udpB} {
				if r := c.must("connected", 10*time.Second); r.Reply != nameB4 {
					t.Fatalf("a socket through the VIP with only B reached %q", r.Reply)
				}
			}
			e.sync(withA...)
			tcpA, udpA := startClient(t, e, "hold-tcp", vip), startClient(t, e, "hold-udp", vip)
			direct := startClient(t, e, "hold-tcp", nameA4)
			for _, c := range []*client{tcpA, udpA, direct} {
				if r := c.must("connected", 10*time.Second); r.Reply != nameA4 {
					t.Fatalf("a socket meant for A reached %q", r.Reply)
				}
			}

			// A leaves, B comes back: the sockets translated to A go, the others stay.
			e.sync(withB...)
			gone := bpf.Gone(withA, withB)
			start := time.Now()
			n, err := e.lb.DestroySockets(context.Background(), gone)
			if err != nil {
				t.Fatalf("DestroySockets(%v): %v", gone, err)
			}
			t.Logf("destroyed %d sockets in %v", n, time.Since(start))
			if n != 2 {
				t.Errorf("DestroySockets(%v) destroyed %d sockets, want 2 (the TCP connection and the UDP socket through the VIP)", gone, n)
			}
			// The abort is synchronous: the blocked reads fail at once. The ceiling is for
			// loaded machines; the log shows the real delay.
			for _, c := range []struct {
				name string
				c    *client
			}{{"TCP connection", tcpA}, {"connected UDP socket", udpA}} {
				r := c.c.must("closed", 5*time.Second)
				t.Logf("%s to the removed backend: %q, %v after DestroySockets began", c.name, r.Error, time.Since(start))
				if syscall.Errno(r.Errno) != syscall.ECONNABORTED {
					t.Errorf("%s to the removed backend ended with %q (errno %d), want ECONNABORTED", c.name, r.Error, r.Errno)
				}
			}
			bs.push(t, "still-here")
			for _, c := range []struct {
				name string
				c    *client
			}{{"TCP connection through the VIP to B", tcpB}, {"UDP socket through the VIP to B", udpB}, {"direct TCP connection to A", direct}} {
				if r := c.c.must("data", 5*time.Second); r.Reply != "still-here" {
					t.Errorf("%s: got %+v after the destroy, want it alive", c.name, r)
				}
			}
			if r := runOK(t, e, "tcp", vip, "5"); r.Replies[nameB4] != 5 {
				t.Errorf("new connections after A left reached %v, want B", r.Replies)
			}
		})
	}
}
