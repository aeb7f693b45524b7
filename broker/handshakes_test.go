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
	if !h.waiting.idle(t.Context(), time.Now().Add(time.Hour)) {
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
	if !h.waiting.idle(t.Context(), time.Now().Add(50*time.Millisecond)) || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("idle returned after %s while 7 connections waited, want its maximum of 50ms", time.Since(start))
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if h.waiting.idle(ctx, time.Now().Add(time.Hour)) {
		t.Fatal("idle with an ended context reported true")
	}
	idle := make(chan time.Time, 1)
	go func() {
		h.waiting.idle(t.Context(), time.Now().Add(time.Hour))
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

// A backlog is idle while at most its threshold of work is in flight.
func TestABacklogIsIdleAtItsThresholdAndBusyAbove(t *testing.T) {
	b := newBacklog(2)
	soon := func() time.Time { return time.Now().Add(30 * time.Millisecond) }
	busy := func() bool {
		start := time.Now()
		b.idle(t.Context(), soon())
		return time.Since(start) >= 30*time.Millisecond
	}
	b.enter()
	b.enter()
	if busy() {
		t.Fatal("two in flight with a threshold of 2: idle waited")
	}
	b.enter()
	if !busy() {
		t.Fatal("three in flight with a threshold of 2: idle returned at once")
	}
	released := make(chan time.Duration, 1)
	go func() {
		start := time.Now()
		b.idle(t.Context(), time.Now().Add(time.Hour))
		released <- time.Since(start)
	}()
	time.Sleep(20 * time.Millisecond)
	b.leave()
	select {
	case d := <-released:
		if d < 20*time.Millisecond {
			t.Fatalf("idle returned after %s, before the third left", d)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("idle did not return once the backlog was back at its threshold")
	}
}
