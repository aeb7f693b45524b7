package broker

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
)

// blockingCreds are credentials whose server handshakes wait for release, counting how many run.
type blockingCreds struct {
	credentials.TransportCredentials
	release       chan struct{}
	running, peak atomic.Int32
}

func (b *blockingCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	n := b.running.Add(1)
	for {
		p := b.peak.Load()
		if n <= p || b.peak.CompareAndSwap(p, n) {
			break
		}
	}
	<-b.release
	b.running.Add(-1)
	return c, nil, nil
}

func (b *blockingCreds) Clone() credentials.TransportCredentials { return b }

// At most n handshakes run at once; while connections wait for a slot a snapshot waits (idle)
// until none does, or for its maximum.
func TestHandshakesRunInSlotsAndSnapshotsWaitForTheQueue(t *testing.T) {
	creds := &blockingCreds{release: make(chan struct{})}
	h := limitHandshakes(creds, 3)
	if !h.idle(t.Context(), time.Hour) {
		t.Fatal("idle with no connection at all did not return at once")
	}
	done := make(chan struct{}, 10)
	for range 10 {
		go func() {
			_, _, _ = h.ServerHandshake(nil)
			done <- struct{}{}
		}()
	}
	deadline := time.Now().Add(5 * time.Second)
	for creds.running.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond)
	if got := creds.running.Load(); got != 3 {
		t.Fatalf("%d handshakes run with 3 slots and 10 connections", got)
	}
	// 7 connections wait: a snapshot waits for them, up to its maximum.
	start := time.Now()
	if !h.idle(t.Context(), 50*time.Millisecond) || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("idle returned after %s while 7 connections waited, want its maximum of 50ms", time.Since(start))
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if h.idle(ctx, time.Hour) {
		t.Fatal("idle with an ended context reported true")
	}
	idle := make(chan time.Time, 1)
	go func() {
		h.idle(t.Context(), time.Hour)
		idle <- time.Now()
	}()
	// Release them one by one: idle returns once the last waiting connection took a slot.
	for i := range 10 {
		creds.release <- struct{}{}
		<-done
		select {
		case <-idle:
			if i < 6 {
				t.Fatalf("idle returned after %d handshakes, with %d connections still waiting", i+1, 6-i)
			}
			for range 9 - i {
				creds.release <- struct{}{}
				<-done
			}
			if p := creds.peak.Load(); p != 3 {
				t.Fatalf("at most %d handshakes ran at once, want 3", p)
			}
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("idle never returned")
}
