package store

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// TestEtcdMirrorReloadsAfterACompactionCutItsWatchOff: a replica whose etcd watch fell so far
// behind that etcd compacted the history it needed reloads everything, and its watchers get the
// commits they missed from the store's own event log, in order, or, when the log no longer holds
// them all, are disconnected to resume (from the log or a snapshot) rather than miss them.
func TestEtcdMirrorReloadsAfterACompactionCutItsWatchOff(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	for _, tt := range []struct {
		name     string
		logSize  int
		wantDrop bool
	}{
		{"the log holds what was missed: watchers get it", 100, false},
		{"the log was trimmed past it: watchers are disconnected", 2, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			root := fmt.Sprintf("/cablemesh-internal/%d/", tt.logSize)
			ctx := context.Background()
			opts := Options{LogSize: tt.logSize}
			a, err := OpenEtcd(ctx, cli, root, opts, EtcdOptions{CompactInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer a.Close()
			b, err := OpenEtcd(ctx, cli, root, opts, EtcdOptions{CompactInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer b.Close()
			w, err := a.Watch(t.Context(), 0)
			if err != nil {
				t.Fatal(err)
			}
			<-w.C()
			// a stops following etcd (as if its watch had stalled), b writes, etcd compacts.
			a.stop()
			<-a.done
			for i := 1; i <= 5; i++ {
				if _, err := b.Update(ctx, func(tx Tx) error { return tx.PutCluster(&apiv1.Cluster{Name: fmt.Sprintf("c%d", i), Id: uint32(i)}) }); err != nil {
					t.Fatal(err)
				}
			}
			resp, err := cli.Get(ctx, "/")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := cli.Compact(ctx, resp.Header.Revision); err != nil {
				t.Fatal(err)
			}
			fctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() {
				a.follow(fctx, a.state.Load().rev)
				close(done)
			}()
			defer func() {
				cancel()
				<-done
			}()
			select {
			case batch, ok := <-w.C():
				if tt.wantDrop {
					if ok || !errors.Is(w.Err(), ErrWatcherTooSlow) {
						t.Fatalf("got batch %v (open=%v, err %v); want the watcher disconnected as too slow", batch, ok, w.Err())
					}
					return
				}
				if !ok {
					t.Fatalf("watcher disconnected: %v", w.Err())
				}
				if batch.Snapshot || len(batch.Events) != 5 || batch.Events[0].Revision != 1 || batch.Revision != 5 {
					t.Fatalf("after the reload: %+v; want the 5 missed events, 1..5", batch)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("nothing reached the watcher after the compaction")
			}
			if st := a.state.Load(); getU64(a.readKV(st), keyRevision) != 5 {
				t.Fatalf("mirror at store revision %d after the reload, want 5", getU64(a.readKV(st), keyRevision))
			}
		})
	}
}

// TestEtcdHistoryIsCompactedOncePerInterval: replicas compact etcd's history (heartbeats would
// grow it without bound) to the revision one interval old, and their watches carry on.
func TestEtcdHistoryIsCompactedOncePerInterval(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	ctx := context.Background()
	var stores []*Etcd
	for range 2 {
		s, err := OpenEtcd(ctx, cli, "/cablemesh-compact/", Options{}, EtcdOptions{CompactInterval: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		stores = append(stores, s)
	}
	w, err := stores[1].Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C()
	first, err := cli.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	i := 0
	for {
		i++
		if _, err := stores[0].Update(ctx, func(tx Tx) error { return tx.PutPolicy(&apiv1.Policy{Name: fmt.Sprintf("p%d", i)}) }); err != nil {
			t.Fatal(err)
		}
		if b := <-w.C(); b.Revision != uint64(i) {
			t.Fatalf("watcher got revision %d, want %d", b.Revision, i)
		}
		if _, err := cli.Get(ctx, "/x", clientv3.WithRev(first.Header.Revision)); err != nil {
			t.Logf("history before revision %d is compacted after %d commits: %v", first.Header.Revision, i, err)
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("etcd's history was never compacted")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEtcdAReplicaThatLostEtcdDisconnectsItsWatchers: when etcd is gone, a replica's watchers
// are told (ErrUnavailable) within a few health checks instead of waiting on a stream that will
// never move, so agents go to a replica that still works.
func TestEtcdAReplicaThatLostEtcdDisconnectsItsWatchers(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	s, err := OpenEtcd(context.Background(), cluster.Client(t), "/cablemesh-health/", Options{},
		EtcdOptions{CompactInterval: -1, HealthInterval: 200 * time.Millisecond, AttemptTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C()
	// Healthy: nothing happens to the watcher over several checks.
	select {
	case b, ok := <-w.C():
		t.Fatalf("a healthy replica's watcher got %v (open=%v, err %v)", b, ok, w.Err())
	case <-time.After(time.Second):
	}
	cluster.Members[0].Kill()
	start := time.Now()
	select {
	case _, ok := <-w.C():
		if ok || !errors.Is(w.Err(), ErrUnavailable) {
			t.Fatalf("watcher: open=%v err %v; want it ended with ErrUnavailable", ok, w.Err())
		}
		t.Logf("watcher disconnected %s after etcd went away", time.Since(start).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("the watcher of a replica without etcd was never disconnected")
	}
}
