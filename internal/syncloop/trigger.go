package syncloop

import "sync"

// Trigger is a coalescing wake-up: any number of Fire calls made while the waiter is busy fold
// into one wake-up, so a burst of changes costs one more pass, never a queue of them. Its zero
// value is ready; it is safe for concurrent use.
type Trigger struct {
	once sync.Once
	ch   chan struct{}
}

func (t *Trigger) init() chan struct{} {
	// One slot: a Fire while the slot is full has nothing to add.
	t.once.Do(func() { t.ch = make(chan struct{}, 1) })
	return t.ch
}

// Fire asks for one more pass. It never blocks.
func (t *Trigger) Fire() {
	select {
	case t.init() <- struct{}{}:
	default:
	}
}

// C receives once after one or more Fire calls.
func (t *Trigger) C() <-chan struct{} { return t.init() }

// Drain forgets a pending Fire (a waiter about to do the pass anyway).
func (t *Trigger) Drain() {
	select {
	case <-t.init():
	default:
	}
}
