package store_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/registry"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
	"github.com/cablemesh/cablemesh/broker/store/storetest"
)

var rootSeq atomic.Int64

// newRoot is a fresh key root for one test inside a shared etcd.
func newRoot(t *testing.T) string {
	return fmt.Sprintf("/cablemesh-test/%d-%s/", rootSeq.Add(1), strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()))
}

func openEtcd(t *testing.T, cli *clientv3.Client, root string, opts store.Options) *store.Etcd {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := store.OpenEtcd(ctx, cli, root, opts, store.EtcdOptions{CompactInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestEtcdConformance(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	storetest.Run(t, func(t *testing.T, opts store.Options) (store.Store, func() store.Store) {
		root := newRoot(t)
		s := openEtcd(t, cli, root, opts)
		return s, func() store.Store {
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			return openEtcd(t, cli, root, opts)
		}
	})
}

// allocateCluster adds a cluster with the lowest free ID, as the broker's CreateJoinToken does
// (admission.AdmitCluster): read every cluster, pick, write, in one Update.
func allocateCluster(ctx context.Context, s store.Store, name string) (uint32, error) {
	var id uint32
	_, err := s.Update(ctx, func(tx store.Tx) error {
		cs, err := tx.Clusters()
		if err != nil {
			return err
		}
		used := map[uint32]bool{}
		for _, c := range cs {
			used[c.Id] = true
		}
		if id, err = registry.AllocateID(used); err != nil {
			return err
		}
		return tx.PutCluster(&apiv1.Cluster{Name: name, Id: id})
	})
	return id, err
}

// TestEtcdTwoReplicasNeverAllocateTheSameID is the allocation proof: two replicas (two stores,
// each with its own client, on one etcd cluster of three members) allocate cluster IDs
// concurrently from several goroutines each; every allocation that succeeded holds a distinct
// ID, what etcd holds afterwards is exactly those clusters, and watchers on both replicas see
// every commit of both, once, in revision order.
func TestEtcdTwoReplicasNeverAllocateTheSameID(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	root := newRoot(t)
	a := openEtcd(t, cluster.Client(t), root, store.Options{})
	b := openEtcd(t, cluster.Client(t), root, store.Options{})
	const perReplica, goroutines = 60, 4

	type seen struct {
		revs []uint64
		err  error
	}
	watch := func(s store.Store) chan seen {
		w, err := s.Watch(t.Context(), 0)
		if err != nil {
			t.Fatal(err)
		}
		ch := make(chan seen, 1)
		go func() {
			var r seen
			for batch := range w.C() {
				if batch.Snapshot {
					continue
				}
				for _, ev := range batch.Events {
					r.revs = append(r.revs, ev.Revision)
				}
				if len(r.revs) >= 2*perReplica {
					break
				}
			}
			r.err = w.Err()
			ch <- r
		}()
		return ch
	}
	wa, wb := watch(a), watch(b)

	var (
		mu   sync.Mutex
		ids  = map[uint32]string{}
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	for r, s := range []store.Store{a, b} {
		for g := range goroutines {
			wg.Go(func() {
				for i := range perReplica / goroutines {
					name := fmt.Sprintf("r%d-g%d-%d", r, g, i)
					id, err := allocateCluster(context.Background(), s, name)
					mu.Lock()
					if err != nil {
						errs = append(errs, err)
					} else if other, dup := ids[id]; dup {
						errs = append(errs, fmt.Errorf("ID %d handed out twice: to %s and %s", id, other, name))
					} else {
						ids[id] = name
					}
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	t.Logf("%d allocations from two replicas in %s", len(ids), time.Since(start).Round(time.Millisecond))
	if len(errs) > 0 {
		t.Fatalf("%d failures, first: %v", len(errs), errs[0])
	}
	if len(ids) != 2*perReplica {
		t.Fatalf("%d IDs allocated, want %d", len(ids), 2*perReplica)
	}
	for _, s := range []store.Store{a, b} {
		var cs []*apiv1.Cluster
		var rev uint64
		err := s.View(context.Background(), func(tx store.ReadTx) error {
			var err error
			cs, err = tx.Clusters()
			rev = tx.Revision()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(cs) != 2*perReplica || rev != 2*perReplica {
			t.Fatalf("store holds %d clusters at revision %d, want %d at %d", len(cs), rev, 2*perReplica, 2*perReplica)
		}
		for _, c := range cs {
			if ids[c.Id] != c.Name {
				t.Fatalf("stored cluster %s has ID %d, which was acknowledged to %q", c.Name, c.Id, ids[c.Id])
			}
		}
	}
	for name, ch := range map[string]chan seen{"a": wa, "b": wb} {
		select {
		case r := <-ch:
			if len(r.revs) != 2*perReplica {
				t.Fatalf("watcher on replica %s saw %d events (then %v), want %d", name, len(r.revs), r.err, 2*perReplica)
			}
			for i, rev := range r.revs {
				if rev != uint64(i+1) {
					t.Fatalf("watcher on replica %s: event %d has revision %d, want %d", name, i, rev, i+1)
				}
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("watcher on replica %s did not see every commit", name)
		}
	}
}

// TestEtcdAReplicaReadsWhatAnotherAcknowledged: a View on one replica right after a write on
// another (one that bumps the revision, or a quiet one) sees the write (reads are linearizable, not "eventually" the mirror's), and a watch
// that resumes on the second replica from the first's revision gets no older snapshot.
func TestEtcdAReplicaReadsWhatAnotherAcknowledged(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := newRoot(t)
	a := openEtcd(t, cluster.Client(t), root, store.Options{})
	b := openEtcd(t, cluster.Client(t), root, store.Options{})
	for i := 1; i <= 50; i++ {
		c, err := a.Update(context.Background(), func(tx store.Tx) error {
			return tx.PutPolicy(&apiv1.Policy{Name: fmt.Sprintf("p%03d", i), Json: []byte("{}")})
		})
		if err != nil {
			t.Fatal(err)
		}
		err = b.View(context.Background(), func(tx store.ReadTx) error {
			p, err := tx.Policy(fmt.Sprintf("p%03d", i))
			if err == nil && (p == nil || tx.Revision() < c.Revision) {
				return fmt.Errorf("replica b at revision %d does not have policy p%03d acknowledged by a at %d", tx.Revision(), i, c.Revision)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		w, err := b.Watch(t.Context(), c.Revision)
		if err != nil {
			t.Fatal(err)
		}
		if first := <-w.C(); first.Snapshot || first.Revision != c.Revision {
			t.Fatalf("resume on b from a's revision %d: snapshot=%v at %d", c.Revision, first.Snapshot, first.Revision)
		}
		// A quiet write (no revision: a join token record, a heartbeat) too.
		nonce := fmt.Sprintf("n%03d", i)
		if _, err := a.Update(context.Background(), func(tx store.Tx) error {
			return tx.PutJoinToken(&apiv1.JoinTokenRecord{Nonce: nonce, Cluster: "east"})
		}); err != nil {
			t.Fatal(err)
		}
		err = b.View(context.Background(), func(tx store.ReadTx) error {
			r, err := tx.JoinToken(nonce)
			if err == nil && r == nil {
				return fmt.Errorf("replica b does not have join token %s acknowledged by a", nonce)
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// TestEtcdAReaperNeverWithdrawsALeaseAnotherReplicaRenewed: replica b renews the leases of
// endpoints (TouchEndpoint, no revision) while replica a reaps the ones it reads as expired
// (list, then delete, in one Update). The two are serialized as in one process: every renewal
// b got an OK for survives, and every endpoint a withdrew was one whose renewal failed because
// it was already gone.
func TestEtcdAReaperNeverWithdrawsALeaseAnotherReplicaRenewed(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := newRoot(t)
	a := openEtcd(t, cluster.Client(t), root, store.Options{})
	b := openEtcd(t, cluster.Client(t), root, store.Options{})
	ctx := context.Background()
	const nodes = 40
	soon, later := time.Now().Add(10*time.Minute), time.Now().Add(2*time.Hour)
	expired := func(e *apiv1.Endpoint) bool { return e.LeaseExpires.AsTime().Before(time.Now().Add(30 * time.Minute)) }
	_, err := a.Update(ctx, func(tx store.Tx) error {
		for i := range nodes {
			if err := tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: fmt.Sprintf("gw%02d", i), LeaseExpires: timestamppb.New(soon)}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	renewed := map[string]bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range nodes {
			node := fmt.Sprintf("gw%02d", i)
			_, err := b.Update(ctx, func(tx store.Tx) error {
				return tx.TouchEndpoint(&apiv1.Endpoint{Cluster: "east", Node: node, LeaseExpires: timestamppb.New(later)})
			})
			if err == nil {
				renewed[node] = true
			} else if !strings.Contains(err.Error(), "not found") {
				t.Errorf("renew %s: %v", node, err)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	var withdrawn []string
	for {
		var reaped []string
		_, err := a.Update(ctx, func(tx store.Tx) error {
			reaped = reaped[:0]
			eps, err := tx.Endpoints()
			if err != nil {
				return err
			}
			time.Sleep(time.Millisecond) // widen the window between the read and the commit
			for _, e := range eps {
				if expired(e) {
					reaped = append(reaped, e.Node)
					if err := tx.DeleteEndpoint(e.Cluster, e.Node); err != nil {
						return err
					}
				}
				if len(reaped) == 2 {
					break // a few at a time, so that renewals and reaps interleave
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		withdrawn = append(withdrawn, reaped...)
		if len(reaped) == 0 {
			select {
			case <-done:
			default:
				continue
			}
			break
		}
	}
	<-done
	var left []*apiv1.Endpoint
	_ = a.View(ctx, func(tx store.ReadTx) error { left, err = tx.Endpoints(); return err })
	for _, n := range withdrawn {
		if renewed[n] {
			t.Errorf("endpoint %s was withdrawn although its renewal was acknowledged", n)
		}
	}
	if len(left) != len(renewed) || len(left)+len(withdrawn) != nodes {
		t.Errorf("%d endpoints left, %d renewed, %d withdrawn of %d", len(left), len(renewed), len(withdrawn), nodes)
	}
	for _, e := range left {
		if !renewed[e.Node] || expired(e) {
			t.Errorf("endpoint %s left with lease %v, renewed=%v", e.Node, e.LeaseExpires.AsTime(), renewed[e.Node])
		}
	}
	t.Logf("%d renewals and %d withdrawals interleaved across two replicas", len(renewed), len(withdrawn))
}

// TestEtcdUpdateRidesOutTheLossOfAMember: with three members, killing one (the one a replica's
// client may be talking to) during a stream of writes loses no acknowledged write.
func TestEtcdUpdateRidesOutTheLossOfAMember(t *testing.T) {
	cluster := etcdtest.Start(t, 3)
	root := newRoot(t)
	s := openEtcd(t, cluster.Client(t), root, store.Options{})
	var acked []string
	deadline := time.Now().Add(6 * time.Second)
	killed := false
	for i := 0; time.Now().Before(deadline); i++ {
		if !killed && i == 20 {
			cluster.Members[0].Kill()
			killed = true
		}
		name := fmt.Sprintf("p%04d", i)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := s.Update(ctx, func(tx store.Tx) error { return tx.PutPolicy(&apiv1.Policy{Name: name, Json: []byte("{}")}) })
		cancel()
		if err == nil {
			acked = append(acked, name)
		} else {
			t.Logf("write %s: %v", name, err)
		}
	}
	if len(acked) < 25 {
		t.Fatalf("only %d writes acknowledged", len(acked))
	}
	// A fresh replica (a new client) sees them all.
	s2 := openEtcd(t, cluster.Client(t), root, store.Options{})
	var names []string
	err := s2.View(context.Background(), func(tx store.ReadTx) error {
		ps, err := tx.Policies()
		for _, p := range ps {
			names = append(names, p.Name)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range acked {
		if !slices.Contains(names, n) {
			t.Fatalf("acknowledged write %s is missing after a member was lost", n)
		}
	}
	t.Logf("%d writes acknowledged across the loss of a member, all present", len(acked))
}

func TestEtcdSecretsAreSealedAndOpenOnlyWithTheirKey(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	cli := cluster.Client(t)
	root := newRoot(t)
	ctx := context.Background()
	key := make([]byte, store.SecretKeySize)
	for i := range key {
		key[i] = byte(i)
	}
	sec, err := store.NewEtcdSecrets(cli, root, key)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := sec.Load(ctx); ok || err != nil {
		t.Fatalf("load before anything was stored: ok=%v err=%v", ok, err)
	}
	if has, err := store.EtcdHasSecrets(ctx, cli, root); has || err != nil {
		t.Fatalf("EtcdHasSecrets before: %v %v", has, err)
	}
	want := map[string][]byte{"ca.key": []byte("-----BEGIN EC PRIVATE KEY----- very secret"), "mesh-secret.key": {1, 2, 3}}
	got, created, err := sec.Create(ctx, want)
	if err != nil || !created || string(got["ca.key"]) != string(want["ca.key"]) {
		t.Fatalf("create: %v %v %v", got, created, err)
	}
	// A second replica's Create loses and gets the first's.
	got, created, err = sec.Create(ctx, map[string][]byte{"ca.key": []byte("another")})
	if err != nil || created || string(got["ca.key"]) != string(want["ca.key"]) {
		t.Fatalf("second create: %q created=%v err=%v; want the first's secrets", got["ca.key"], created, err)
	}
	// Nothing in etcd holds the plaintext.
	resp, err := cli.Get(ctx, root, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Value), "very secret") || strings.Contains(string(kv.Value), "BEGIN") {
			t.Fatalf("etcd key %s holds a secret in the clear: %s", kv.Key, kv.Value)
		}
	}
	// Another key is named in the error, not a bare decryption failure.
	other := append([]byte(nil), key...)
	other[0] ^= 1
	sec2, _ := store.NewEtcdSecrets(cli, root, other)
	if _, _, err := sec2.Load(ctx); err == nil || !strings.Contains(err.Error(), store.SecretKeyID(key)) || !strings.Contains(err.Error(), "copy the secret key file") {
		t.Fatalf("load with another key: %v; want an error naming both keys and what to do", err)
	}
	// Tampering is detected.
	v := string(resp.Kvs[0].Value)
	i := strings.Index(v, `"sealed":"`) + len(`"sealed":"`)
	flip := map[byte]byte{'0': '1', '1': '0'}
	b := []byte(v)
	if f, ok := flip[b[i]]; ok {
		b[i] = f
	} else {
		b[i] = '0'
	}
	if _, err := cli.Put(ctx, string(resp.Kvs[0].Key), string(b)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := sec.Load(ctx); err == nil || !strings.Contains(err.Error(), "does not decrypt") {
		t.Fatalf("load of a tampered value: %v", err)
	}
	// Modify swaps atomically.
	if err := sec.Modify(ctx, func(map[string][]byte) (map[string][]byte, error) { return want, nil }); err == nil {
		t.Fatal("modify over a tampered value succeeded")
	}
	if _, err := cli.Delete(ctx, string(resp.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	err = sec.Modify(ctx, func(cur map[string][]byte) (map[string][]byte, error) {
		cur["next"] = []byte("x")
		return cur, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if m, ok, err := sec.Load(ctx); !ok || err != nil || string(m["next"]) != "x" {
		t.Fatalf("after modify: %v %v %v", m, ok, err)
	}
}

func TestSecretKeyFileIsCreatedOnlyWhenEtcdHasNoSecrets(t *testing.T) {
	dir := t.TempDir()
	path := dir + "/secret.key"
	if _, _, err := store.LoadOrCreateSecretKey(path, false); !errors.Is(err, store.ErrNoSecretKey) {
		t.Fatalf("missing key while etcd has secrets: %v, want ErrNoSecretKey", err)
	}
	k, created, err := store.LoadOrCreateSecretKey(path, true)
	if err != nil || !created || len(k) != store.SecretKeySize {
		t.Fatalf("create: %d bytes created=%v err=%v", len(k), created, err)
	}
	k2, created, err := store.LoadOrCreateSecretKey(path, true)
	if err != nil || created || string(k2) != string(k) {
		t.Fatalf("reload: created=%v err=%v", created, err)
	}
	if err := chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := store.LoadOrCreateSecretKey(path, true); err == nil || !strings.Contains(err.Error(), "readable by others") {
		t.Fatalf("world-readable key: %v", err)
	}
}

func chmod(path string, mode os.FileMode) error { return os.Chmod(path, mode) }

// TestEtcdAListingSeesAQuietDeleteOfAnotherReplica: deletes that bump no revision (join token
// records) still invalidate a concurrent transaction that listed their bucket. Replica a copies
// token tN if its listing has it; replica b deletes tN unless the copy exists. In any serial
// order the copy and the deletion never both happen.
func TestEtcdAListingSeesAQuietDeleteOfAnotherReplica(t *testing.T) {
	cluster := etcdtest.Start(t, 1)
	root := newRoot(t)
	a := openEtcd(t, cluster.Client(t), root, store.Options{})
	b := openEtcd(t, cluster.Client(t), root, store.Options{})
	ctx := context.Background()
	const rounds = 30
	for i := range rounds {
		tok := fmt.Sprintf("t%02d", i)
		if _, err := a.Update(ctx, func(tx store.Tx) error { return tx.PutJoinToken(&apiv1.JoinTokenRecord{Nonce: tok, Cluster: "east"}) }); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Go(func() {
			_, err := a.Update(ctx, func(tx store.Tx) error {
				all, err := tx.JoinTokens()
				if err != nil {
					return err
				}
				time.Sleep(2 * time.Millisecond)
				for _, r := range all {
					if r.Nonce == tok {
						return tx.PutJoinToken(&apiv1.JoinTokenRecord{Nonce: tok + "-copy", Cluster: "east"})
					}
				}
				return nil
			})
			if err != nil {
				t.Error(err)
			}
		})
		wg.Go(func() {
			_, err := b.Update(ctx, func(tx store.Tx) error {
				c, err := tx.JoinToken(tok + "-copy")
				if err != nil || c != nil {
					return err
				}
				time.Sleep(2 * time.Millisecond)
				return tx.DeleteJoinToken(tok)
			})
			if err != nil {
				t.Error(err)
			}
		})
		wg.Wait()
		err := a.View(ctx, func(tx store.ReadTx) error {
			orig, err1 := tx.JoinToken(tok)
			cp, err2 := tx.JoinToken(tok + "-copy")
			if err1 != nil || err2 != nil {
				return errors.Join(err1, err2)
			}
			if orig == nil && cp != nil {
				return fmt.Errorf("round %d: %s was copied from a listing and deleted by a transaction that saw no copy: not serializable", i, tok)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// The costs of the etcd store's operations against a local one-member etcd on tmpfs (no fsync
// cost): go test -run - -bench Etcd ./broker/store/
func benchEtcd(b *testing.B) (*store.Etcd, *store.Etcd) {
	cluster := etcdtest.Start(b, 1)
	root := fmt.Sprintf("/cablemesh-bench/%d/", rootSeq.Add(1))
	open := func() *store.Etcd {
		s, err := store.OpenEtcd(context.Background(), cluster.Client(b), root, store.Options{}, store.EtcdOptions{CompactInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		return s
	}
	s := open()
	_, err := s.Update(context.Background(), func(tx store.Tx) error {
		for i := range 1000 {
			if err := tx.PutEndpoint(&apiv1.Endpoint{Cluster: fmt.Sprintf("c%03d", i/10), Node: fmt.Sprintf("gw%d", i%10), PrivateIp: "10.0.0.1"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return s, open()
}

// BenchmarkEtcdHeartbeat: TouchEndpoint of one of 1,000 endpoints, from parallel callers on two
// replicas (what 1,000 gateways' heartbeats cost).
func BenchmarkEtcdHeartbeat(b *testing.B) {
	s1, s2 := benchEtcd(b)
	var n atomic.Int64
	b.SetParallelism(16) // many gateways at once
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := n.Add(1)
		s := s1
		if i%2 == 0 {
			s = s2
		}
		for pb.Next() {
			i++
			_, err := s.Update(context.Background(), func(tx store.Tx) error {
				return tx.TouchEndpoint(&apiv1.Endpoint{Cluster: fmt.Sprintf("c%03d", i%1000/10), Node: fmt.Sprintf("gw%d", i%10), LastHeartbeat: timestamppb.Now()})
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEtcdPolicyWrite: a revision-bumping write (one policy), parallel callers on two
// replicas: these serialize on meta/revision.
func BenchmarkEtcdPolicyWrite(b *testing.B) {
	s1, s2 := benchEtcd(b)
	var n atomic.Int64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := n.Add(1)
		s := s1
		if i%2 == 0 {
			s = s2
		}
		for pb.Next() {
			i++
			_, err := s.Update(context.Background(), func(tx store.Tx) error {
				return tx.PutPolicy(&apiv1.Policy{Name: fmt.Sprintf("p%d", i%100), Json: []byte("{}")})
			})
			if err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkEtcdView: a linearizable read of one cluster.
func BenchmarkEtcdView(b *testing.B) {
	s, _ := benchEtcd(b)
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.View(context.Background(), func(tx store.ReadTx) error { _, err := tx.Endpoint("c001", "gw1"); return err }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
