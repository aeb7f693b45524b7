package broker

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"unsafe"

	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the codec watchCodec delegates to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/watchzstd"
	"github.com/cablemesh/cablemesh/broker/store"
)

// Watch message sizes. An agent's gRPC client receives at most 4 MiB per message by default;
// the broker keeps every message under DefaultWatchMessageBytes, far below that, by sending a
// large batch in parts (WatchResponse.more). An event larger than the budget goes alone; one that
// no agent could receive (over maxWatchEventBytes, which only a resource stored before the API
// bounded its input can be) is left out and logged. A DELETE event carries its old value only
// when that is small: agents delete by key.
//
// The default budget keeps a message within the 32 KiB buffers of gRPC's encoding pool: gRPC
// encodes every message larger than that into a buffer of 1 MiB, held until the stream's
// transport has written it, and a thousand agents starting at once each had a snapshot of a
// few tens of kilobytes in one: most of the broker's memory (a heap profile at the peak of a
// fleet start: 360 of 530 MB). In parts of at most 31 KiB each stream holds a few 32 KiB buffers
// (gRPC's write quota, 64 KiB a stream, blocks Send beyond that) instead.
const (
	DefaultWatchMessageBytes = 31 << 10
	maxWatchEventBytes       = 4<<20 - 64<<10
	maxDeleteValueBytes      = 4 << 10
)

// The fields of a WatchResponse, which the broker encodes by hand (encodeBatch, encodeSnapshot),
// and a bound on the size of those besides the events, the imports and the CA bundle (snapshot,
// revision, more) that packing a message under its budget allows for.
const (
	snapshotField   = 1
	eventsField     = 2
	revisionField   = 3
	importsField    = 4
	moreField       = 5
	caField         = 6
	messageOverhead = 64
)

// appendFlag appends boolean field num, set.
func appendFlag(b []byte, num protowire.Number) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), 1)
}

// appendTail appends to a message's events the fields that follow them, in field order (as
// proto.Marshal writes them): the revision when not 0, the imports, more when set, the CA bundle
// (imports and ca encoded already, messageField; nil for none).
func appendTail(b []byte, revision uint64, imports []byte, more bool, ca []byte) []byte {
	if revision != 0 {
		b = protowire.AppendVarint(protowire.AppendTag(b, revisionField, protowire.VarintType), revision)
	}
	b = append(b, imports...)
	if more {
		b = appendFlag(b, moreField)
	}
	return append(b, ca...)
}

// packParts splits items of the given sizes, in order, into parts [from, to) of at most budget
// bytes each, overhead included: greedily, a new part when the next item would take the part
// past the budget, and never an empty part (an item larger than the budget goes alone). There is
// one part, empty, when there are no items.
func packParts(sizes []int, budget, overhead int) [][2]int {
	var parts [][2]int
	from, size := 0, overhead
	for i, n := range sizes {
		if i > from && size+n > budget {
			parts = append(parts, [2]int{from, i})
			from, size = i, overhead
		}
		size += n
	}
	if from < len(sizes) || len(parts) == 0 {
		parts = append(parts, [2]int{from, len(sizes)})
	}
	return parts
}

// messageBudget is Config.WatchMessageBytes or its default.
func (s *Server) messageBudget() int {
	if s.watchBudget > 0 {
		return s.watchBudget
	}
	return DefaultWatchMessageBytes
}

// Encoding a watch batch once. At 5,000 agents every commit group went to 5,100 watchers, and
// each encoded the same events again (proto.Size and Marshal walk every endpoint's maps): 61 %
// of the broker's CPU, O(watchers x events) work per commit, which starved the committer until
// registrations missed their deadline. The store already shares a batch's events between
// watchers (hub.publishLocked), so the broker encodes each event once, keyed by the shared
// event, and every watcher's message is the concatenation of those bytes (protobuf encodes a
// repeated message field as the concatenation of its elements, so this is exactly what
// proto.Marshal makes of the same message). What differs between watchers is encoded for the
// watchers that share it: a cluster UPSERT carries the pair PSK of the watcher's cluster (one
// variant per watching cluster); the imports and the CA bundle, sent on the first message and
// when they change, are encoded for the watcher. A watcher's message is still its own byte
// slice (coalesce makes each watcher's batches its own), but building it is a copy.

// watchEncodingBytes bounds the event encodings kept (per generation, of two): a few snapshots
// and the recent deltas of a mesh of 5,000 endpoints and 255 clusters (a snapshot read decodes
// new events, store.txn.firstBatch, so each read is encoded once for the watchers that share
// it; the keys keep the decoded events alive, several times the bytes counted here).
const watchEncodingBytes = 8 << 20

