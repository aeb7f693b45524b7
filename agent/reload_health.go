package agent

import "github.com/cablemesh/cablemesh/agent/health"

// setHealth starts the gateway's probers with settings when enabled (healthCheck.enabled) and
// none run, or stops the ones that run when not. Run calls it at start and, with false, at its
// end; a reload that changes healthCheck.enabled calls it too (applyConfig, which then wakes
// the passes that follow it). A non-gateway has no probers of its own to start (its probes of
// the local gateways, nongateway.go, do not depend on this setting).
func (a *Agent) setHealth(enabled bool, settings health.Settings) {
	a.mu.Lock()
	m := a.health
	switch {
	case enabled && m == nil && a.cfg.Gateway:
		m = health.NewManager(settings, a.opts.NewPinger, a.metrics, a.pairLog)
		// A pair whose probes cross the threshold leaves the service maps now, not at the
		// next pass.
		m.OnChange(func(string, bool) { a.TriggerServices() })
		a.health = m
		a.mu.Unlock()
	case !enabled && m != nil:
		a.health = nil
		a.mu.Unlock()
		// Outside a.mu: Close waits for the probers, whose callbacks may take it.
		m.Close()
	default:
		a.mu.Unlock()
	}
}
