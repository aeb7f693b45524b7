package main

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/agent/handover"
	"github.com/cablemesh/cablemesh/internal/version"
)

// errHandedOver is the agent's context's cause once a successor has taken the node.
var errHandedOver = errors.New("the node was handed over to the next agent")

// handoverTimeout bounds the wait for a running agent to stop for this one: its stop is about
// 50-150 ms (its loops, its wireguard-go device, charon); one that takes longer is stuck, and this
// agent starts anyway (and fails on what the other still holds, to be restarted).
const handoverTimeout = 20 * time.Second

// nodeHandover is this agent's side of agent/handover: it takes the node from a running agent
// before its datapath starts, then offers it to the next one.
type nodeHandover struct {
	path   string
	id     handover.Identity
	log    *slog.Logger
	cancel context.CancelCauseFunc // the agent's context's
	// stopped is closed once the agent's Run and its writers have returned: the node is free.
	stopped chan struct{}

	mu    sync.Mutex
	offer *handover.Offer
	// adoptsProcesses: the successor runs in this PID namespace and adopts the helper daemons
	// (charon) this agent leaves running; false until a successor said so.
	adoptsProcesses bool
}

func newNodeHandover(statusSocket string, id handover.Identity, cancel context.CancelCauseFunc, log *slog.Logger) *nodeHandover {
	return &nodeHandover{path: handover.SocketPath(statusSocket), id: id, log: log, cancel: cancel, stopped: make(chan struct{})}
}

// takeOver is agent.Options.TakeOver.
func (h *nodeHandover) takeOver(ctx context.Context) {
	start := time.Now()
	rctx, cancel := context.WithTimeout(ctx, handoverTimeout)
	took, err := handover.Request(rctx, h.path, h.id, version.String())
	cancel()
	switch {
	case err != nil:
		h.log.Warn("the running agent did not hand the node over: starting anyway", "err", err)
	case took:
		h.log.Info("the running agent handed the node over", "waitedMs", time.Since(start).Milliseconds())
	}
	offer, err := handover.Listen(h.path, h.id, version.String(), h.log)
	if err != nil {
		// Not fatal: the next agent then starts beside this one and fails until this one exits.
		h.log.Warn("no hand-over socket: a next agent started beside this one cannot take over", "err", err)
		return
	}
	h.mu.Lock()
	h.offer = offer
	h.mu.Unlock()
	go offer.Serve(h.release)
}

// release stops the agent for a successor and returns once it has stopped.
func (h *nodeHandover) release(s handover.Successor) {
	h.mu.Lock()
	h.adoptsProcesses = s.SharesPIDNamespace()
	h.mu.Unlock()
	if !s.SharesPIDNamespace() {
		h.log.Info("the next agent runs in another PID namespace: this one ends its helper daemons (charon) as it stops",
			"successorPIDNamespace", s.PIDNamespace, "own", handover.PIDNamespace())
	}
	h.cancel(errHandedOver)
	<-h.stopped
}

// agentStopped tells a waiting release that the node is free, then closes the offer (if the agent
// stopped for another reason) and waits for an answer being written.
func (h *nodeHandover) agentStopped() {
	close(h.stopped)
	h.mu.Lock()
	offer := h.offer
	h.mu.Unlock()
	if offer != nil {
		offer.Close()
		offer.Wait()
	}
}

// stopProcesses is agent.Options.StopProcessesOnStop: handed over to an agent that cannot adopt
// this one's helper daemons.
func (h *nodeHandover) stopProcesses(ctx context.Context) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return handedOver(ctx) && !h.adoptsProcesses
}

// handedOver reports whether ctx, the agent's, ended for a successor.
func handedOver(ctx context.Context) bool { return errors.Is(context.Cause(ctx), errHandedOver) }
