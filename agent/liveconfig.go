package agent

import (
	"context"
	"net/http"

	"github.com/cablemesh/cablemesh/agent/cables"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/metrics"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// liveConfig is the live part of the config in force (reload.Reloader.Live).
func (a *Agent) liveConfig() config.Live { return a.reload.Live() }

// ReloadConfig reads the config file and applies it, or refuses it whole.
func (a *Agent) ReloadConfig(ctx context.Context, client apiv1.AgentClient) {
	a.reload.Reload(ctx, client)
}

// applyConfig applies plan, the live changes in next, touching only what changed.
func (a *Agent) applyConfig(ctx context.Context, client apiv1.AgentClient, next config.Live, plan config.ReloadPlan) {
	if plan.LogLevel && a.opts.LogLevel != nil {
		a.opts.LogLevel.Set(next.SlogLevel())
	}
	if plan.Health {
		// healthCheck.enabled starts or stops the probers; the other settings go to the ones
		// that run.
		a.cables.SetHealth(next.HealthCheck.IsEnabled(), cables.HealthSettings(next.HealthCheck))
		if m := a.cables.Health(); m != nil {
			m.SetSettings(cables.HealthSettings(next.HealthCheck))
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
		a.dp.ApplyConfig(next)
	}
	if len(plan.Drivers) > 0 && a.cfg.Gateway {
		a.cables.Rebuild(ctx, next, plan.Drivers)
		a.cables.ClampMSS()
		a.link.Reregister(ctx, client)
		a.Trigger()
	}
}

func (a *Agent) metricsHandler() http.Handler { return metrics.Handler(a.registry, a.ready) }
func (a *Agent) markSynced(rev uint64)        { a.ready.Mark(rev) }

// Synced reports whether a reconcile pass ran over a full state, and at which revision.
func (a *Agent) Synced() (bool, uint64) { return a.ready.Synced() }
