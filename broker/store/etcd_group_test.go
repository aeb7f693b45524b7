package store_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// The etcd store commits concurrent Updates in groups, one etcd transaction each, against an etcd
// with its default limits (128 operations, 1.5 MiB a request): every Update that succeeds gets
// revisions of its own, one that fails leaves nothing behind and does not take its group down,
// Updates that read what another of their group wrote (allocation) still never hand out one
// value twice, watchers see every revision once and in order, and the fleet of Updates costs
// far fewer etcd transactions than Updates.
func TestEtcdGroupsConcurrentUpdatesWithinEtcdsDefaultLimits(t *testing.T) {
	cluster := etcdtest.StartWith(t, 1, etcdtest.DefaultLimits...)
	cli := cluster.Client(t)
	s := openEtcd(t, cli, newRoot(t), store.Options{})
	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C() // the (empty) snapshot
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	before, err := cli.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}

	errOdd := errors.New("refused")
	const endpoints, clusters = 400, 60
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		commits  []store.Commit
		ids      = map[uint32]string{}
		failures []string
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		failures = append(failures, fmt.Sprintf(format, args...))
		mu.Unlock()
	}
	for i := range endpoints {
		wg.Go(func() {
			node := fmt.Sprintf("gw%03d", i)
			c, err := s.Update(ctx, func(tx store.Tx) error {
				// Every Update writes; the odd ones then fail, after their write.
				if err := tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: node, PrivateIp: "10.0.0.1"}); err != nil {
					return err
				}
				if i%2 == 1 {
					return errOdd
				}
				return nil
			})
			switch {
			case i%2 == 1 && !errors.Is(err, errOdd):
				fail("endpoint update %d: %v, want its own error", i, err)
			case i%2 == 0 && err != nil:
				fail("endpoint update %d failed: %v", i, err)
			case i%2 == 0:
				mu.Lock()
				commits = append(commits, c)
				mu.Unlock()
			}
		})
	}
	for i := range clusters {
		wg.Go(func() {
			name := fmt.Sprintf("c%02d", i)
			id, err := allocateCluster(ctx, s, name)
			if err != nil {
				fail("allocate %s: %v", name, err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if other, dup := ids[id]; dup {
				failures = append(failures, fmt.Sprintf("ID %d handed out to %s and %s", id, other, name))
			}
			ids[id] = name
		})
	}
	wg.Wait()
	for _, f := range failures {
		t.Error(f)
	}
	want := uint64(endpoints/2 + clusters)
	var nodes []string
	err = s.View(ctx, func(tx store.ReadTx) error {
		es, err := tx.Endpoints()
		for _, e := range es {
			nodes = append(nodes, e.Node)
		}
		if tx.Revision() != want {
			t.Errorf("revision %d after %d successful updates of one change each", tx.Revision(), want)
		}
		cs, _ := tx.Clusters()
		if len(cs) != clusters {
			t.Errorf("%d clusters stored, want %d", len(cs), clusters)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	var wantNodes []string
	for i := 0; i < endpoints; i += 2 {
		wantNodes = append(wantNodes, fmt.Sprintf("gw%03d", i))
	}
	if !slices.Equal(nodes, wantNodes) {
		t.Errorf("stored endpoints %v, want exactly the even ones %v", nodes, wantNodes)
	}
	// The watcher saw each commit once, in order.
	var seen uint64
	for seen < want {
		select {
		case b := <-w.C():
			for _, ev := range b.Events {
				if ev.Revision != seen+1 {
					t.Fatalf("watcher got revision %d after %d", ev.Revision, seen)
				}
				seen = ev.Revision
			}
		case <-ctx.Done():
			t.Fatalf("watcher saw revisions up to %d of %d", seen, want)
		}
	}
	after, err := cli.Get(ctx, "/")
	if err != nil {
		t.Fatal(err)
	}
	// Each etcd transaction moves etcd's revision by one; one per Update (failed ones write
	// nothing) would be endpoints/2+clusters.
	txns := after.Header.Revision - before.Header.Revision
	t.Logf("%d successful updates (and %d failed) committed in %d etcd transactions", want, endpoints/2, txns)
	if txns > int64(want)/2 {
		t.Errorf("%d updates took %d etcd transactions: they were not grouped", want, txns)
	}
}

// A group whose writes would not fit in one transaction of etcd's default limits is split:
// Updates that each write more than a quarter of the operations etcd allows all commit.
func TestEtcdSplitsAGroupThatWouldExceedEtcdsLimits(t *testing.T) {
	cluster := etcdtest.StartWith(t, 1, etcdtest.DefaultLimits...)
	s := openEtcd(t, cluster.Client(t), newRoot(t), store.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const updates, policiesEach = 20, 20 // 40 etcd operations each (resource + event)
	var wg sync.WaitGroup
	errs := make(chan error, updates)
	for i := range updates {
		wg.Go(func() {
			_, err := s.Update(ctx, func(tx store.Tx) error {
				for j := range policiesEach {
					if err := tx.PutPolicy(&apiv1.Policy{Name: fmt.Sprintf("p%02d-%02d", i, j)}); err != nil {
						return err
					}
				}
				return nil
			})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("update failed: %v", err)
		}
	}
	err := s.View(ctx, func(tx store.ReadTx) error {
		ps, err := tx.Policies()
		if len(ps) != updates*policiesEach {
			t.Errorf("%d policies stored, want %d", len(ps), updates*policiesEach)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// An Update too large for etcd alone fails with an error that says so, and only it: the Updates
// that waited behind it in the same group commit.
func TestEtcdAnUpdateTooLargeForEtcdFailsAlone(t *testing.T) {
	cluster := etcdtest.StartWith(t, 1, etcdtest.DefaultLimits...)
	s := openEtcd(t, cluster.Client(t), newRoot(t), store.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for round := range 5 {
		var wg sync.WaitGroup
		bigErr := make(chan error, 1)
		wg.Go(func() {
			_, err := s.Update(ctx, func(tx store.Tx) error {
				for j := range 100 { // 200 etcd operations: over the default 128
					if err := tx.PutPolicy(&apiv1.Policy{Name: fmt.Sprintf("big%d-%03d", round, j)}); err != nil {
						return err
					}
				}
				return nil
			})
			bigErr <- err
		})
		errs := make(chan error, 20)
		for i := range 20 {
			wg.Go(func() {
				_, err := s.Update(ctx, func(tx store.Tx) error {
					return tx.PutPolicy(&apiv1.Policy{Name: fmt.Sprintf("small%d-%02d", round, i)})
				})
				errs <- err
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Fatalf("round %d: a small update failed beside the large one: %v", round, err)
			}
		}
		if err := <-bigErr; err == nil || !strings.Contains(err.Error(), "--max-txn-ops") {
			t.Fatalf("round %d: the update of 200 operations: %v, want the error naming --max-txn-ops", round, err)
		}
	}
}

// An Update runs on the replica's mirror without first catching up with etcd; what it read must
// still be current when it returns, even when it writes nothing: a replica's Update sees every
// write another replica acknowledged before it began.
func TestEtcdAnUpdateSeesWhatAnotherReplicaAcknowledged(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := newRoot(t)
	a := openEtcd(t, cluster.Client(t), root, store.Options{})
	b := openEtcd(t, cluster.Client(t), root, store.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range 100 {
		name := fmt.Sprintf("c%03d", i)
		if _, err := a.Update(ctx, func(tx store.Tx) error {
			return tx.PutCluster(&apiv1.Cluster{Name: name, Id: uint32(i + 1)})
		}); err != nil {
			t.Fatal(err)
		}
		// Read-only, then writing: both must see the cluster a just wrote.
		var rev uint64
		if _, err := b.Update(ctx, func(tx store.Tx) error {
			c, err := tx.Cluster(name)
			if err != nil {
				return err
			}
			if c == nil {
				return fmt.Errorf("cluster %s, acknowledged by the other replica, is not there", name)
			}
			rev = tx.Revision()
			return nil
		}); err != nil {
			t.Fatalf("read-only update %d: %v", i, err)
		}
		// Each round commits a's write, then b's: a's of round i is revision 2i+1.
		if rev != uint64(2*i+1) {
			t.Fatalf("read-only update after %d commits saw revision %d", 2*i+1, rev)
		}
		if _, err := b.Update(ctx, func(tx store.Tx) error {
			c, err := tx.Cluster(name)
			if err != nil || c == nil {
				return fmt.Errorf("cluster %s, acknowledged by the other replica, is not there (%v)", name, err)
			}
			c.Labels = map[string]string{"seen": "b"}
			return tx.PutCluster(c)
		}); err != nil {
			t.Fatalf("writing update %d: %v", i, err)
		}
	}
}
