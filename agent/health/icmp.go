package health

import (
	"bytes"
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// TimeoutError is a probe that got no answer in time.
type TimeoutError struct{ After time.Duration }

func (e *TimeoutError) Error() string { return "timeout after " + e.After.String() }

// IsTimeout reports whether err is a probe timeout (the remote did not answer), as opposed to a
// local failure to send.
func IsTimeout(err error) bool {
	var te *TimeoutError
	return errors.As(err, &te)
}

// ICMP is a Pinger that sends ICMP (v4 or v6) echo requests from a source address to a
// destination over a privileged raw socket bound to the source, so the kernel sends them with
// that source (this node's health-check address) along the route to the destination (the
// cable). It needs CAP_NET_RAW; the agent runs as root.
//
// The raw socket is opened in the network namespace of the calling thread when NewICMP runs and
// stays there; tests that probe inside a namespace call NewICMP from a thread switched into it.
type ICMP struct {
	src, dst netip.Addr
	v6       bool
	id       int
	token    [8]byte // echo payload, so a reply is ours and not another prober's with our ID

	mu   sync.Mutex // one probe at a time
	conn *icmp.PacketConn
	seq  int
}

// idCounter hands out echo identifiers. Every raw ICMP socket receives every echo reply sent to
// its address, so probers sharing a source tell theirs apart by identifier (and payload); a
// random start keeps two agents on one host (tests) apart as well.
var idCounter atomic.Uint32

func init() { idCounter.Store(rand.Uint32()) }

// NewICMP opens the raw socket for probing dst from src. Both must be of the same family.
func NewICMP(src, dst netip.Addr) (*ICMP, error) {
	src, dst = src.Unmap(), dst.Unmap()
	if !src.IsValid() || !dst.IsValid() {
		return nil, fmt.Errorf("icmp probe from %v to %v: both addresses are required", src, dst)
	}
	if src.Is4() != dst.Is4() {
		return nil, fmt.Errorf("icmp probe from %s to %s: address families differ", src, dst)
	}
	p := &ICMP{src: src, dst: dst, v6: dst.Is6(), id: int(idCounter.Add(1) & 0xffff)}
	_, _ = crand.Read(p.token[:]) // never fails (crypto/rand panics rather than return short)
	network := "ip4:icmp"
	if p.v6 {
		network = "ip6:ipv6-icmp"
	}
	c, err := icmp.ListenPacket(network, src.String())
	if err != nil {
		return nil, fmt.Errorf("icmp probe to %s: open raw socket on %s: %w", dst, src, err)
	}
	p.conn = c
	return p, nil
}

// Ping sends one echo request and waits up to timeout (or until ctx ends) for its reply.
func (p *ICMP) Ping(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return 0, fmt.Errorf("icmp probe to %s: closed", p.dst)
	}
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	conn := p.conn
	p.seq = (p.seq + 1) & 0xffff
	var typ icmp.Type = ipv4.ICMPTypeEcho
	if p.v6 {
		typ = ipv6.ICMPTypeEchoRequest
	}
	msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: p.id, Seq: p.seq, Data: p.token[:]}}
	// For ICMPv6 the kernel computes the checksum of raw ICMPv6 sockets, so no pseudo-header.
	wb, err := msg.Marshal(nil)
	if err != nil {
		return 0, fmt.Errorf("icmp probe to %s: marshal echo: %w", p.dst, err)
	}

	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if err := p.conn.SetReadDeadline(deadline); err != nil {
		return 0, fmt.Errorf("icmp probe to %s: set deadline: %w", p.dst, err)
	}
	// Cancelling ctx ends the wait at once, so stopping a prober never waits out a timeout.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetReadDeadline(time.Now()) })
	defer stop()

	start := time.Now()
	if _, err := p.conn.WriteTo(wb, &net.IPAddr{IP: p.dst.AsSlice()}); err != nil {
		return 0, fmt.Errorf("send echo to %s: %w", p.dst, unwrapOp(err))
	}
	proto := 1 // ICMPv4
	if p.v6 {
		proto = 58
	}
	rb := make([]byte, 1500)
	for {
		n, peer, err := p.conn.ReadFrom(rb)
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return 0, &TimeoutError{After: timeout}
			}
			return 0, fmt.Errorf("read echo reply from %s: %w", p.dst, unwrapOp(err))
		}
		rtt := time.Since(start)
		if !p.isReply(rb[:n], peer, proto) {
			continue
		}
		return rtt, nil
	}
}

// isReply tells our echo reply from everything else a raw socket receives: replies to other
// probers, echo requests others send us, errors.
func (p *ICMP) isReply(b []byte, peer net.Addr, proto int) bool {
	ia, ok := peer.(*net.IPAddr)
	if !ok {
		return false
	}
	from, ok := netip.AddrFromSlice(ia.IP)
	if !ok || from.Unmap() != p.dst {
		return false
	}
	m, err := icmp.ParseMessage(proto, b)
	if err != nil {
		return false
	}
	if m.Type != ipv4.ICMPTypeEchoReply && m.Type != ipv6.ICMPTypeEchoReply {
		return false
	}
	e, ok := m.Body.(*icmp.Echo)
	return ok && e.ID == p.id && e.Seq == p.seq && bytes.Equal(e.Data, p.token[:])
}

// Close closes the socket.
func (p *ICMP) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conn == nil {
		return nil
	}
	err := p.conn.Close()
	p.conn = nil
	return err
}

// unwrapOp drops net.OpError's "write ip4 10.1.0.1->10.2.0.1:" prefix: the caller names the peer.
func unwrapOp(err error) error {
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Err != nil {
		return oe.Err
	}
	return err
}

// RouteSource is the source address the kernel picks for packets to dst (for a probe that has
// no configured source): connecting a UDP socket sends nothing but runs the route lookup.
func RouteSource(dst netip.Addr) (netip.Addr, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9)))
	if err != nil {
		return netip.Addr{}, fmt.Errorf("no route to %s: %w", dst, err)
	}
	defer func() { _ = c.Close() }()
	la, ok := c.LocalAddr().(*net.UDPAddr)
	if !ok {
		return netip.Addr{}, fmt.Errorf("no source address towards %s", dst)
	}
	return la.AddrPort().Addr().Unmap(), nil
}
