package xds

import (
	"cmp"
	"context"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/v3"
	serverv3 "github.com/envoyproxy/go-control-plane/pkg/server/v3"
)

// NodeStatus is one xDS client node's state.
type NodeStatus struct {
	Node  string
	Types []TypeStatus
}

// TypeStatus is one resource type of one node.
type TypeStatus struct {
	// Type is the short name: listeners, routes, clusters, endpoints, secrets.
	Type string
	// Current is the version the server holds; Sent the last one sent to the node; Acked the
	// last one the node accepted.
	Current, Sent, Acked string
	// NackError is the error_detail of the node's last NACK, while no later version was ACKed;
	// NackVersion the version it refused.
	NackError, NackVersion string
	Updated                time.Time
}

// ShortType is the status name of a type URL: listeners, routes, clusters, endpoints, secrets.
func ShortType(url string) string {
	switch {
	case strings.HasSuffix(url, ".Listener"):
		return "listeners"
	case strings.HasSuffix(url, ".RouteConfiguration"):
		return "routes"
	case strings.HasSuffix(url, ".Cluster"):
		return "clusters"
	case strings.HasSuffix(url, ".ClusterLoadAssignment"):
		return "endpoints"
	case strings.HasSuffix(url, ".Secret"):
		return "secrets"
	}
	return url
}

type typeKey struct{ node, url string }

type typeState struct {
	sent, acked, nack, nackVersion string
	updated                        time.Time
}

// tracker follows ACKs and NACKs through the server's callbacks (which run synchronously on
// the stream's goroutine; the tracker's lock makes them safe across streams).
type tracker struct {
	mu      sync.Mutex
	current map[string]string           // type URL -> current version
	nonces  map[int64]map[string]string // delta stream -> nonce -> version sent
	state   map[typeKey]*typeState
	ch      chan struct{}
}

func newTracker() *tracker {
	return &tracker{current: map[string]string{}, nonces: map[int64]map[string]string{}, state: map[typeKey]*typeState{}, ch: make(chan struct{})}
}

// maxNackLength bounds a NACK's error detail as status keeps it (Envoy's are a line or two).
const maxNackLength = 1024

// tracked says url is one of the served types: requests for any other type are not recorded
// (the type URL comes from the client; the status must not grow with made-up ones).
func tracked(url string) bool {
	for _, t := range served {
		if u, _ := cache.GetResponseTypeURL(t); u == url {
			return true
		}
	}
	return false
}

// forget drops the state of nodes that left the node table.
func (t *tracker) forget(nodes []string) {
	if len(nodes) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.state {
		if slices.Contains(nodes, k.node) {
			delete(t.state, k)
		}
	}
	t.notifyLocked()
}

func (t *tracker) changed() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.ch
}

// notifyLocked wakes every waiter of changed().
func (t *tracker) notifyLocked() {
	close(t.ch)
	t.ch = make(chan struct{})
}

func (t *tracker) setCurrent(v map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.current = v
	t.notifyLocked()
}

func (t *tracker) get(node, url string) *typeState {
	k := typeKey{node, url}
	s := t.state[k]
	if s == nil {
		s = &typeState{}
		t.state[k] = s
	}
	return s
}

