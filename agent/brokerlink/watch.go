package brokerlink

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
func (l *Link) identity(ctx context.Context) (*brokerclient.Identity, error) {
	token := l.deps.Live().JoinTokenFile
	id, err := brokerclient.LoadIdentity(l.cfg.StateDir)
	if err == nil {
		if _, serr := os.Stat(token); token != "" && serr == nil {
			l.log.Info("the node has joined: the join token file is no longer needed and can be deleted", "joinTokenFile", token)
		}
		return id, nil
	}
	if !errors.Is(err, brokerclient.ErrNoIdentity) {
		return nil, fmt.Errorf("load agent identity from %s: %w", l.cfg.StateDir, err)
	}
	l.log.Info("no agent certificate in the state dir; joining the broker", "broker", l.cfg.Broker, "stateDir", l.cfg.StateDir)
	bo := l.deps.Backoff()
	for {
		id, cl, err := brokerclient.Join(ctx, brokerclient.JoinParams{
			Broker: l.cfg.Broker, Cluster: l.cfg.Cluster, Node: l.cfg.Node,
			TokenFile: token, StateDir: l.cfg.StateDir,
		})
		if err == nil {
			l.mu.Lock()
			l.joinCluster = cl
			l.mu.Unlock()
			l.log.Info("joined the broker; certificate stored", "stateDir", l.cfg.StateDir, "clusterID", cl.GetId(), "certificateNotAfter", id.Leaf.NotAfter.UTC().Format(time.RFC3339))
			l.log.Info("the join token file is no longer needed and can be deleted: the agent now uses its certificate in stateDir", "joinTokenFile", token)
			return id, nil
		}
		if brokerclient.Permanent(err) {
			return nil, fmt.Errorf("cannot join the mesh: %w", err)
		}
		l.setBrokerError(err)
		l.log.Warn("join failed; retrying", "broker", l.cfg.Broker, "err", err)
		if !retry.Sleep(ctx, bo.Next()) {
			return nil, ctx.Err() // stopped while waiting for the broker: not a failure
		}
	}
}

// watchLoop keeps one watch stream open, resuming from the last applied revision. A stream whose
// connection was replaced (a renewed certificate) is reopened at once on the new one; a broker
// that refused the certificate for good ends the loop.
func (l *Link) watchLoop(ctx context.Context, client apiv1.AgentClient) {
	bo := l.deps.Backoff()
	var quiet brokerclient.RepeatFilter
	for {
		gen := l.conn.generation()
		got, err := l.watchOnce(ctx, client)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errConnMoved) {
			l.log.Info("watch moves to the broker connection of the renewed certificate", "revision", l.revision())
			continue
		}
		if errors.Is(err, errWatchReopen) {
			l.log.Info("watch reopened for the new imports.selector", "selector", l.deps.Live().Imports.EffectiveSelector())
			continue
		}
		if got {
			bo.Reset()
			quiet.Reset()
		}
		l.mu.Lock()
		l.watchUp = false
		l.mu.Unlock()
		if l.refusedForGood(err, gen) {
			return
		}
		l.setBrokerError(err)
		d := bo.Next()
		level := slog.LevelWarn
		if quiet.Repeated(err) {
			level = slog.LevelDebug
		}
		l.log.Log(ctx, level, "broker watch ended; keeping current state and retrying", "err", err, "retryIn", d.Round(time.Millisecond).String())
		// Drop a stale wake-up: only a register that succeeds from now on should cut the wait.
		l.wakeWatch.Drain()
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-l.certs.refusedCh:
			t.Stop()
			return
		case <-t.C:
		case <-l.wakeWatch.C():
			t.Stop()
		}
		l.redial()
	}
}

// watchOnce runs one stream until it fails, or until its connection is replaced (errConnMoved).
// got says whether any message arrived.
func (l *Link) watchOnce(ctx context.Context, client apiv1.AgentClient) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, _, swapped := l.conn.current()
	reopen := l.watchReopen()
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
	since := l.watchSince()
	stream, err := client.Watch(ctx, &apiv1.WatchRequest{SinceRevision: since, WantImports: true, ImportSelector: l.deps.Live().Imports.EffectiveSelector(),
		AcceptEncodings: []string{watchzstd.Name}})
	if err != nil {
		return false, l.watchErr(moved, reopened, fmt.Errorf("open watch: %w", err))
	}
	var parts []*apiv1.WatchResponse
	for {
		resp, err := stream.Recv()
		if err != nil {
			return got, l.watchErr(moved, reopened, fmt.Errorf("watch: %w", err))
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
			l.deps.OnFirstMessage()
		}
		got = true
		if err := l.apply(resp); err != nil {
			return got, err
		}
	}
}

// watchErr is errConnMoved when the stream ended because its connection was replaced,
// errWatchReopen when a reload asked for a new stream (reload.go), else err.
func (l *Link) watchErr(moved, reopened <-chan struct{}, err error) error {
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
func (l *Link) apply(resp *apiv1.WatchResponse) error {
	l.mu.Lock()
	next := l.state.Clone()
	if err := next.Apply(resp); err != nil {
		// Ask for a full snapshot on the next stream rather than resuming past a message we
		// could not apply.
		l.state.Revision = 0
		l.mu.Unlock()
		return fmt.Errorf("apply broker message at revision %d: %w", resp.GetRevision(), err)
	}
	l.state = next
	l.cached = false
	l.watchUp = true
	l.lastContact = time.Now()
	if !l.cfg.Gateway || l.beatOK {
		l.lastErr = ""
	}
	l.mu.Unlock()
	l.saver.Update(next) // written within a second, and at once when the agent stops
	if ca := resp.GetCa(); ca != nil {
		l.onCABundle(ca)
	}
	l.log.Debug("applied broker message", "revision", next.Revision, "snapshot", resp.GetSnapshot(), "events", len(resp.GetEvents()), "imports", resp.GetImports() != nil)
	if resp.GetImports() != nil {
		l.log.Info("service imports received", "imports", len(next.Imports), "revision", next.Revision)
	}
	l.deps.OnState()
	return nil
}

func (l *Link) revision() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state.Revision
}

func (l *Link) setBrokerError(err error) {
	if err == nil {
		return
	}
	msg := err.Error()
	if s, ok := status.FromError(errors.Unwrap(err)); ok && s.Code() != codes.OK {
		msg = s.Message()
	}
	l.mu.Lock()
	l.lastErr = msg
	l.mu.Unlock()
}

// brokerStatus returns the broker part of the status document.
func (l *Link) brokerStatus() (connected bool, rev uint64, last time.Time, errMsg string, cached bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	connected = l.watchUp && (!l.cfg.Gateway || l.beatOK)
	return connected, l.state.Revision, l.lastContact, l.lastErr, l.cached
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