// encodedWatch is one watch message, already encoded: watchCodec sends its bytes as they are.
type encodedWatch struct{ b []byte }

// PreEncoded is a watch message the broker encoded once for many watchers, as a Watch stream's
// SendMsg gets it (Config.StreamInterceptors): WireBytes are the encoded apiv1.WatchResponse,
// shared, never to be modified.
type PreEncoded interface{ WireBytes() []byte }

// WireBytes implements PreEncoded.
func (m *encodedWatch) WireBytes() []byte { return m.b }

// watchCodec is the broker's server codec: protobuf, but for encodedWatch, whose bytes are the
// message. Its name is proto's, so clients see the usual content type.
type watchCodec struct{ proto encoding.CodecV2 }

func newWatchCodec() watchCodec { return watchCodec{proto: encoding.GetCodecV2("proto")} }

func (c watchCodec) Marshal(v any) (mem.BufferSlice, error) {
	if m, ok := v.(*encodedWatch); ok {
		// A SliceBuffer is not returned to any pool when gRPC frees it.
		return mem.BufferSlice{mem.SliceBuffer(m.b)}, nil
	}
	return c.proto.Marshal(v)
}

func (c watchCodec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }
func (c watchCodec) Name() string                                { return c.proto.Name() }

// eventKey names one encoding of a shared event: for the watchers of cluster psk (the UID, empty
// but for cluster UPSERTs of another cluster than the watcher's), bare without its revision (the
// parts of a snapshot before the last).
type eventKey struct {
	ev   *apiv1.Event
	psk  string
	bare bool
}

// eventEncoding is an event encoded as a WatchResponse.events field (tag, length, message); skip
// when the event is too large for any agent. The first watcher to need it encodes it, the others
// wait for that (once) instead of encoding it too.
type eventEncoding struct {
	once sync.Once
	b    []byte
	skip bool
}

// watchEncodings caches the encodings of the events being sent, in shards by the event's address:
// at 5,000 watchers every event of a commit is looked up once per watcher, millions of lookups a
// second while a fleet registers, too many for one lock. The keys hold the events alive, so an
// event's address names it for as long as it is here; in each shard two generations of at most
// limit/shards bytes each bound the memory (the older is dropped when the newer fills up, and
// what is still in use is encoded again).
type watchEncodings struct {
	shards  [encodingShards]encodingShard
	encoded atomic.Int64 // events encoded (tests count them)
}

const encodingShards = 64

// encodingShard is one shard's generations, each full past limit bytes.
type encodingShard struct {
	generations[eventKey, eventEncoding]
	limit int64
	_     [64]byte // keeps the shards' locks on separate cache lines
}

func newWatchEncodings(limit int64) *watchEncodings {
	c := &watchEncodings{}
	for i := range c.shards {
		c.shards[i].limit = max(limit/encodingShards, 1)
	}
	return c
}

// shard is the shard of k: by the event's address (a hash of a pointer value, which the key
// keeps alive), the PSK variant and the bareness.
func (c *watchEncodings) shard(k eventKey) *encodingShard {
	h := uint64(uintptr(unsafe.Pointer(k.ev))) >> 4
	h ^= uint64(len(k.psk))
	for i := 0; i < len(k.psk); i++ {
		h = h*31 + uint64(k.psk[i])
	}
	if k.bare {
		h++
	}
	h *= 0x9E3779B97F4A7C15
	return &c.shards[h>>58] // 64 shards: the top 6 bits
}

// get returns the entry of k, creating it when neither generation of its shard holds it, and
// the shard, whose size the entry's encoding is added to.
func (c *watchEncodings) get(k eventKey) (*eventEncoding, *encodingShard) {
	sh := c.shard(k)
	return sh.get(k, 0, sh.limit), sh
}

// agentEndpoint is endpoint e as agents receive it: without what only the broker uses (the
// certificate it is bound to, its lease and last heartbeat, which the watch never updates
// anyway: ListClusters shows them live). Each endpoint goes to every agent, so its size is paid
// N x N times when a fleet of N gateways starts: these fields were 62 of a wireguard gateway's
// 281 bytes (7.3 GB of the fleet start at 5,100 gateways).
func agentEndpoint(e *apiv1.Endpoint) *apiv1.Endpoint {
	if e.CertificateSerial == "" && e.LastHeartbeat == nil && e.LeaseExpires == nil && e.LeaseSeconds == 0 {
		return e
	}
	out := proto.Clone(e).(*apiv1.Endpoint)
	out.CertificateSerial, out.LastHeartbeat, out.LeaseExpires, out.LeaseSeconds = "", nil, nil, 0
	return out
}

