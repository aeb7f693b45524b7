package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/watchzstd"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// identity loads the agent's certificate or joins to get one. Transient failures (broker not
// up yet) are retried with backoff; a refusal or a wrong broker ends the agent.
func (a *Agent) identity(ctx context.Context) (*brokerclient.Identity, error) {
	id, err := brokerclient.LoadIdentity(a.cfg.StateDir)
	if err == nil {
		if _, serr := os.Stat(a.cfg.JoinTokenFile); a.cfg.JoinTokenFile != "" && serr == nil {
			a.log.Info("the node has joined: the join token file is no longer needed and can be deleted", "joinTokenFile", a.cfg.JoinTokenFile)
		}
		return id, nil
	}
	if !errors.Is(err, brokerclient.ErrNoIdentity) {
		return nil, fmt.Errorf("load agent identity from %s: %w", a.cfg.StateDir, err)
	}
	a.log.Info("no agent certificate in the state dir; joining the broker", "broker", a.cfg.Broker, "stateDir", a.cfg.StateDir)
	bo := a.newBackoff()
	for {
		id, cl, err := brokerclient.Join(ctx, brokerclient.JoinParams{
			Broker: a.cfg.Broker, Cluster: a.cfg.Cluster, Node: a.cfg.Node,
			TokenFile: a.cfg.JoinTokenFile, StateDir: a.cfg.StateDir,
		})
		if err == nil {
			a.mu.Lock()
			a.joinCluster = cl
			a.mu.Unlock()
			a.log.Info("joined the broker; certificate stored", "stateDir", a.cfg.StateDir, "clusterID", cl.GetId(), "certificateNotAfter", id.Leaf.NotAfter.UTC().Format(time.RFC3339))
			a.log.Info("the join token file is no longer needed and can be deleted: the agent now uses its certificate in stateDir", "joinTokenFile", a.cfg.JoinTokenFile)
			return id, nil
		}
		if brokerclient.Permanent(err) {
			return nil, fmt.Errorf("cannot join the mesh: %w", err)
		}
		a.setBrokerError(err)
		a.log.Warn("join failed; retrying", "broker", a.cfg.Broker, "err", err)
		if !retry.Sleep(ctx, bo.Next()) {
			return nil, ctx.Err() // stopped while waiting for the broker: not a failure
		}
	}
}

// watchLoop keeps one watch stream open, resuming from the last applied revision. A stream whose
// connection was replaced (a renewed certificate) is reopened at once on the new one; a broker
// that refused the certificate for good ends the loop.
func (a *Agent) watchLoop(ctx context.Context, client apiv1.AgentClient) {
	bo := a.newBackoff()
	var quiet brokerclient.RepeatFilter
	for {
		gen := a.conn.generation()
		got, err := a.watchOnce(ctx, client)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errConnMoved) {
			a.log.Info("watch moves to the broker connection of the renewed certificate", "revision", a.revision())
			continue
		}
		if errors.Is(err, errWatchReopen) {
			a.log.Info("watch reopened for the new imports.selector", "selector", a.importSelector())
			continue
		}
		if got {
			bo.Reset()
			quiet.Reset()
		}
		a.mu.Lock()
		a.watchUp = false
		a.mu.Unlock()
		if a.refusedForGood(err, gen) {
			return
		}
		a.setBrokerError(err)
		d := bo.Next()
		level := slog.LevelWarn
		if quiet.Repeated(err) {
			level = slog.LevelDebug
		}
		a.log.Log(ctx, level, "broker watch ended; keeping current state and retrying", "err", err, "retryIn", d.Round(time.Millisecond).String())
		// Drop a stale wake-up: only a register that succeeds from now on should cut the wait.
		a.wakeWatch.Drain()
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-a.certs.refusedCh:
			t.Stop()
			return
		case <-t.C:
		case <-a.wakeWatch.C():
			t.Stop()
		}
		a.redial()
	}
}

