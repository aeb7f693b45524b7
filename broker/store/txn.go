package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/maphash"
	"net/netip"

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

func (t *txn) Cluster(name string) (*apiv1.Cluster, error) {
	return load[apiv1.Cluster](t.kv, bucketClusters, "cluster", name)
}

func (t *txn) Clusters() ([]*apiv1.Cluster, error) {
	return loadAll[apiv1.Cluster](t.kv, bucketClusters, "cluster")
}

// digestSeed seeds ClustersDigest: digests compare within one process only.
var digestSeed = maphash.MakeSeed()

func (t *txn) ClustersDigest() (uint64, error) {
	var h maphash.Hash
	h.SetSeed(digestSeed)
	var n [8]byte
	err := t.kv.scan(bucketClusters, nil, func(k, v []byte) error {
		// Each key and value with its length: no two different listings hash the same input.
		binary.BigEndian.PutUint32(n[:4], uint32(len(k)))
		binary.BigEndian.PutUint32(n[4:], uint32(len(v)))
		_, _ = h.Write(n[:])
		_, _ = h.Write(k)
		_, _ = h.Write(v)
		return nil
	})
	return h.Sum64(), err
}

func (t *txn) Endpoint(cluster, node string) (*apiv1.Endpoint, error) {
	return load[apiv1.Endpoint](t.kv, bucketEndpoints, "endpoint", EndpointKey(cluster, node))
}

func (t *txn) Endpoints() ([]*apiv1.Endpoint, error) {
	return loadAll[apiv1.Endpoint](t.kv, bucketEndpoints, "endpoint")
}

func (t *txn) Policy(name string) (*apiv1.Policy, error) {
	return load[apiv1.Policy](t.kv, bucketPolicies, "policy", name)
}

func (t *txn) Policies() ([]*apiv1.Policy, error) {
	return loadAll[apiv1.Policy](t.kv, bucketPolicies, "policy")
}

func (t *txn) ServiceExport(cluster, node, namespace, name string) (*apiv1.ServiceExport, error) {
	return load[apiv1.ServiceExport](t.kv, bucketExports, "service export", ServiceExportKey(cluster, node, namespace, name))
}

func (t *txn) ServiceExports() ([]*apiv1.ServiceExport, error) {
	return loadAll[apiv1.ServiceExport](t.kv, bucketExports, "service export")
}

func (t *txn) ServiceVIP(namespace, name string) (*apiv1.ServiceVIP, error) {
	return load[apiv1.ServiceVIP](t.kv, bucketVIPs, "service VIP", ServiceVIPKey(namespace, name))
}

func (t *txn) ServiceVIPs() ([]*apiv1.ServiceVIP, error) {
	return loadAll[apiv1.ServiceVIP](t.kv, bucketVIPs, "service VIP")
}

func (t *txn) JoinToken(nonce string) (*apiv1.JoinTokenRecord, error) {
	return load[apiv1.JoinTokenRecord](t.kv, bucketTokens, "join token", nonce)
}

func (t *txn) JoinTokens() ([]*apiv1.JoinTokenRecord, error) {
	return loadAll[apiv1.JoinTokenRecord](t.kv, bucketTokens, "join token")
}

func (t *txn) NodeCertificate(cluster, node string) (*apiv1.NodeCertificate, error) {
	return load[apiv1.NodeCertificate](t.kv, bucketNodeCerts, "node certificate", NodeCertificateKey(cluster, node))
}

func (t *txn) NodeCertificates() ([]*apiv1.NodeCertificate, error) {
	return loadAll[apiv1.NodeCertificate](t.kv, bucketNodeCerts, "node certificate")
}

func (t *txn) MeshAddressClaim(address string) (*apiv1.MeshAddressClaim, error) {
	return load[apiv1.MeshAddressClaim](t.kv, bucketMeshClaims, "mesh address claim", address)
}

func (t *txn) MeshAddressClaims() ([]*apiv1.MeshAddressClaim, error) {
	return loadAll[apiv1.MeshAddressClaim](t.kv, bucketMeshClaims, "mesh address claim")
}

// upsert stores m under key, stamped with the next revision (stamp sets it), and records the event.
func (t *txn) upsert(bucket []byte, kind, key string, m proto.Message, stamp func(uint64), res *apiv1.Resource) error {
	t.rev++
	stamp(t.rev)
	if err := putProto(t.kv, bucket, key, m); err != nil {
		return fmt.Errorf("put %s %q: %w", kind, key, err)
	}
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: kind, Key: key, Resource: res, Revision: t.rev})
	return nil
}

