// Package handover passes a node from a running agent to the next one without waiting for the
// first to exit: the new agent asks, the old one stops exactly as on a restart (tunnels, routes,
// neighbours and eBPF pins stay for its successor; its own listeners, loops, wireguard-go device
// and charon go), answers, and then idles until it is told to exit.
//
// Why: a DaemonSet rolled with maxSurge starts the new pod beside the old one and deletes the old
// one only when the new one is ready. Without a hand-over both would fight over the node (the
// UDP ports, the status socket, the datapath) and the new pod could never become ready; with one,
// the only gap left is the agents' own (the old one's stop, the new one's start of its devices),
// not the kubelet's pod replacement, which alone takes about a second (docs/helm.md).
//
// The socket sits next to the status socket (statusSocket + ".handover", mode 0600) and both
// agents must name the same cluster and node: an agent never stops for another node's agent that
// shares a directory (the netns tests do).
package handover

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/cablemesh/cablemesh/internal/unixsock"
)

// SocketPath is the hand-over socket of the agent whose status socket is statusSocket.
func SocketPath(statusSocket string) string { return statusSocket + ".handover" }

// Identity is what a successor must match to be handed the node.
type Identity struct {
	Cluster string `json:"cluster"`
	Node    string `json:"node"`
}

// Successor is what a running agent learns of the agent taking the node over.
type Successor struct {
	Version string `json:"version"`
	// PIDNamespace is the successor's (/proc/self/ns/pid, e.g. "pid:[4026531836]"): a
	// successor in another one (the next pod of a DaemonSet) cannot adopt the helper daemons
	// (charon) the running agent would leave for it, so the running agent ends them.
	PIDNamespace string `json:"pidNamespace,omitempty"`
}

// SharesPIDNamespace reports whether s runs in this process's PID namespace (false when either
// is unknown).
func (s Successor) SharesPIDNamespace() bool {
	own := PIDNamespace()
	return own != "" && s.PIDNamespace == own
}

// PIDNamespace is this process's PID namespace, "" when it cannot be read.
func PIDNamespace() string {
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return ""
	}
	return ns
}

// request is a successor's one line; reply is the predecessor's one line.
type request struct {
	Identity
	Successor
}

