// Package storetest is the conformance suite of store.Store: every implementation (Bolt, Memory,
// Etcd) runs Run, so they cannot drift apart in what the broker relies on:
// revisions, events, the resumable event log, watches and their slow-watcher disconnect,
// TouchEndpoint, and every resource kind (clusters, endpoints, policies, service exports, service
// VIPs, node certificates), the join token records and the mesh address claims.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// Open returns a new, empty store with opts, closed when t ends. reopen, nil for a store that
// does not persist (Memory), closes it and opens the same data again (also closed when t ends);
// the suite's durability checks run only where it is given.
type Open func(t *testing.T, opts store.Options) (s store.Store, reopen func() store.Store)

// Run runs the suite against the stores open returns.
func Run(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, Open)
	}{
		{"EveryChangeBumpsTheRevisionAndStampsTheResource", everyChangeBumpsTheRevisionAndStampsTheResource},
		{"TouchEndpointKeepsTheRevisionAndEmitsNothing", touchEndpointKeepsTheRevisionAndEmitsNothing},
		{"TouchingAnAbsentEndpointFails", touchingAnAbsentEndpointFails},
		{"StateSurvivesCloseAndReopen", stateSurvivesCloseAndReopen},
		{"WatchResumesFromTheLogOrFallsBackToASnapshot", watchResumesFromTheLogOrFallsBackToASnapshot},
		{"TheLogKeepsAtMostLogBytes", theLogKeepsAtMostLogBytes},
		{"WatchDeliversLaterCommitsInOrder", watchDeliversLaterCommitsInOrder},
		{"ASlowWatcherIsDroppedWithoutBlockingWriters", aSlowWatcherIsDroppedWithoutBlockingWriters},
		{"AWatcherThatLagsByWatchBufferBytesIsDropped", aWatcherThatLagsByWatchBufferBytesIsDropped},
		{"AWatchEndsWithItsContextAndWithTheStore", aWatchEndsWithItsContextAndWithTheStore},
		{"AClosedStoreRefusesWritesAndWatches", aClosedStoreRefusesWritesAndWatches},
		{"PoliciesAreRevisionedWatchedAndSurviveReopen", policiesAreRevisionedWatchedAndSurviveReopen},
		{"ServiceExportsAndVIPsAreRevisionedWatchedAndSurviveReopen", serviceExportsAndVIPsAreRevisionedWatchedAndSurviveReopen},
		{"AServiceExportOrVIPWithoutItsKeyIsRefused", aServiceExportOrVIPWithoutItsKeyIsRefused},
		{"AWatchThatOmitsResourcesGetsTheirEventsBare", aWatchThatOmitsResourcesGetsTheirEventsBare},
		{"APairPSKIsNeverStored", aPairPSKIsNeverStored},
		{"ReadsAreCopiesAndListsAreInKeyOrder", readsAreCopiesAndListsAreInKeyOrder},
		{"ConcurrentWritersAndWatchersSeeEveryRevisionOnceInOrder", concurrentWritersAndWatchersSeeEveryRevisionOnceInOrder},
		{"JoinTokensAreQuietAndSurviveReopen", joinTokensAreQuietAndSurviveReopen},
		{"NodeCertificatesAreRevisionedTouchedQuietlyAndSurviveReopen", nodeCertificatesAreRevisionedTouchedQuietlyAndSurviveReopen},
		{"MeshAddressClaimsAreQuietKeyedByAddressAndSurviveReopen", meshAddressClaimsAreQuietKeyedByAddressAndSurviveReopen},
		{"TheClustersDigestChangesWithTheClustersOnly", theClustersDigestChangesWithTheClustersOnly},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, open) })
	}
}