// remove deletes key, whose last value is in res, and records the event.
func (t *txn) remove(bucket []byte, kind, key string, res *apiv1.Resource) error {
	if err := t.kv.delete(bucket, []byte(key)); err != nil {
		return fmt.Errorf("delete %s %q: %w", kind, key, err)
	}
	t.rev++
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_DELETE, Kind: kind, Key: key, Resource: res, Revision: t.rev})
	return nil
}

func (t *txn) PutCluster(c *apiv1.Cluster) error {
	if !t.writable {
		return errReadOnly
	}
	if c.GetName() == "" {
		return errors.New("put cluster: name is empty")
	}
	c = proto.Clone(c).(*apiv1.Cluster)
	// Pair PSKs are derived per watcher when the broker sends a cluster; they are never stored.
	c.PairPsk = nil
	return t.upsert(bucketClusters, KindCluster, c.Name, c, func(r uint64) { c.Revision = r },
		&apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: c}})
}

func (t *txn) DeleteCluster(name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Cluster(name)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketClusters, KindCluster, name, &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: old}})
}

func (t *txn) PutEndpoint(e *apiv1.Endpoint) error {
	if !t.writable {
		return errReadOnly
	}
	if e.GetCluster() == "" || e.GetNode() == "" {
		return errors.New("put endpoint: cluster or node is empty")
	}
	e = proto.Clone(e).(*apiv1.Endpoint)
	return t.upsert(bucketEndpoints, KindEndpoint, EndpointKey(e.Cluster, e.Node), e, func(r uint64) { e.Revision = r },
		&apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}})
}

func (t *txn) TouchEndpoint(e *apiv1.Endpoint) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Endpoint(e.GetCluster(), e.GetNode())
	if err != nil {
		return err
	}
	key := EndpointKey(e.GetCluster(), e.GetNode())
	if old == nil {
		return fmt.Errorf("touch endpoint %q: not found", key)
	}
	old.LastHeartbeat = e.LastHeartbeat
	old.LeaseExpires = e.LeaseExpires
	if err := putProto(t.kv, bucketEndpoints, key, old); err != nil {
		return fmt.Errorf("touch endpoint %q: %w", key, err)
	}
	return nil
}

func (t *txn) DeleteEndpoint(cluster, node string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Endpoint(cluster, node)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketEndpoints, KindEndpoint, EndpointKey(cluster, node), &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: old}})
}

func (t *txn) PutPolicy(p *apiv1.Policy) error {
	if !t.writable {
		return errReadOnly
	}
	if p.GetName() == "" {
		return errors.New("put policy: name is empty")
	}
	p = proto.Clone(p).(*apiv1.Policy)
	p.StatusJson = nil
	return t.upsert(bucketPolicies, KindPolicy, p.Name, p, func(r uint64) { p.Revision = r },
		&apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: p}})
}

func (t *txn) DeletePolicy(name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Policy(name)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketPolicies, KindPolicy, name, &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: old}})
}

func (t *txn) PutServiceExport(e *apiv1.ServiceExport) error {
	if !t.writable {
		return errReadOnly
	}
	if e.GetCluster() == "" || e.GetNode() == "" || e.GetNamespace() == "" || e.GetName() == "" {
		return fmt.Errorf("put service export %q: cluster, node, namespace or name is empty",
			ServiceExportKey(e.GetCluster(), e.GetNode(), e.GetNamespace(), e.GetName()))
	}
	e = proto.Clone(e).(*apiv1.ServiceExport)
	return t.upsert(bucketExports, KindServiceExport, ServiceExportKey(e.Cluster, e.Node, e.Namespace, e.Name), e,
		func(r uint64) { e.Revision = r }, &apiv1.Resource{Kind: &apiv1.Resource_ServiceExport{ServiceExport: e}})
}

func (t *txn) DeleteServiceExport(cluster, node, namespace, name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.ServiceExport(cluster, node, namespace, name)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketExports, KindServiceExport, ServiceExportKey(cluster, node, namespace, name),
		&apiv1.Resource{Kind: &apiv1.Resource_ServiceExport{ServiceExport: old}})
}

