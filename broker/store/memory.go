package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync/atomic"
)

// Memory is a Store that keeps its state in memory: the same revisions, event log, watches and
// TouchEndpoint semantics as Bolt (the storetest suite holds both to them), without a file. State
// ends with the process. Unit tests use it where a file adds nothing.
type Memory struct {
	opts Options
	hub  hub
	// data is the committed state. A commit replaces it with a new value and never modifies
	// one that was stored, so a View reads a consistent state without holding a lock. nil once
	// closed.
	data atomic.Pointer[memData]
}

// memData maps bucket to key to value. Values are encoded messages, so whatever a caller does
// with what it read cannot reach the store.
type memData map[string]map[string][]byte

// NewMemory returns an empty in-memory store.
func NewMemory(opts Options) *Memory {
	opts = opts.withDefaults()
	m := &Memory{opts: opts, hub: newHub(opts)}
	d := memData{}
	for _, b := range buckets {
		d[string(b)] = map[string][]byte{}
	}
	m.data.Store(&d)
	return m
}

// Close ends every watch; later calls fail with ErrClosed.
func (m *Memory) Close() error {
	m.hub.mu.Lock()
	defer m.hub.mu.Unlock()
	if m.hub.closeLocked() {
		m.data.Store(nil)
	}
	return nil
}

// View implements Store.
func (m *Memory) View(ctx context.Context, fn func(ReadTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	d := m.data.Load()
	if d == nil {
		return ErrClosed
	}
	return fn(newTxn(&memKV{base: *d}, false))
}

// Update implements Store.
func (m *Memory) Update(ctx context.Context, fn func(Tx) error) (Commit, error) {
	if err := ctx.Err(); err != nil {
		return Commit{}, err
	}
	m.hub.mu.Lock()
	defer m.hub.mu.Unlock()
	d := m.data.Load()
	if d == nil {
		return Commit{}, ErrClosed
	}
	s := &memKV{base: *d}
	t := newTxn(s, true)
	if err := fn(t); err != nil {
		return Commit{}, err
	}
	if err := t.finish(m.opts.LogSize, m.opts.LogBytes); err != nil {
		return Commit{}, err
	}
	if s.next != nil {
		m.data.Store(&s.next)
	}
	c := Commit{Revision: t.rev, Events: t.events}
	if len(c.Events) > 0 {
		m.hub.publishLocked(Batch{Events: c.Events, Revision: c.Revision})
	}
	return c, nil
}

// Watch implements Store.
func (m *Memory) Watch(ctx context.Context, since uint64, opts ...WatchOption) (Watch, error) {
	o := watchOpts(opts)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w, err := m.hub.subscribe(ctx, since, o, func() (Batch, error) {
		d := m.data.Load()
		if d == nil {
			return Batch{}, ErrClosed
		}
		return newTxn(&memKV{base: *d}, false).firstBatch(since, o)
	})
	if errors.Is(err, ErrClosed) {
		return nil, ErrClosed
	}
	if err != nil {
		return nil, fmt.Errorf("start watch from revision %d: %w", since, err)
	}
	return w, nil
}

// memKV is the kv of one Memory transaction. Writes go to next, a copy of base made at the first
// write that shares the buckets not written to; base is never modified.
type memKV struct {
	base   memData
	next   memData
	copied map[string]bool // buckets of next that are its own
}

func (s *memKV) current() memData {
	if s.next != nil {
		return s.next
	}
	return s.base
}

func (s *memKV) writable(bucket []byte) map[string][]byte {
	if s.next == nil {
		s.next = maps.Clone(s.base)
		s.copied = map[string]bool{}
	}
	b := string(bucket)
	if !s.copied[b] {
		s.next[b] = maps.Clone(s.next[b])
		s.copied[b] = true
	}
	return s.next[b]
}

func (s *memKV) get(bucket, key []byte) []byte { return s.current()[string(bucket)][string(key)] }

func (s *memKV) peek(bucket, key []byte) []byte { return s.get(bucket, key) }

func (s *memKV) put(bucket, key, value []byte) error {
	s.writable(bucket)[string(key)] = bytes.Clone(value)
	return nil
}

func (s *memKV) delete(bucket, key []byte) error {
	if _, ok := s.current()[string(bucket)][string(key)]; ok {
		delete(s.writable(bucket), string(key))
	}
	return nil
}

func (s *memKV) scan(bucket, from []byte, fn func(k, v []byte) error) error {
	b := s.current()[string(bucket)]
	// String order is byte order, as in bbolt.
	for _, k := range slices.Sorted(maps.Keys(b)) {
		if from != nil && k < string(from) {
			continue
		}
		if err := fn([]byte(k), b[k]); err != nil {
			return err
		}
	}
	return nil
}
