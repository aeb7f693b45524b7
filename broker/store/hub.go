package store

import (
	"context"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// hub hands every commit of a store to its watchers. A store publishes a commit's events under
// mu, in revision order, after the commit. A new watcher's first batch is read without mu (a
// snapshot of a large mesh takes milliseconds, and a thousand agents starting at once would hold
// every commit behind theirs), then the watcher subscribes under mu and gets first the batches
// published since the revision it read (recent keeps them); a commit that is published after it
// subscribed but that its first batch already holds (the store committed, and had not yet
// published, when the first batch was read) it skips (watch.from). So a watcher sees every
// revision exactly once and in order.
//
// The events of a published batch are shared by every watcher (and so is a snapshot, see
// snapshotLocked): at a thousand watchers, a copy per watcher of every event was most of the
// broker's work and memory when a fleet started at once. Watchers must not modify them.
type hub struct {
	mu          sync.Mutex
	buffer      int // batches a watcher may lag behind before it is dropped
	bufferBytes int // bytes of delta batches (encoded, as sent to it) a watcher may lag behind
	subs        map[*watch]struct{}
	closed      bool
	// snaps are the last snapshot, by the kinds their watchers omit, to share between the
	// watchers that start later: brought up to date with the batches published since it was
	// read (advanceLocked), as long as recent holds them. A fleet registering at once commits
	// every few milliseconds; a fresh read per commit was a decoding (and, in the broker, an
	// encoding) of the whole mesh for every few watchers.
	snaps map[string]Batch
	// published is the revision of the last batch published; recent the last batches published
	// (at most maxRecent, and at most maxRecentBytes of events, ascending, contiguous), for
	// watchers whose first batch is older; recentBytes the size of their events, and
	// recentSizes the size of each.
	published   uint64
	recent      []Batch
	recentSizes []int
	recentBytes int
	// reading are the snapshot reads in flight, by the kinds their watchers omit: a watcher
	// that starts meanwhile waits for one and shares it instead of reading its own (while a
	// fleet registers, commits come too fast for snaps to serve many).
	reading map[string]*snapshotRead
}

// snapshotRead is one snapshot read in flight; b and err are set before done is closed.
type snapshotRead struct {
	done chan struct{}
	b    Batch
	err  error
}

// maxRecent is how many published batches the hub keeps for watchers that subscribe after them,
// and maxRecentBytes how large their events may be together, encoded (what they hold decoded in
// the heap is several times that: about 7x for exports of many endpoints). A fleet that starts
// at once commits hundreds of small batches a second, which the count serves; the bytes bound a
// few large ones. Counted only, one agent that wrote its 512 exports of 128 endpoints and
// withdrew them, again and again, kept 256 of those commits, gigabytes, past the broker's
// 512Mi limit. A watcher whose first batch is older than what recent keeps reads another
// (subscribe), so the bound costs a read, never a revision.
const (
	maxRecent      = 256
	maxRecentBytes = 4 << 20
)

// firstReadAttempts is how often subscribe reads a first batch without the lock before it reads
// one under it (when commits came faster than recent could cover).
const firstReadAttempts = 3

func newHub(opts Options) hub {
	return hub{buffer: opts.WatchBuffer, bufferBytes: opts.WatchBufferBytes, subs: map[*watch]struct{}{}}
}

type watch struct {
	ch   chan Batch
	opts watchOptions
	from uint64 // the revision of the first batch: later batches up to it are not sent
	err  error  // written under hub.mu before ch is closed; read after ch is closed
	// sizes[head:] are the sizes of the batches sent on ch, oldest first, as far as the watcher
	// may not have received them yet, and queued their sum (under hub.mu). ch is first in, first
	// out, so those it received are the oldest: as many as ch holds fewer than sizes. The first
	// batch counts 0: a snapshot is the state itself, shared, and no lag.
	sizes  []int
	head   int
	queued int
}

// lagging reports whether w, sent a batch of n more bytes, would hold more than limit bytes it
// has not received. A watcher that received everything takes any one batch, however large.
func (w *watch) lagging(n, limit int) bool {
	for len(w.sizes)-w.head > len(w.ch) {
		w.queued -= w.sizes[w.head]
		w.head++
	}
	if w.head > 0 && w.head >= len(w.sizes)-w.head {
		// Move what is left to the front of the same array: it stays no larger than the most
		// the watcher lagged by, and needs no allocation per batch.
		w.sizes = w.sizes[:copy(w.sizes, w.sizes[w.head:])]
		w.head = 0
	}
	return w.queued > 0 && w.queued+n > limit
}

// sent records a batch of n bytes sent on w.ch.
func (w *watch) sent(n int) {
	w.sizes = append(w.sizes, n)
	w.queued += n
}

func (w *watch) C() <-chan Batch { return w.ch }
func (w *watch) Err() error      { return w.err }

// publishLocked sends b to every watcher and drops those whose buffer is full (in batches or
// in bytes): a slow watcher never blocks writers, nor holds more than bufferBytes of commits
// that every other watcher has received.
func (h *hub) publishLocked(b Batch) {
	h.published = b.Revision
	size := h.keepRecentLocked(b)
	// One copy of the events for the watchers that want every resource, one bare copy per set of
	// omitted kinds: never one per watcher.
	type bareCopy struct {
		evs  []*apiv1.Event
		size int
	}
	var bare map[string]bareCopy
	for w := range h.subs {
		if b.Revision <= w.from {
			continue // its first batch holds this commit already
		}
		evs, n := b.Events, size
		if len(w.opts.omit) > 0 && omitsAny(b.Events, w.opts) {
			sig := w.opts.signature()
			c, ok := bare[sig]
			if !ok {
				if bare == nil {
					bare = map[string]bareCopy{}
				}
				c.evs = omitEvents(b.Events, w.opts)
				c.size = eventsBytes(c.evs)
				bare[sig] = c
			}
			evs, n = c.evs, c.size
		}
		if w.lagging(n, h.bufferBytes) {
			h.dropLocked(w, ErrWatcherTooSlow)
			continue
		}
		select {
		case w.ch <- Batch{Snapshot: b.Snapshot, Revision: b.Revision, Events: evs}:
			w.sent(n)
		default:
			h.dropLocked(w, ErrWatcherTooSlow)
		}
	}
}

// keepRecentLocked adds b to recent and drops the oldest batches until recent is within
// maxRecent batches and maxRecentBytes; a batch larger than maxRecentBytes alone is not kept at
// all (the watchers that would need it read a snapshot or the log instead).
func (h *hub) keepRecentLocked(b Batch) (size int) {
	size = eventsBytes(b.Events)
	h.recent = append(h.recent, b)
	h.recentSizes = append(h.recentSizes, size)
	h.recentBytes += size
	drop := 0
	for drop < len(h.recent) && (len(h.recent)-drop > maxRecent || h.recentBytes > maxRecentBytes) {
		h.recentBytes -= h.recentSizes[drop]
		drop++
	}
	if drop > 0 {
		// A new array: the dropped batches' events must not stay reachable from the old one.
		h.recent = append([]Batch(nil), h.recent[drop:]...)
		h.recentSizes = append([]int(nil), h.recentSizes[drop:]...)
	}
	return size
}

// eventsBytes is the size of evs, encoded.
func eventsBytes(evs []*apiv1.Event) int {
	n := 0
	for _, ev := range evs {
		n += proto.Size(ev)
	}
	return n
}

// advanceLocked is snapshot snap, read earlier for watchers with opts, brought up to the last
// batch published: the batches published since applied to it (their events replace, add and
// delete its own; unchanged events stay the same pointers, so their encodings are shared too).
// ok is false when recent no longer holds every batch since snap, or when they hold more events
// than snap itself plus a few: a fresh read is then as cheap.
func (h *hub) advanceLocked(snap Batch, opts watchOptions) (Batch, bool) {
	backlog, ok := h.sinceLocked(snap.Revision)
	if !ok {
		return Batch{}, false
	}
	if len(backlog) == 0 {
		return snap, true
	}
	n := 0
	for _, b := range backlog {
		n += len(b.Events)
	}
	if n > len(snap.Events)+64 {
		return Batch{}, false
	}
	type ref struct{ kind, key string }
	last := map[ref]*apiv1.Event{} // the last event of each resource the backlog changed
	var order []ref                // the resources it changed, in the order they first changed
	for _, b := range backlog {
		for _, ev := range b.Events {
			r := ref{ev.Kind, ev.Key}
			if _, seen := last[r]; !seen {
				order = append(order, r)
			}
			last[r] = ev
		}
	}
	out := Batch{Snapshot: true, Revision: backlog[len(backlog)-1].Revision, Events: make([]*apiv1.Event, 0, len(snap.Events)+len(order))}
	for _, ev := range snap.Events {
		r := ref{ev.Kind, ev.Key}
		nev, changed := last[r]
		switch {
		case !changed:
			out.Events = append(out.Events, ev)
		case nev.Type == apiv1.Event_UPSERT:
			out.Events = append(out.Events, nev)
		}
		delete(last, r)
	}
	for _, r := range order {
		if ev, ok := last[r]; ok && ev.Type == apiv1.Event_UPSERT && !opts.omit[ev.Kind] {
			out.Events = append(out.Events, ev)
		}
	}
	return out, true
}

// forgetLocked empties recent and drops the shared snapshots: the store could not publish a
// contiguous sequence (Etcd), so the next watchers read their first batch afresh.
func (h *hub) forgetLocked() {
	h.recent, h.recentSizes, h.recentBytes = nil, nil, 0
	h.snaps = nil
}

// subscribe starts a watch: read reads its first batch from the store, without the hub's lock
// (a snapshot for a watcher from revision 0 is shared with the other watchers that start before
// the next commit); then, under the lock, the watcher registers and gets the batches published
// since. It returns ErrClosed once the hub is closed.
func (h *hub) subscribe(ctx context.Context, since uint64, opts watchOptions, read func() (Batch, error)) (*watch, error) {
	sig := opts.signature()
	for attempt := 0; ; attempt++ {
		h.mu.Lock()
		if h.closed {
			h.mu.Unlock()
			return nil, ErrClosed
		}
		if attempt == firstReadAttempts {
			// Commits keep outrunning recent: read under the lock, which holds them back.
			defer h.mu.Unlock()
			first, err := read()
			if err != nil {
				return nil, err
			}
			return h.subscribeLocked(ctx, first, opts), nil
		}
		first, cached := h.snaps[sig]
		if cached && since == 0 {
			if first, cached = h.advanceLocked(first, opts); cached {
				h.snaps[sig] = first
			}
		} else {
			cached = false
		}
		var (
			shared *snapshotRead // a read of another watcher, to wait for
			own    *snapshotRead // this watcher's read, for others to share
		)
		if !cached && since == 0 {
			if shared = h.reading[sig]; shared == nil {
				own = &snapshotRead{done: make(chan struct{})}
				if h.reading == nil {
					h.reading = map[string]*snapshotRead{}
				}
				h.reading[sig] = own
			}
		}
		h.mu.Unlock()
		var err error
		switch {
		case cached:
		case shared != nil:
			<-shared.done
			first, err = shared.b, shared.err
		default:
			first, err = read()
		}
		h.mu.Lock()
		if own != nil {
			own.b, own.err = first, err
			delete(h.reading, sig)
			close(own.done)
		}
		if err != nil {
			h.mu.Unlock()
			return nil, err
		}
		if h.closed {
			h.mu.Unlock()
			return nil, ErrClosed
		}
		if own != nil && first.Snapshot && first.Revision >= h.snaps[sig].Revision {
			if h.snaps == nil {
				h.snaps = map[string]Batch{}
			}
			h.snaps[sig] = first
		}
		backlog, ok := h.sinceLocked(first.Revision)
		if ok && len(backlog)+1 <= h.buffer {
			w := h.subscribeLocked(ctx, first, opts)
			for _, b := range backlog {
				b = h.forWatcher(w, b)
				w.ch <- b
				w.sent(eventsBytes(b.Events))
			}
			h.mu.Unlock()
			return w, nil
		}
		h.mu.Unlock()
	}
}

// sinceLocked returns the published batches after rev; ok is false when recent no longer holds
// all of them.
func (h *hub) sinceLocked(rev uint64) (out []Batch, ok bool) {
	if rev >= h.published {
		return nil, true
	}
	i := len(h.recent)
	for i > 0 && h.recent[i-1].Revision > rev {
		i--
	}
	if i == 0 {
		// The oldest batch kept must begin right after rev.
		if len(h.recent) == 0 || len(h.recent[0].Events) == 0 || h.recent[0].Events[0].Revision > rev+1 {
			return nil, false
		}
	}
	return h.recent[i:], true
}

// forWatcher is b as watcher w receives it: without the resources of the kinds it omits.
func (h *hub) forWatcher(w *watch, b Batch) Batch {
	if len(w.opts.omit) > 0 && omitsAny(b.Events, w.opts) {
		b.Events = omitEvents(b.Events, w.opts)
	}
	return b
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
	w := &watch{ch: make(chan Batch, h.buffer+1), opts: opts, from: first.Revision}
	w.ch <- first
	w.sent(0)
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

// omitsAny reports whether evs holds an event of a kind opts omits.
func omitsAny(evs []*apiv1.Event, opts watchOptions) bool {
	for _, e := range evs {
		if opts.omit[e.Kind] {
			return true
		}
	}
	return false
}

// omitEvents is evs with the events of kinds opts omits without their resources (new events;
// the others are evs's own).
func omitEvents(evs []*apiv1.Event, opts watchOptions) []*apiv1.Event {
	out := make([]*apiv1.Event, len(evs))
	for i, e := range evs {
		if opts.omit[e.Kind] {
			out[i] = withoutResource(e)
		} else {
			out[i] = e
		}
	}
	return out
}

// signature names the set of omitted kinds (the key of shared copies).
func (o watchOptions) signature() string {
	ks := make([]string, 0, len(o.omit))
	for k, on := range o.omit {
		if on {
			ks = append(ks, k)
		}
	}
	slices.Sort(ks)
	return strings.Join(ks, ",")
}

func withoutResource(e *apiv1.Event) *apiv1.Event {
	return &apiv1.Event{Type: e.Type, Kind: e.Kind, Key: e.Key, Revision: e.Revision}
}
