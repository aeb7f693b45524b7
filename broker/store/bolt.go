package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	bolt "go.etcd.io/bbolt"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

var (
	bucketMeta      = []byte("meta")
	bucketClusters  = []byte("clusters")
	bucketEndpoints = []byte("endpoints")
	bucketEvents    = []byte("events")
	bucketPolicies  = []byte("policies")

	keyRevision  = []byte("revision")
	keyCompacted = []byte("compacted")
)

// Options tune a Bolt store; zero values take the defaults.
type Options struct {
	// LogSize is how many events the log keeps for resuming watchers (default 10,000).
	LogSize int
	// WatchBuffer is how many batches a watcher may lag behind before it is dropped (default 1,024).
	WatchBuffer int
}

// Bolt is the embedded store: one bbolt file.
type Bolt struct {
	db   *bolt.DB
	opts Options

	// mu serialises commits with the publishing of their events and with the registration of
	// watchers, so that a watcher sees every revision exactly once and in order.
	mu     sync.Mutex
	subs   map[*boltWatch]struct{}
	closed bool
}

// OpenBolt opens (creating if needed) the store at path.
func OpenBolt(path string, opts Options) (*Bolt, error) {
	if opts.LogSize <= 0 {
		opts.LogSize = 10000
	}
	if opts.WatchBuffer <= 0 {
		opts.WatchBuffer = 1024
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		if errors.Is(err, bolt.ErrTimeout) {
			return nil, fmt.Errorf("open store %s: locked by another process (is another cable-broker running on this data dir?)", path)
		}
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketMeta, bucketClusters, bucketEndpoints, bucketEvents, bucketPolicies} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return fmt.Errorf("create bucket %s: %w", b, err)
			}
		}
		return nil
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	return &Bolt{db: db, opts: opts, subs: map[*boltWatch]struct{}{}}, nil
}

// Close ends every watch and closes the file.
func (s *Bolt) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for w := range s.subs {
		s.dropLocked(w, ErrClosed)
	}
	s.mu.Unlock()
	return s.db.Close()
}

// View implements Store.
func (s *Bolt) View(ctx context.Context, fn func(ReadTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(btx *bolt.Tx) error {
		return fn(&boltTx{btx: btx, rev: getU64(btx.Bucket(bucketMeta), keyRevision)})
	})
}

// Update implements Store.
func (s *Bolt) Update(ctx context.Context, fn func(Tx) error) (Commit, error) {
	if err := ctx.Err(); err != nil {
		return Commit{}, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return Commit{}, ErrClosed
	}
	var t *boltTx
	err := s.db.Update(func(btx *bolt.Tx) error {
		t = &boltTx{btx: btx, rev: getU64(btx.Bucket(bucketMeta), keyRevision), writable: true}
		if err := fn(t); err != nil {
			return err
		}
		return t.finish(s.opts.LogSize)
	})
	if err != nil {
		return Commit{}, err
	}
	c := Commit{Revision: t.rev, Events: t.events}
	if len(c.Events) > 0 {
		s.publishLocked(Batch{Events: c.Events, Revision: c.Revision})
	}
	return c, nil
}

func (s *Bolt) publishLocked(b Batch) {
	for w := range s.subs {
		// Each watcher gets its own copies: the hub must not share mutable messages between
		// goroutines.
		cp := Batch{Snapshot: b.Snapshot, Revision: b.Revision, Events: cloneEvents(b.Events)}
		select {
		case w.ch <- cp:
		default:
			s.dropLocked(w, ErrWatcherTooSlow)
		}
	}
}

func (s *Bolt) dropLocked(w *boltWatch, err error) {
	if _, ok := s.subs[w]; !ok {
		return
	}
	delete(s.subs, w)
	w.err = err
	close(w.ch)
}

type boltWatch struct {
	ch  chan Batch
	err error // written under Bolt.mu before ch is closed; read after ch is closed
}

func (w *boltWatch) C() <-chan Batch { return w.ch }
func (w *boltWatch) Err() error      { return w.err }

