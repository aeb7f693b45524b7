package broker

import (
	"context"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// endingStore ends its first watches after their first batch, as an etcd replica that lost
// etcd (or whose health check timed out) ends every watch: ErrUnavailable.
type endingStore struct {
	store.Store
	ends    atomic.Int32 // watches still to end
	watches atomic.Int32
}

type endingWatch struct {
	c chan store.Batch
}

func (w *endingWatch) C() <-chan store.Batch { return w.c }
func (w *endingWatch) Err() error            { return store.ErrUnavailable }

func (s *endingStore) Watch(ctx context.Context, since uint64, opts ...store.WatchOption) (store.Watch, error) {
	s.watches.Add(1)
	w, err := s.Store.Watch(ctx, since, opts...)
	if err != nil || s.ends.Add(-1) < 0 {
		return w, err
	}
	out := &endingWatch{c: make(chan store.Batch, 1)}
	out.c <- <-w.C()
	close(out.c)
	return out, nil
}

// The service import tracker resumes when the store ends its watch for another reason than
// being too slow; it stopped for good before, and every agent's watch on that replica then
// failed at its first message ("service imports are not available").
func TestTheImportTrackerResumesAfterTheStoreEndsItsWatch(t *testing.T) {
	st := &endingStore{Store: store.NewMemory(store.Options{})}
	st.ends.Store(2)
	tr := newImportTracker(slog.New(slog.NewTextHandler(io.Discard, nil)), make(chan struct{}))
	var wg sync.WaitGroup
	ctx, cancel := context.WithCancel(t.Context())
	defer func() { cancel(); wg.Wait() }()
	if err := tr.start(ctx, st, &wg); err != nil {
		t.Fatal(err)
	}
	// Each ended watch needs a batch to end on, and the watch that resumes after it another:
	// three changes take the tracker through both ends to a third watch.
	actx, acancel := context.WithTimeout(ctx, 10*time.Second)
	defer acancel()
	for i, name := range []string{"east", "west", "north"} {
		c, err := st.Update(ctx, func(tx store.Tx) error {
			return tx.PutCluster(&apiv1.Cluster{Name: name, Uid: "uid-" + name, Id: uint32(i + 1)})
		})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tr.at(actx, c.Revision); err != nil {
			t.Fatalf("the imports at revision %d (cluster %s) after the store ended the tracker's watch: %v", c.Revision, name, err)
		}
	}
	for st.watches.Load() < 3 && actx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	if n := st.watches.Load(); n < 3 {
		t.Fatalf("the tracker watched the store %d times, want it to have resumed twice", n)
	}
}
