package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// After the health check disconnected a replica's watchers, new watchers get every later commit.
func TestEtcdWatchersAfterADisconnectGetLaterCommits(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	s, err := OpenEtcd(context.Background(), cluster.Client(t), "/cablemesh-recover/", Options{}, EtcdOptions{CompactInterval: -1, HealthInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	put := func(i int) uint64 {
		c, err := s.Update(t.Context(), func(tx Tx) error { return tx.PutCluster(&apiv1.Cluster{Name: fmt.Sprintf("c%d", i), Id: uint32(i)}) })
		if err != nil {
			t.Fatal(err)
		}
		return c.Revision
	}
	put(1)
	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	first := <-w.C()
	// What the health check does when it fails twice.
	s.hub.mu.Lock()
	s.dropWatchersLocked(ErrUnavailable)
	s.hub.mu.Unlock()
	if c := s.cancelWatch.Load(); c != nil {
		(*c)()
	}
	rev := put(2)
	for _, since := range []uint64{0, first.Revision} {
		w2, err := s.Watch(t.Context(), since)
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.After(5 * time.Second)
		for got := uint64(0); got < rev; {
			select {
			case b, ok := <-w2.C():
				if !ok {
					t.Fatalf("since %d: the new watcher ended: %v", since, w2.Err())
				}
				got = b.Revision
			case <-deadline:
				t.Fatalf("since %d: the new watcher never reached revision %d after a disconnect", since, rev)
			}
		}
	}
	rev = put(3)
	w3, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case b := <-w3.C():
		if b.Revision < rev {
			t.Fatalf("a snapshot at %d after the commit at %d", b.Revision, rev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no snapshot")
	}
}