// watcherOf is what a watch message depends on besides its batch: the watcher's cluster (the
// PSKs of its pairs) and where errors are logged.
type watcherOf struct {
	cluster, clusterUID string
	log                 *slog.Logger
	// zstd: the agent accepts compressed messages (WatchRequest.accept_encodings); the shared
	// ones, snapshots' parts and delta batches, go to it compressed (compressed once for all).
	zstd bool
}

// event returns ev encoded for watcher w (bare: without its revision).
func (s *Server) event(ev *apiv1.Event, w watcherOf, bare bool) *eventEncoding {
	k := eventKey{ev: ev, bare: bare}
	c := ev.GetResource().GetCluster()
	pairPSK := ev.Type == apiv1.Event_UPSERT && c != nil && c.Name != w.cluster
	if pairPSK {
		k.psk = w.clusterUID
	}
	e, sh := s.watchEnc.get(k)
	e.once.Do(func() {
		// A copy of ev (shared, never changed) as this watcher is sent it.
		out := &apiv1.Event{Type: ev.Type, Kind: ev.Kind, Key: ev.Key, Revision: ev.Revision, Resource: ev.Resource}
		if pairPSK {
			c = proto.Clone(c).(*apiv1.Cluster)
			c.PairPsk = PairPSK(s.meshSecret, w.clusterUID, c.Uid)
			out.Resource = &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: c}}
		}
		if ep := out.GetResource().GetEndpoint(); ep != nil {
			if a := agentEndpoint(ep); a != ep {
				out.Resource = &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: a}}
			}
		}
		if out.Type == apiv1.Event_DELETE && out.Resource != nil && proto.Size(out.Resource) > maxDeleteValueBytes {
			out.Resource = nil
		}
		if bare {
			out.Revision = 0
		}
		// Deterministic: the same event is the same bytes (map order aside, which agents do not
		// care about, it makes the shared encoding comparable with a per-watcher one).
		b, err := proto.MarshalOptions{Deterministic: true}.Marshal(out)
		switch {
		case err != nil:
			w.log.Error("a watch event cannot be encoded and is left out", "kind", ev.Kind, "key", ev.Key, "err", err)
			e.skip = true
		case len(b) > maxWatchEventBytes:
			w.log.Error("a resource is too large for any agent to receive and is left out of the watch; delete it or apply it again within the API's limits",
				"kind", ev.Kind, "key", ev.Key, "bytes", len(b), "revision", ev.Revision)
			e.skip = true
		default:
			f := make([]byte, 0, protowire.SizeTag(eventsField)+protowire.SizeBytes(len(b)))
			f = protowire.AppendTag(f, eventsField, protowire.BytesType)
			e.b = protowire.AppendBytes(f, b)
		}
		sh.bytes.Add(int64(len(e.b)) + 64)
		s.watchEnc.encoded.Add(1)
	})
	return e
}

