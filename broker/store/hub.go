package store

import (
	"context"
	"sync"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// hub hands every commit of a store to its watchers. A store holds mu across a commit and the
// publishing of its events, and across reading a new watcher's first batch and registering it,
// so that a watcher sees every revision exactly once and in order.
type hub struct {
	mu     sync.Mutex
	buffer int // batches a watcher may lag behind before it is dropped
	subs   map[*watch]struct{}
	closed bool
}

func newHub(buffer int) hub {
	return hub{buffer: buffer, subs: map[*watch]struct{}{}}
}

type watch struct {
	ch   chan Batch
	opts watchOptions
	err  error // written under hub.mu before ch is closed; read after ch is closed
}

func (w *watch) C() <-chan Batch { return w.ch }
func (w *watch) Err() error      { return w.err }

// publishLocked sends b to every watcher and drops those whose buffer is full: a slow watcher
// never blocks writers.
func (h *hub) publishLocked(b Batch) {
	for w := range h.subs {
		// Each watcher gets its own copies: the hub must not share mutable messages between
		// goroutines.
		cp := Batch{Snapshot: b.Snapshot, Revision: b.Revision, Events: cloneEvents(b.Events, w.opts)}
		select {
		case w.ch <- cp:
		default:
			h.dropLocked(w, ErrWatcherTooSlow)
		}
	}
}

func (h *hub) dropLocked(w *watch, err error) {
	if _, ok := h.subs[w]; !ok {
		return
	}
	delete(h.subs, w)
	w.err = err
	close(w.ch)
}

// subscribeLocked registers a watcher that starts with first and ends with ctx.
func (h *hub) subscribeLocked(ctx context.Context, first Batch, opts watchOptions) *watch {
	w := &watch{ch: make(chan Batch, h.buffer+1), opts: opts}
	w.ch <- first
	h.subs[w] = struct{}{}
	// The watch's context owns this goroutine; it also ends when the watch is dropped for another
	// reason, because dropLocked is idempotent and the goroutine only waits for ctx.
	go func() {
		<-ctx.Done()
		h.mu.Lock()
		h.dropLocked(w, ctx.Err())
		h.mu.Unlock()
	}()
	return w
}

// closeLocked ends every watch with ErrClosed; it reports false when the hub was closed already.
func (h *hub) closeLocked() bool {
	if h.closed {
		return false
	}
	h.closed = true
	for w := range h.subs {
		h.dropLocked(w, ErrClosed)
	}
	return true
}

// cloneEvents copies evs for one watcher: the events of kinds it omits without their resources.
func cloneEvents(evs []*apiv1.Event, opts watchOptions) []*apiv1.Event {
	out := make([]*apiv1.Event, len(evs))
	for i, e := range evs {
		if opts.omit[e.Kind] {
			out[i] = withoutResource(e)
		} else {
			out[i] = proto.Clone(e).(*apiv1.Event)
		}
	}
	return out
}

func withoutResource(e *apiv1.Event) *apiv1.Event {
	return &apiv1.Event{Type: e.Type, Kind: e.Kind, Key: e.Key, Revision: e.Revision}
}
