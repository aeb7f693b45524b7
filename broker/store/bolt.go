package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Bolt is the embedded store: one bbolt file.
//
// Its writes are committed in groups: Update hands fn to one committer goroutine, which runs every
// fn waiting at that moment in one bbolt transaction (each fn in a transaction of its own over
// it, in turn, so each sees the ones before it) and syncs the file once for all of them. A
// fleet of gateways that register, heartbeat and join at once would otherwise wait for one fsync
// each, in a line. The hub's lock is held only to publish a group's events, not across the commit,
// so watchers start (and read their snapshots) while the file syncs.
type Bolt struct {
	db   *bolt.DB
	opts Options
	hub  hub

	reqs chan *boltReq // to the committer; unbuffered, so a request is either taken or refused
	stop chan struct{} // closed by Close: the committer stops taking requests
	done chan struct{} // closed when the committer has stopped
}

// boltReq is one Update waiting for the committer.
type boltReq struct {
	ctx    context.Context
	fn     func(Tx) error
	commit Commit
	err    error
	done   chan struct{}
}

// initialMmapSize is the address space bbolt maps at open (see OpenBolt).
const initialMmapSize = 1 << 30

// maxGroup bounds how many Updates one bbolt transaction commits.
const maxGroup = 512

// OpenBolt opens (creating if needed) the store at path.
func OpenBolt(path string, opts Options) (*Bolt, error) {
	opts = opts.withDefaults()
	// A file that grows is mapped again, and bbolt's remap waits for every read transaction to
	// end: with a large initial mapping a commit never waits for the snapshots being read (a
	// fleet starting at once reads many while its registrations grow the file). It is address
	// space, not memory: only the pages of the file are ever touched.
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, InitialMmapSize: initialMmapSize})
	if err != nil {
		if errors.Is(err, bolterrors.ErrTimeout) {
			return nil, fmt.Errorf("open store %s: locked by another process (is another cable-broker running on this data dir?)", path)
		}
		return nil, fmt.Errorf("open store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range buckets {
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
	s := &Bolt{db: db, opts: opts, hub: newHub(opts), reqs: make(chan *boltReq), stop: make(chan struct{}), done: make(chan struct{})}
	go s.commitLoop()
	return s, nil
}

// Close ends every watch, waits for the commit in progress and closes the file.
func (s *Bolt) Close() error {
	s.hub.mu.Lock()
	first := s.hub.closeLocked()
	s.hub.mu.Unlock()
	if !first {
		return nil
	}
	close(s.stop)
	<-s.done
	return s.db.Close()
}

// View implements Store.
func (s *Bolt) View(ctx context.Context, fn func(ReadTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return s.db.View(func(btx *bolt.Tx) error {
		return fn(newTxn(boltKV{btx}, false))
	})
}

// Update implements Store.
func (s *Bolt) Update(ctx context.Context, fn func(Tx) error) (Commit, error) {
	if err := ctx.Err(); err != nil {
		return Commit{}, err
	}
	r := &boltReq{ctx: ctx, fn: fn, done: make(chan struct{})}
	select {
	case s.reqs <- r:
	case <-s.stop:
		return Commit{}, ErrClosed
	case <-ctx.Done():
		return Commit{}, ctx.Err()
	}
	// Once taken, the request is committed or refused by the committer: its caller must learn
	// which, so it waits even if its context ends meanwhile.
	<-r.done
	return r.commit, r.err
}

// commitLoop is the committer: it takes the Updates that wait, commits them as one group, and
// goes on until Close.
func (s *Bolt) commitLoop() {
	defer close(s.done)
	for {
		var group []*boltReq
		select {
		case r := <-s.reqs:
			group = append(group, r)
		case <-s.stop:
			return
		}
	take:
		for len(group) < maxGroup {
			select {
			case r := <-s.reqs:
				group = append(group, r)
			default:
				break take
			}
		}
		s.commitGroup(group)
	}
}

// commitGroup commits group in one bbolt transaction. When one fn fails the transaction is rolled
// back, that fn runs again alone (its error goes to its caller), and the others are committed
// without it: fn may run more than once (Store.Update says so).
func (s *Bolt) commitGroup(group []*boltReq) {
	finish := func(r *boltReq, c Commit, err error) {
		r.commit, r.err = c, err
		close(r.done)
	}
	for len(group) > 0 {
		// A request whose caller gave up before its turn is not run.
		live := group[:0]
		for _, r := range group {
			if err := r.ctx.Err(); err != nil {
				finish(r, Commit{}, err)
			} else {
				live = append(live, r)
			}
		}
		group = live
		if len(group) == 0 {
			return
		}
		s.hub.mu.Lock()
		closed := s.hub.closed
		s.hub.mu.Unlock()
		if closed {
			for _, r := range group {
				finish(r, Commit{}, ErrClosed)
			}
			return
		}
		var (
			txns   []*txn
			failed = -1
		)
		err := s.db.Update(func(btx *bolt.Tx) error {
			txns = txns[:0]
			for i, r := range group {
				t := newTxn(boltKV{btx}, true)
				err := r.fn(t)
				if err == nil {
					err = t.finish(s.opts.LogSize, s.opts.LogBytes)
				}
				if err != nil {
					failed = i
					return err
				}
				txns = append(txns, t)
			}
			return nil
		})
		if failed >= 0 && len(group) > 1 {
			// The ones before it succeeded on the same state: they commit again as a group
			// (their fns run again), then the failed one alone, then the rest as a group of
			// their own. Each failure costs one run of the group at most, not one per fn.
			r, rest := group[failed], group[failed+1:]
			if failed > 0 {
				s.commitGroup(group[:failed])
			}
			s.commitGroup([]*boltReq{r})
			group = rest
			continue
		}
		if err != nil {
			for _, r := range group {
				finish(r, Commit{}, err)
			}
			return
		}
		// The group's events go to watchers as one batch (as Etcd's do, one per etcd
		// transaction): a fleet registering at once would otherwise queue one batch per
		// registration in every watcher's buffer, and each would be a message of its own.
		var evs []*apiv1.Event
		for _, t := range txns {
			evs = append(evs, t.events...)
		}
		s.hub.mu.Lock()
		if len(evs) > 0 {
			s.hub.publishLocked(Batch{Events: evs, Revision: evs[len(evs)-1].Revision})
		}
		s.hub.mu.Unlock()
		for i, r := range group {
			finish(r, Commit{Revision: txns[i].rev, Events: txns[i].events}, nil)
		}
		return
	}
}

// Watch implements Store.
func (s *Bolt) Watch(ctx context.Context, since uint64, opts ...WatchOption) (Watch, error) {
	o := watchOpts(opts)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w, err := s.hub.subscribe(ctx, since, o, func() (Batch, error) {
		var first Batch
		err := s.db.View(func(btx *bolt.Tx) error {
			var err error
			first, err = newTxn(boltKV{btx}, false).firstBatch(since, o)
			return err
		})
		return first, err
	})
	if errors.Is(err, ErrClosed) {
		return nil, ErrClosed
	}
	if err != nil {
		return nil, fmt.Errorf("start watch from revision %d: %w", since, err)
	}
	return w, nil
}

// boltKV is the kv of one bbolt transaction; every bucket exists (OpenBolt creates them).
type boltKV struct{ tx *bolt.Tx }

func (b boltKV) get(bucket, key []byte) []byte { return b.tx.Bucket(bucket).Get(key) }

func (b boltKV) peek(bucket, key []byte) []byte { return b.get(bucket, key) }

func (b boltKV) put(bucket, key, value []byte) error { return b.tx.Bucket(bucket).Put(key, value) }

func (b boltKV) delete(bucket, key []byte) error { return b.tx.Bucket(bucket).Delete(key) }

func (b boltKV) scan(bucket, from []byte, fn func(k, v []byte) error) error {
	c := b.tx.Bucket(bucket).Cursor()
	k, v := c.First()
	if from != nil {
		k, v = c.Seek(from)
	}
	for ; k != nil; k, v = c.Next() {
		if err := fn(k, v); err != nil {
			return err
		}
	}
	return nil
}