type reply struct {
	// Stopping is the first answer, at once: the request is taken and the agent stops.
	Stopping bool   `json:"stopping,omitempty"`
	Released bool   `json:"released,omitempty"`
	Version  string `json:"version,omitempty"`
	Error    string `json:"error,omitempty"`
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// AckTimeout bounds the wait for a running agent's first answer, which a live one gives at once
// (its stop follows): a stopped (SIGSTOP) or wedged process accepts the connection but never
// answers, and the successor starts without it.
const AckTimeout = time.Second

// maxLine bounds a request or reply: both are a few dozen bytes.
const maxLine = 4096

// parseRequest decodes a successor's request and checks it names id.
func parseRequest(line []byte, id Identity) (request, error) {
	var r request
	if err := json.Unmarshal(line, &r); err != nil {
		return request{}, fmt.Errorf("hand-over request: %w", err)
	}
	if r.Cluster != id.Cluster || r.Node != id.Node {
		return r, fmt.Errorf("hand-over request for cluster %q node %q refused: this agent is cluster %q node %q", r.Cluster, r.Node, id.Cluster, id.Node)
	}
	return r, nil
}

// parseReply decodes a predecessor's reply.
func parseReply(line []byte) (reply, error) {
	var r reply
	if err := json.Unmarshal(line, &r); err != nil {
		return reply{}, fmt.Errorf("hand-over reply: %w", err)
	}
	if n := btoi(r.Stopping) + btoi(r.Released) + btoi(r.Error != ""); n != 1 {
		return r, errors.New("hand-over reply: want exactly one of stopping, released, error")
	}
	return r, nil
}

// Offer is a running agent's hand-over socket.
type Offer struct {
	lis     net.Listener
	id      Identity
	version string
	log     *slog.Logger

	closeOnce sync.Once
	done      chan struct{} // closed when Serve returns
}

// Listen opens the hand-over socket at path. A socket file nobody serves is a dead agent's and
// is replaced; one that answers is a live agent's, and an error.
func Listen(path string, id Identity, version string, log *slog.Logger) (*Offer, error) {
	lis, err := unixsock.Listen(path, 0o600)
	if err != nil {
		return nil, fmt.Errorf("hand-over socket %s: %w", path, err)
	}
	return &Offer{lis: lis, id: id, version: version, log: log, done: make(chan struct{})}, nil
}

// Serve answers successors until Close or one hand-over. For a successor naming this agent's
// cluster and node it first stops listening (no second successor can ask), then calls release
// with what it said of itself; release must return only once the agent has stopped. Requests for
// another identity, or that cannot be read, are refused and the offer stays open.
func (o *Offer) Serve(release func(Successor)) {
	defer close(o.done)
	for {
		c, err := o.lis.Accept()
		if err != nil {
			return // closed
		}
		handedOver := o.serveOne(c, release)
		if handedOver {
			return
		}
	}
}

// serveOne reads one request from c and answers it; it reports whether the node was handed over.
func (o *Offer) serveOne(c net.Conn, release func(Successor)) bool {
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReaderSize(c, maxLine).ReadSlice('\n')
	if err != nil {
		o.log.Warn("hand-over: unreadable request ignored", "err", err)
		return false
	}
	req, err := parseRequest(line, o.id)
	if err != nil {
		o.log.Warn("hand-over refused", "err", err)
		writeReply(c, reply{Error: err.Error(), Version: o.version})
		return false
	}
	o.log.Info("handing the node over to the next agent: stopping as on a restart", "successorVersion", req.Version)
	o.Close()
	writeReply(c, reply{Stopping: true, Version: o.version})
	release(req.Successor)
	writeReply(c, reply{Released: true, Version: o.version})
	return true
}

func writeReply(c net.Conn, r reply) {
	b, _ := json.Marshal(r)
	_ = c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_, _ = c.Write(append(b, '\n'))
}

// Wait returns once Serve has returned (after Close, or after a hand-over's answer is written).
func (o *Offer) Wait() { <-o.done }

// Close stops listening, which removes the socket file (once; Serve's hand-over does it first).
func (o *Offer) Close() { o.closeOnce.Do(func() { o.lis.Close() }) }

// Request asks the agent serving path, if any, to hand the node over, and waits until it has
// stopped. It reports false with no error when nobody serves path (no socket, or a dead agent's).
// ctx bounds the wait: a predecessor that does not answer in time is reported as an error.
func Request(ctx context.Context, path string, id Identity, version string) (bool, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ENOENT) {
			return false, nil
		}
		return false, fmt.Errorf("hand-over socket %s: %w", path, err)
	}
	defer c.Close()
	b, _ := json.Marshal(request{Identity: id, Successor: Successor{Version: version, PIDNamespace: PIDNamespace()}})
	_ = c.SetWriteDeadline(time.Now().Add(AckTimeout))
	if _, err := c.Write(append(b, '\n')); err != nil {
		return false, fmt.Errorf("hand-over socket %s: send request: %w", path, err)
	}
	rd := bufio.NewReaderSize(c, maxLine)
	_ = c.SetReadDeadline(time.Now().Add(AckTimeout))
	line, err := rd.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return false, fmt.Errorf("hand-over socket %s: the process on it did not answer within %s (stopped or stuck)", path, AckTimeout)
		}
		return false, fmt.Errorf("hand-over socket %s: read reply: %w", path, err)
	}
	if r, err := parseReply(line); err != nil || !r.Stopping {
		return false, replyError(path, r, err)
	}
	// Now the running agent stops: wait as long as ctx allows.
	dl, _ := ctx.Deadline()
	_ = c.SetReadDeadline(dl)
	stop := context.AfterFunc(ctx, func() { _ = c.SetReadDeadline(time.Now()) })
	defer stop()
	if ctx.Err() != nil { // ended before AfterFunc was armed: the deadline set above may be none
		return false, fmt.Errorf("hand-over socket %s: the running agent did not stop in time: %w", path, ctx.Err())
	}
	line, err = rd.ReadSlice('\n')
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return false, fmt.Errorf("hand-over socket %s: the running agent did not stop in time: %w", path, context.DeadlineExceeded)
		}
		return false, fmt.Errorf("hand-over socket %s: read reply: %w", path, err)
	}
	if r, err := parseReply(line); err != nil || !r.Released {
		return false, replyError(path, r, err)
	}
	return true, nil
}

// replyError is the error for a reply that is not the one expected.
func replyError(path string, r reply, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("hand-over socket %s: %w", path, err)
	case r.Error != "":
		return fmt.Errorf("hand-over socket %s: the running agent (version %s) refused: %s", path, r.Version, r.Error)
	default:
		return fmt.Errorf("hand-over socket %s: unexpected reply %+v", path, r)
	}
}