// watchOnce runs one stream until it fails, or until its connection is replaced (errConnMoved).
// got says whether any message arrived.
func (a *Agent) watchOnce(ctx context.Context, client apiv1.AgentClient) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, _, swapped := a.conn.current()
	reopen := a.watchReopen()
	moved, reopened := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-swapped:
			close(moved)
			cancel()
		case <-reopen:
			close(reopened)
			cancel()
		case <-done:
		}
	}()
	since := a.watchSince()
	stream, err := client.Watch(ctx, &apiv1.WatchRequest{SinceRevision: since, WantImports: true, ImportSelector: a.importSelector(),
		AcceptEncodings: []string{watchzstd.Name}})
	if err != nil {
		return false, a.watchErr(moved, reopened, fmt.Errorf("open watch: %w", err))
	}
	var parts []*apiv1.WatchResponse
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, a.watchErr(moved, reopened, fmt.Errorf("watch: %w", err))
		}
		// Large messages come compressed (the broker shares them between agents).
		if err := watchzstd.Expand(resp); err != nil {
			return got, fmt.Errorf("watch: a message at revision %d cannot be decoded: %w", resp.GetRevision(), err)
		}
		// A batch too large for one message comes in parts (more set on all but the last): apply
		// them together, never a part of a snapshot as if it were the whole state.
		if resp.GetMore() {
			if len(parts) >= maxWatchParts {
				return got, fmt.Errorf("watch: a batch of more than %d parts; asking for a fresh snapshot", maxWatchParts)
			}
			parts = append(parts, resp)
			continue
		}
		if len(parts) > 0 {
			resp = joinWatchParts(append(parts, resp))
			parts = nil
		}
		if !got {
			// (Re)connected: the broker may have lost or never had this node's exports.
			a.exports.Trigger()
		}
		got = true
		if err := a.apply(resp); err != nil {
			return got, err
		}
	}
}

// watchErr is errConnMoved when the stream ended because its connection was replaced,
// errWatchReopen when a reload asked for a new stream (reload.go), else err.
func (a *Agent) watchErr(moved, reopened <-chan struct{}, err error) error {
	select {
	case <-moved:
		return errConnMoved
	case <-reopened:
		return errWatchReopen
	default:
		return err
	}
}

// apply applies one watch message, persists the state and triggers a reconcile.
func (a *Agent) apply(resp *apiv1.WatchResponse) error {
	a.mu.Lock()
	next := a.state.Clone()
	if err := next.Apply(resp); err != nil {
		// Ask for a full snapshot on the next stream rather than resuming past a message we
		// could not apply.
		a.state.Revision = 0
		a.mu.Unlock()
		return fmt.Errorf("apply broker message at revision %d: %w", resp.GetRevision(), err)
	}
	a.state = next
	a.cached = false
	a.watchUp = true
	a.lastContact = time.Now()
	if !a.cfg.Gateway || a.beatOK {
		a.lastErr = ""
	}
	a.mu.Unlock()
	if err := next.Save(a.cfg.StateDir, time.Now()); err != nil {
		a.log.Error("cannot persist broker state; running on memory", "err", err)
	}
	if ca := resp.GetCa(); ca != nil {
		a.onCABundle(ca)
	}
	a.log.Debug("applied broker message", "revision", next.Revision, "snapshot", resp.GetSnapshot(), "events", len(resp.GetEvents()), "imports", resp.GetImports() != nil)
	if resp.GetImports() != nil {
		a.log.Info("service imports received", "imports", len(next.Imports), "revision", next.Revision)
	}
	a.Trigger()
	a.TriggerServices()
	return nil
}

func (a *Agent) revision() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.state.Revision
}

func (a *Agent) setBrokerError(err error) {
	if err == nil {
		return
	}
	msg := err.Error()
	if s, ok := status.FromError(errors.Unwrap(err)); ok && s.Code() != codes.OK {
		msg = s.Message()
	}
	a.mu.Lock()
	a.lastErr = msg
	a.mu.Unlock()
}

// brokerStatus returns the broker part of the status document.
func (a *Agent) brokerStatus() (connected bool, rev uint64, last time.Time, errMsg string, cached bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	connected = a.watchUp && (!a.cfg.Gateway || a.beatOK)
	return connected, a.state.Revision, a.lastContact, a.lastErr, a.cached
}

// maxWatchParts bounds how many parts of one batch the agent buffers (the broker keeps parts
// under 1 MiB, so this is a 256 MiB batch).
const maxWatchParts = 256

// joinWatchParts makes one message of the parts of a batch: a snapshot if the first part is one,
// every part's events in order, and the last part's revision, imports and CA bundle (each part
// that carries imports or a bundle carries the whole of it).
func joinWatchParts(parts []*apiv1.WatchResponse) *apiv1.WatchResponse {
	out := &apiv1.WatchResponse{Snapshot: parts[0].GetSnapshot()}
	for _, p := range parts {
		out.Events = append(out.Events, p.GetEvents()...)
		out.Revision = p.GetRevision()
		if p.GetImports() != nil {
			out.Imports = p.GetImports()
		}
		if p.GetCa() != nil {
			out.Ca = p.GetCa()
		}
	}
	return out
}