// Watch implements Store.
func (s *Bolt) Watch(ctx context.Context, since uint64) (Watch, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	var first Batch
	err := s.db.View(func(btx *bolt.Tx) error {
		meta := btx.Bucket(bucketMeta)
		rev, compacted := getU64(meta, keyRevision), getU64(meta, keyCompacted)
		first.Revision = rev
		if since > 0 && since >= compacted && since <= rev {
			c := btx.Bucket(bucketEvents).Cursor()
			for k, v := c.Seek(u64Key(since + 1)); k != nil; k, v = c.Next() {
				ev := &apiv1.Event{}
				if err := proto.Unmarshal(v, ev); err != nil {
					return fmt.Errorf("decode event %d: %w", binary.BigEndian.Uint64(k), err)
				}
				first.Events = append(first.Events, ev)
			}
			return nil
		}
		first.Snapshot = true
		t := &boltTx{btx: btx, rev: rev}
		cs, err := t.Clusters()
		if err != nil {
			return err
		}
		es, err := t.Endpoints()
		if err != nil {
			return err
		}
		for _, c := range cs {
			first.Events = append(first.Events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: KindCluster, Key: c.Name,
				Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: c}}, Revision: rev})
		}
		for _, e := range es {
			first.Events = append(first.Events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: KindEndpoint, Key: EndpointKey(e.Cluster, e.Node),
				Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}}, Revision: rev})
		}
		ps, err := t.Policies()
		if err != nil {
			return err
		}
		for _, p := range ps {
			first.Events = append(first.Events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: KindPolicy, Key: p.Name,
				Resource: &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: p}}, Revision: rev})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("start watch from revision %d: %w", since, err)
	}
	w := &boltWatch{ch: make(chan Batch, s.opts.WatchBuffer+1)}
	w.ch <- first
	s.subs[w] = struct{}{}
	// The watch's context owns this goroutine; it also ends when the watch is dropped for another
	// reason, because dropLocked is idempotent and the goroutine only waits for ctx.
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		s.dropLocked(w, ctx.Err())
		s.mu.Unlock()
	}()
	return w, nil
}

// boltTx implements Tx over one bbolt transaction.
type boltTx struct {
	btx      *bolt.Tx
	rev      uint64
	writable bool
	events   []*apiv1.Event
}

func (t *boltTx) Revision() uint64 { return t.rev }

func (t *boltTx) Cluster(name string) (*apiv1.Cluster, error) {
	v := t.btx.Bucket(bucketClusters).Get([]byte(name))
	if v == nil {
		return nil, nil
	}
	c := &apiv1.Cluster{}
	if err := proto.Unmarshal(v, c); err != nil {
		return nil, fmt.Errorf("decode cluster %q: %w", name, err)
	}
	return c, nil
}

func (t *boltTx) Clusters() ([]*apiv1.Cluster, error) {
	var out []*apiv1.Cluster
	err := t.btx.Bucket(bucketClusters).ForEach(func(k, v []byte) error {
		c := &apiv1.Cluster{}
		if err := proto.Unmarshal(v, c); err != nil {
			return fmt.Errorf("decode cluster %q: %w", k, err)
		}
		out = append(out, c)
		return nil
	})
	return out, err
}

func (t *boltTx) Endpoint(cluster, node string) (*apiv1.Endpoint, error) {
	key := EndpointKey(cluster, node)
	v := t.btx.Bucket(bucketEndpoints).Get([]byte(key))
	if v == nil {
		return nil, nil
	}
	e := &apiv1.Endpoint{}
	if err := proto.Unmarshal(v, e); err != nil {
		return nil, fmt.Errorf("decode endpoint %q: %w", key, err)
	}
	return e, nil
}

func (t *boltTx) Endpoints() ([]*apiv1.Endpoint, error) {
	var out []*apiv1.Endpoint
	err := t.btx.Bucket(bucketEndpoints).ForEach(func(k, v []byte) error {
		e := &apiv1.Endpoint{}
		if err := proto.Unmarshal(v, e); err != nil {
			return fmt.Errorf("decode endpoint %q: %w", k, err)
		}
		out = append(out, e)
		return nil
	})
	return out, err
}

var errReadOnly = errors.New("write in a read-only transaction")

func (t *boltTx) PutCluster(c *apiv1.Cluster) error {
	if !t.writable {
		return errReadOnly
	}
	if c.GetName() == "" {
		return errors.New("put cluster: name is empty")
	}
	c = proto.Clone(c).(*apiv1.Cluster)
	// Pair PSKs are derived per watcher when the broker sends a cluster; they are never stored.
	c.PairPsk = nil
	t.rev++
	c.Revision = t.rev
	if err := putProto(t.btx.Bucket(bucketClusters), c.Name, c); err != nil {
		return fmt.Errorf("put cluster %q: %w", c.Name, err)
	}
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: KindCluster, Key: c.Name,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: c}}, Revision: t.rev})
	return nil
}

func (t *boltTx) DeleteCluster(name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Cluster(name)
	if err != nil || old == nil {
		return err
	}
	if err := t.btx.Bucket(bucketClusters).Delete([]byte(name)); err != nil {
		return fmt.Errorf("delete cluster %q: %w", name, err)
	}
	t.rev++
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_DELETE, Kind: KindCluster, Key: name,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: old}}, Revision: t.rev})
	return nil
}

func (t *boltTx) PutEndpoint(e *apiv1.Endpoint) error {
	if !t.writable {
		return errReadOnly
	}
	if e.GetCluster() == "" || e.GetNode() == "" {
		return errors.New("put endpoint: cluster or node is empty")
	}
	e = proto.Clone(e).(*apiv1.Endpoint)
	t.rev++
	e.Revision = t.rev
	key := EndpointKey(e.Cluster, e.Node)
	if err := putProto(t.btx.Bucket(bucketEndpoints), key, e); err != nil {
		return fmt.Errorf("put endpoint %q: %w", key, err)
	}
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: KindEndpoint, Key: key,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}}, Revision: t.rev})
	return nil
}

