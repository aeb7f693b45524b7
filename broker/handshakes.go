package broker

import (
	"net"
	"runtime"

	"google.golang.org/grpc/credentials"
)

// handshakeLimit runs at most a few dozen TLS handshakes at once; the connections behind them
// wait, in the order they came, before their handshake starts. A fleet starting at once opens
// thousands of connections in a second: run all at once, every handshake shares the CPU with all
// the others and they all finish late together, after the agents' calls waited out their
// deadline. In slots, the agents connect one group after the other, the first at once.
//
// While connections wait for a slot, snapshots wait too (Watch): a fleet that starts together
// connects and registers first, and is sent the mesh afterwards. Sent at once, the snapshots
// (and the registrations fanned out to every agent already watching) filled the connections of
// the agents still connecting, whose registrations then missed their deadline.
type handshakeLimit struct {
	credentials.TransportCredentials
	*handshakeQueue
}

type handshakeQueue struct {
	slots   chan struct{}
	waiting *backlog // connections waiting for a slot
}

// handshakesPerCPU is how many handshakes run at once per CPU: many more than one, because a
// handshake also waits for its peer (two round trips) and holds its slot meanwhile, and an
// agent on a loaded host answers slowly.
const handshakesPerCPU = 32

func limitHandshakes(c credentials.TransportCredentials, n int) *handshakeLimit {
	if n <= 0 {
		n = handshakesPerCPU * runtime.GOMAXPROCS(0)
	}
	q := &handshakeQueue{slots: make(chan struct{}, n), waiting: newBacklog(0)}
	return &handshakeLimit{TransportCredentials: c, handshakeQueue: q}
}

func (h *handshakeLimit) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	h.acquire()
	defer func() { <-h.slots }()
	return h.TransportCredentials.ServerHandshake(conn)
}

// Clone shares the queue: every clone limits the same handshakes.
func (h *handshakeLimit) Clone() credentials.TransportCredentials {
	return &handshakeLimit{TransportCredentials: h.TransportCredentials.Clone(), handshakeQueue: h.handshakeQueue}
}

func (q *handshakeQueue) acquire() {
	select {
	case q.slots <- struct{}{}:
		return
	default:
	}
	q.waiting.enter()
	q.slots <- struct{}{}
	q.waiting.leave()
}
