package store

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Group commit in etcd. Every Update of a replica goes to one committer goroutine, which takes
// the Updates waiting at that moment and commits them in one etcd transaction: it runs each fn in
// turn on the mirror, each in a transaction of its own over the writes of the ones before it (so
// each sees them, as in Bolt), and sends the union of their writes under the union of their
// conditions. A group's first attempt runs on the mirror as it is (commitOnce says why that is
// safe); a group that writes nothing, and every attempt after one that did not commit, first
// brings the mirror up to date with a linearizable read (fresh), as View does: a group that
// writes nothing (each fn found nothing to do, or failed) then answers from a state no older than
// any write acknowledged before it, and, while etcd elects a new leader, that read waits for it
// instead of a commit hanging on the old one (a proposal to a leader that is gone blocks for
// etcd's request timeout, 7 s by default; an attempt without that read gives up after
// staleAttemptTimeout). The attempt ends early when every caller of the group has given up. The conditions are those of the first read of each key in the group: a key
// that an earlier Update of the group wrote is a dependency inside the transaction, not on etcd,
// and is not compared. So a group commits exactly when every one of its Updates would have
// committed alone, one after the other, on the same state.
//
// When the conditions fail (another replica committed first) the mirror catches up and the group
// runs again; when they fail twice in a row the group is halved, and so on down to one Update
// at a time, so that a conflict with another replica costs the Updates it touches, not every
// Update waiting. An Update whose fn returns an error writes nothing, and its error is given only
// once the group it ran in has committed (it may have depended on an earlier Update's writes).
// A group stops before the Update that would make its transaction exceed MaxTxnOps (as learnt
// from etcd's refusals, learnTxnOps) or MaxTxnBytes; the rest wait for the next transaction.

// etcdReq is one Update waiting for the committer.
type etcdReq struct {
	ctx     context.Context
	fn      func(Tx) error
	commit  Commit
	err     error
	lastErr error // of the last attempt that failed, for the error of a caller that gave up
	done    chan struct{}
}

func (r *etcdReq) finish(c Commit, err error) {
	r.commit, r.err = c, err
	close(r.done)
}

// maxEtcdGroup bounds how many waiting Updates the committer takes at once.
const maxEtcdGroup = 512

// Update implements Store. fn may run more than once (see Etcd).
func (s *Etcd) Update(ctx context.Context, fn func(Tx) error) (Commit, error) {
	if err := ctx.Err(); err != nil {
		return Commit{}, err
	}
	if s.closed.Load() {
		return Commit{}, ErrClosed
	}
	r := &etcdReq{ctx: ctx, fn: fn, done: make(chan struct{})}
	select {
	case s.reqs <- r:
	case <-s.stopped:
		return Commit{}, ErrClosed
	case <-ctx.Done():
		return Commit{}, ctx.Err()
	}
	// Once taken, the request is committed or refused by the committer: its caller must learn
	// which, so it waits even if its context ends meanwhile.
	<-r.done
	return r.commit, r.err
}

// commitLoop is the committer: it takes the Updates that wait and commits them in groups, until
// ctx ends (Close).
func (s *Etcd) commitLoop(ctx context.Context) {
	for {
		var group []*etcdReq
		select {
		case r := <-s.reqs:
			group = append(group, r)
		case <-ctx.Done():
			return
		}
	take:
		for len(group) < maxEtcdGroup {
			select {
			case r := <-s.reqs:
				group = append(group, r)
			default:
				break take
			}
		}
		s.commitGroup(ctx, group)
	}
}

