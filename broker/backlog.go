package broker

import (
	"context"
	"sync"
	"time"
)

// backlog counts work that waits (connections waiting for a handshake slot, registrations in
// flight) and tells when it is at most a threshold: the broker holds its largest and least
// urgent work, sending snapshots, while a fleet connects and registers (Watch).
type backlog struct {
	mu        sync.Mutex
	threshold int
	n         int
	idleCh    chan struct{} // closed while n <= threshold
}

func newBacklog(threshold int) *backlog {
	b := &backlog{threshold: threshold, idleCh: make(chan struct{})}
	close(b.idleCh)
	return b
}

func (b *backlog) enter() {
	b.mu.Lock()
	if b.n++; b.n == b.threshold+1 {
		b.idleCh = make(chan struct{})
	}
	b.mu.Unlock()
}

func (b *backlog) leave() {
	b.mu.Lock()
	if b.n--; b.n == b.threshold {
		close(b.idleCh)
	}
	b.mu.Unlock()
}

// idle returns when the backlog is at most its threshold, or at deadline, or when ctx ends
// (false then).
func (b *backlog) idle(ctx context.Context, deadline time.Time) bool {
	b.mu.Lock()
	ch := b.idleCh
	b.mu.Unlock()
	select {
	case <-ch:
		return true
	default:
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C:
	case <-ctx.Done():
		return false
	}
	return true
}
