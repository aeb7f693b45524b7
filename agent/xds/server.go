package xds

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	clusterservice "github.com/envoyproxy/go-control-plane/envoy/service/cluster/v3"
	discoverygrpc "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	endpointservice "github.com/envoyproxy/go-control-plane/envoy/service/endpoint/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	routeservice "github.com/envoyproxy/go-control-plane/envoy/service/route/v3"
	secretservice "github.com/envoyproxy/go-control-plane/envoy/service/secret/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
	"google.golang.org/grpc"

	"github.com/cablemesh/cablemesh/agent/config"
)

// Server is the agent's xDS server: one snapshot, set for every node that has connected, and
// the ACK/NACK state of each node per resource type.
type Server struct {
	log     *slog.Logger
	cache   cache.SnapshotCache
	tracker *tracker
	grpc    *grpc.Server

	buildMu sync.Mutex // serialises Update's builds (the Builder's memo)
	builder Builder

	mu       sync.Mutex
	snap     *cache.Snapshot // nil until the first Update
	nodes    *nodeTable      // the nodes served (bounded, expiring: nodes.go)
	now      func() time.Time
	lis      *peerListener
	sockPath string // the unix socket to remove on Close
}

// NewServer builds a server that serves nothing until Update and Serve.
func NewServer(log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{log: log, tracker: newTracker(), nodes: newNodeTable(DefaultMaxNodes, DefaultNodeTTL), now: time.Now}
	// Not ADS mode: in ADS mode the cache answers a request that names a subset of the
	// resources only once all of them exist, and gRPC clients always name theirs.
	s.cache = cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	cb := s.tracker.callbacks(s)
	xs := serverv3.NewServer(context.Background(), s.cache, cb)
	// grpc-go's xDS client and Envoy keep one long stream; no message limits beyond the
	// defaults: a snapshot of 1,000 services fits well under gRPC's 4 MiB.
	g := grpc.NewServer()
	discoverygrpc.RegisterAggregatedDiscoveryServiceServer(g, xs)
	listenerservice.RegisterListenerDiscoveryServiceServer(g, xs)
	routeservice.RegisterRouteDiscoveryServiceServer(g, xs)
	clusterservice.RegisterClusterDiscoveryServiceServer(g, xs)
	endpointservice.RegisterEndpointDiscoveryServiceServer(g, xs)
	secretservice.RegisterSecretDiscoveryServiceServer(g, xs)
	s.grpc = g
	return s
}

// Listen is ListenWith without clients beyond root and the agent's own user.
func (s *Server) Listen(addr string) (net.Listener, error) { return s.ListenWith(addr, Access{}) }

// ListenWith opens the unix socket ingress.xds.listen names (config.ParseXDSListen: TCP is
// refused) for the clients acc allows; a connection of anyone else is closed at once
// (peerListener). The socket file is made under a temporary name, given its owner and mode
// (acc.fileOwner), and only then renamed into place, so that it never exists at its path with
// looser permissions. A stale socket left by a previous agent is replaced; any other file at
// the path is an error.
func (s *Server) ListenWith(addr string, acc Access) (net.Listener, error) {
	_, address, err := config.ParseXDSListen(addr)
	if err != nil {
		return nil, fmt.Errorf("ingress.xds.listen: %w", err)
	}
	if fi, err := os.Lstat(address); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("ingress.xds.listen: %s exists and is not a socket", address)
		}
		if err := os.Remove(address); err != nil {
			return nil, fmt.Errorf("ingress.xds.listen: remove stale socket: %w", err)
		}
	}
	if err := os.MkdirAll(dirOf(address), 0o755); err != nil {
		return nil, fmt.Errorf("ingress.xds.listen: %w", err)
	}
	ul, err := listenUnixAs(address, acc)
	if err != nil {
		return nil, fmt.Errorf("ingress.xds.listen: %w", err)
	}
	lis := newPeerListener(ul, acc, s.log)
	s.mu.Lock()
	s.lis = lis
	s.sockPath = address
	s.mu.Unlock()
	return lis, nil
}

func dirOf(p string) string {
	for i := len(p) - 1; i > 0; i-- {
		if p[i] == '/' {
			return p[:i]
		}
	}
	return "/"
}