// encodeBatch encodes resp, one batch of a watch for watcher w (its events as the store shares
// them, before any PSK is added), in messages of at most the budget each, exactly as splitBatch
// would split it and proto.Marshal (deterministic) encode the parts: one message when it fits,
// else parts, every part but the last with more set; the parts of deltas carry the revision of
// their last event, a snapshot's parts before the last revision 0 (and so do their events); the
// imports and the CA bundle go with the last part, or in a last message of their own when they
// do not fit in it. An event larger than the budget goes alone.
func (s *Server) encodeBatch(resp *apiv1.WatchResponse, w watcherOf, budget int) ([][]byte, error) {
	evs := make([]*apiv1.Event, 0, len(resp.Events))
	enc := make([][]byte, 0, len(resp.Events))
	sizes := make([]int, 0, len(resp.Events))
	eventsSize := 0
	for _, ev := range resp.Events {
		e := s.event(ev, w, false)
		if e.skip {
			continue
		}
		evs = append(evs, ev)
		enc = append(enc, e.b)
		sizes = append(sizes, len(e.b))
		eventsSize += len(e.b)
	}
	imports, err := messageField(importsField, resp.Imports)
	if err != nil {
		return nil, fmt.Errorf("encode imports: %w", err)
	}
	ca, err := messageField(caField, resp.Ca)
	if err != nil {
		return nil, fmt.Errorf("encode CA bundle: %w", err)
	}
	tailSize := len(imports) + len(ca)
	if tailSize > maxWatchEventBytes {
		// The imports are one field the agent replaces whole: they cannot be split without the
		// agent's help. The API's bounds on exports keep them far below this in any mesh the
		// bounds were made for; say so loudly if one gets there.
		w.log.Error("the service imports of this agent are larger than an agent receives in one message; it will not get them",
			"bytes", tailSize, "limit", maxWatchEventBytes)
	}
	type part struct {
		from, to  int // evs[from:to]
		tail      bool
		revision  uint64
		more      bool
		bareEvent bool
	}
	var parts []part
	if eventsSize+tailSize+messageOverhead <= budget {
		parts = []part{{from: 0, to: len(evs), tail: true, revision: resp.Revision}}
	} else {
		for _, r := range packParts(sizes, budget, messageOverhead) {
			parts = append(parts, part{from: r[0], to: r[1]})
		}
		if resp.Imports != nil || resp.Ca != nil {
			last, size := parts[len(parts)-1], messageOverhead
			for _, n := range sizes[last.from:last.to] {
				size += n
			}
			if size+tailSize <= budget {
				parts[len(parts)-1].tail = true
			} else {
				parts = append(parts, part{from: len(evs), to: len(evs), tail: true})
			}
		}
		for i := range parts {
			p := &parts[i]
			switch {
			case i == len(parts)-1:
				p.revision = resp.Revision
			case resp.Snapshot:
				p.more, p.bareEvent = true, true
			default:
				p.more, p.revision = true, resp.Revision
				if p.to > p.from {
					p.revision = evs[p.to-1].Revision
				}
			}
		}
	}
	out := make([][]byte, 0, len(parts))
	for i, p := range parts {
		n := 2 + 11 + 2 // snapshot, revision, more
		for j := p.from; j < p.to; j++ {
			n += len(enc[j])
		}
		if p.tail {
			n += tailSize
		}
		b := make([]byte, 0, n)
		if resp.Snapshot && i == 0 {
			b = appendFlag(b, snapshotField)
		}
		for j := p.from; j < p.to; j++ {
			if p.bareEvent {
				b = append(b, s.event(evs[j], w, true).b...)
			} else {
				b = append(b, enc[j]...)
			}
		}
		if p.tail {
			b = appendTail(b, p.revision, imports, p.more, ca)
		} else {
			b = appendTail(b, p.revision, nil, p.more, nil)
		}
		out = append(out, b)
	}
	return out, nil
}

// messageField is m encoded as field num of a message (nothing when m is nil).
func messageField[M proto.Message](num protowire.Number, m M) ([]byte, error) {
	if !m.ProtoReflect().IsValid() {
		return nil, nil
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	f := protowire.AppendTag(nil, num, protowire.BytesType)
	return protowire.AppendBytes(f, b), nil
}

// sendBatch sends resp, one batch of a watch to watcher w, as one message when it fits the
// budget, else in parts (encodeBatch).
func (s *Server) sendBatch(stream apiv1.Agent_WatchServer, resp *apiv1.WatchResponse, w watcherOf) error {
	msgs, err := s.encodeBatch(resp, w, s.messageBudget())
	if err != nil {
		return err
	}
	return sendEncoded(stream, msgs)
}

// sendEncoded sends messages encoded already, in order.
func sendEncoded(stream apiv1.Agent_WatchServer, msgs [][]byte) error {
	for _, b := range msgs {
		if err := stream.SendMsg(&encodedWatch{b: b}); err != nil {
			return err
		}
	}
	return nil
}

// Delta batches are shared whole. The hub hands the same batch (the same events slice) to every
// watcher, and a delta batch's messages differ between watchers only by the pair PSKs of the
// clusters in it: so each batch is encoded once (once per watching cluster when it holds a
// cluster UPSERT) and every watcher sends the same bytes, which gRPC holds, shared, until each
// stream has written them. Per watcher, encoding a batch was O(watchers x events) work and
// garbage per commit: a copy of every commit for each of 5,000 watchers.

// batchID names a batch as the store shares it: by its first event (shared by every watcher that
// got the batch from the same publish), its length and revision.
type batchID struct {
	first *apiv1.Event
	n     int
	rev   uint64
}

func batchIDOf(b store.Batch) batchID {
	id := batchID{n: len(b.Events), rev: b.Revision}
	if len(b.Events) > 0 {
		id.first = b.Events[0]
	}
	return id
}

// batchKey names the encoding of a delta batch: its batchID and, for a batch with cluster
// UPSERTs, the watching cluster.
type batchKey struct {
	batchID
	psk string
}

// batchEncoding is messages encoded once, for whoever shares them (err: why they could not be).
type batchEncoding struct {
	once sync.Once
	msgs [][]byte
	err  error
	// zmsgs are msgs as agents that accept zstd are sent them (forZstd), compressed once.
	zonce sync.Once
	zmsgs [][]byte
}

// sendable is e's messages as watcher w is sent them: compressed when it accepts zstd.
func (e *batchEncoding) sendable(w watcherOf) [][]byte {
	if !w.zstd || e.err != nil {
		return e.msgs
	}
	e.zonce.Do(func() { e.zmsgs = compressAll(e.msgs) })
	return e.zmsgs
}

// compressAll is msgs as an agent that accepts zstd is sent them (watchzstd.Encode: those too
// small to gain stay as they are).
func compressAll(msgs [][]byte) [][]byte {
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		out[i] = watchzstd.Encode(m)
	}
	return out
}