// request records an ACK or a NACK: a request that answers a response (a nonce) is a NACK when
// it carries error_detail, an ACK of version otherwise.
func (t *tracker) request(node, url, nonce, version, errDetail string, nack bool) {
	if nonce == "" || !tracked(url) {
		return // the first request of the type (nothing to answer yet), or a type not served
	}
	if len(errDetail) > maxNackLength {
		errDetail = errDetail[:maxNackLength] + "..."
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.get(node, url)
	s.updated = time.Now()
	if nack {
		s.nack, s.nackVersion = errDetail, s.sent
		if s.nack == "" {
			s.nack = "NACK without error detail"
		}
	} else {
		s.acked = version
		if version != s.nackVersion {
			s.nack, s.nackVersion = "", ""
		}
	}
	t.notifyLocked()
}

func (t *tracker) sent(node, url, version string) {
	if !tracked(url) {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.get(node, url)
	s.sent, s.updated = version, time.Now()
	t.notifyLocked()
}

// nodeHooks are the server's node table as the callbacks use it.
type nodeHooks interface {
	// admit returns the node of a request on stream k (admitting it on the stream's first
	// request), or the error that ends the stream.
	admit(k streamKey, node *core.Node) (string, error)
	nodeOf(k streamKey) string
	closed(k streamKey)
}

// callbacks are the server callbacks.
func (t *tracker) callbacks(h nodeHooks) serverv3.CallbackFuncs {
	return serverv3.CallbackFuncs{
		StreamRequestFunc: func(id int64, req *discovery.DiscoveryRequest) error {
			node, err := h.admit(streamKey{id: id}, req.GetNode())
			if err != nil {
				return err
			}
			t.request(node, req.GetTypeUrl(), req.GetResponseNonce(), req.GetVersionInfo(), req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
			return nil
		},
		StreamResponseFunc: func(_ context.Context, id int64, req *discovery.DiscoveryRequest, resp *discovery.DiscoveryResponse) {
			t.sent(h.nodeOf(streamKey{id: id}), resp.GetTypeUrl(), resp.GetVersionInfo())
		},
		StreamClosedFunc: func(id int64, _ *core.Node) { h.closed(streamKey{id: id}) },
		StreamDeltaRequestFunc: func(id int64, req *discovery.DeltaDiscoveryRequest) error {
			node, err := h.admit(streamKey{delta: true, id: id}, req.GetNode())
			if err != nil {
				return err
			}
			t.mu.Lock()
			// Delta requests carry no version: the nonce says which response they answer.
			version := t.nonces[id][req.GetResponseNonce()]
			delete(t.nonces[id], req.GetResponseNonce())
			t.mu.Unlock()
			t.request(node, req.GetTypeUrl(), req.GetResponseNonce(), version, req.GetErrorDetail().GetMessage(), req.GetErrorDetail() != nil)
			return nil
		},
		StreamDeltaResponseFunc: func(id int64, req *discovery.DeltaDiscoveryRequest, resp *discovery.DeltaDiscoveryResponse) {
			node := h.nodeOf(streamKey{delta: true, id: id})
			t.mu.Lock()
			if t.nonces[id] == nil {
				t.nonces[id] = map[string]string{}
			}
			// A response per type at most is unanswered at a time; keep the map from growing
			// with responses a client never answers.
			if len(t.nonces[id]) >= len(served)*4 {
				clear(t.nonces[id])
			}
			t.nonces[id][resp.GetNonce()] = resp.GetSystemVersionInfo()
			t.mu.Unlock()
			t.sent(node, resp.GetTypeUrl(), resp.GetSystemVersionInfo())
		},
		DeltaStreamClosedFunc: func(id int64, _ *core.Node) {
			t.mu.Lock()
			delete(t.nonces, id)
			t.mu.Unlock()
			h.closed(streamKey{delta: true, id: id})
		},
	}
}

func (t *tracker) status() []NodeStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	by := map[string][]TypeStatus{}
	for k, s := range t.state {
		by[k.node] = append(by[k.node], TypeStatus{Type: ShortType(k.url), Current: t.current[k.url], Sent: s.sent, Acked: s.acked,
			NackError: s.nack, NackVersion: s.nackVersion, Updated: s.updated})
	}
	out := make([]NodeStatus, 0, len(by))
	for _, n := range slices.Sorted(maps.Keys(by)) {
		ts := by[n]
		slices.SortFunc(ts, func(a, b TypeStatus) int { return cmp.Compare(a.Type, b.Type) })
		out = append(out, NodeStatus{Node: n, Types: ts})
	}
	return out
}

// Acked reports whether node has ACKed version of the type URL (for tests and benchmarks).
func (s *Server) Acked(node, typeURL, version string) bool {
	t := s.tracker
	t.mu.Lock()
	defer t.mu.Unlock()
	st := t.state[typeKey{node, typeURL}]
	return st != nil && st.acked == version
}
