package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func open(t *testing.T, path string, opts Options) *Bolt {
	t.Helper()
	s, err := OpenBolt(path, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func putCluster(t *testing.T, s Store, name string, id uint32) Commit {
	t.Helper()
	c, err := s.Update(context.Background(), func(tx Tx) error {
		return tx.PutCluster(&apiv1.Cluster{Name: name, Id: id, PodCidrs: []string{fmt.Sprintf("10.%d.0.0/16", id)}})
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func state(t *testing.T, s Store) (uint64, []*apiv1.Cluster, []*apiv1.Endpoint) {
	t.Helper()
	var (
		rev uint64
		cs  []*apiv1.Cluster
		es  []*apiv1.Endpoint
	)
	err := s.View(context.Background(), func(tx ReadTx) error {
		var err error
		rev = tx.Revision()
		if cs, err = tx.Clusters(); err != nil {
			return err
		}
		es, err = tx.Endpoints()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return rev, cs, es
}

func TestEveryChangeBumpsTheRevisionAndStampsTheResource(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "b.db"), Options{})
	c1 := putCluster(t, s, "east", 1)
	c2, err := s.Update(context.Background(), func(tx Tx) error {
		if err := tx.PutCluster(&apiv1.Cluster{Name: "west", Id: 2}); err != nil {
			return err
		}
		return tx.PutEndpoint(&apiv1.Endpoint{Cluster: "west", Node: "gw1", PrivateIp: "10.0.0.1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if c1.Revision != 1 || c2.Revision != 3 || len(c2.Events) != 2 || c2.Events[0].Revision != 2 || c2.Events[1].Revision != 3 {
		t.Fatalf("revisions: first commit %d, second %d with events %v; want 1, then 3 with events at 2 and 3", c1.Revision, c2.Revision, c2.Events)
	}
	rev, cs, es := state(t, s)
	if rev != 3 || cs[0].Revision != 1 || cs[1].Revision != 2 || es[0].Revision != 3 {
		t.Fatalf("stored revisions: store %d, clusters %d %d, endpoint %d; want 3, 1 2, 3", rev, cs[0].Revision, cs[1].Revision, es[0].Revision)
	}
	// Deleting something absent changes nothing; a failing transaction changes nothing.
	c3, err := s.Update(context.Background(), func(tx Tx) error { return tx.DeleteCluster("nope") })
	if err != nil || c3.Revision != 3 || len(c3.Events) != 0 {
		t.Fatalf("delete of an absent cluster: commit %+v err %v; want revision 3 and no events", c3, err)
	}
	boom := errors.New("boom")
	_, err = s.Update(context.Background(), func(tx Tx) error {
		if err := tx.PutCluster(&apiv1.Cluster{Name: "north", Id: 3}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failing transaction returned %v, want boom", err)
	}
	if rev, cs, _ := state(t, s); rev != 3 || len(cs) != 2 {
		t.Fatalf("after a failed transaction: revision %d with %d clusters, want 3 and 2", rev, len(cs))
	}
}

func TestTouchEndpointKeepsTheRevisionAndEmitsNothing(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "b.db"), Options{})
	_, err := s.Update(context.Background(), func(tx Tx) error {
		return tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", PrivateIp: "10.0.0.1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C()
	c, err := s.Update(context.Background(), func(tx Tx) error {
		return tx.TouchEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", LastHeartbeat: nowpb(), PrivateIp: "ignored"})
	})
	if err != nil || c.Revision != 1 || len(c.Events) != 0 {
		t.Fatalf("touch: commit %+v, err %v; want revision 1, no events", c, err)
	}
	_, _, es := state(t, s)
	if es[0].LastHeartbeat == nil || es[0].PrivateIp != "10.0.0.1" || es[0].Revision != 1 {
		t.Fatalf("touched endpoint %v: want heartbeat set, private IP and revision unchanged", es[0])
	}
	select {
	case b := <-w.C():
		t.Fatalf("a touch reached a watcher: %v", b)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestStateSurvivesCloseAndReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.db")
	s, err := OpenBolt(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	putCluster(t, s, "east", 1)
	putCluster(t, s, "west", 2)
	_, err = s.Update(context.Background(), func(tx Tx) error {
		if err := tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", PrivateIp: "10.0.0.1", CablePorts: map[string]uint32{"wireguard": 51820}}); err != nil {
			return err
		}
		return tx.DeleteCluster("west")
	})
	if err != nil {
		t.Fatal(err)
	}
	rev1, cs1, es1 := state(t, s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2 := open(t, path, Options{})
	rev2, cs2, es2 := state(t, s2)
	if rev1 != rev2 || len(cs1) != len(cs2) || len(es1) != len(es2) {
		t.Fatalf("after reopen: revision %d, %d clusters, %d endpoints; before: %d, %d, %d", rev2, len(cs2), len(es2), rev1, len(cs1), len(es1))
	}
	for i := range cs1 {
		if !proto.Equal(cs1[i], cs2[i]) {
			t.Fatalf("cluster %d changed across reopen: %v vs %v", i, cs1[i], cs2[i])
		}
	}
	for i := range es1 {
		if !proto.Equal(es1[i], es2[i]) {
			t.Fatalf("endpoint %d changed across reopen: %v vs %v", i, es1[i], es2[i])
		}
	}
	// The event log survives too: a watcher resumes across the restart.
	w, err := s2.Watch(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	b := <-w.C()
	if b.Snapshot || len(b.Events) != 3 || b.Revision != 4 {
		t.Fatalf("resume from 1 after reopen: snapshot=%v, %d events, revision %d; want 3 deltas to revision 4", b.Snapshot, len(b.Events), b.Revision)
	}
	// Revisions continue from where they were.
	if c := putCluster(t, s2, "north", 3); c.Revision != rev1+1 {
		t.Fatalf("first commit after reopen has revision %d, want %d", c.Revision, rev1+1)
	}
}

func TestWatchResumesFromTheLogOrFallsBackToASnapshot(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "b.db"), Options{LogSize: 5})
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

func TestWatchDeliversLaterCommitsInOrder(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "b.db"), Options{})
	putCluster(t, s, "east", 1)
	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); !b.Snapshot || len(b.Events) != 1 {
		t.Fatalf("first batch %+v, want a snapshot of one cluster", b)
	}
	putCluster(t, s, "west", 2)
	if _, err := s.Update(context.Background(), func(tx Tx) error { return tx.DeleteCluster("east") }); err != nil {
		t.Fatal(err)
	}
	b1, b2 := <-w.C(), <-w.C()
	if b1.Revision != 2 || b1.Events[0].Key != "west" || b2.Revision != 3 || b2.Events[0].Type != apiv1.Event_DELETE || b2.Events[0].GetResource().GetCluster().GetName() != "east" {
		t.Fatalf("deltas %+v then %+v; want west upsert at 2, east delete (with its last value) at 3", b1, b2)
	}
}

func TestASlowWatcherIsDroppedWithoutBlockingWriters(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "b.db"), Options{WatchBuffer: 2})
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
	if !errors.Is(w.Err(), ErrWatcherTooSlow) || n != 3 {
		t.Fatalf("slow watcher got %d batches then err %v; want 3 (snapshot + 2 buffered) then ErrWatcherTooSlow", n, w.Err())
	}
}

func TestAWatchEndsWithItsContextAndWithTheStore(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "b.db"), Options{})
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
	if !errors.Is(w2.Err(), ErrClosed) {
		t.Fatalf("watch of a closed store ended with %v, want ErrClosed", w2.Err())
	}
}

func TestASecondOpenOfTheSameFileFailsClearly(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.db")
	open(t, path, Options{})
	_, err := OpenBolt(path, Options{})
	if err == nil || !contains(err.Error(), "locked by another process") {
		t.Fatalf("second open: %v, want a 'locked by another process' error", err)
	}
}

func nowpb() *timestamppb.Timestamp { return timestamppb.Now() }

func contains(s, sub string) bool { return strings.Contains(s, sub) }