// batchEncodings keeps the encodings of the last batches (two generations of maxSharedBatches).
type batchEncodings struct {
	generations[batchKey, batchEncoding]
	encoded atomic.Int64 // batches encoded (tests count them)
}

const maxSharedBatches = 1024

// generations keeps values by key in two generations: when the newer is full it becomes the
// older, and what is still asked for moves back into the newer. Full is a number of values, or
// of bytes as the users count them (bytes).
type generations[K comparable, V any] struct {
	mu       sync.Mutex
	cur, old map[K]*V
	// bytes is what the newer generation's values hold, as their users count it (they add to it);
	// 0 again when it rotates.
	bytes atomic.Int64
}

// get returns the value of k, a new zero one when neither generation holds it. The newer
// generation is full at maxValues values, or past maxBytes bytes (0: no such bound).
func (g *generations[K, V]) get(k K, maxValues int, maxBytes int64) *V {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cur == nil || (maxValues > 0 && len(g.cur) >= maxValues) || (maxBytes > 0 && g.bytes.Load() > maxBytes) {
		g.old, g.cur = g.cur, map[K]*V{}
		g.bytes.Store(0)
	}
	v := g.cur[k]
	if v == nil {
		if v = g.old[k]; v == nil {
			v = new(V)
		}
		g.cur[k] = v
	}
	return v
}

// sharedDelta is delta batch b (as the store published it) encoded for the watchers of w's
// cluster: no message when it holds nothing agents see.
func (s *Server) sharedDelta(b store.Batch, w watcherOf) ([][]byte, error) {
	if len(b.Events) == 0 {
		return nil, nil
	}
	k := batchKey{batchID: batchIDOf(b)}
	for _, ev := range b.Events {
		if ev.Type == apiv1.Event_UPSERT && ev.GetResource().GetCluster() != nil {
			k.psk = w.clusterUID
			break
		}
	}
	var e *batchEncoding = s.watchBatches.get(k, maxSharedBatches, 0)
	e.once.Do(func() {
		evs, _ := agentEvents(b.Events)
		if len(evs) == 0 {
			return
		}
		e.msgs, e.err = s.encodeBatch(&apiv1.WatchResponse{Events: evs, Revision: b.Revision}, w, s.messageBudget())
		s.watchBatches.encoded.Add(1)
	})
	return e.sendable(w), e.err
}

// sendShared sends a group of delta batches, each as encoded once for every watcher, but for the
// last when resp (the group's message) carries imports or a CA bundle: that one goes with them,
// encoded for this watcher (its events' encodings are shared still).
func (s *Server) sendShared(stream apiv1.Agent_WatchServer, group []store.Batch, resp *apiv1.WatchResponse, w watcherOf) error {
	shared := group
	tail := resp.Imports != nil || resp.Ca != nil
	if tail {
		shared = group[:len(group)-1]
	}
	for _, b := range shared {
		msgs, err := s.sharedDelta(b, w)
		if err != nil {
			return err
		}
		if err := sendEncoded(stream, msgs); err != nil {
			return err
		}
	}
	if !tail {
		return nil
	}
	last := group[len(group)-1]
	evs, _ := agentEvents(last.Events)
	return s.sendBatch(stream, &apiv1.WatchResponse{Events: evs, Revision: resp.Revision, Imports: resp.Imports, Ca: resp.Ca}, w)
}
