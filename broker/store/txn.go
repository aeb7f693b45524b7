package store

import (
	"encoding/binary"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// The layout every key-value backend (Bolt, Memory) shares: one bucket per kind, keyed by name
// (endpoints by cluster/node, service exports by cluster/node/namespace/name, service VIPs by
// namespace/name), resources as protobuf; the event log keyed by big-endian revision;
// the revision and the compaction point in meta.
var (
	bucketMeta      = []byte("meta")
	bucketClusters  = []byte("clusters")
	bucketEndpoints = []byte("endpoints")
	bucketEvents    = []byte("events")
	bucketPolicies  = []byte("policies")
	bucketExports   = []byte("serviceExports")
	bucketVIPs      = []byte("serviceVIPs")
	bucketTokens    = []byte("joinTokens")
	bucketNodeCerts = []byte("nodeCertificates")
	// bucketMeshClaims holds the mesh address claims, keyed by address. (Before it existed the
	// broker kept them in bucketTokens as records with nonce "mesh-address/<address>"; the
	// broker moves those at start, see broker/meshaddrs.go.)
	bucketMeshClaims = []byte("meshAddressClaims")

	buckets = [][]byte{bucketMeta, bucketClusters, bucketEndpoints, bucketEvents, bucketPolicies, bucketExports, bucketVIPs, bucketTokens, bucketNodeCerts, bucketMeshClaims}

	keyRevision  = []byte("revision")
	keyCompacted = []byte("compacted")
	// keyLogBytes is the size of the events the log holds (compacted, revision], with the
	// revision it was counted at: 16 bytes, both big-endian. A log written by a broker that did
	// not keep it (or that another revision of the store has moved on since) is counted again.
	keyLogBytes = []byte("logBytes")
)

// kv is the ordered key-value space one transaction of a backend sees: the named buckets above,
// with byte keys and values. A value given to put is not modified afterwards; values get and scan
// return are only read, and only during the transaction.
type kv interface {
	get(bucket, key []byte) []byte
	put(bucket, key, value []byte) error
	delete(bucket, key []byte) error
	// scan calls fn for every key >= from (nil: from the first) in byte order, until fn returns
	// an error, which scan returns.
	scan(bucket, from []byte, fn func(k, v []byte) error) error
	// peek is get without recording the read as one the transaction depends on (Etcd compares
	// what a transaction read when it commits). Only for the event log and its size, which only
	// commits that bump the revision write: those compare the revision, which covers them.
	peek(bucket, key []byte) []byte
}

// txn implements Tx over a kv: the revision bookkeeping, the events and the log, written once for
// every key-value backend.
type txn struct {
	kv       kv
	rev      uint64
	writable bool
	events   []*apiv1.Event
}

func newTxn(s kv, writable bool) *txn {
	return &txn{kv: s, rev: getU64(s, keyRevision), writable: writable}
}

var errReadOnly = errors.New("write in a read-only transaction")

func (t *txn) Revision() uint64 { return t.rev }

// message is a protobuf message type used by value, as its pointer.
type message[T any] interface {
	*T
	proto.Message
}

func load[T any, P message[T]](s kv, bucket []byte, what, key string) (P, error) {
	v := s.get(bucket, []byte(key))
	if v == nil {
		return nil, nil
	}
	m := P(new(T))
	if err := proto.Unmarshal(v, m); err != nil {
		return nil, fmt.Errorf("decode %s %q: %w", what, key, err)
	}
	return m, nil
}

func loadAll[T any, P message[T]](s kv, bucket []byte, what string) ([]P, error) {
	var out []P
	err := s.scan(bucket, nil, func(k, v []byte) error {
		m := P(new(T))
		if err := proto.Unmarshal(v, m); err != nil {
			return fmt.Errorf("decode %s %q: %w", what, k, err)
		}
		out = append(out, m)
		return nil
	})
	return out, err
}

// finish records the revision and the events of the transaction and trims the log to its newest
// logSize events and logBytes bytes (encoded; at least the oldest event goes when the log is
// past either, so a single event larger than logBytes is not kept either).
func (t *txn) finish(logSize, logBytes int) error {
	if len(t.events) == 0 {
		return nil
	}
	if err := t.kv.put(bucketMeta, keyRevision, u64Key(t.rev)); err != nil {
		return err
	}
	// Revisions are contiguous, so the log holds exactly (compacted, rev].
	compacted := getU64(t.kv, keyCompacted)
	size := t.logBytesBefore(compacted, t.events[0].Revision-1)
	for _, ev := range t.events {
		b, err := proto.Marshal(ev)
		if err != nil {
			return fmt.Errorf("encode event %d: %w", ev.Revision, err)
		}
		if err := t.kv.put(bucketEvents, u64Key(ev.Revision), b); err != nil {
			return err
		}
		size += uint64(len(b))
	}
	for compacted < t.rev && (t.rev-compacted > uint64(logSize) || size > uint64(logBytes)) {
		compacted++
		key := u64Key(compacted)
		size -= min(size, uint64(len(t.kv.peek(bucketEvents, key))))
		if err := t.kv.delete(bucketEvents, key); err != nil {
			return err
		}
	}
	if err := t.kv.put(bucketMeta, keyLogBytes, logBytesValue(t.rev, size)); err != nil {
		return err
	}
	if compacted == getU64(t.kv, keyCompacted) {
		return nil
	}
	return t.kv.put(bucketMeta, keyCompacted, u64Key(compacted))
}

// logBytesBefore is the size of the logged events (compacted, rev], rev being the revision
// before this transaction's: as recorded when it was recorded at rev, else counted.
func (t *txn) logBytesBefore(compacted, rev uint64) uint64 {
	if v := t.kv.peek(bucketMeta, keyLogBytes); len(v) == 16 && binary.BigEndian.Uint64(v) == rev {
		return binary.BigEndian.Uint64(v[8:])
	}
	var n uint64
	for r := compacted + 1; r <= rev; r++ {
		n += uint64(len(t.kv.peek(bucketEvents, u64Key(r))))
	}
	return n
}

func logBytesValue(rev, size uint64) []byte {
	b := make([]byte, 16)
	binary.BigEndian.PutUint64(b, rev)
	binary.BigEndian.PutUint64(b[8:], size)
	return b
}

// firstBatch is what a watch from since starts with: the logged events after since when the log
// still holds every one of them, a snapshot of everything otherwise (and for since 0). Events of
// the kinds opts omits come without their resources, and not at all in a snapshot.
func (t *txn) firstBatch(since uint64, opts watchOptions) (Batch, error) {
	compacted := getU64(t.kv, keyCompacted)
	first := Batch{Revision: t.rev}
	if since > 0 && since >= compacted && since <= t.rev {
		err := t.kv.scan(bucketEvents, u64Key(since+1), func(k, v []byte) error {
			ev := &apiv1.Event{}
			if err := proto.Unmarshal(v, ev); err != nil {
				return fmt.Errorf("decode event %d: %w", binary.BigEndian.Uint64(k), err)
			}
			if opts.omit[ev.Kind] {
				ev = withoutResource(ev)
			}
			first.Events = append(first.Events, ev)
			return nil
		})
		return first, err
	}
	first.Snapshot = true
	upserts := func(kind string, read func() ([]*apiv1.Event, error)) error {
		if opts.omit[kind] {
			return nil
		}
		evs, err := read()
		first.Events = append(first.Events, evs...)
		return err
	}
	event := func(kind, key string, r *apiv1.Resource) *apiv1.Event {
		return &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: kind, Key: key, Resource: r, Revision: t.rev}
	}
	err := upserts(KindCluster, func() ([]*apiv1.Event, error) {
		cs, err := t.Clusters()
		evs := make([]*apiv1.Event, len(cs))
		for i, c := range cs {
			evs[i] = event(KindCluster, c.Name, &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: c}})
		}
		return evs, err
	})
	if err == nil {
		err = upserts(KindEndpoint, func() ([]*apiv1.Event, error) {
			es, err := t.Endpoints()
			evs := make([]*apiv1.Event, len(es))
			for i, e := range es {
				evs[i] = event(KindEndpoint, EndpointKey(e.Cluster, e.Node), &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}})
			}
			return evs, err
		})
	}
	if err == nil {
		err = upserts(KindPolicy, func() ([]*apiv1.Event, error) {
			ps, err := t.Policies()
			evs := make([]*apiv1.Event, len(ps))
			for i, p := range ps {
				evs[i] = event(KindPolicy, p.Name, &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: p}})
			}
			return evs, err
		})
	}
	if err == nil {
		err = upserts(KindServiceExport, func() ([]*apiv1.Event, error) {
			xs, err := t.ServiceExports()
			evs := make([]*apiv1.Event, len(xs))
			for i, x := range xs {
				evs[i] = event(KindServiceExport, ServiceExportKey(x.Cluster, x.Node, x.Namespace, x.Name),
					&apiv1.Resource{Kind: &apiv1.Resource_ServiceExport{ServiceExport: x}})
			}
			return evs, err
		})
	}
	if err == nil {
		err = upserts(KindNodeCertificate, func() ([]*apiv1.Event, error) {
			ns, err := t.NodeCertificates()
			evs := make([]*apiv1.Event, len(ns))
			for i, n := range ns {
				evs[i] = event(KindNodeCertificate, NodeCertificateKey(n.Cluster, n.Node), &apiv1.Resource{Kind: &apiv1.Resource_NodeCertificate{NodeCertificate: n}})
			}
			return evs, err
		})
	}
	if err == nil {
		err = upserts(KindServiceVIP, func() ([]*apiv1.Event, error) {
			vs, err := t.ServiceVIPs()
			evs := make([]*apiv1.Event, len(vs))
			for i, v := range vs {
				evs[i] = event(KindServiceVIP, ServiceVIPKey(v.Namespace, v.Name), &apiv1.Resource{Kind: &apiv1.Resource_ServiceVip{ServiceVip: v}})
			}
			return evs, err
		})
	}
	return first, err
}

func putProto(s kv, bucket []byte, key string, m proto.Message) error {
	v, err := proto.Marshal(m)
	if err != nil {
		return err
	}
	return s.put(bucket, []byte(key), v)
}

func u64Key(v uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, v)
	return b
}

func getU64(s kv, key []byte) uint64 {
	v := s.get(bucketMeta, key)
	if len(v) != 8 {
		return 0
	}
	return binary.BigEndian.Uint64(v)
}
