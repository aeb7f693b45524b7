// Command delayrelay forwards UDP between two WireGuard endpoints and holds every datagram for
// -delay first, for the handshake-race test of the wireguard driver: the kernel here may have no
// netem, and a delay longer than the gap between the two sides' Connects is what makes their
// first handshake initiations cross in flight every time.
//
// Datagrams from -b go to -a; every other datagram goes to -b. Point side a's peer endpoint at
// -listen (side b's peer endpoint follows by roaming, or can be set to -listen too). Once it
// listens it writes {"pid": N} to -status. It runs until it is killed.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"
)

func main() {
	listen := flag.String("listen", "", "address:port to listen on")
	a := flag.String("a", "", "address:port of side a")
	b := flag.String("b", "", "address:port of side b")
	delay := flag.Duration("delay", 100*time.Millisecond, "how long each datagram is held")
	status := flag.String("status", "", "status file written once listening")
	flag.Parse()
	if err := run(*listen, *a, *b, *delay, *status); err != nil {
		fmt.Fprintln(os.Stderr, "delayrelay:", err)
		os.Exit(1)
	}
}

func run(listen, a, b string, delay time.Duration, status string) error {
	la, err := netip.ParseAddrPort(listen)
	if err != nil {
		return fmt.Errorf("-listen %q: %w", listen, err)
	}
	aa, err := netip.ParseAddrPort(a)
	if err != nil {
		return fmt.Errorf("-a %q: %w", a, err)
	}
	ba, err := netip.ParseAddrPort(b)
	if err != nil {
		return fmt.Errorf("-b %q: %w", b, err)
	}
	c, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(la))
	if err != nil {
		return fmt.Errorf("listen on %s: %w", la, err)
	}
	data, _ := json.Marshal(map[string]int{"pid": os.Getpid()})
	if err := os.WriteFile(status, data, 0o644); err != nil {
		return fmt.Errorf("-status %q: %w", status, err)
	}
	buf := make([]byte, 65536)
	for {
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		to := ba
		if netip.AddrPortFrom(from.Addr().Unmap(), from.Port()) == ba {
			to = aa
		}
		pkt := append([]byte(nil), buf[:n]...)
		// The process ends by being killed, which ends these timers too.
		time.AfterFunc(delay, func() { c.WriteToUDPAddrPort(pkt, to) })
	}
}
