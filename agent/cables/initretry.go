package cables

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/cable"
)

// A driver whose Init fails is initialised again with backoff until it succeeds, the agent
// stops, or a config change rebuilds or removes it. Most failures pass: an agent started again
// right after it was killed finds what its predecessor held (a TUN link, a port) still being
// released, and charon may be slow to answer on a loaded node. One that does not pass (no
// strongSwan installed) costs a log line per maxInitRetry.

// The backoff of Init retries: firstInitRetry after the failure, doubling up to maxInitRetry.
const (
	firstInitRetry = 250 * time.Millisecond
	maxInitRetry   = 30 * time.Second
)

// nextInitRetry is the wait before the next Init, given the wait before the last one (0: none
// yet).
func nextInitRetry(prev time.Duration) time.Duration {
	if prev <= 0 {
		return firstInitRetry
	}
	return min(2*prev, maxInitRetry)
}

// startRetries makes retries of drivers' Init run under ctx until stopRetries; called once, by
// Start.
func (c *Cables) startRetries(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.retryCtx, c.cancelRetries = context.WithCancel(ctx)
}

// retryInit initialises d again, with backoff, on a goroutine of its own. d failed its Init
// with err.
func (c *Cables) retryInit(d cable.Driver, err error) {
	c.mu.Lock()
	ctx := c.retryCtx
	c.mu.Unlock()
	if ctx == nil || ctx.Err() != nil {
		return
	}
	c.retries.Go(func() { c.retryLoop(ctx, d, err) })
}

func (c *Cables) retryLoop(ctx context.Context, d cable.Driver, err error) {
	var wait time.Duration
	for attempt := 1; ; attempt++ {
		wait = nextInitRetry(wait)
		c.log.Warn("cable driver initialisation failed; retrying", "driver", d.Name(), "retryIn", wait, "attempt", attempt, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		var done bool
		if done, err = c.tryInit(ctx, d); done {
			if err == nil {
				c.log.Info("cable driver ready", "driver", d.Name(), "port", d.LocalEndpoint().Port,
					"links", strings.Join(d.Links(), ","), "reason", "initialisation retried", "attempts", attempt+1)
				c.ClampMSS()
				if c.deps.OnDriverReady != nil {
					c.deps.OnDriverReady(ctx)
				}
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// tryInit runs d's Init once more, serialised with Rebuild. done is true when there is nothing
// more to try: Init succeeded (err nil) and d now runs, or d is no longer built (a config change
// rebuilt or removed it; err nil too).
func (c *Cables) tryInit(ctx context.Context, d cable.Driver) (done bool, err error) {
	c.driversMu.Lock()
	defer c.driversMu.Unlock()
	if !c.isBuilt(d) {
		return true, nil
	}
	if err := d.Init(ctx); err != nil {
		c.mu.Lock()
		c.driverErrs[d.Name()] = err
		c.mu.Unlock()
		return false, err
	}
	c.addRunning(d)
	return true, nil
}

// isBuilt reports whether d is one of the built drivers (not one a config change replaced).
func (c *Cables) isBuilt(d cable.Driver) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Contains(c.built, d)
}

// addRunning makes d, which has just initialised, one of the running drivers: it is published
// (Endpoint) and offered to the plan (DriverSet), and the reconciler that replaces the current
// one connects its pairs while keeping what was applied over the others (reconcile.Successor).
// Called with driversMu held.
func (c *Cables) addRunning(d cable.Driver) {
	c.mu.Lock()
	old := c.reconciler
	c.reconciler = nil
	c.mu.Unlock()
	if old != nil {
		old.Retire() // waits for a pass in flight
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	var order []string
	for _, b := range c.built {
		order = append(order, b.Name())
	}
	c.running = inConfigOrder(append(slices.DeleteFunc(slices.Clone(c.running), func(r cable.Driver) bool { return r.Name() == d.Name() }), d), order)
	c.driverErrs[d.Name()] = nil
	if old != nil {
		c.reconciler = old.Successor(map[string]cable.Driver{d.Name(): d})
	} else {
		c.reconciler = reconcile.NewReconciler(c.running, c.pairLog)
	}
}

// stopRetries ends every Init retry and waits for them: before the drivers are cleaned up or
// closed.
func (c *Cables) stopRetries() {
	c.mu.Lock()
	cancel := c.cancelRetries
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	c.retries.Wait()
}
