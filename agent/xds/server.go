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
	nodes    map[string]bool // every node ID that sent a request
	lis      net.Listener
	sockPath string // the unix socket to remove on Close ("" for TCP)
}

// NewServer builds a server that serves nothing until Update and Serve.
func NewServer(log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{log: log, tracker: newTracker(), nodes: map[string]bool{}}
	// Not ADS mode: in ADS mode the cache answers a request that names a subset of the
	// resources only once all of them exist, and gRPC clients always name theirs.
	s.cache = cache.NewSnapshotCache(false, cache.IDHash{}, nil)
	cb := s.tracker.callbacks(s.sawNode)
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

// Listen opens addr as ingress.xds.listen allows it (a unix socket path, or a loopback
// host:port); anything else is refused with an error naming it. A stale socket file left by a
// previous agent is replaced; any other file at the path is an error.
func (s *Server) Listen(addr string) (net.Listener, error) {
	network, address, err := config.ParseXDSListen(addr)
	if err != nil {
		return nil, fmt.Errorf("ingress.xds.listen: %w", err)
	}
	if network == "unix" {
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
	}
	lis, err := net.Listen(network, address)
	if err != nil {
		return nil, fmt.Errorf("ingress.xds.listen: %w", err)
	}
	if network == "unix" {
		// The socket hands out the ingress's private key: the agent's user alone.
		if err := os.Chmod(address, 0o600); err != nil {
			lis.Close()
			return nil, fmt.Errorf("ingress.xds.listen: %w", err)
		}
	}
	s.mu.Lock()
	s.lis = lis
	if network == "unix" {
		s.sockPath = address
	}
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
	for node := range s.nodes {
		if err := s.cache.SetSnapshot(ctx, node, snap); err != nil {
			return true, fmt.Errorf("xds: set snapshot of node %s: %w", node, err)
		}
	}
	return true, nil
}

// sawNode gives a node seen for the first time the current snapshot (per-node snapshots: the
// cache holds one per node ID, all the same content).
func (s *Server) sawNode(node string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.nodes[node] {
		return
	}
	s.nodes[node] = true
	if s.snap != nil {
		if err := s.cache.SetSnapshot(context.Background(), node, s.snap); err != nil {
			s.log.Warn("xds: cannot set the snapshot of a new node", "xdsNode", node, "err", err)
		}
	}
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

// Status is every node's ACK/NACK state per resource type, sorted.
func (s *Server) Status() []NodeStatus { return s.tracker.status() }

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
