package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// How a replica's reads are kept fresh: a shared linearizable read of etcd's revisions, and the
// wait until the mirror has caught up with it.

// transient reports whether err from etcd may pass by itself: unavailable members, a leader
// election, a timeout of one attempt.
func transient(err error) bool {
	if errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	for _, e := range []error{rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader, rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail,
		rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrTooManyRequests, rpctypes.ErrNotCapable} {
		if errors.Is(err, e) || err.Error() == e.Error() {
			return true
		}
	}
	return false
}

// fresh returns the mirror once it holds every commit etcd had acknowledged when fresh was
// called: a linearizable read of meta/committed gives the etcd revision of the last one. Callers that arrive while such a read is in flight share the next one, which starts
// after they arrived (so it is linearizable for each of them): under load one read serves many.
func (s *Etcd) fresh(ctx context.Context) (*etcdState, error) {
	s.fmu.Lock()
	b := s.fnext
	if b == nil {
		b = &freshRead{done: make(chan struct{})}
		s.fnext = b
	}
	if !s.freading {
		s.freading = true
		s.fnext = nil
		go s.readRevisions(b)
	}
	s.fmu.Unlock()
	select {
	case <-b.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if b.err != nil {
		return nil, fmt.Errorf("read the store revision from etcd: %w", b.err)
	}
	if err := s.waitFor(ctx, b.target); err != nil {
		return nil, err
	}
	return s.state.Load(), nil
}

// freshRead is one linearizable read of meta/committed, shared by the callers of fresh that
// arrived before it started.
type freshRead struct {
	done   chan struct{}
	target int64
	err    error
}

// readRevisions does b, then every batch that gathered meanwhile, until none is waiting. A read
// that fails for a reason that passes (a leader election) is tried again within AttemptTimeout,
// so that readers ride out an election instead of failing.
func (s *Etcd) readRevisions(b *freshRead) {
	for b != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.eopts.AttemptTimeout)
		var (
			resp *clientv3.GetResponse
			err  error
		)
		for delay := 20 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
			resp, err = s.cli.Get(ctx, s.key(bucketMeta, keyCommitted), clientv3.WithKeysOnly())
			if err == nil || !transient(err) || s.closed.Load() {
				break
			}
			select {
			case <-time.After(delay):
				continue
			case <-ctx.Done():
			}
			break
		}
		cancel()
		if err != nil {
			b.err = err
		} else if len(resp.Kvs) > 0 {
			b.target = resp.Kvs[0].ModRevision
		}
		close(b.done)
		s.fmu.Lock()
		b = s.fnext
		s.fnext = nil
		if b == nil {
			s.freading = false
		}
		s.fmu.Unlock()
	}
}

// waitFor waits until the mirror has applied etcd revision rev.
func (s *Etcd) waitFor(ctx context.Context, rev int64) error {
	for {
		s.mu.Lock()
		st, ch := s.state.Load(), s.advanced
		s.mu.Unlock()
		if st.rev >= rev {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return ErrClosed
		}
	}
}