func putCluster(t *testing.T, s store.Store, name string, id uint32) store.Commit {
	t.Helper()
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.PutCluster(&apiv1.Cluster{Name: name, Id: id, PodCidrs: []string{fmt.Sprintf("10.%d.0.0/16", id)}})
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func state(t *testing.T, s store.Store) (uint64, []*apiv1.Cluster, []*apiv1.Endpoint) {
	t.Helper()
	var (
		rev uint64
		cs  []*apiv1.Cluster
		es  []*apiv1.Endpoint
	)
	err := s.View(context.Background(), func(tx store.ReadTx) error {
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

func everyChangeBumpsTheRevisionAndStampsTheResource(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	c1 := putCluster(t, s, "east", 1)
	c2, err := s.Update(context.Background(), func(tx store.Tx) error {
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
	c3, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteCluster("nope") })
	if err != nil || c3.Revision != 3 || len(c3.Events) != 0 {
		t.Fatalf("delete of an absent cluster: commit %+v err %v; want revision 3 and no events", c3, err)
	}
	boom := errors.New("boom")
	_, err = s.Update(context.Background(), func(tx store.Tx) error {
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

func touchEndpointKeepsTheRevisionAndEmitsNothing(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	_, err := s.Update(context.Background(), func(tx store.Tx) error {
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
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.TouchEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", LastHeartbeat: timestamppb.Now(), PrivateIp: "ignored"})
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

func touchingAnAbsentEndpointFails(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	_, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.TouchEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", LastHeartbeat: timestamppb.Now()})
	})
	if err == nil {
		t.Fatal("touching an endpoint that was never put succeeded")
	}
	if _, _, es := state(t, s); len(es) != 0 {
		t.Fatalf("a failed touch stored %v", es)
	}
}

func stateSurvivesCloseAndReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	if reopen == nil {
		t.Skip("this store does not persist")
	}
	putCluster(t, s, "east", 1)
	putCluster(t, s, "west", 2)
	_, err := s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", PrivateIp: "10.0.0.1", CablePorts: map[string]uint32{"wireguard": 51820}}); err != nil {
			return err
		}
		return tx.DeleteCluster("west")
	})
	if err != nil {
		t.Fatal(err)
	}
	rev1, cs1, es1 := state(t, s)
	s2 := reopen()
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

func policiesAreRevisionedWatchedAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	putCluster(t, s, "east", 1)
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutPolicy(&apiv1.Policy{Name: "default", Json: []byte(`{"a":1}`), IsDefault: true, StatusJson: []byte(`{"x":1}`)}); err != nil {
			return err
		}
		return tx.PutPolicy(&apiv1.Policy{Name: "on-prem", Json: []byte(`{"b":2}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Revision != 3 || len(c.Events) != 2 || c.Events[0].Kind != store.KindPolicy || c.Events[0].Key != "default" || c.Events[1].GetResource().GetPolicy().GetRevision() != 3 {
		t.Fatalf("commit %+v: want two policy events at 2 and 3, the second stamped 3", c)
	}
	var got []*apiv1.Policy
	err = s.View(context.Background(), func(tx store.ReadTx) error {
		var err error
		got, err = tx.Policies()
		return err
	})
	if err != nil || len(got) != 2 || got[0].Name != "default" || !got[0].IsDefault || got[0].Revision != 2 || got[0].StatusJson != nil {
		t.Fatalf("policies %v, %v: want default (is_default, revision 2, no stored status) then on-prem", got, err)
	}

	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); keysOf(b.Events) != "cluster:east policy:default policy:on-prem" {
		t.Fatalf("snapshot holds %s, want the cluster then both policies", keysOf(b.Events))
	}
	// Deleting an absent policy is no change; deleting a present one is an event with its last value.
	c, err = s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.DeletePolicy("nope"); err != nil {
			return err
		}
		return tx.DeletePolicy("on-prem")
	})
	if err != nil || c.Revision != 4 || len(c.Events) != 1 || c.Events[0].Type != apiv1.Event_DELETE || string(c.Events[0].GetResource().GetPolicy().GetJson()) != `{"b":2}` {
		t.Fatalf("delete: commit %+v err %v; want one DELETE of on-prem at 4 with its last value", c, err)
	}
	if b := <-w.C(); b.Revision != 4 || keysOf(b.Events) != "policy:on-prem" {
		t.Fatalf("watcher got %s at %d, want the on-prem delete at 4", keysOf(b.Events), b.Revision)
	}
	if reopen == nil {
		return // the rest is about durability
	}

	s2 := reopen()
	err = s2.View(context.Background(), func(tx store.ReadTx) error {
		p, err := tx.Policy("default")
		if err != nil || p == nil || string(p.Json) != `{"a":1}` || tx.Revision() != 4 {
			t.Errorf("after reopen: default %v err %v revision %d", p, err, tx.Revision())
		}
		if p, err := tx.Policy("on-prem"); p != nil || err != nil {
			t.Errorf("deleted policy came back: %v %v", p, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func serviceExportsAndVIPsAreRevisionedWatchedAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	created := timestamppb.New(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	web := func(cluster, node string) *apiv1.ServiceExport {
		return &apiv1.ServiceExport{Cluster: cluster, Node: node, Namespace: "shop", Name: "web", Type: "ClusterSetIP",
			Ports:     []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
			Labels:    map[string]string{"cablemesh.io/exported": "true"},
			Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.5", Ready: true}}, Affinity: "local", Created: created}
	}
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		// Put out of key order: lists come back in key order.
		for _, e := range []*apiv1.ServiceExport{web("west", "gw1"), web("east", "gw2"), web("east", "gw1")} {
			if err := tx.PutServiceExport(e); err != nil {
				return err
			}
		}
		return tx.PutServiceVIP(&apiv1.ServiceVIP{Namespace: "shop", Name: "web", Vips: []string{"241.0.0.1"}, Allocated: created})
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Revision != 4 || keysOf(c.Events) != "serviceexport:west/gw1/shop/web serviceexport:east/gw2/shop/web serviceexport:east/gw1/shop/web servicevip:shop/web" ||
		c.Events[3].GetResource().GetServiceVip().GetRevision() != 4 || c.Events[0].GetResource().GetServiceExport().GetRevision() != 1 {
		t.Fatalf("commit at %d with %s: want three export events and a VIP event, stamped 1..4", c.Revision, keysOf(c.Events))
	}
	read := func(s store.Store) ([]*apiv1.ServiceExport, []*apiv1.ServiceVIP, uint64) {
		t.Helper()
		var (
			xs  []*apiv1.ServiceExport
			vs  []*apiv1.ServiceVIP
			rev uint64
		)
		err := s.View(context.Background(), func(tx store.ReadTx) error {
			var err error
			if xs, err = tx.ServiceExports(); err != nil {
				return err
			}
			vs, err = tx.ServiceVIPs()
			rev = tx.Revision()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return xs, vs, rev
	}
	xs, vs, _ := read(s)
	var order []string
	for _, x := range xs {
		order = append(order, store.ServiceExportKey(x.Cluster, x.Node, x.Namespace, x.Name))
	}
	if want := []string{"east/gw1/shop/web", "east/gw2/shop/web", "west/gw1/shop/web"}; !slices.Equal(order, want) {
		t.Fatalf("exports listed %v, want %v", order, want)
	}
	if !proto.Equal(xs[2], func() *apiv1.ServiceExport { e := web("west", "gw1"); e.Revision = 1; return e }()) {
		t.Fatalf("stored export %v differs from what was put", xs[2])
	}
	if len(vs) != 1 || vs[0].Vips[0] != "241.0.0.1" || vs[0].Revision != 4 || !vs[0].Allocated.AsTime().Equal(created.AsTime()) {
		t.Fatalf("VIPs %v", vs)
	}
	err = s.View(context.Background(), func(tx store.ReadTx) error {
		x, err := tx.ServiceExport("east", "gw2", "shop", "web")
		if err != nil || x == nil || x.Revision != 2 {
			t.Errorf("ServiceExport(east, gw2, shop, web) = %v, %v", x, err)
		}
		if x, err := tx.ServiceExport("east", "gw3", "shop", "web"); x != nil || err != nil {
			t.Errorf("an absent export: %v, %v; want nil, nil", x, err)
		}
		if v, err := tx.ServiceVIP("shop", "db"); v != nil || err != nil {
			t.Errorf("an absent VIP: %v, %v; want nil, nil", v, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); keysOf(b.Events) != "serviceexport:east/gw1/shop/web serviceexport:east/gw2/shop/web serviceexport:west/gw1/shop/web servicevip:shop/web" {
		t.Fatalf("snapshot holds %s, want the three exports and the VIP", keysOf(b.Events))
	}
	// Deleting what is absent is no change; deleting what is present is an event with its last value.
	c, err = s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.DeleteServiceExport("north", "gw1", "shop", "web"); err != nil {
			return err
		}
		if err := tx.DeleteServiceVIP("shop", "db"); err != nil {
			return err
		}
		if err := tx.DeleteServiceExport("west", "gw1", "shop", "web"); err != nil {
			return err
		}
		return tx.DeleteServiceVIP("shop", "web")
	})
	if err != nil || c.Revision != 6 || keysOf(c.Events) != "serviceexport:west/gw1/shop/web servicevip:shop/web" ||
		c.Events[0].Type != apiv1.Event_DELETE || c.Events[0].GetResource().GetServiceExport().GetEndpoints()[0].GetIp() != "10.1.0.5" ||
		c.Events[1].GetResource().GetServiceVip().GetVips()[0] != "241.0.0.1" {
		t.Fatalf("deletes: commit %+v err %v; want two DELETEs at 5 and 6 with their last values", c, err)
	}
	if b := <-w.C(); b.Revision != 6 || keysOf(b.Events) != "serviceexport:west/gw1/shop/web servicevip:shop/web" {
		t.Fatalf("watcher got %s at %d, want both deletes at 6", keysOf(b.Events), b.Revision)
	}
	if reopen == nil {
		return
	}
	before, _, rev := read(s)
	s2 := reopen()
	after, vs2, rev2 := read(s2)
	if rev2 != rev || len(after) != len(before) || len(vs2) != 0 {
		t.Fatalf("after reopen: revision %d, %d exports, %d VIPs; before: %d, %d, 0", rev2, len(after), len(vs2), rev, len(before))
	}
	for i := range before {
		if !proto.Equal(before[i], after[i]) {
			t.Fatalf("export changed across reopen: %v vs %v", before[i], after[i])
		}
	}
}

func aServiceExportOrVIPWithoutItsKeyIsRefused(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	for _, put := range []func(store.Tx) error{
		func(tx store.Tx) error {
			return tx.PutServiceExport(&apiv1.ServiceExport{Cluster: "east", Namespace: "shop", Name: "web"})
		},
		func(tx store.Tx) error {
			return tx.PutServiceExport(&apiv1.ServiceExport{Cluster: "east", Node: "gw1", Name: "web"})
		},
		func(tx store.Tx) error { return tx.PutServiceVIP(&apiv1.ServiceVIP{Namespace: "shop"}) },
	} {
		if _, err := s.Update(context.Background(), put); err == nil {
			t.Fatal("a record without its whole key was stored")
		}
	}
	var n int
	err := s.View(context.Background(), func(tx store.ReadTx) error {
		xs, err := tx.ServiceExports()
		vs, _ := tx.ServiceVIPs()
		n = len(xs) + len(vs)
		return err
	})
	if err != nil || n != 0 {
		t.Fatalf("after refused puts: %d records, %v", n, err)
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

func aPairPSKIsNeverStored(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	_, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.PutCluster(&apiv1.Cluster{Name: "east", Id: 1, PairPsk: []byte("secret")})
	})
	if err != nil {
		t.Fatal(err)
	}
	_, cs, _ := state(t, s)
	if len(cs) != 1 || cs[0].PairPsk != nil {
		t.Fatalf("stored cluster %v carries a PSK", cs)
	}
}

func readsAreCopiesAndListsAreInKeyOrder(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	in := &apiv1.Cluster{Name: "west", Id: 2, Labels: map[string]string{"env": "prod"}}
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutCluster(in); err != nil {
			return err
		}
		for _, n := range []string{"west/gw2", "east/gw1", "west/gw1"} {
			cl, node, _ := strings.Cut(n, "/")
			if err := tx.PutEndpoint(&apiv1.Endpoint{Cluster: cl, Node: node, PrivateIp: "10.0.0.1"}); err != nil {
				return err
			}
		}
		return tx.PutCluster(&apiv1.Cluster{Name: "east", Id: 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	// What the caller gave, what it read and what the commit reported are its own.
	in.Labels["env"] = "dev"
	c.Events[0].GetResource().GetCluster().Labels["env"] = "test"
	_, cs, es := state(t, s)
	cs[1].Labels["env"] = "staging"
	_, cs, _ = state(t, s)
	if in.Revision != 0 || cs[1].Name != "west" || cs[1].Labels["env"] != "prod" {
		t.Fatalf("stored west %v (given %v): want env=prod, and the caller's message not stamped", cs[1], in)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	for _, e := range es {
		names = append(names, store.EndpointKey(e.Cluster, e.Node))
	}
	if want := []string{"east", "west", "east/gw1", "west/gw1", "west/gw2"}; !slices.Equal(names, want) {
		t.Fatalf("listed %v, want %v", names, want)
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

// joinTokensAreQuietAndSurviveReopen: a join token record is written in a transaction like any
// resource, but bumps no revision and emits no event; it survives a reopen; deleting it is quiet
// too.
func joinTokensAreQuietAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	putCluster(t, s, "east", 1)
	rec := &apiv1.JoinTokenRecord{Nonce: "n1", Cluster: "east", ClusterUid: "u1", MaxNodes: 2, Nodes: []string{"gw1"}, Expires: timestamppb.New(time.Unix(2e9, 0))}
	c, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.PutJoinToken(rec) })
	if err != nil || c.Revision != 1 || len(c.Events) != 0 {
		t.Fatalf("put join token: commit %+v err %v; want revision 1 still and no event", c, err)
	}
	_, err = s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutJoinToken(&apiv1.JoinTokenRecord{Nonce: "n0", Cluster: "east"}); err != nil {
			return err
		}
		return errors.New("abort")
	})
	if err == nil {
		t.Fatal("aborted update succeeded")
	}
	check := func(s store.Store) {
		t.Helper()
		err := s.View(context.Background(), func(tx store.ReadTx) error {
			got, err := tx.JoinToken("n1")
			if err != nil || !proto.Equal(got, rec) {
				t.Errorf("join token n1 = %v, %v; want %v", got, err, rec)
			}
			if got, err := tx.JoinToken("n0"); got != nil || err != nil {
				t.Errorf("a token of an aborted transaction was stored: %v %v", got, err)
			}
			all, err := tx.JoinTokens()
			if err != nil || len(all) != 1 {
				t.Errorf("join tokens %v %v, want n1 only", all, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check(s)
	if reopen != nil {
		s = reopen()
		check(s)
	}
	c, err = s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteJoinToken("n1") })
	if err != nil || len(c.Events) != 0 {
		t.Fatalf("delete join token: %+v %v", c, err)
	}
	_ = s.View(context.Background(), func(tx store.ReadTx) error {
		if got, _ := tx.JoinToken("n1"); got != nil {
			t.Errorf("deleted join token is still there: %v", got)
		}
		return nil
	})
	if _, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.PutJoinToken(&apiv1.JoinTokenRecord{}) }); err == nil {
		t.Error("a join token without a nonce was stored")
	}
}

// nodeCertificatesAreRevisionedTouchedQuietlyAndSurviveReopen: a node certificate record is a
// resource with revisions and events (watchers learn of revocations from them); a touch rewrites it
// without either.
func nodeCertificatesAreRevisionedTouchedQuietlyAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	putCluster(t, s, "east", 1)
	w, err := s.Watch(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C() // nothing after revision 1 yet
	n := &apiv1.NodeCertificate{Cluster: "east", Node: "gw1", ClusterUid: "u1", Certificates: []*apiv1.IssuedCertificate{{Serial: "ab"}}}
	c, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.PutNodeCertificate(n) })
	if err != nil || c.Revision != 2 || len(c.Events) != 1 || c.Events[0].Kind != store.KindNodeCertificate || c.Events[0].Key != "east/gw1" ||
		c.Events[0].GetResource().GetNodeCertificate().GetRevision() != 2 {
		t.Fatalf("put node certificate: %+v %v", c, err)
	}
	if b := <-w.C(); b.Revision != 2 || keysOf(b.Events) != "nodecert:east/gw1" {
		t.Fatalf("watcher got %s at %d", keysOf(b.Events), b.Revision)
	}
	n.Certificates[0].Used = true
	c, err = s.Update(context.Background(), func(tx store.Tx) error { return tx.TouchNodeCertificate(n) })
	if err != nil || c.Revision != 2 || len(c.Events) != 0 {
		t.Fatalf("touch node certificate: %+v %v; want no revision and no event", c, err)
	}
	if _, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.TouchNodeCertificate(&apiv1.NodeCertificate{Cluster: "east", Node: "nope"})
	}); err == nil {
		t.Error("touching an absent node certificate succeeded")
	}
	if reopen != nil {
		s = reopen()
	}
	err = s.View(context.Background(), func(tx store.ReadTx) error {
		got, err := tx.NodeCertificate("east", "gw1")
		if err != nil || got == nil || got.Revision != 2 || !got.Certificates[0].Used {
			t.Errorf("node certificate %v %v: want revision 2, used", got, err)
		}
		all, err := tx.NodeCertificates()
		if err != nil || len(all) != 1 {
			t.Errorf("node certificates %v %v", all, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err = s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); keysOf(b.Events) != "cluster:east nodecert:east/gw1" {
		t.Fatalf("snapshot holds %s", keysOf(b.Events))
	}
	c, err = s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteNodeCertificate("east", "gw1") })
	if err != nil || len(c.Events) != 1 || c.Events[0].Type != apiv1.Event_DELETE {
		t.Fatalf("delete node certificate: %+v %v", c, err)
	}
}

// meshAddressClaimsAreQuietKeyedByAddressAndSurviveReopen: a mesh address claim is bookkeeping
// like a join token record (no revision, no event, in no watch), stored under its address, which
// must be an address's canonical text; claims are apart from join tokens (neither lists the
// other); they survive a reopen and an aborted transaction writes none.
func meshAddressClaimsAreQuietKeyedByAddressAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	putCluster(t, s, "east", 1)
	w, err := s.Watch(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C() // nothing after revision 1 yet
	claimed := timestamppb.New(time.Unix(2e9, 0))
	c1 := &apiv1.MeshAddressClaim{Address: "242.0.0.10", Cluster: "east", ClusterUid: "u1", Node: "gw1", Claimed: claimed}
	c2 := &apiv1.MeshAddressClaim{Address: "242.0.0.9", Cluster: "east", ClusterUid: "u1", Node: "gw2", Claimed: claimed}
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutMeshAddressClaim(c1); err != nil {
			return err
		}
		if err := tx.PutMeshAddressClaim(c2); err != nil {
			return err
		}
		return tx.PutJoinToken(&apiv1.JoinTokenRecord{Nonce: "n1", Cluster: "east"})
	})
	if err != nil || c.Revision != 1 || len(c.Events) != 0 {
		t.Fatalf("put mesh address claims: commit %+v err %v; want revision 1 still and no event", c, err)
	}
	_, err = s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutMeshAddressClaim(&apiv1.MeshAddressClaim{Address: "242.0.0.11", Cluster: "east", Node: "gw3"}); err != nil {
			return err
		}
		return errors.New("abort")
	})
	if err == nil {
		t.Fatal("aborted update succeeded")
	}
	// A quiet write wakes no watcher: the next batch is the cluster put below, nothing before it.
	putCluster(t, s, "west", 2)
	if b := <-w.C(); b.Revision != 2 || keysOf(b.Events) != "cluster:west" {
		t.Fatalf("watcher got %s at %d; want only cluster:west at 2", keysOf(b.Events), b.Revision)
	}
	check := func(s store.Store) {
		t.Helper()
		err := s.View(context.Background(), func(tx store.ReadTx) error {
			if got, err := tx.MeshAddressClaim("242.0.0.10"); err != nil || !proto.Equal(got, c1) {
				t.Errorf("claim of 242.0.0.10 = %v, %v; want %v", got, err, c1)
			}
			if got, err := tx.MeshAddressClaim("242.0.0.11"); got != nil || err != nil {
				t.Errorf("a claim of an aborted transaction was stored: %v %v", got, err)
			}
			if got, err := tx.MeshAddressClaim("242.0.0.1"); got != nil || err != nil {
				t.Errorf("claim of an unclaimed address: %v %v; want nil, nil", got, err)
			}
			all, err := tx.MeshAddressClaims()
			var addrs []string
			for _, c := range all {
				addrs = append(addrs, c.Address)
			}
			// Key order is the text's byte order: .10 before .9.
			if err != nil || fmt.Sprint(addrs) != "[242.0.0.10 242.0.0.9]" {
				t.Errorf("claims %v %v; want [242.0.0.10 242.0.0.9]", addrs, err)
			}
			if toks, err := tx.JoinTokens(); err != nil || len(toks) != 1 || toks[0].Nonce != "n1" {
				t.Errorf("join tokens %v %v; want n1 only (claims are not tokens)", toks, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check(s)
	if reopen != nil {
		s = reopen()
		check(s)
	}
	w, err = s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); keysOf(b.Events) != "cluster:east cluster:west" {
		t.Fatalf("snapshot holds %s; want the clusters only", keysOf(b.Events))
	}
	c, err = s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteMeshAddressClaim("242.0.0.10") })
	if err != nil || c.Revision != 2 || len(c.Events) != 0 {
		t.Fatalf("delete mesh address claim: %+v %v; want revision 2 still and no event", c, err)
	}
	// Deleting an absent claim is no error (as a delete of any absent key).
	if _, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteMeshAddressClaim("242.0.0.200") }); err != nil {
		t.Fatalf("delete an absent claim: %v", err)
	}
	_ = s.View(context.Background(), func(tx store.ReadTx) error {
		if got, _ := tx.MeshAddressClaim("242.0.0.10"); got != nil {
			t.Errorf("deleted claim is still there: %v", got)
		}
		if got, _ := tx.MeshAddressClaim("242.0.0.9"); got == nil {
			t.Error("deleting one claim deleted another")
		}
		return nil
	})
	for _, bad := range []struct{ addr, want string }{
		{"", `address "" is not an IP address`},
		{"242.0.0.x", `address "242.0.0.x" is not an IP address`},
		{"2001:db8:0:0::1", `address "2001:db8:0:0::1" is not in canonical form`},
		{"2001:DB8::1", `address "2001:DB8::1" is not in canonical form (2001:db8::1)`},
		{"fe80::1%eth0", `address "fe80::1%eth0" has a zone`},
	} {
		_, err := s.Update(context.Background(), func(tx store.Tx) error {
			return tx.PutMeshAddressClaim(&apiv1.MeshAddressClaim{Address: bad.addr, Cluster: "east", Node: "gw1"})
		})
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("claim of %q: %v; want an error saying %s", bad.addr, err, bad.want)
		}
	}
}

func theClustersDigestChangesWithTheClustersOnly(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	digest := func() uint64 {
		t.Helper()
		var d uint64
		if err := s.View(context.Background(), func(tx store.ReadTx) error {
			var err error
			d, err = tx.ClustersDigest()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	update := func(fn func(store.Tx) error) {
		t.Helper()
		if _, err := s.Update(context.Background(), fn); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uint64]string{digest(): "no cluster"}
	changed := func(what string) {
		t.Helper()
		d := digest()
		if prev, ok := seen[d]; ok {
			t.Fatalf("after %s the clusters digest is the one of %s", what, prev)
		}
		seen[d] = what
	}
	putCluster(t, s, "east", 1)
	changed("east created")
	eastOnly := digest()
	putCluster(t, s, "west", 2)
	changed("west created")
	d := digest()
	update(func(tx store.Tx) error {
		return tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", PrivateIp: "192.0.2.1"})
	})
	update(func(tx store.Tx) error {
		return tx.PutPolicy(&apiv1.Policy{Name: "p"})
	})
	if digest() != d {
		t.Fatal("an endpoint and a policy changed the clusters digest")
	}
	update(func(tx store.Tx) error {
		return tx.PutCluster(&apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.9.0.0/16"}})
	})
	changed("west's pod CIDR changed")
	update(func(tx store.Tx) error { return tx.DeleteCluster("west") })
	if digest() != eastOnly {
		t.Fatal("with west removed the clusters digest is not the one of east alone")
	}
}
