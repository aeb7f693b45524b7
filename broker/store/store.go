// Package store holds the broker's state: clusters, endpoints, policies, service exports and
// service VIPs, a global revision bumped by every change, and a bounded log of change events that lets a watcher resume from a revision.
// Store is the interface the broker codes against. Bolt (bbolt, one file) is the embedded
// implementation; Memory keeps the same state in memory (unit tests); Etcd keeps it in etcd, for
// several broker replicas at once. storetest holds the conformance suite every implementation
// passes.
package store

import (
	"context"
	"errors"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Event kinds, as apiv1.Event.kind carries them.
const (
	KindCluster  = "cluster"
	KindEndpoint = "endpoint"
	KindPolicy   = "policy"
	// KindServiceExport events are keyed cluster/node/namespace/name (mcs.ExportKey);
	// KindServiceVIP events namespace/name (mcs.Key). The broker does not forward either to
	// agents: they get the service imports derived from them instead.
	KindServiceExport = "serviceexport"
	KindServiceVIP    = "servicevip"
	// KindNodeCertificate events are keyed cluster/node: a node's certificates at the broker
	// (joined, renewed, revoked). Agents never receive them; a watch of a node ends when its
	// record says its certificate is no longer good.
	KindNodeCertificate = "nodecert"
)

// ErrWatcherTooSlow ends a watch whose buffer filled up: the broker drops a slow watcher rather
// than block writers on it. The watcher reconnects with its last revision.
var ErrWatcherTooSlow = errors.New("watcher fell behind and was disconnected; reconnect with since_revision")

// ErrClosed is returned by a store that has been closed.
var ErrClosed = errors.New("store is closed")

// Options tune a store; zero values take the defaults.
type Options struct {
	// LogSize is how many events the log keeps for resuming watchers (default 10,000), and
	// LogBytes how large they may be, encoded (default 16 MiB): the oldest go when either is
	// reached. A watcher that resumes from a revision the log no longer holds gets a snapshot.
	// (Etcd keeps the log in every replica's memory, and a resuming watcher decodes it: counted
	// only, 10,000 events of exports at the largest a node may send are gigabytes.)
	LogSize  int
	LogBytes int
	// WatchBuffer is how many batches a watcher may lag behind before it is dropped (default
	// 1,024), and WatchBufferBytes how large they may be, encoded as the watcher gets them
	// (default 16 MiB; a watcher that received every batch takes the next however large). The
	// batches a watcher has not received stay in memory for it: counted only, one that stopped
	// reading held 1,024 commits of whatever size. A dropped watcher resumes from its revision.
	WatchBuffer      int
	WatchBufferBytes int
}

func (o Options) withDefaults() Options {
	if o.LogSize <= 0 {
		o.LogSize = 10000
	}
	if o.LogBytes <= 0 {
		o.LogBytes = 16 << 20
	}
	if o.WatchBuffer <= 0 {
		o.WatchBuffer = 1024
	}
	if o.WatchBufferBytes <= 0 {
		o.WatchBufferBytes = 16 << 20
	}
	return o
}

// ReadTx reads a consistent view. Returned messages are copies the caller may keep and modify.
type ReadTx interface {
	Revision() uint64
	// Cluster returns nil, nil when name is absent.
	Cluster(name string) (*apiv1.Cluster, error)
	Clusters() ([]*apiv1.Cluster, error)
	// ClustersDigest is a digest of every stored cluster, far cheaper than Clusters: two equal
	// digests (in one process) are the same clusters. A caller keeps what it made of Clusters
	// under it, and decodes them again only when it changes.
	ClustersDigest() (uint64, error)
	// Endpoint returns nil, nil when absent.
	Endpoint(cluster, node string) (*apiv1.Endpoint, error)
	Endpoints() ([]*apiv1.Endpoint, error)
	// Policy returns nil, nil when name is absent.
	Policy(name string) (*apiv1.Policy, error)
	// Policies returns every policy in name order.
	Policies() ([]*apiv1.Policy, error)
	// ServiceExport returns nil, nil when absent.
	ServiceExport(cluster, node, namespace, name string) (*apiv1.ServiceExport, error)
	// ServiceExports returns every export in key order (cluster/node/namespace/name).
	ServiceExports() ([]*apiv1.ServiceExport, error)
	// ServiceVIP returns nil, nil when absent.
	ServiceVIP(namespace, name string) (*apiv1.ServiceVIP, error)
	// ServiceVIPs returns every VIP record in key order (namespace/name).
	ServiceVIPs() ([]*apiv1.ServiceVIP, error)
	// JoinToken returns nil, nil when no record of the token nonce exists.
	JoinToken(nonce string) (*apiv1.JoinTokenRecord, error)
	// JoinTokens returns every join token record in nonce order.
	JoinTokens() ([]*apiv1.JoinTokenRecord, error)
	// NodeCertificate returns nil, nil when absent.
	NodeCertificate(cluster, node string) (*apiv1.NodeCertificate, error)
	// NodeCertificates returns every node's record in key order (cluster/node).
	NodeCertificates() ([]*apiv1.NodeCertificate, error)
	// MeshAddressClaim returns the claim of a mesh address (its canonical text, e.g.
	// "242.0.0.7"); nil, nil when nobody claims it.
	MeshAddressClaim(address string) (*apiv1.MeshAddressClaim, error)
	// MeshAddressClaims returns every mesh address claim, in key order (the address's text:
	// byte order, not numeric order).
	MeshAddressClaims() ([]*apiv1.MeshAddressClaim, error)
}

// Tx is a read-write transaction. Every Put and every Delete of a present key bumps the global
// revision by one, stamps the resource with it, and records an event; all of a transaction's
// events are published together after it commits.
type Tx interface {
	ReadTx
	PutCluster(c *apiv1.Cluster) error
	DeleteCluster(name string) error
	PutEndpoint(e *apiv1.Endpoint) error
	DeleteEndpoint(cluster, node string) error
	// TouchEndpoint rewrites an endpoint's liveness fields (last heartbeat, lease expiry) without
	// bumping the revision or emitting an event: heartbeats every few seconds from every gateway
	// would otherwise flood watchers and the event log with changes nobody acts on.
	TouchEndpoint(e *apiv1.Endpoint) error
	// PutPolicy stores a policy under its name. Its status_json is not stored: status is computed
	// from the current clusters whenever someone asks for it.
	PutPolicy(p *apiv1.Policy) error
	DeletePolicy(name string) error
	// PutServiceExport stores an export under cluster/node/namespace/name.
	PutServiceExport(e *apiv1.ServiceExport) error
	DeleteServiceExport(cluster, node, namespace, name string) error
	// PutServiceVIP stores the VIP record of namespace/name.
	PutServiceVIP(v *apiv1.ServiceVIP) error
	DeleteServiceVIP(namespace, name string) error
	// PutJoinToken stores a join token's record under its nonce. Token records are bookkeeping
	// of the broker alone: writing or deleting one bumps no revision and emits no event (as
	// TouchEndpoint), but it is part of the transaction like any write.
	PutJoinToken(r *apiv1.JoinTokenRecord) error
	DeleteJoinToken(nonce string) error
	// PutNodeCertificate stores a node's certificate record under cluster/node (revision, event).
	PutNodeCertificate(n *apiv1.NodeCertificate) error
	// TouchNodeCertificate rewrites a stored node record without bumping the revision or
	// emitting an event (a certificate's first use); the record must exist.
	TouchNodeCertificate(n *apiv1.NodeCertificate) error
	DeleteNodeCertificate(cluster, node string) error
	// PutMeshAddressClaim stores a claim under its address, which must be an IP address in its
	// canonical text (so that one address has one key). Claims are the broker's bookkeeping, as
	// join token records are: no revision, no event, but part of the transaction.
	PutMeshAddressClaim(c *apiv1.MeshAddressClaim) error
	DeleteMeshAddressClaim(address string) error
}

// Commit is the outcome of an Update. Its events are shared with the store's watchers: read
// them, do not modify them.
type Commit struct {
	Revision uint64
	Events   []*apiv1.Event
}

// Batch is one message of a watch: a snapshot (every resource as an UPSERT) or deltas. Its
// events, and the resources in them, are shared with the store's other watchers (and with the
// Commit of the Update that made them): a watcher must not modify them, and copies what it
// changes.
type Batch struct {
	Snapshot bool
	Events   []*apiv1.Event
	Revision uint64
}

// Watch delivers batches in revision order on C until its context ends, the store closes, or the
// watcher falls behind; then C is closed and Err says why.
type Watch interface {
	C() <-chan Batch
	Err() error
}

// WatchOption tunes one watch.
type WatchOption func(*watchOptions)

type watchOptions struct {
	omit map[string]bool // kinds whose resources the watcher does not want
}

// OmitResources says the watcher wants to know when resources of kinds change, but not the
// resources themselves: its snapshot leaves them out, and its deltas carry their events with
// type, kind, key and revision only. The broker's agent watches omit service exports and VIPs,
// which reach agents as the imports derived from them, so that no watcher decodes or copies
// every export of the mesh.
func OmitResources(kinds ...string) WatchOption {
	return func(o *watchOptions) {
		if o.omit == nil {
			o.omit = map[string]bool{}
		}
		for _, k := range kinds {
			o.omit[k] = true
		}
	}
}

func watchOpts(opts []WatchOption) watchOptions {
	var o watchOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// Store is the broker's state.
type Store interface {
	View(ctx context.Context, fn func(ReadTx) error) error
	// Update runs fn in one transaction; if fn returns an error nothing is changed. fn may run
	// more than once (Etcd runs it again when another replica committed first), so it must
	// compute everything it returns from tx and have no other effect.
	Update(ctx context.Context, fn func(Tx) error) (Commit, error)
	// Watch first delivers a snapshot, or, when since > 0 and the event log still holds every
	// event after since, those events; then every later commit.
	Watch(ctx context.Context, since uint64, opts ...WatchOption) (Watch, error)
	Close() error
}

// LocalViewer is a Store whose replica reads its own copy of the state without first asking
// the others what they committed (Etcd: its mirror, which etcd's watch keeps within milliseconds
// of the cluster). Such a read may miss a write that another replica committed a moment ago.
type LocalViewer interface {
	ViewLocal(ctx context.Context, fn func(ReadTx) error) error
}

// ViewLocal runs fn on st's local state when st keeps one (LocalViewer), else as View does;
// when fn fails on the local state it runs again with View, so that an error (a refusal) is
// never given from a state that may lag. Use it only where what fn lets through is decided again
// linearizably before it matters (by the transaction of a write).
func ViewLocal(ctx context.Context, st Store, fn func(ReadTx) error) error {
	l, ok := st.(LocalViewer)
	if !ok {
		return st.View(ctx, fn)
	}
	if err := l.ViewLocal(ctx, fn); err == nil {
		return nil
	}
	return st.View(ctx, fn)
}

// EndpointKey is the event key of an endpoint.
func EndpointKey(cluster, node string) string { return cluster + "/" + node }

// ServiceExportKey is the event key of a service export: cluster/node/namespace/name.
func ServiceExportKey(cluster, node, namespace, name string) string {
	return cluster + "/" + node + "/" + namespace + "/" + name
}

// NodeCertificateKey is the event key of a node certificate record: cluster/node.
func NodeCertificateKey(cluster, node string) string { return cluster + "/" + node }

// ServiceVIPKey is the event key of a service VIP record: namespace/name.
func ServiceVIPKey(namespace, name string) string { return namespace + "/" + name }
