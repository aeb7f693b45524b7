package dns

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// Backoff of the bind retries: from firstBindRetry, doubling up to maxBindRetryWait.
const (
	firstBindRetry   = 20 * time.Millisecond
	maxBindRetryWait = time.Second
)

// anyPortTries is how many UDP ports listenUDPAndTCP tries when any port will do: the TCP port
// of the same number may be taken (by any TCP socket, a connection's ephemeral port too).
const anyPortTries = 10

// listenUDPAndTCP listens on addr over UDP and over TCP on the same port. With port 0, TCP takes
// the port UDP was given, and another one is tried when that TCP port is taken.
func listenUDPAndTCP(addr string) (net.PacketConn, net.Listener, error) {
	tries := 1
	if _, port, err := net.SplitHostPort(addr); err == nil && port == "0" {
		tries = anyPortTries
	}
	for i := 1; ; i++ {
		pc, err := net.ListenPacket("udp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("dns server: listen udp %s: %w", addr, err)
		}
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			return pc, ln, nil
		}
		pc.Close()
		if i >= tries || !errors.Is(err, syscall.EADDRINUSE) {
			return nil, nil, fmt.Errorf("dns server: listen tcp %s: %w", pc.LocalAddr(), err)
		}
	}
}

// listen is listenUDPAndTCP on cfg.Listen, tried again with backoff while the address is in use,
// for up to cfg.BindRetry or until Shutdown.
func (s *Server) listen() (net.PacketConn, net.Listener, error) {
	giveUp := time.Now().Add(s.cfg.BindRetry)
	wait := firstBindRetry
	for tries := 1; ; tries++ {
		pc, ln, err := listenUDPAndTCP(s.cfg.Listen)
		if err == nil || !errors.Is(err, syscall.EADDRINUSE) {
			return pc, ln, err
		}
		if time.Now().Add(wait).After(giveUp) {
			return nil, nil, fmt.Errorf("%w (still in use after %d tries over %s)", err, tries, s.cfg.BindRetry)
		}
		s.log.Warn("dns server: address in use, retrying; an agent killed just before may still hold it while it exits",
			"addr", s.cfg.Listen, "try", tries, "retryIn", wait, "err", err)
		select {
		case <-s.ctx.Done():
			return nil, nil, fmt.Errorf("dns server: shut down while waiting for %s: %w", s.cfg.Listen, err)
		case <-time.After(wait):
		}
		wait = min(2*wait, maxBindRetryWait)
	}
}