// commitGroup commits every request of group, in order, in as few etcd transactions as the
// limits and conflicts allow.
func (s *Etcd) commitGroup(ctx context.Context, group []*etcdReq) {
	limit := len(group) // how many the next transaction may hold; halved by repeated conflicts
	attempt, conflicts := 0, 0
	fresh := false // the next attempt reads etcd's revision first (a group that writes nothing)
	for len(group) > 0 {
		// A request whose caller gave up is not run again.
		live := group[:0]
		for _, r := range group {
			if err := r.ctx.Err(); err != nil {
				if r.lastErr != nil {
					err = fmt.Errorf("%w (last attempt: %v)", err, r.lastErr)
				}
				r.finish(Commit{}, err)
			} else {
				live = append(live, r)
			}
		}
		group = live
		if len(group) == 0 {
			return
		}
		if ctx.Err() != nil || s.closed.Load() {
			for _, r := range group {
				r.finish(Commit{}, ErrClosed)
			}
			return
		}
		if attempt > 0 {
			// Jitter keeps two replicas that conflicted from meeting again at once.
			d := time.Duration(rand.Int64N(int64(min(attempt, 10))*int64(5*time.Millisecond) + 1))
			select {
			case <-time.After(d):
			case <-ctx.Done():
				continue
			}
		}
		n, out := s.commitOnce(ctx, group[:min(limit, len(group))], fresh)
		// After anything but a commit the next attempt reads etcd's revision first: a group
		// that writes nothing needs it, and after a failure it waits out an election.
		fresh = out != groupDone
		switch out {
		case groupDone:
			group = group[n:]
			limit, attempt, conflicts = len(group), 0, 0
		case groupReadOnly:
		case groupConflict:
			attempt++
			if conflicts++; conflicts >= 2 {
				limit, conflicts = max(1, n/2), 0
			}
		case groupTooLarge:
			limit = max(1, n/2)
		case groupRetry:
			attempt++
		}
	}
}

// groupOutcome is what became of one transaction of a group.
type groupOutcome int

const (
	groupDone     groupOutcome = iota // its n requests are finished
	groupConflict                     // its conditions failed; the mirror has caught up
	groupTooLarge                     // etcd refused it as too large: fewer requests next time
	groupRetry                        // etcd was unavailable; worth another attempt
	groupReadOnly                     // it writes nothing: it runs again on a fresh state
)

