package broker

import (
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/encoding/protowire"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/watchzstd"
	"github.com/cablemesh/cablemesh/broker/store"
)

// Snapshots are shared too. The store hands one snapshot to every watcher that starts while it is
// recent (store.hub), and at 5,000 agents starting at once each encoded its own copy of it: 5,000
// endpoints looked up in the encoding cache and copied into messages of its own, a quarter of a
// megabyte per agent (a quarter of the broker's CPU and most of its garbage). What differs
// between watchers is small: the clusters (each carries the pair PSK of the watcher's cluster),
// the imports and the CA bundle. So a large snapshot goes as
//
//  1. the cluster UPSERTs, encoded for the watcher (snapshot set, more set, bare events);
//  2. the other events in parts encoded once for every watcher (more set, bare events);
//  3. a last message: the rest of the events, the revision, and the watcher's imports and CA
//     bundle (or, when those do not fit beside the events, the events with more set and then a
//     message of their own).
//
// Joined (the agent joins parts before it applies them) this is the snapshot encodeBatch makes,
// with the clusters first, as the store orders a snapshot anyway. A snapshot that fits in one
// message goes as encodeBatch makes it.

// snapshotEncoding is what every watcher of one snapshot sends alike.
type snapshotEncoding struct {
	once sync.Once
	// small: the snapshot fits in one message; it goes through encodeBatch.
	small bool
	// evs are the snapshot's events that agents are sent (agentEvents), shared.
	evs []*apiv1.Event
	// clusters are the events that carry a cluster (encoded per watching cluster, whose pair
	// PSKs they carry: clusterParts, by the watching cluster's UID).
	clusters     []*apiv1.Event
	mu           sync.Mutex
	clusterParts map[string]*batchEncoding
	// shared are the complete messages of step 2; last and lastBare the events of step 3, with
	// and without their revisions.
	shared         [][]byte
	last, lastBare []byte
	// For agents that accept zstd (compressed once, on the first such watcher): the shared
	// parts, and lastBare as a message of its own (more set) that the watcher's own last
	// message then follows with only the revision, imports and CA bundle.
	zonce   sync.Once
	zshared [][]byte
	zlast   []byte
}

// compressed is e's shared parts and last events (zshared, zlast) for agents that accept zstd.
func (e *snapshotEncoding) compressed() ([][]byte, []byte) {
	e.zonce.Do(func() {
		e.zshared = compressAll(e.shared)
		if len(e.lastBare) > 0 {
			e.zlast = watchzstd.Encode(appendFlag(slices.Clip(e.lastBare), moreField))
		}
	})
	return e.zshared, e.zlast
}

// snapshotEncodings keeps the encodings of the last few snapshots (two generations of
// maxSharedSnapshots).
type snapshotEncodings struct {
	generations[batchID, snapshotEncoding]
	encoded atomic.Int64 // snapshots encoded (tests count them)
}

// maxSharedSnapshots is how many snapshot encodings a generation holds: the store shares one
// snapshot per set of omitted kinds at a time, and a few older ones are still being sent.
const maxSharedSnapshots = 8

// sharedSnapshot encodes, once for every watcher, the parts of snapshot b (as the store shares
// it) that do not depend on the watcher.
func (s *Server) sharedSnapshot(b store.Batch, w watcherOf, budget int) *snapshotEncoding {
	e := s.watchSnapshots.get(batchIDOf(b), maxSharedSnapshots, 0)
	e.once.Do(func() {
		s.watchSnapshots.encoded.Add(1)
		evs, _ := agentEvents(b.Events)
		e.evs = evs
		// The other events' encodings, with their revisions (full) and without (bare): only
		// cluster UPSERTs depend on the watcher, these are the same for all.
		var full, bare [][]byte
		var bareSizes []int
		size := 0
		for _, ev := range evs {
			if ev.GetResource().GetCluster() != nil {
				e.clusters = append(e.clusters, ev)
				continue
			}
			f, b := s.event(ev, w, false), s.event(ev, w, true)
			if f.skip || b.skip {
				continue
			}
			full, bare = append(full, f.b), append(bare, b.b)
			bareSizes = append(bareSizes, len(b.b))
			size += len(f.b)
		}
		if size+messageOverhead <= budget {
			e.small = true
			return
		}
		// Step 2 takes whole parts while what is left does not fit in one; that is step 3's.
		left, from := size, 0
		for _, p := range packParts(bareSizes, budget, messageOverhead) {
			if left+messageOverhead <= budget {
				break
			}
			n := 0
			for i := p[0]; i < p[1]; i++ {
				n += len(bare[i])
				left -= len(full[i])
			}
			msg := make([]byte, 0, n+2)
			for _, r := range bare[p[0]:p[1]] {
				msg = append(msg, r...)
			}
			e.shared = append(e.shared, appendFlag(msg, moreField))
			from = p[1]
		}
		for i := from; i < len(full); i++ {
			e.last = append(e.last, full[i]...)
			e.lastBare = append(e.lastBare, bare[i]...)
		}
	})
	return e
}

