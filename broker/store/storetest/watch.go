package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// The suite's checks of watches: resuming from the log, the log's bound, order, the slow-watcher
// disconnect, the ends of a watch, and concurrent writers.

func watchResumesFromTheLogOrFallsBackToASnapshot(t *testing.T, open Open) {
	s, _ := open(t, store.Options{LogSize: 5})
	for i := 1; i <= 8; i++ { // revisions 1..8; the log keeps 4..8
		putCluster(t, s, fmt.Sprintf("c%d", i), uint32(i))
	}
	tests := []struct {
		name         string
		since        uint64
		wantSnapshot bool
		wantEvents   int
	}{
		{"since zero asks for a snapshot", 0, true, 8},
		{"since a revision the log still holds gets the missed deltas", 5, false, 3},
		{"since the oldest revision the log can resume gets every kept event", 3, false, 5},
		{"since a compacted revision gets a snapshot", 2, true, 8},
		{"since the current revision gets no events", 8, false, 0},
		{"since a revision from the future gets a snapshot", 99, true, 8},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := s.Watch(t.Context(), tt.since)
			if err != nil {
				t.Fatal(err)
			}
			b := <-w.C()
			if b.Snapshot != tt.wantSnapshot || len(b.Events) != tt.wantEvents || b.Revision != 8 {
				t.Fatalf("snapshot=%v events=%d revision=%d; want snapshot=%v events=%d revision=8", b.Snapshot, len(b.Events), b.Revision, tt.wantSnapshot, tt.wantEvents)
			}
			if !b.Snapshot && len(b.Events) > 0 && b.Events[0].Revision != tt.since+1 {
				t.Fatalf("first delta has revision %d, want %d", b.Events[0].Revision, tt.since+1)
			}
		})
	}
}

// bigExport is export shop/<name> of east/gw1 with n endpoints.
func bigExport(name string, n int) *apiv1.ServiceExport {
	e := &apiv1.ServiceExport{Cluster: "east", Node: "gw1", Namespace: "shop", Name: name}
	for i := range n {
		e.Endpoints = append(e.Endpoints, &apiv1.ServiceEndpoint{Ip: fmt.Sprintf("10.1.%d.%d", i>>8, i&0xff), Ready: true})
	}
	return e
}

func putExport(t *testing.T, s store.Store, e *apiv1.ServiceExport) store.Commit {
	t.Helper()
	c, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.PutServiceExport(e) })
	if err != nil {
		t.Fatalf("put export %s: %v", e.Name, err)
	}
	return c
}

// theLogKeepsAtMostLogBytes: the log is bounded by the size of its events too, not only by
// their count; a watcher that resumes from beyond it gets a snapshot, one within it the deltas.
func theLogKeepsAtMostLogBytes(t *testing.T, open Open) {
	scratch, _ := open(t, store.Options{})
	size := proto.Size(putExport(t, scratch, bigExport("s1", 100)).Events[0]) // every event below is this size
	s, _ := open(t, store.Options{LogBytes: 3*size + size/2})
	for i := 1; i <= 6; i++ { // revisions 1..6; the log keeps 4..6
		putExport(t, s, bigExport(fmt.Sprintf("s%d", i), 100))
	}
	first := func(since uint64) store.Batch {
		t.Helper()
		w, err := s.Watch(t.Context(), since)
		if err != nil {
			t.Fatal(err)
		}
		return <-w.C()
	}
	if b := first(3); b.Snapshot || len(b.Events) != 3 || b.Events[0].Revision != 4 {
		t.Fatalf("since 3: snapshot=%v, %d events; want the 3 deltas 4..6 the log holds", b.Snapshot, len(b.Events))
	}
	if b := first(2); !b.Snapshot || len(b.Events) != 6 {
		t.Fatalf("since 2: snapshot=%v, %d events; want a snapshot of 6 exports (event 3 is beyond the log's bytes)", b.Snapshot, len(b.Events))
	}
	// An event larger than the log's bytes alone is not kept: resuming before it is a snapshot.
	putExport(t, s, bigExport("huge", 1000))
	if b := first(6); !b.Snapshot || len(b.Events) != 7 || b.Revision != 7 {
		t.Fatalf("since 6 after a large event: snapshot=%v, %d events, revision %d; want a snapshot of 7 exports at 7", b.Snapshot, len(b.Events), b.Revision)
	}
	putExport(t, s, bigExport("s7", 100))
	if b := first(7); b.Snapshot || len(b.Events) != 1 || b.Events[0].Revision != 8 {
		t.Fatalf("since 7: snapshot=%v, %d events; want the delta 8", b.Snapshot, len(b.Events))
	}
}

