package brokerlink

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// registerLoop registers this gateway's endpoint and renews its lease every heartbeatInterval,
// registering again whenever a heartbeat fails (lease lost, broker restarted without it, ...). It
// ends once the broker refused the agent's certificate for good.
func (l *Link) registerLoop(ctx context.Context, client apiv1.AgentClient) {
	registered := false
	var quiet brokerclient.RepeatFilter
	// A call that failed without the broker's answer (a deadline, a reset, no connection) is
	// retried after the backoff's next jittered step, not a heartbeat interval later: a lone
	// agent is back within a second or two, and a fleet whose calls failed together (a broker
	// restart, a storm past the broker's deadlines) comes back spread, slower at each failure.
	failures := l.deps.Backoff()
	// The first registration goes at once: a gateway joining a quiet mesh is not kept waiting for
	// a storm that is not happening. A fleet that starts together is spread by the broker, which
	// answers registrations it has no room for with "busy, come back in a while"
	// (brokerclient.BusyWait), and by the jittered waits of its heartbeats
	// (brokerclient.HeartbeatDelay).
	for {
		if l.certificateRefused() != "" {
			return
		}
		var err error
		gen := l.conn.generation()
		wasRegistered := registered
		if !registered {
			err = l.register(ctx, client)
			registered = err == nil
		} else if err = l.heartbeat(ctx, client); err != nil {
			registered = false
			wasRegistered = false
			if status.Code(err) == codes.NotFound {
				l.log.Info("broker lost this endpoint; registering again")
				if err = l.register(ctx, client); err == nil {
					registered = true
				}
			}
		}
		// Just registered: the first heartbeat comes after a wider random wait (a fleet
		// registers together).
		wait := brokerclient.HeartbeatDelay(l.cfg.HeartbeatInterval)
		if registered && !wasRegistered {
			wait = brokerclient.AfterRegistrationDelay(l.cfg.HeartbeatInterval)
		}
		if err == nil {
			failures.Reset()
		} else if _, busy := brokerclient.BusyWait(err); !busy {
			wait = failures.Next()
		}
		if ctx.Err() != nil {
			return
		}
		if d, busy := brokerclient.BusyWait(err); busy {
			// The broker answered, it only has no room now: come back when it said, on the
			// same connection.
			l.mu.Lock()
			l.beatOK = false
			l.mu.Unlock()
			l.log.Debug("broker busy; registering again later", "retryIn", d.Round(time.Millisecond).String())
			if !retry.Sleep(ctx, d) {
				return
			}
			continue
		}
		if err != nil && l.refusedForGood(err, gen) {
			l.mu.Lock()
			l.beatOK = false
			l.mu.Unlock()
			return
		}
		l.mu.Lock()
		l.beatOK = err == nil
		watchUp := l.watchUp
		if err == nil {
			l.lastContact = time.Now()
			if l.watchUp {
				l.lastErr = ""
			}
		}
		l.mu.Unlock()
		if err != nil {
			l.setBrokerError(err)
			level := slog.LevelWarn
			if quiet.Repeated(err) {
				level = slog.LevelDebug
			}
			l.log.Log(ctx, level, "endpoint registration or heartbeat failed", "err", err)
		} else {
			quiet.Reset()
			if !watchUp {
				// The broker answers: do not leave the watch waiting out a long backoff.
				l.wakeWatch.Fire()
			}
		}
		if !retry.Sleep(ctx, wait) {
			return
		}
		if err != nil {
			l.redial()
		}
	}
}

func (l *Link) register(ctx context.Context, client apiv1.AgentClient) error {
	ep := l.deps.Endpoint()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sent := time.Now()
	resp, err := client.RegisterEndpoint(brokerclient.AcceptBusy(cctx), &apiv1.RegisterEndpointRequest{Endpoint: ep, LeaseSeconds: int64(l.cfg.LeaseSeconds)})
	if err != nil {
		return fmt.Errorf("register endpoint: %w", err)
	}
	l.clock.observe(sent, time.Now(), resp.GetBrokerTime(), resp.GetBrokerVersion())
	l.deps.OnRegistered(resp.GetEndpoint())
	l.log.Info("endpoint registered", "drivers", strings.Join(ep.GetDrivers(), ","), "address", ep.GetPrivateIp(), "subnets", strings.Join(ep.GetSubnets(), ","))
	return nil
}

func (l *Link) heartbeat(ctx context.Context, client apiv1.AgentClient) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	sent := time.Now()
	resp, err := client.Heartbeat(cctx, &apiv1.HeartbeatRequest{Node: l.cfg.Node})
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	l.clock.observe(sent, time.Now(), resp.GetBrokerTime(), resp.GetBrokerVersion())
	return nil
}
