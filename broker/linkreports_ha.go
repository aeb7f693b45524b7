package broker

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// On etcd, an agent's calls go to any replica (gRPC round_robin), so each replica sees only some
// of a node's reports. Each replica therefore writes, soon after it accepts a report (from a
// loop of its own), the node's whole view to <root>linkreports/<cluster>/<node>, outside the store (no revision, no watch event),
// under a lease: a new lease every summary interval, of forget's length, so that the key of a
// node that stops reporting goes away on its own. ListLinkReports reads
// the prefix, a page at a time.

// linkReportWriteTimeout bounds the write of one report to etcd; a report lost to a slow etcd
// is replaced by the next.
const linkReportWriteTimeout = 2 * time.Second

// linkReportLease hands out the lease the reports are written under, renewed by a new grant
// every summary interval.
type linkReportLease struct {
	mu      sync.Mutex
	id      clientv3.LeaseID
	granted time.Time
}

func (h *haReplica) linkReportsPrefix() string { return h.root + "linkreports/" }

// lease returns the current lease, granting a new one when the current is older than every.
func (l *linkReportLease) lease(ctx context.Context, cli *clientv3.Client, every, ttl time.Duration, now time.Time) (clientv3.LeaseID, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.id != 0 && now.Sub(l.granted) < every {
		return l.id, nil
	}
	g, err := cli.Grant(ctx, int64(ttl/time.Second)+1)
	if err != nil {
		return 0, fmt.Errorf("grant the link reports' lease: %w", err)
	}
	l.id, l.granted = g.ID, now
	return l.id, nil
}

// linkShare is the set of nodes whose report changed since it was last written to etcd. The
// handler only marks a node; one loop writes (shareLinkReportsLoop), so that a fleet reporting
// at once neither holds a request's memory per waiting handler nor waits on etcd, and a node
// that reports twice before its write is written once, with its latest report.
type linkShare struct {
	mu    sync.Mutex
	dirty map[nodeKey]time.Time // node -> when its latest accepted report came
	wake  chan struct{}
}

func (l *linkShare) mark(k nodeKey, at time.Time) {
	l.mu.Lock()
	if l.dirty == nil {
		l.dirty = map[nodeKey]time.Time{}
	}
	l.dirty[k] = at
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *linkShare) take() map[nodeKey]time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.dirty
	l.dirty = nil
	return d
}

// linkShareWriters is how many writes to etcd the loop has in flight.
const linkShareWriters = 4

// shareLinkReportsLoop writes the marked nodes' reports to etcd until ctx ends.
func (s *Server) shareLinkReportsLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.linkShare.wake:
		}
		dirty := s.linkShare.take()
		keys := make(chan nodeKey)
		var wg sync.WaitGroup
		for range linkShareWriters {
			wg.Go(func() {
				for k := range keys {
					s.shareLinkReport(ctx, k, dirty[k])
				}
			})
		}
		for k := range dirty {
			keys <- k
		}
		close(keys)
		wg.Wait()
	}
}

// shareLinkReport writes node k's report as this replica holds it to etcd. Failures are logged:
// the report stays in this replica's memory, and the next one tries again.
func (s *Server) shareLinkReport(ctx context.Context, k nodeKey, now time.Time) {
	r := s.linkReports
	r.mu.Lock()
	var n nodeLinks
	n0 := r.nodes[k]
	if n0 != nil {
		n = *n0 // its links are never changed in place
	}
	r.mu.Unlock()
	if n0 == nil {
		return
	}
	b, err := proto.Marshal(n.report(k))
	if err == nil {
		ctx, cancel := context.WithTimeout(ctx, linkReportWriteTimeout)
		var id clientv3.LeaseID
		if id, err = s.linkLease.lease(ctx, s.ha.cli, r.summary, r.forget, now); err == nil {
			_, err = s.ha.cli.Put(ctx, s.ha.linkReportsPrefix()+k.order(), string(b), clientv3.WithLease(id))
		}
		cancel()
	}
	if err != nil && ctx.Err() == nil {
		s.log.Debug("share link report in etcd", "cluster", k.cluster, "node", k.node, "err", err)
	}
}

// linkReportsPerRead is how many nodes' reports one etcd read of a page fetches (about 15 KB
// each in a full mesh of 255 clusters).
const linkReportsPerRead = 64

// sharedLinkReports reads one page of every replica's reports from etcd: the nodes after the
// key after, up to maxPageBytes, and the key to continue after ("" at the end).
func (s *Server) sharedLinkReports(ctx context.Context, after string) (out []*apiv1.NodeLinkReports, next string, err error) {
	prefix := s.ha.linkReportsPrefix()
	from := prefix + after + "\x00" // the first key after after
	end := clientv3.GetPrefixRangeEnd(prefix)
	size := 0
	for {
		resp, err := s.ha.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(linkReportsPerRead))
		if err != nil {
			return nil, "", fmt.Errorf("read the link reports in etcd: %w", err)
		}
		for _, kv := range resp.Kvs {
			nr := &apiv1.NodeLinkReports{}
			if err := proto.Unmarshal(kv.Value, nr); err != nil {
				s.log.Warn("unreadable link report in etcd", "key", string(kv.Key), "err", err)
				continue
			}
			if len(out) > 0 && size+len(kv.Value) > maxPageBytes {
				return out, strings.TrimPrefix(strings.TrimSuffix(from, "\x00"), prefix), nil
			}
			size += len(kv.Value)
			out = append(out, nr)
			from = string(kv.Key) + "\x00"
		}
		if !resp.More {
			return out, "", nil
		}
	}
}