// encodeSnapshot is the messages of snapshot b for watcher w, resp being the watcher's message
// (its imports and CA bundle): encodeBatch's when the snapshot fits in one message, else the
// clusters for w, the shared parts and w's last message.
func (s *Server) encodeSnapshot(b store.Batch, resp *apiv1.WatchResponse, w watcherOf, budget int) ([][]byte, error) {
	e := s.sharedSnapshot(b, w, budget)
	if e.small {
		return s.encodeBatch(resp, w, budget)
	}
	// Step 1, then step 2.
	clusters := s.snapshotClusters(e, w, budget)
	out := make([][]byte, 0, len(clusters)+len(e.shared)+2)
	out = append(out, clusters...)
	shared, zlast := e.shared, []byte(nil)
	if w.zstd {
		shared, zlast = e.compressed()
	}
	out = append(out, shared...)
	// Step 3.
	imports, err := messageField(importsField, resp.Imports)
	if err != nil {
		return nil, err
	}
	ca, err := messageField(caField, resp.Ca)
	if err != nil {
		return nil, err
	}
	// tail is a message of events (shared: copied) and the fields after them.
	tail := func(events []byte, more bool) []byte {
		m := append(make([]byte, 0, len(events)+len(imports)+len(ca)+16), events...)
		if more {
			return appendTail(m, 0, nil, true, nil)
		}
		return appendTail(m, b.Revision, imports, false, ca)
	}
	if w.zstd {
		// The last events go compressed as shared, the watcher's own fields after them.
		if zlast != nil {
			out = append(out, zlast)
		}
		return append(out, tail(nil, false)), nil
	}
	if len(e.last)+len(imports)+len(ca)+messageOverhead <= budget {
		return append(out, tail(e.last, false)), nil
	}
	return append(out, tail(e.lastBare, true), tail(nil, false)), nil
}

// snapshotClusters is step 1 of snapshot e for watcher w: its cluster events, with the pair PSKs
// of w's cluster, in parts of the budget, the first message saying snapshot. They are encoded
// (and compressed, for watchers that accept zstd) once for every watcher of the same cluster.
func (s *Server) snapshotClusters(e *snapshotEncoding, w watcherOf, budget int) [][]byte {
	e.mu.Lock()
	if e.clusterParts == nil {
		e.clusterParts = map[string]*batchEncoding{}
	}
	p := e.clusterParts[w.clusterUID]
	if p == nil {
		p = &batchEncoding{}
		e.clusterParts[w.clusterUID] = p
	}
	e.mu.Unlock()
	p.once.Do(func() {
		var enc [][]byte
		var sizes []int
		for _, ev := range e.clusters {
			if c := s.event(ev, w, true); !c.skip {
				enc, sizes = append(enc, c.b), append(sizes, len(c.b))
			}
		}
		// The first message says snapshot: its size counts with the first event's.
		if len(sizes) > 0 {
			sizes[0] += protowire.SizeTag(snapshotField) + protowire.SizeVarint(1)
		}
		for i, r := range packParts(sizes, budget, messageOverhead) {
			msg := make([]byte, 0, budget)
			if i == 0 {
				msg = appendFlag(msg, snapshotField)
			}
			for _, b := range enc[r[0]:r[1]] {
				msg = append(msg, b...)
			}
			p.msgs = append(p.msgs, appendFlag(msg, moreField))
		}
	})
	return p.sendable(w)
}

// sendSnapshot sends snapshot b to watcher w (encodeSnapshot).
func (s *Server) sendSnapshot(stream apiv1.Agent_WatchServer, b store.Batch, resp *apiv1.WatchResponse, w watcherOf) error {
	msgs, err := s.encodeSnapshot(b, resp, w, s.messageBudget())
	if err != nil {
		return err
	}
	return sendEncoded(stream, msgs)
}