func watchDeliversLaterCommitsInOrder(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	putCluster(t, s, "east", 1)
	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); !b.Snapshot || len(b.Events) != 1 {
		t.Fatalf("first batch %+v, want a snapshot of one cluster", b)
	}
	putCluster(t, s, "west", 2)
	if _, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteCluster("east") }); err != nil {
		t.Fatal(err)
	}
	b1, b2 := <-w.C(), <-w.C()
	if b1.Revision != 2 || b1.Events[0].Key != "west" || b2.Revision != 3 || b2.Events[0].Type != apiv1.Event_DELETE || b2.Events[0].GetResource().GetCluster().GetName() != "east" {
		t.Fatalf("deltas %+v then %+v; want west upsert at 2, east delete (with its last value) at 3", b1, b2)
	}
}

func aSlowWatcherIsDroppedWithoutBlockingWriters(t *testing.T, open Open) {
	s, _ := open(t, store.Options{WatchBuffer: 2})
	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 1; i <= 5; i++ {
			putCluster(t, s, fmt.Sprintf("c%d", i), uint32(i))
		}
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("writers blocked on a watcher that does not read")
	}
	n := 0
	for range w.C() {
		n++
	}
	if !errors.Is(w.Err(), store.ErrWatcherTooSlow) || n != 3 {
		t.Fatalf("slow watcher got %d batches then err %v; want 3 (snapshot + 2 buffered) then ErrWatcherTooSlow", n, w.Err())
	}
}

// aWatcherThatLagsByWatchBufferBytesIsDropped: a watcher that does not read is dropped once the
// batches it has not received are larger than WatchBufferBytes, however few they are; one that
// reads along gets every batch, even one larger than that alone.
func aWatcherThatLagsByWatchBufferBytesIsDropped(t *testing.T, open Open) {
	scratch, _ := open(t, store.Options{})
	size := proto.Size(putExport(t, scratch, bigExport("s1", 100)).Events[0]) // every event below but "huge" is this size
	s, _ := open(t, store.Options{WatchBufferBytes: 3*size + size/2})
	// Ended after the writes, so that a watcher that is never dropped ends too (with another error).
	slowCtx, endSlow := context.WithCancel(t.Context())
	defer endSlow()
	slow, err := s.Watch(slowCtx, 0)
	if err != nil {
		t.Fatal(err)
	}
	reader, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-reader.C(); !b.Snapshot {
		t.Fatal("first batch is not a snapshot")
	}
	for i := 1; i <= 5; i++ {
		putExport(t, s, bigExport(fmt.Sprintf("s%d", i), 100))
		if b, ok := <-reader.C(); !ok || b.Revision != uint64(i) {
			t.Fatalf("reader: batch of revision %d (open %v), want %d; err %v", b.Revision, ok, i, reader.Err())
		}
	}
	c := putExport(t, s, bigExport("huge", 1000))
	if b, ok := <-reader.C(); !ok || b.Revision != c.Revision {
		t.Fatalf("reader: batch of revision %d (open %v), want the large one, %d; err %v", b.Revision, ok, c.Revision, reader.Err())
	}
	endSlow()
	n := 0
	for range slow.C() {
		n++
	}
	if !errors.Is(slow.Err(), store.ErrWatcherTooSlow) || n != 4 {
		t.Fatalf("a watcher that did not read got %d batches then err %v; want 4 (the snapshot and the 3 deltas within the bytes) then ErrWatcherTooSlow", n, slow.Err())
	}
}

func aWatchEndsWithItsContextAndWithTheStore(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	w1, err := s.Watch(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	for range w1.C() {
	}
	if !errors.Is(w1.Err(), context.Canceled) {
		t.Fatalf("cancelled watch ended with %v, want context.Canceled", w1.Err())
	}
	s.Close()
	for range w2.C() {
	}
	if !errors.Is(w2.Err(), store.ErrClosed) {
		t.Fatalf("watch of a closed store ended with %v, want ErrClosed", w2.Err())
	}
}

func aClosedStoreRefusesWritesAndWatches(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("a second Close: %v", err)
	}
	_, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.PutCluster(&apiv1.Cluster{Name: "east", Id: 1}) })
	if !errors.Is(err, store.ErrClosed) {
		t.Fatalf("update of a closed store: %v, want ErrClosed", err)
	}
	if _, err := s.Watch(context.Background(), 0); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("watch of a closed store: %v, want ErrClosed", err)
	}
}

