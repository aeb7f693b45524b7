package xds

import (
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// The node table: every xDS client node the server holds a snapshot and a status row for. The
// node IDs come from the clients, so the table is bounded and forgets: a node is kept while one
// of its streams is open and for NodeTTL after its last one closed (so a reconnecting Envoy keeps
// its row, and status shows a client that went away), then dropped with its snapshot and status.
// A new node when the table is full takes the place of the node idle longest; when every node
// has an open stream, the new one is refused (ResourceExhausted) until one leaves.

// Defaults of the node table.
const (
	// DefaultMaxNodes bounds the node table: an ingress Envoy and a few proxyless gRPC clients
	// per node need a handful.
	DefaultMaxNodes = 64
	// DefaultNodeTTL is how long a node stays after its last stream closed.
	DefaultNodeTTL = 5 * time.Minute
	// MaxNodeIDLength bounds a node ID (Envoy's are "<node>-ingress"; a status row carries it).
	MaxNodeIDLength = 256
)

// streamKey names a stream: state-of-the-world and delta streams are counted apart.
type streamKey struct {
	delta bool
	id    int64
}

// nodeEntry is one node of the table.
type nodeEntry struct {
	streams   int       // open streams naming the node
	idleSince time.Time // when its last stream closed (streams == 0)
}

// nodeTable is the bounded table of nodes and which stream names which node. Not safe for
// concurrent use: the Server's mu guards it.
type nodeTable struct {
	max     int
	ttl     time.Duration
	streams map[streamKey]string
	nodes   map[string]*nodeEntry
}

func newNodeTable(max int, ttl time.Duration) *nodeTable {
	return &nodeTable{max: max, ttl: ttl, streams: map[streamKey]string{}, nodes: map[string]*nodeEntry{}}
}

// admit decides the node of a request on stream k: the node the stream named first (a stream
// may not change it), or, on a stream's first request, node, admitted to the table. isNew says
// the node was not in the table (it needs its snapshot); dropped are the nodes that left it
// (expired, or the one idle longest, evicted to make room), whose snapshots and status go.
func (t *nodeTable) admit(k streamKey, node string, hasNode bool, now time.Time) (id string, isNew bool, dropped []string, err error) {
	if cur, ok := t.streams[k]; ok {
		if hasNode && node != cur {
			return "", false, nil, status.Errorf(codes.InvalidArgument, "xds: a stream may not change its node id (%q, then %q)", cur, node)
		}
		return cur, false, nil, nil
	}
	if !hasNode {
		return "", false, nil, status.Error(codes.InvalidArgument, "xds: the first request of a stream must name its node")
	}
	if err := checkNodeID(node); err != nil {
		return "", false, nil, err
	}
	dropped = t.expire(now)
	if e := t.nodes[node]; e != nil {
		e.streams++
		t.streams[k] = node
		return node, false, dropped, nil
	}
	if len(t.nodes) >= t.max {
		victim := t.idlest()
		if victim == "" {
			return "", false, dropped, status.Errorf(codes.ResourceExhausted, "xds: the node table is full (%d nodes, each with an open stream): node %q refused", t.max, node)
		}
		delete(t.nodes, victim)
		dropped = append(dropped, victim)
	}
	t.nodes[node] = &nodeEntry{streams: 1}
	t.streams[k] = node
	return node, true, dropped, nil
}

// closed forgets stream k; its node turns idle with its last stream.
func (t *nodeTable) closed(k streamKey, now time.Time) {
	node, ok := t.streams[k]
	if !ok {
		return
	}
	delete(t.streams, k)
	if e := t.nodes[node]; e != nil {
		e.streams--
		if e.streams <= 0 {
			e.streams, e.idleSince = 0, now
		}
	}
}

// nodeOf is the node stream k named ("" before its first request).
func (t *nodeTable) nodeOf(k streamKey) string { return t.streams[k] }

// expire drops the nodes idle for longer than the TTL and returns them.
func (t *nodeTable) expire(now time.Time) []string {
	var out []string
	for n, e := range t.nodes {
		if e.streams == 0 && now.Sub(e.idleSince) >= t.ttl {
			delete(t.nodes, n)
			out = append(out, n)
		}
	}
	return out
}

// idlest is the idle node idle longest ("" when every node has an open stream).
func (t *nodeTable) idlest() string {
	victim := ""
	var since time.Time
	for n, e := range t.nodes {
		if e.streams == 0 && (victim == "" || e.idleSince.Before(since)) {
			victim, since = n, e.idleSince
		}
	}
	return victim
}

// checkNodeID refuses node IDs that would bloat or garble the status: too long, not UTF-8, or
// with control characters.
func checkNodeID(node string) error {
	if len(node) > MaxNodeIDLength {
		return status.Errorf(codes.InvalidArgument, "xds: node id of %d bytes, at most %d", len(node), MaxNodeIDLength)
	}
	if !utf8.ValidString(node) {
		return status.Error(codes.InvalidArgument, "xds: node id is not UTF-8")
	}
	for _, r := range node {
		if unicode.IsControl(r) {
			return status.Errorf(codes.InvalidArgument, "xds: node id %q has a control character", node)
		}
	}
	return nil
}

// streamsOf is a node's open stream count, for status.
func (t *nodeTable) streamsOf(node string) int {
	if e := t.nodes[node]; e != nil {
		return e.streams
	}
	return 0
}
