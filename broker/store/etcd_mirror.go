package store

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// The mirror: the etcd watch that feeds a replica's in-memory copy and its watchers, its reload,
// the health check, and the compaction of etcd's history.

// follow applies etcd's watch of the prefix to the mirror from revision after+1 until ctx ends,
// re-watching after errors and reloading everything after a compaction.
func (s *Etcd) follow(ctx context.Context, after int64) {
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		s.cancelWatch.Store(&cancel)
		wch := s.cli.Watch(wctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(after+1))
		compacted := false
		for resp := range wch {
			if err := resp.Err(); err != nil {
				if resp.CompactRevision > 0 || errors.Is(err, rpctypes.ErrCompacted) {
					compacted = true
				} else if ctx.Err() == nil {
					s.log.Warn("etcd watch of the store ended; watching again", "after", after, "err", err)
				}
				break
			}
			if len(resp.Events) > 0 {
				s.apply(resp.Events)
				after = s.state.Load().rev
				delay = 100 * time.Millisecond
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if compacted {
			s.log.Warn("etcd compacted the history the store's watch needed; reloading the store", "after", after)
			if err := s.reload(ctx); err != nil {
				s.log.Error("reload the store from etcd", "err", err)
			} else {
				after = s.state.Load().rev
				continue
			}
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// apply applies watch events (whole etcd revisions, in order) to the mirror and publishes each
// commit's store events as one batch.
func (s *Etcd) apply(evs []*clientv3.Event) {
	eventsPrefix, _ := s.bucketRange(bucketEvents)
	var batches []Batch
	last := int64(0)
	for i := 0; i < len(evs); {
		rev := evs[i].Kv.ModRevision
		var out []*apiv1.Event
		for ; i < len(evs) && evs[i].Kv.ModRevision == rev; i++ {
			e := evs[i]
			key := string(e.Kv.Key)
			if e.Type == clientv3.EventTypeDelete {
				s.working.Delete(etcdItem{key: key})
				continue
			}
			s.working.ReplaceOrInsert(etcdItem{key: key, value: e.Kv.Value, mod: rev})
			if strings.HasPrefix(key, eventsPrefix) {
				ev := &apiv1.Event{}
				if err := proto.Unmarshal(e.Kv.Value, ev); err != nil {
					s.log.Error("decode a logged event from etcd; watchers resume from the log", "key", key, "err", err)
					continue
				}
				out = append(out, ev)
			}
		}
		last = rev
		if len(out) > 0 {
			sort.Slice(out, func(a, b int) bool { return out[a].Revision < out[b].Revision })
			batches = append(batches, Batch{Events: out, Revision: out[len(out)-1].Revision})
		}
	}
	if last == 0 {
		return
	}
	snap := s.working.Clone()
	s.hub.mu.Lock()
	s.setState(&etcdState{tree: snap, rev: last})
	for _, b := range batches {
		if b.Events[0].Revision != s.published+1 {
			// Not expected (commits are serialized on meta/revision); a watcher that missed
			// revisions must not go on as if it had them.
			s.log.Error("store events out of sequence in etcd's watch; disconnecting watchers so they resume from the log",
				"after", s.published, "got", b.Events[0].Revision)
			s.dropWatchersLocked(ErrWatcherTooSlow)
		} else {
			s.hub.publishLocked(b)
		}
		s.published = b.Revision
	}
	s.hub.mu.Unlock()
}

// reload replaces the mirror with a fresh read of etcd after a compaction cut the watch off, and
// publishes the events the log holds beyond what watchers have (or, when the log no longer holds
// them, disconnects the watchers, which resume from the log or get a snapshot).
func (s *Etcd) reload(ctx context.Context) error {
	st, err := s.load(ctx)
	if err != nil {
		return err
	}
	s.working = st.tree
	snap := &etcdState{tree: st.tree.Clone(), rev: st.rev}
	kv := s.readKV(snap)
	rev := getU64(kv, keyRevision)
	var missed []*apiv1.Event
	complete := getU64(kv, keyCompacted) <= s.published
	if complete && rev > s.published {
		err := kv.scan(bucketEvents, u64Key(s.published+1), func(k, v []byte) error {
			ev := &apiv1.Event{}
			if err := proto.Unmarshal(v, ev); err != nil {
				return fmt.Errorf("decode event %d: %w", binaryRev(k), err)
			}
			missed = append(missed, ev)
			return nil
		})
		if err != nil {
			return err
		}
		complete = len(missed) > 0 && missed[0].Revision == s.published+1 && uint64(len(missed)) == rev-s.published
	}
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.setState(snap)
	switch {
	case rev == s.published:
	case complete && rev > s.published:
		s.hub.publishLocked(Batch{Events: missed, Revision: rev})
	default:
		s.dropWatchersLocked(ErrWatcherTooSlow)
	}
	s.published = rev
	return nil
}

func (s *Etcd) setState(st *etcdState) {
	s.mu.Lock()
	s.state.Store(st)
	close(s.advanced)
	s.advanced = make(chan struct{})
	s.mu.Unlock()
}

func (s *Etcd) dropWatchersLocked(err error) {
	// The published sequence has a gap (or ends here): later watchers read afresh.
	s.hub.forgetLocked()
	for w := range s.hub.subs {
		s.hub.dropLocked(w, err)
	}
}

// healthLoop checks every interval that a linearizable read of etcd succeeds and that the mirror
// reaches what it returned within the interval. A replica cut off from etcd (partitioned, or
// its members gone) would otherwise keep its watchers on a stream that never moves again; after
// two failed checks in a row it disconnects them, so that agents go to a replica that works, and
// it restarts its etcd watch in case that is what stalled. A check that timed out while the
// mirror moved on since the last one is not a failure: the replica follows etcd, late (at 5,100
// agents starting at once, etcd and the mirror lagged past the interval, and the replica
// disconnected every agent of a mesh it was serving).
func (s *Etcd) healthLoop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failed := 0
	last := s.state.Load().rev
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, interval)
		_, err := s.fresh(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		rev := s.state.Load().rev
		moved := rev > last
		last = rev
		if err == nil || moved {
			failed = 0
			continue
		}
		failed++
		if failed < 2 {
			continue
		}
		s.log.Warn("this replica cannot follow etcd; disconnecting its watchers so they go to another replica", "err", err)
		s.hub.mu.Lock()
		s.dropWatchersLocked(ErrUnavailable)
		s.hub.mu.Unlock()
		if c := s.cancelWatch.Load(); c != nil {
			(*c)()
		}
		failed = 0
	}
}

// compactLoop compacts etcd's history every interval to the revision it saw one interval
// earlier, so that heartbeats (which rewrite endpoints) do not grow etcd without bound. A
// compare-and-swap on key makes one replica do it per interval.
func (s *Etcd) compactLoop(ctx context.Context, key string, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var version, pending int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", version)).
			Then(clientv3.OpPut(key, "")).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("etcd compaction: claim this interval", "err", err)
			}
			continue
		}
		if !resp.Succeeded {
			// Another replica compacted in this interval; follow its count.
			if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
				version = kvs[0].Version
			}
			pending = 0
			continue
		}
		version++
		if pending > 0 {
			if _, err := s.cli.Compact(ctx, pending); err != nil && !errors.Is(err, rpctypes.ErrCompacted) && ctx.Err() == nil {
				s.log.Warn("etcd compaction", "revision", pending, "err", err)
			} else if err == nil {
				s.log.Debug("compacted etcd", "revision", pending)
			}
		}
		pending = resp.Header.Revision
	}
}
