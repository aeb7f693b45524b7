package bpflb

import (
	"bufio"
	"net"
	"net/netip"
	"sync"
	"testing"
)

// backends are TCP and UDP servers in the backend namespace, one per address, each answering
// with its own address and port ("10.231.0.2:8080") so that a client can tell which one it
// reached. They keep TCP connections open until the client closes them, and remember the UDP
// clients, so that push can prove a connection still works.
type backends struct {
	mu       sync.Mutex
	conns    []net.Conn
	udp      []*net.UDPConn
	udpPeers map[*net.UDPConn]map[netip.AddrPort]bool
	wg       sync.WaitGroup
}

func startBackends(t *testing.T, e *env, addrs ...netip.Addr) *backends {
	t.Helper()
	b := &backends{udpPeers: map[*net.UDPConn]map[netip.AddrPort]bool{}}
	var listeners []net.Listener
	err := inNamespace(e.backendNS, func() error {
		for _, a := range addrs {
			name := ap(a, backendPort)
			l, err := net.Listen("tcp", name)
			if err != nil {
				return err
			}
			listeners = append(listeners, l)
			u, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(a, backendPort)))
			if err != nil {
				return err
			}
			b.udp = append(b.udp, u)
			b.udpPeers[u] = map[netip.AddrPort]bool{}
			b.wg.Add(2)
			go b.serveTCP(l, name)
			go b.serveUDP(u, name)
		}
		return nil
	})
	// Cleanups run last registered first: the servers close before their namespace goes.
	t.Cleanup(func() {
		for _, l := range listeners {
			l.Close()
		}
		b.mu.Lock()
		for _, c := range b.conns {
			c.Close()
		}
		for _, u := range b.udp {
			u.Close()
		}
		b.mu.Unlock()
		b.wg.Wait()
	})
	if err != nil {
		t.Fatalf("start backends: %v", err)
	}
	return b
}

func (b *backends) serveTCP(l net.Listener, name string) {
	defer b.wg.Done()
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		b.mu.Lock()
		b.conns = append(b.conns, c)
		b.mu.Unlock()
		b.wg.Add(1)
		go func() { // owned by the listener's cleanup, which closes c
			defer b.wg.Done()
			if _, err := c.Write([]byte(name + "\n")); err != nil {
				return
			}
			sc := bufio.NewScanner(c)
			for sc.Scan() {
			}
		}()
	}
}

func (b *backends) serveUDP(u *net.UDPConn, name string) {
	defer b.wg.Done()
	buf := make([]byte, 1500)
	for {
		_, from, err := u.ReadFromUDPAddrPort(buf)
		if err != nil {
			return
		}
		b.mu.Lock()
		b.udpPeers[u][from] = true
		b.mu.Unlock()
		_, _ = u.WriteToUDPAddrPort([]byte(name), from)
	}
}

// push sends a line to every open TCP connection and a datagram to every UDP client.
func (b *backends) push(t *testing.T, msg string) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.conns {
		_, _ = c.Write([]byte(msg + "\n"))
	}
	for u, peers := range b.udpPeers {
		for p := range peers {
			_, _ = u.WriteToUDPAddrPort([]byte(msg), p)
		}
	}
}