func (t *txn) PutServiceVIP(v *apiv1.ServiceVIP) error {
	if !t.writable {
		return errReadOnly
	}
	if v.GetNamespace() == "" || v.GetName() == "" {
		return fmt.Errorf("put service VIP %q: namespace or name is empty", ServiceVIPKey(v.GetNamespace(), v.GetName()))
	}
	v = proto.Clone(v).(*apiv1.ServiceVIP)
	return t.upsert(bucketVIPs, KindServiceVIP, ServiceVIPKey(v.Namespace, v.Name), v,
		func(r uint64) { v.Revision = r }, &apiv1.Resource{Kind: &apiv1.Resource_ServiceVip{ServiceVip: v}})
}

func (t *txn) DeleteServiceVIP(namespace, name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.ServiceVIP(namespace, name)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketVIPs, KindServiceVIP, ServiceVIPKey(namespace, name),
		&apiv1.Resource{Kind: &apiv1.Resource_ServiceVip{ServiceVip: old}})
}

func (t *txn) PutJoinToken(r *apiv1.JoinTokenRecord) error {
	if !t.writable {
		return errReadOnly
	}
	if r.GetNonce() == "" {
		return errors.New("put join token: nonce is empty")
	}
	if err := putProto(t.kv, bucketTokens, r.Nonce, r); err != nil {
		return fmt.Errorf("put join token %q: %w", r.Nonce, err)
	}
	return nil
}

func (t *txn) DeleteJoinToken(nonce string) error {
	if !t.writable {
		return errReadOnly
	}
	if err := t.kv.delete(bucketTokens, []byte(nonce)); err != nil {
		return fmt.Errorf("delete join token %q: %w", nonce, err)
	}
	return nil
}

func (t *txn) PutNodeCertificate(n *apiv1.NodeCertificate) error {
	if !t.writable {
		return errReadOnly
	}
	if n.GetCluster() == "" || n.GetNode() == "" {
		return errors.New("put node certificate: cluster or node is empty")
	}
	n = proto.Clone(n).(*apiv1.NodeCertificate)
	return t.upsert(bucketNodeCerts, KindNodeCertificate, NodeCertificateKey(n.Cluster, n.Node), n, func(r uint64) { n.Revision = r },
		&apiv1.Resource{Kind: &apiv1.Resource_NodeCertificate{NodeCertificate: n}})
}

func (t *txn) TouchNodeCertificate(n *apiv1.NodeCertificate) error {
	if !t.writable {
		return errReadOnly
	}
	key := NodeCertificateKey(n.GetCluster(), n.GetNode())
	old, err := t.NodeCertificate(n.GetCluster(), n.GetNode())
	if err != nil {
		return err
	}
	if old == nil {
		return fmt.Errorf("touch node certificate %q: not found", key)
	}
	n = proto.Clone(n).(*apiv1.NodeCertificate)
	n.Revision = old.Revision
	if err := putProto(t.kv, bucketNodeCerts, key, n); err != nil {
		return fmt.Errorf("touch node certificate %q: %w", key, err)
	}
	return nil
}

func (t *txn) DeleteNodeCertificate(cluster, node string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.NodeCertificate(cluster, node)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketNodeCerts, KindNodeCertificate, NodeCertificateKey(cluster, node),
		&apiv1.Resource{Kind: &apiv1.Resource_NodeCertificate{NodeCertificate: old}})
}

func (t *txn) PutMeshAddressClaim(c *apiv1.MeshAddressClaim) error {
	if !t.writable {
		return errReadOnly
	}
	if err := checkClaimAddress(c.GetAddress()); err != nil {
		return fmt.Errorf("put mesh address claim: %w", err)
	}
	if err := putProto(t.kv, bucketMeshClaims, c.Address, c); err != nil {
		return fmt.Errorf("put mesh address claim %q: %w", c.Address, err)
	}
	return nil
}

func (t *txn) DeleteMeshAddressClaim(address string) error {
	if !t.writable {
		return errReadOnly
	}
	if err := t.kv.delete(bucketMeshClaims, []byte(address)); err != nil {
		return fmt.Errorf("delete mesh address claim %q: %w", address, err)
	}
	return nil
}

// checkClaimAddress refuses a claim key that is not an address in its canonical text, without a
// zone: "2001:DB8::1" or "fe80::1%eth0" would be a second key for an address another claim may
// hold, and uniqueness rests on one key per address.
func checkClaimAddress(s string) error {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return fmt.Errorf("address %q is not an IP address", s)
	}
	if a.Zone() != "" {
		return fmt.Errorf("address %q has a zone (a mesh address is mesh-wide, not of one interface)", s)
	}
	if a.String() != s {
		return fmt.Errorf("address %q is not in canonical form (%s)", s, a)
	}
	return nil
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