// commitOnce runs the requests of group that fit in one transaction on the mirror and commits
// them; n is how many it ran. The mirror is brought up to date first (a linearizable read, fresh)
// only when asked: a transaction that writes compares every key its requests read, so on a
// stale mirror it fails and runs again rather than commit what a newer state would not have
// (and the watch keeps the mirror within milliseconds of etcd, so that is rare). A group that
// writes nothing has no such check: it answers from what it read, which must be no older than
// any write acknowledged before it, so it runs again on a fresh state (groupReadOnly). That read
// was a round trip to etcd's leader before every transaction, the longest wait of a busy
// committer.
func (s *Etcd) commitOnce(ctx context.Context, group []*etcdReq, fresh bool) (n int, _ groupOutcome) {
	// The attempt is the callers': it ends when the last of them gives up.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var left atomic.Int64
	left.Store(int64(len(group)))
	for _, r := range group {
		stop := context.AfterFunc(r.ctx, func() {
			if left.Add(-1) == 0 {
				cancel()
			}
		})
		defer stop()
	}
	fail := func(rs []*etcdReq, err error) (int, groupOutcome) {
		for _, r := range rs {
			r.finish(Commit{}, err)
		}
		return len(rs), groupDone
	}
	st := s.state.Load()
	if fresh {
		var err error
		if st, err = s.fresh(ctx); err != nil {
			if transient(err) {
				for _, r := range group {
					r.lastErr = err
				}
				return len(group), groupRetry
			}
			return fail(group, err)
		}
	}
	type result struct {
		commit Commit
		err    error
	}
	var (
		g       = newGroupTxn(s, st)
		tree    = st.tree
		results []result
		bumps   bool
		maxOps  = s.txnOps()
	)
	for i, r := range group {
		kv := &etcdTxnKV{s: s, base: st, tree: tree, track: true}
		t := newTxn(kv, true)
		err := r.fn(t)
		if err == nil {
			err = t.finish(s.opts.LogSize, s.opts.LogBytes)
		}
		if err != nil {
			// It writes nothing, but what it read decided its error: the group commits only if
			// that still holds.
			kv.writes = nil
		}
		g.add(kv)
		nb := bumps || (err == nil && len(t.events) > 0)
		if i > 0 && g.size(nb).exceeds(maxOps, s.eopts.MaxTxnBytes) {
			g.drop()
			break // this one and the rest go in the next transaction
		}
		bumps = nb
		if err != nil {
			results = append(results, result{err: err})
			continue
		}
		tree = kv.tree
		results = append(results, result{commit: Commit{Revision: t.rev, Events: t.events}})
	}
	n = len(results)
	finish := func() (int, groupOutcome) {
		for i, r := range group[:n] {
			r.finish(results[i].commit, results[i].err)
		}
		return n, groupDone
	}
	all := g.all
	if len(all.writes) == 0 {
		if !fresh {
			return n, groupReadOnly
		}
		return finish()
	}
	cmps, failure := all.conditions(bumps)
	ops := all.ops()
	timeout := s.eopts.AttemptTimeout
	if !fresh {
		// Unchecked, the member may be waiting for a leader that is gone, and etcd answers a
		// proposal made then only after its request timeout (7 s): give up sooner and try
		// again after a fresh read, which waits for the new leader instead.
		timeout = min(timeout, staleAttemptTimeout)
	}
	actx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := s.cli.Txn(actx).If(cmps...).Then(ops...).Else(failure...).Commit()
	cancel()
	if err != nil && !fresh && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("commit to etcd: no answer within %s; trying again after a fresh read", timeout)
		for _, r := range group[:n] {
			r.lastErr = err
		}
		return n, groupRetry
	}
	if err != nil {
		if errors.Is(err, rpctypes.ErrTooManyOps) || errors.Is(err, rpctypes.ErrRequestTooLarge) || tooLargeToSend(err) {
			if errors.Is(err, rpctypes.ErrTooManyOps) {
				s.learnTxnOps(max(len(cmps), len(failure), len(ops)))
			}
			if n > 1 {
				return n, groupTooLarge
			}
			events := len(results[0].commit.Events)
			// Only this one request is too large: the requests held back for the next
			// transaction are not its.
			return fail(group[:n], fmt.Errorf("commit to etcd: a transaction of %d operations (%d events): %w; raise etcd's --max-txn-ops and --max-request-bytes", len(ops), events, err))
		}
		// An error here may hide a commit that happened (the member died after proposing it).
		// The next attempt starts from a fresh state: if the commit happened each fn sees it,
		// and its conditions hold again only if it still has something to do.
		err = fmt.Errorf("commit to etcd: %w", err)
		if transient(err) {
			for _, r := range group[:n] {
				r.lastErr = err
			}
			return n, groupRetry
		}
		return fail(group[:n], err)
	}
	if !resp.Succeeded {
		var target int64
		for _, r := range resp.Responses {
			for _, kv := range r.GetResponseRange().GetKvs() {
				target = max(target, kv.ModRevision)
			}
		}
		if err := s.waitFor(ctx, target); err != nil {
			return fail(group[:n], err)
		}
		for _, r := range group[:n] {
			r.lastErr = errConflict
		}
		return n, groupConflict
	}
	// Read your writes: the next View of this replica, and the commit's watchers, see it.
	if err := s.waitFor(ctx, resp.Header.Revision); err != nil {
		return fail(group[:n], fmt.Errorf("committed at etcd revision %d but not yet applied here: %w", resp.Header.Revision, err))
	}
	return finish()
}

// tooLargeToSend reports whether err is the etcd client refusing to send a request larger than
// its gRPC limit (2 MiB by default): ResourceExhausted, as etcd's own "too many requests" is,
// but no retry can succeed, and retrying it held the committer, and every write waiting behind
// it, until the Update's context ended.
func tooLargeToSend(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.ResourceExhausted && strings.Contains(st.Message(), "larger than max")
}

// staleAttemptTimeout bounds the commit of an attempt that did not read etcd's revision first.
const staleAttemptTimeout = 2 * time.Second

// errConflict is an attempt whose conditions failed: another replica changed what fn read.
var errConflict = errors.New("conflict with a concurrent write")
