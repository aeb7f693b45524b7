package broker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// maxImportViews is how many views the tracker keeps, and maxImportViewBytes how large the
// imports may be (encoded) that the views after the oldest merged afresh (each view shares the
// entries of the services it did not merge again with the view before it; in the heap the
// imports take several times their encoded size). A watcher asks for the view of the revision
// it is at; one that lags by more views than these keep gets the oldest view kept, which is
// newer than its revision (it then sees the imports a little before the events; the next
// message catches the events up). Counted only, one agent that exported and withdrew 512
// services of 128 endpoints again and again kept 8 full copies of them.
const (
	maxImportViews     = 16
	maxImportViewBytes = 4 << 20
)

// importTracker computes the mesh's service imports and pair decisions once per revision that
// can change them, for every watcher to share. It follows the store's watch like a watcher does
// (so it sees exactly the revisions watchers see), feeds importState, and publishes an
// importView for every batch that touched clusters, policies, exports or VIPs. A watcher at
// revision R waits until the tracker has applied R and takes the newest view at or before R:
// the imports it sends always match the events it sent.
type importTracker struct {
	log      *slog.Logger
	stopping <-chan struct{} // closed when the broker shuts down: waiting watchers give up

	mu      sync.Mutex
	applied uint64        // the revision of the last batch applied
	views   []*importView // ascending revisions, at most maxImportViews
	changed chan struct{} // closed, and replaced, whenever applied moves or the tracker stops
	err     error         // why the tracker stopped; nil while it runs
}

func newImportTracker(log *slog.Logger, stopping <-chan struct{}) *importTracker {
	return &importTracker{log: log, stopping: stopping, changed: make(chan struct{})}
}

// start subscribes to st now, so that every watch started later is at a revision the tracker
// will apply, and follows it until ctx ends; wg tracks the goroutine.
func (t *importTracker) start(ctx context.Context, st store.Store, wg *sync.WaitGroup) error {
	w, err := st.Watch(ctx, 0, store.OmitResources(store.KindNodeCertificate))
	if err != nil {
		return fmt.Errorf("follow the store for service imports: %w", err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.stop(t.run(ctx, st, w))
	}()
	return nil
}

// run applies every batch of w, and of the watches that resume it whenever the store ends one
// (too slow, or a replica that lost etcd for a while), until ctx ends or the store closes. w
// starts with a snapshot, so the first batch always makes a view. It used to stop for good on
// anything but "too slow": after an etcd outage, or a health check that timed out under load,
// every agent's watch then failed at its first message on that replica until it was restarted.
func (t *importTracker) run(ctx context.Context, st store.Store, w store.Watch) error {
	state := newImportState()
	var since uint64
	bo := retry.Backoff{Min: 100 * time.Millisecond, Max: 5 * time.Second}
	for {
		for b := range w.C() {
			if state.apply(b) {
				v, err := state.view(b.Revision)
				if err != nil {
					t.log.Error("resolve connection policies for service imports; no other cluster's services are imported until this is fixed", "revision", b.Revision, "err", err)
				}
				t.publish(b.Revision, v)
			} else {
				t.publish(b.Revision, nil)
			}
			since = b.Revision
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		err := w.Err()
		if errors.Is(err, store.ErrClosed) {
			return err
		}
		if errors.Is(err, store.ErrWatcherTooSlow) {
			t.log.Warn("service import tracker fell behind the store; resuming", "revision", since)
		} else {
			t.log.Warn("service import tracker's watch of the store ended; resuming", "revision", since, "err", err)
		}
		// Resumed from the last revision applied: the store sends what followed (or a snapshot,
		// which state.apply takes as a whole). While the store cannot be read, try again.
		for {
			if w, err = st.Watch(ctx, since, store.OmitResources(store.KindNodeCertificate)); err == nil {
				break
			}
			if errors.Is(err, store.ErrClosed) || ctx.Err() != nil {
				return err
			}
			t.log.Warn("service import tracker cannot watch the store; trying again", "revision", since, "err", err)
			if !retry.Sleep(ctx, bo.Next()) {
				return ctx.Err()
			}
		}
		bo.Reset()
	}
}

// publish records that revision rev is applied, with its new view when it has one.
func (t *importTracker) publish(rev uint64, v *importView) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v != nil {
		t.views = append(t.views, v)
		t.trimViewsLocked()
	}
	t.applied = rev
	close(t.changed)
	t.changed = make(chan struct{})
}

// trimViewsLocked drops the oldest views until at most maxImportViews are left and the views
// after the oldest merged at most maxImportViewBytes; it always keeps the newest.
func (t *importTracker) trimViewsLocked() {
	bytes := 0
	for _, v := range t.views[1:] {
		bytes += v.mergedBytes
	}
	drop := 0
	for len(t.views)-drop > 1 && (len(t.views)-drop > maxImportViews || bytes > maxImportViewBytes) {
		drop++
		bytes -= t.views[drop].mergedBytes // the new oldest: what it shares with no view kept is held anyway
	}
	if drop > 0 {
		// A new array: the dropped views must not stay reachable from the old one.
		t.views = append([]*importView(nil), t.views[drop:]...)
	}
}

func (t *importTracker) stop(err error) {
	if err == nil {
		err = errors.New("stopped")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.err = err
	close(t.changed)
	t.changed = make(chan struct{})
}

// at returns the view as of revision rev, waiting for the tracker to apply it.
func (t *importTracker) at(ctx context.Context, rev uint64) (*importView, error) {
	for {
		t.mu.Lock()
		if t.err != nil {
			err := t.err
			t.mu.Unlock()
			return nil, unavailableError{fmt.Errorf("service imports are not available: %v; reconnect with since_revision", err)}
		}
		if len(t.views) > 0 && t.applied >= rev {
			v := t.views[0]
			for _, x := range t.views[1:] {
				if x.rev > rev {
					break
				}
				v = x
			}
			t.mu.Unlock()
			return v, nil
		}
		ch := t.changed
		t.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.stopping:
			return nil, unavailableError{errStopping}
		}
	}
}

// agentEvents are the events of a batch an agent receives: all but service exports and VIPs,
// which reach it as the imports derived from them, and node certificate records. touchesImports says whether the batch can
// change those imports (a cluster, policy, export or VIP event, or an endpoint's, whose mesh
// address the imports' ingresses carry).
func agentEvents(evs []*apiv1.Event) (out []*apiv1.Event, touchesImports bool) {
	out = evs[:0:0]
	for _, ev := range evs {
		switch ev.GetKind() {
		case store.KindServiceExport, store.KindServiceVIP:
			touchesImports = true
			continue
		case store.KindNodeCertificate:
			continue
		case store.KindCluster, store.KindPolicy, store.KindEndpoint:
			touchesImports = true
		}
		out = append(out, ev)
	}
	return out, touchesImports
}
