package agent

import (
	"context"
	"net/http"
	"time"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/metrics"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// reregisterAttempts bounds the endpoint registrations a driver change makes at once; the
// heartbeat loop re-registers later if the broker forgot the endpoint meanwhile.
const reregisterAttempts = 5

// liveConfig is the config in force (reload.Reloader.Live).
func (a *Agent) liveConfig() *config.Config { return a.reload.Live() }

// ReloadConfig reads the config file and applies it, or refuses it whole.
func (a *Agent) ReloadConfig(ctx context.Context, client apiv1.AgentClient) {
	a.reload.Reload(ctx, client)
}

// applyConfig applies plan, the live changes from cur to next, touching only what changed.
func (a *Agent) applyConfig(ctx context.Context, client apiv1.AgentClient, cur, next *config.Config, plan config.ReloadPlan) {
	if plan.LogLevel && a.opts.LogLevel != nil {
		a.opts.LogLevel.Set(next.SlogLevel())
	}
	if plan.Health {
		// healthCheck.enabled starts or stops the probers; the other settings go to the ones
		// that run.
		a.cables.SetHealth(next.HealthCheck.IsEnabled(), healthSettingsOf(next))
		if m := a.cables.Health(); m != nil {
			m.SetSettings(healthSettingsOf(next))
		}
		// Without probes a pair they held out of the service maps comes back.
		a.TriggerServices()
		// Wake the reconcile loop: its repair check follows the new period from its next
		// wake-up, and the pass points the probers at the pairs again.
		a.Trigger()
	}
	if plan.Exports {
		a.exports.ApplyConfig(next)
	}
	if plan.DNS {
		a.datapath().ApplyConfig(next)
	}
	if len(plan.Drivers) > 0 && a.cfg.Gateway {
		a.cables.Rebuild(ctx, next, plan.Drivers)
		a.cables.ClampMSS()
		a.reregister(ctx, client)
		a.Trigger()
	}
}

// reregister sends the endpoint again at once, so that the broker publishes the new cable ports;
// a failure is retried a few times, then left to the heartbeat loop.
func (a *Agent) reregister(ctx context.Context, client apiv1.AgentClient) {
	if client == nil {
		return
	}
	var err error
	for i := range reregisterAttempts {
		if err = a.link.Register(ctx, client); err == nil || ctx.Err() != nil {
			return
		}
		if !retry.Sleep(ctx, time.Duration(i+1)*500*time.Millisecond) {
			return
		}
	}
	a.log.Warn("endpoint not re-registered after a driver change; the broker publishes the old ports until the next registration", "err", err)
}

// healthSettingsOf are cfg's probe settings (defaults already applied by config).
func healthSettingsOf(cfg *config.Config) health.Settings {
	h := cfg.HealthCheck
	return health.Settings{Period: h.Period, Timeout: h.Timeout, FailureThreshold: h.FailureThreshold, Window: h.Window}.WithDefaults()
}

func (a *Agent) metricsHandler() http.Handler { return metrics.Handler(a.registry, a.ready) }
func (a *Agent) markSynced(rev uint64)        { a.ready.Mark(rev) }

// Synced reports whether a reconcile pass ran over a full state, and at which revision.
func (a *Agent) Synced() (bool, uint64) { return a.ready.Synced() }