// Serve serves lis until Close.
func (s *Server) Serve(lis net.Listener) error {
	err := s.grpc.Serve(lis)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// Close stops the server, ending every stream, and removes its unix socket.
func (s *Server) Close() {
	s.grpc.Stop()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lis != nil {
		s.lis.Close()
	}
	if s.sockPath != "" {
		os.Remove(s.sockPath)
		s.sockPath = ""
	}
}

// Update builds the snapshot of st and, if any type's version changed, sets it for every node.
// It reports whether anything changed. An invalid state is an error and the last snapshot stays.
func (s *Server) Update(ctx context.Context, st State) (bool, error) {
	s.buildMu.Lock()
	defer s.buildMu.Unlock()
	snap, err := s.builder.Build(st)
	if err != nil {
		return false, err
	}
	return s.SetSnapshot(ctx, snap)
}

// SetSnapshot serves snap to every node unless every type's version equals the current one.
func (s *Server) SetSnapshot(ctx context.Context, snap *cache.Snapshot) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snap != nil && sameVersions(s.snap, snap) {
		return false, nil
	}
	s.snap = snap
	s.tracker.setCurrent(versions(snap))
	for node := range s.nodes.nodes {
		if err := s.cache.SetSnapshot(ctx, node, snap); err != nil {
			return true, fmt.Errorf("xds: set snapshot of node %s: %w", node, err)
		}
	}
	return true, nil
}

// admit is the node of a request on stream k (nodeHooks): on a stream's first request the node
// it names enters the node table, and a node new to it gets the current snapshot (per-node
// snapshots: the cache holds one per node ID, all the same content); nodes that left the table
// lose theirs.
func (s *Server) admit(k streamKey, n *core.Node) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	node, isNew, dropped, err := s.nodes.admit(k, n.GetId(), n != nil, s.now())
	s.dropLocked(dropped)
	if err != nil {
		s.log.Debug("xDS stream refused", "err", err)
		return "", err
	}
	if isNew && s.snap != nil {
		if err := s.cache.SetSnapshot(context.Background(), node, s.snap); err != nil {
			s.log.Warn("xds: cannot set the snapshot of a new node", "xdsNode", node, "err", err)
		}
	}
	return node, nil
}

// dropLocked forgets nodes that left the node table: their snapshot and status.
func (s *Server) dropLocked(nodes []string) {
	for _, n := range nodes {
		s.cache.ClearSnapshot(n)
	}
	s.tracker.forget(nodes)
}

func (s *Server) nodeOf(k streamKey) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodes.nodeOf(k)
}

func (s *Server) closed(k streamKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes.closed(k, s.now())
}

// SetNodeLimits replaces the node table's bounds (before Serve; for tests and benchmarks).
func (s *Server) SetNodeLimits(max int, ttl time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nodes.max, s.nodes.ttl = max, ttl
}

// expireNodes drops the nodes idle longer than the TTL (status calls it: a table nobody adds
// to still forgets).
func (s *Server) expireNodes() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.dropLocked(s.nodes.expire(s.now()))
}

// NodeStreams is the number of open streams per node in the table.
func (s *Server) NodeStreams() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int, len(s.nodes.nodes))
	for n := range s.nodes.nodes {
		out[n] = s.nodes.streamsOf(n)
	}
	return out
}

// Refused are the connections the socket refused (a client neither root, the agent's user nor
// allowed), and the last of them.
func (s *Server) Refused() (count uint64, last string) {
	s.mu.Lock()
	lis := s.lis
	s.mu.Unlock()
	if lis == nil {
		return 0, ""
	}
	return lis.refused()
}

// Versions are the current snapshot's version per type URL (nil before the first Update).
func (s *Server) Versions() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.snap == nil {
		return nil
	}
	return versions(s.snap)
}

// Status is every node's ACK/NACK state per resource type, sorted: the nodes of the node table
// that have been sent or have answered anything.
func (s *Server) Status() []NodeStatus {
	s.expireNodes()
	return s.tracker.status()
}

// Changed returns a channel closed at the next change of the tracked state (a response sent,
// an ACK, a NACK): tests and benchmarks wait on it instead of polling.
func (s *Server) Changed() <-chan struct{} { return s.tracker.changed() }

// served are the types a snapshot carries.
var served = []types.ResponseType{types.Listener, types.Route, types.Cluster, types.Endpoint, types.Secret}

func versions(snap *cache.Snapshot) map[string]string {
	out := map[string]string{}
	for _, t := range served {
		url, _ := cache.GetResponseTypeURL(t)
		out[url] = snap.Resources[t].Version
	}
	return out
}

func sameVersions(a, b *cache.Snapshot) bool {
	for _, t := range served {
		if a.Resources[t].Version != b.Resources[t].Version {
			return false
		}
	}
	return true
}
