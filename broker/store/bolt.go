package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"
)

// Bolt is the embedded store: one bbolt file.
type Bolt struct {
	db   *bolt.DB
	opts Options
	hub  hub
}

// OpenBolt opens (creating if needed) the store at path.
func OpenBolt(path string, opts Options) (*Bolt, error) {
	opts = opts.withDefaults()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
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
	return &Bolt{db: db, opts: opts, hub: newHub(opts.WatchBuffer)}, nil
}

// Close ends every watch and closes the file.
func (s *Bolt) Close() error {
	s.hub.mu.Lock()
	first := s.hub.closeLocked()
	s.hub.mu.Unlock()
	if !first {
		return nil
	}
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
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	if s.hub.closed {
		return Commit{}, ErrClosed
	}
	var t *txn
	err := s.db.Update(func(btx *bolt.Tx) error {
		t = newTxn(boltKV{btx}, true)
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
		s.hub.publishLocked(Batch{Events: c.Events, Revision: c.Revision})
	}
	return c, nil
}

// Watch implements Store.
func (s *Bolt) Watch(ctx context.Context, since uint64, opts ...WatchOption) (Watch, error) {
	o := watchOpts(opts)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	if s.hub.closed {
		return nil, ErrClosed
	}
	var first Batch
	err := s.db.View(func(btx *bolt.Tx) error {
		var err error
		first, err = newTxn(boltKV{btx}, false).firstBatch(since, o)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("start watch from revision %d: %w", since, err)
	}
	return s.hub.subscribeLocked(ctx, first, o), nil
}

// boltKV is the kv of one bbolt transaction; every bucket exists (OpenBolt creates them).
type boltKV struct{ tx *bolt.Tx }

func (b boltKV) get(bucket, key []byte) []byte { return b.tx.Bucket(bucket).Get(key) }

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
