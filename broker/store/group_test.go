package store_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// Bolt commits concurrent Updates in groups (one bbolt transaction each): an Update that fails
// must leave nothing behind, must not take the others of its group down with it, and every
// commit must get revisions of its own, published to watchers once and in order.
func TestBoltGroupsConcurrentUpdatesAndIsolatesTheOnesThatFail(t *testing.T) {
	s := openBolt(t, filepath.Join(t.TempDir(), "b.db"), store.Options{})
	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C() // the (empty) snapshot
	errOdd := errors.New("refused")
	const n = 200
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		commits []store.Commit
	)
	for i := range n {
		wg.Go(func() {
			name := fmt.Sprintf("c%03d", i)
			c, err := s.Update(context.Background(), func(tx store.Tx) error {
				// Every Update writes; the odd ones then fail, after their write.
				if err := tx.PutCluster(&apiv1.Cluster{Name: name, Id: uint32(i + 1)}); err != nil {
					return err
				}
				if i%2 == 1 {
					return errOdd
				}
				return nil
			})
			switch {
			case i%2 == 1 && !errors.Is(err, errOdd):
				t.Errorf("update %d: %v, want its own error", i, err)
			case i%2 == 0 && err != nil:
				t.Errorf("update %d failed: %v", i, err)
			case i%2 == 0:
				mu.Lock()
				commits = append(commits, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var names []string
	err = s.View(context.Background(), func(tx store.ReadTx) error {
		cs, err := tx.Clusters()
		for _, c := range cs {
			names = append(names, c.Name)
		}
		if tx.Revision() != n/2 {
			t.Errorf("revision %d after %d successful updates of one change each", tx.Revision(), n/2)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := 0; i < n; i += 2 {
		want = append(want, fmt.Sprintf("c%03d", i))
	}
	if !slices.Equal(names, want) {
		t.Errorf("stored clusters %v, want exactly the even ones %v", names, want)
	}
	var revs []uint64
	for _, c := range commits {
		revs = append(revs, c.Revision)
	}
	slices.Sort(revs)
	for i, r := range revs {
		if r != uint64(i+1) {
			t.Fatalf("commit revisions %v: want each of 1..%d once", revs, n/2)
		}
	}
	// The watcher saw each commit once, in order.
	var seen uint64
	for seen < n/2 {
		b := <-w.C()
		for _, ev := range b.Events {
			if ev.Revision != seen+1 {
				t.Fatalf("watcher got revision %d after %d", ev.Revision, seen)
			}
			seen = ev.Revision
		}
	}
}

// Watchers that start from revision 0 share one snapshot: a fleet that starts at once must not
// make the store read (and hold, and the broker encode) one per watcher. A watcher that starts
// after a few commits gets the shared snapshot and then those commits; after many, a fresh one.
func TestWatchersStartingTogetherShareOneSnapshot(t *testing.T) {
	for _, tt := range []struct {
		name string
		open func(t *testing.T) store.Store
	}{
		{"bolt", func(t *testing.T) store.Store {
			return openBolt(t, filepath.Join(t.TempDir(), "b.db"), store.Options{})
		}},
		{"memory", func(t *testing.T) store.Store { return store.NewMemory(store.Options{}) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := tt.open(t)
			put := func(node string) {
				t.Helper()
				if _, err := s.Update(context.Background(), func(tx store.Tx) error {
					return tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: node})
				}); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := s.Update(context.Background(), func(tx store.Tx) error {
				return tx.PutCluster(&apiv1.Cluster{Name: "east", Id: 1})
			}); err != nil {
				t.Fatal(err)
			}
			watch := func() store.Watch {
				w, err := s.Watch(t.Context(), 0)
				if err != nil {
					t.Fatal(err)
				}
				return w
			}
			next := func(w store.Watch) store.Batch {
				t.Helper()
				select {
				case b := <-w.C():
					return b
				case <-time.After(5 * time.Second):
					t.Fatal("no batch within 5s")
					return store.Batch{}
				}
			}
			a, b := next(watch()), next(watch())
			if !a.Snapshot || len(a.Events) != 1 || len(b.Events) != 1 || a.Events[0] != b.Events[0] {
				t.Fatalf("two watchers with no commit between them got %v and %v, want one shared snapshot", a.Events, b.Events)
			}
			// A commit: the next watcher gets the shared snapshot brought up to date, not a fresh
			// read (the cluster's event is the same one).
			put("gw1")
			c := next(watch())
			if !c.Snapshot || len(c.Events) != 2 || c.Revision != 2 || c.Events[0] != a.Events[0] || c.Events[1].Key != "east/gw1" {
				t.Fatalf("after one commit the first batch is %v at revision %d (snapshot %v), want the shared snapshot with east/gw1 added at 2", c.Events, c.Revision, c.Snapshot)
			}
			// A delete takes the resource out of it.
			if _, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteEndpoint("east", "gw1") }); err != nil {
				t.Fatal(err)
			}
			if c := next(watch()); !c.Snapshot || len(c.Events) != 1 || c.Revision != 3 || c.Events[0] != a.Events[0] {
				t.Fatalf("after the delete the first batch is %v at revision %d, want the shared snapshot of east alone at 3", c.Events, c.Revision)
			}
			// Many commits (more events than the snapshot holds, and 64 more): a fresh read.
			for i := range 70 {
				put(fmt.Sprintf("gw%d", i+2))
			}
			d := next(watch())
			if !d.Snapshot || len(d.Events) != 71 || d.Revision != 73 || d.Events[0] == a.Events[0] {
				t.Fatalf("after 70 more commits the first batch holds %d events at revision %d (shared cluster event: %v), want a fresh snapshot of 71 at 73",
					len(d.Events), d.Revision, d.Events[0] == a.Events[0])
			}
		})
	}
}