func (t *boltTx) TouchEndpoint(e *apiv1.Endpoint) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Endpoint(e.GetCluster(), e.GetNode())
	if err != nil {
		return err
	}
	if old == nil {
		return fmt.Errorf("touch endpoint %q: not found", EndpointKey(e.GetCluster(), e.GetNode()))
	}
	old.LastHeartbeat = e.LastHeartbeat
	old.LeaseExpires = e.LeaseExpires
	key := EndpointKey(old.Cluster, old.Node)
	if err := putProto(t.btx.Bucket(bucketEndpoints), key, old); err != nil {
		return fmt.Errorf("touch endpoint %q: %w", key, err)
	}
	return nil
}

func (t *boltTx) DeleteEndpoint(cluster, node string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Endpoint(cluster, node)
	if err != nil || old == nil {
		return err
	}
	key := EndpointKey(cluster, node)
	if err := t.btx.Bucket(bucketEndpoints).Delete([]byte(key)); err != nil {
		return fmt.Errorf("delete endpoint %q: %w", key, err)
	}
	t.rev++
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_DELETE, Kind: KindEndpoint, Key: key,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: old}}, Revision: t.rev})
	return nil
}

func (t *boltTx) Policy(name string) (*apiv1.Policy, error) {
	v := t.btx.Bucket(bucketPolicies).Get([]byte(name))
	if v == nil {
		return nil, nil
	}
	p := &apiv1.Policy{}
	if err := proto.Unmarshal(v, p); err != nil {
		return nil, fmt.Errorf("decode policy %q: %w", name, err)
	}
	return p, nil
}

func (t *boltTx) Policies() ([]*apiv1.Policy, error) {
	var out []*apiv1.Policy
	err := t.btx.Bucket(bucketPolicies).ForEach(func(k, v []byte) error {
		p := &apiv1.Policy{}
		if err := proto.Unmarshal(v, p); err != nil {
			return fmt.Errorf("decode policy %q: %w", k, err)
		}
		out = append(out, p)
		return nil
	})
	return out, err
}

func (t *boltTx) PutPolicy(p *apiv1.Policy) error {
	if !t.writable {
		return errReadOnly
	}
	if p.GetName() == "" {
		return errors.New("put policy: name is empty")
	}
	p = proto.Clone(p).(*apiv1.Policy)
	p.StatusJson = nil
	t.rev++
	p.Revision = t.rev
	if err := putProto(t.btx.Bucket(bucketPolicies), p.Name, p); err != nil {
		return fmt.Errorf("put policy %q: %w", p.Name, err)
	}
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: KindPolicy, Key: p.Name,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: p}}, Revision: t.rev})
	return nil
}

func (t *boltTx) DeletePolicy(name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Policy(name)
	if err != nil || old == nil {
		return err
	}
	if err := t.btx.Bucket(bucketPolicies).Delete([]byte(name)); err != nil {
		return fmt.Errorf("delete policy %q: %w", name, err)
	}
	t.rev++
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_DELETE, Kind: KindPolicy, Key: name,
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: old}}, Revision: t.rev})
	return nil
}

// finish records the revision and the events of the transaction and trims the log to logSize.
func (t *boltTx) finish(logSize int) error {
	if len(t.events) == 0 {
		return nil
	}
	meta := t.btx.Bucket(bucketMeta)
	if err := meta.Put(keyRevision, u64Key(t.rev)); err != nil {
		return err
	}
	evb := t.btx.Bucket(bucketEvents)
	for _, ev := range t.events {
		b, err := proto.Marshal(ev)
		if err != nil {
			return fmt.Errorf("encode event %d: %w", ev.Revision, err)
		}
		if err := evb.Put(u64Key(ev.Revision), b); err != nil {
			return err
		}
	}
	if t.rev <= uint64(logSize) {
		return nil
	}
	// Revisions are contiguous, so the log holds exactly (compacted, rev]; keep the newest logSize.
	keepFrom := t.rev - uint64(logSize) + 1
	c := evb.Cursor()
	for k, _ := c.First(); k != nil && binary.BigEndian.Uint64(k) < keepFrom; k, _ = c.First() {
		if err := c.Delete(); err != nil {
			return err
		}
	}
	if keepFrom-1 > getU64(meta, keyCompacted) {
		return meta.Put(keyCompacted, u64Key(keepFrom-1))
	}
	return nil
}

func putProto(b *bolt.Bucket, key string, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return b.Put([]byte(key), v)
}

func u64Key(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func getU64(b *bolt.Bucket, key []byte) uint64 {
	v := b.Get(key)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}

func cloneEvents(evs []*apiv1.Event) []*apiv1.Event {
	out := make([]*apiv1.Event, len(evs))
	for i, e := range evs {
		out[i] = proto.Clone(e).(*apiv1.Event)
	}
	return out
}