func aWatchThatOmitsResourcesGetsTheirEventsBare(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	put := func(node string) store.Commit {
		t.Helper()
		c, err := s.Update(context.Background(), func(tx store.Tx) error {
			if err := tx.PutCluster(&apiv1.Cluster{Name: "east", Id: 1}); err != nil {
				return err
			}
			if err := tx.PutServiceExport(&apiv1.ServiceExport{Cluster: "east", Node: node, Namespace: "shop", Name: "web"}); err != nil {
				return err
			}
			return tx.PutServiceVIP(&apiv1.ServiceVIP{Namespace: "shop", Name: "web", Vips: []string{"241.0.0.1"}})
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	first := put("gw1")
	omit := store.OmitResources(store.KindServiceExport, store.KindServiceVIP)
	bare := func(evs []*apiv1.Event) string {
		out := ""
		for _, e := range evs {
			out += fmt.Sprintf("%s:%s@%d(%v) ", e.Kind, e.Key, e.Revision, e.Resource != nil)
		}
		return out
	}
	w, err := s.Watch(t.Context(), 0, omit)
	if err != nil {
		t.Fatal(err)
	}
	all, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); bare(b.Events) != "cluster:east@3(true) " || b.Revision != 3 {
		t.Fatalf("snapshot of a watch that omits exports and VIPs: %s at %d; want the cluster only, at 3", bare(b.Events), b.Revision)
	}
	if b := <-all.C(); len(b.Events) != 3 {
		t.Fatalf("a watch without the option lost events: %s", bare(b.Events))
	}
	put("gw2")
	if b := <-w.C(); bare(b.Events) != "cluster:east@4(true) serviceexport:east/gw2/shop/web@5(false) servicevip:shop/web@6(false) " {
		t.Fatalf("deltas: %s; want the export and VIP events bare", bare(b.Events))
	}
	if b := <-all.C(); b.Events[1].GetResource().GetServiceExport().GetNode() != "gw2" {
		t.Fatalf("a watch without the option got %s", bare(b.Events))
	}
	// Resuming from the log: the same.
	r, err := s.Watch(t.Context(), first.Revision, omit)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-r.C(); b.Snapshot || bare(b.Events) != "cluster:east@4(true) serviceexport:east/gw2/shop/web@5(false) servicevip:shop/web@6(false) " {
		t.Fatalf("resume: %s", bare(b.Events))
	}
}

func concurrentWritersAndWatchersSeeEveryRevisionOnceInOrder(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	const writers, each = 4, 25
	type result struct {
		revs []uint64
		err  error
	}
	watchers := make([]chan result, 2)
	for i := range watchers {
		w, err := s.Watch(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan result, 1)
		watchers[i] = ch
		go func() {
			var r result
			for b := range w.C() {
				for _, ev := range b.Events {
					if !b.Snapshot {
						r.revs = append(r.revs, ev.Revision)
					}
				}
				if len(r.revs) == writers*each {
					break
				}
			}
			r.err = w.Err()
			ch <- r
		}()
	}
	var wg sync.WaitGroup
	for g := range writers {
		wg.Go(func() {
			for i := range each {
				_, err := s.Update(context.Background(), func(tx store.Tx) error {
					return tx.PutCluster(&apiv1.Cluster{Name: fmt.Sprintf("w%d-%d", g, i), Id: uint32(g*each + i + 1)})
				})
				if err != nil {
					t.Error(err)
				}
				// Readers run alongside the writers.
				if err := s.View(context.Background(), func(tx store.ReadTx) error { _, err := tx.Clusters(); return err }); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for i, ch := range watchers {
		select {
		case r := <-ch:
			if len(r.revs) != writers*each {
				t.Fatalf("watcher %d got %d events (then %v), want %d", i, len(r.revs), r.err, writers*each)
			}
			for j, rev := range r.revs {
				if rev != uint64(j+1) {
					t.Fatalf("watcher %d: event %d has revision %d, want %d", i, j, rev, j+1)
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("watcher %d did not get every event", i)
		}
	}
}

func keysOf(evs []*apiv1.Event) string {
	out := ""
	for i, e := range evs {
		if i > 0 {
			out += " "
		}
		out += e.Kind + ":" + e.Key
	}
	return out
}
