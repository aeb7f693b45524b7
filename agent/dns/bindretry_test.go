package dns

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/cablemesh/cablemesh/internal/syncbuf"
)

// holdPort takes a loopback UDP port (as a predecessor that is still exiting would) and returns
// its address.
func holdPort(t *testing.T) (net.PacketConn, string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	return pc, pc.LocalAddr().String()
}

func newBindServer(t *testing.T, addr string, retry time.Duration, logs *syncbuf.Buffer) *Server {
	t.Helper()
	s, err := NewServer(Config{Listen: addr, BindRetry: retry, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Shutdown(ctx)
	})
	return s
}

// A server whose address is still held retries, logging why, and listens once it is released.
func TestStartWaitsForAnAddressInUse(t *testing.T) {
	held, addr := holdPort(t)
	var logs syncbuf.Buffer
	s := newBindServer(t, addr, 10*time.Second, &logs)
	released := make(chan time.Time, 1)
	go func() {
		time.Sleep(300 * time.Millisecond)
		held.Close()
		released <- time.Now()
	}()
	if err := s.Start(); err != nil {
		t.Fatalf("Start with the address released after 300ms: %v\n%s", err, logs.String())
	}
	started := time.Now()
	if d := started.Sub(<-released); d > 2*time.Second {
		t.Errorf("listening %s after the address was released, want within the backoff cap %s", d, maxBindRetryWait)
	}
	if !strings.Contains(logs.String(), "address in use, retrying") {
		t.Errorf("no log line saying why the start waits:\n%s", logs.String())
	}
	if err := s.Update(nil); err != nil {
		t.Fatal(err)
	}
	resp := exchange(t, "udp", addr, query("nope.clusterset.local.", mdns.TypeA))
	if resp.Rcode != mdns.RcodeNameError {
		t.Errorf("rcode %s after the retried start, want NXDOMAIN", mdns.RcodeToString[resp.Rcode])
	}
}

// An address that stays in use fails Start after BindRetry with the address in the error; a
// negative BindRetry fails at once.
func TestStartGivesUpOnAnAddressInUse(t *testing.T) {
	_, addr := holdPort(t)
	for _, tc := range []struct {
		retry   time.Duration
		atLeast time.Duration
	}{{retry: 400 * time.Millisecond, atLeast: 200 * time.Millisecond}, {retry: -1}} {
		var logs syncbuf.Buffer
		s := newBindServer(t, addr, tc.retry, &logs)
		t0 := time.Now()
		err := s.Start()
		took := time.Since(t0)
		if err == nil {
			t.Fatalf("BindRetry %s: Start on a held address succeeded", tc.retry)
		}
		if !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "address already in use") {
			t.Errorf("BindRetry %s: error %q does not name the address and the cause", tc.retry, err)
		}
		if took < tc.atLeast || took > tc.retry+2*time.Second {
			t.Errorf("BindRetry %s: gave up after %s", tc.retry, took)
		}
	}
}

// A Shutdown while Start waits for the address ends the wait; the server never listens.
func TestShutdownEndsTheBindRetry(t *testing.T) {
	_, addr := holdPort(t)
	var logs syncbuf.Buffer
	s := newBindServer(t, addr, time.Minute, &logs)
	errc := make(chan error, 1)
	go func() { errc <- s.Start() }()
	time.Sleep(100 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown while starting: %v", err)
	}
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("Start succeeded after a Shutdown")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Start still waiting 5s after Shutdown")
	}
}
