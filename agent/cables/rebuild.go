package cables

import (
	"context"
	"maps"
	"slices"
	"strings"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/cable"
)

// Rebuild applies a reloaded config's driver changes: every driver in names (its block
// changed, or cableDrivers added or removed it) is torn down (Cleanup, Close) and, when next
// still lists it, built with its new block and initialised. The other drivers, their devices and
// their pairs are not touched: the reconciler that replaces the current one keeps what it applied
// over them (reconcile.Successor), so the next pass plans nothing for them, and reconnects the
// rebuilt drivers' pairs only.
//
// The host is reconciled by no one while this runs: the current reconciler is retired first
// (waiting for a pass in flight), so no pass uses a driver being torn down, and the agent has no
// reconciler until the new one is in place (a pass then does nothing; the caller triggers one).
func (c *Cables) Rebuild(ctx context.Context, next config.Live, names []string) {
	c.driversMu.Lock()
	defer c.driversMu.Unlock()
	// Build the new drivers before anything changes: building validates and touches nothing.
	fresh := map[string]cable.Driver{}
	errs := map[string]error{}
	for _, n := range names {
		if !slices.Contains(next.CableDrivers, n) {
			continue
		}
		d, err := c.BuildDriver(n, next)
		if err != nil {
			// config.Parse had the driver validate the block: a failure here is the driver's.
			errs[n] = err
			c.log.Error("CABLE DRIVER UNAVAILABLE: cannot build it with the reloaded settings", "driver", n, "err", err)
			continue
		}
		fresh[n] = d
	}

	c.mu.Lock()
	old := c.reconciler
	c.reconciler = nil
	built := slices.Clone(c.built)
	c.mu.Unlock()
	if old != nil {
		old.Retire()
	}
	var kept []cable.Driver
	for _, d := range built {
		if !slices.Contains(names, d.Name()) {
			kept = append(kept, d)
			continue
		}
		// Cleanup removes the driver's links and routes: its pairs go down until the new driver
		// connects them again. Close then ends its goroutines and sockets.
		if err := d.Cleanup(ctx); err != nil {
			c.log.Error("cable driver cleanup failed before its rebuild", "driver", d.Name(), "err", err)
		}
		if err := d.Close(); err != nil {
			c.log.Error("cable driver did not close cleanly before its rebuild", "driver", d.Name(), "err", err)
		}
		c.log.Info("cable driver stopped for a config change", "driver", d.Name())
	}

	changed := map[string]cable.Driver{}
	for _, n := range names {
		changed[n] = nil
	}
	for _, n := range slices.Sorted(maps.Keys(fresh)) {
		d := fresh[n]
		kept = append(kept, d) // built: closed when Run ends, even if Init fails
		if err := d.Init(ctx); err != nil {
			errs[n] = err
			c.log.Error("CABLE DRIVER UNAVAILABLE: initialisation failed after a config change; this node will not offer it and pairs that need it stay down until a retry succeeds",
				"driver", n, "err", err)
			// Retried once this Rebuild is done (it holds driversMu).
			defer c.retryInit(d, err)
			continue
		}
		changed[n] = d
		c.log.Info("cable driver ready", "driver", n, "port", d.LocalEndpoint().Port, "links", strings.Join(d.Links(), ","), "reason", "config change")
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	c.built = inConfigOrder(kept, next.CableDrivers)
	var running []cable.Driver
	for _, d := range c.running {
		if _, ch := changed[d.Name()]; !ch {
			running = append(running, d)
		}
	}
	for _, d := range changed {
		if d != nil {
			running = append(running, d)
		}
	}
	c.running = inConfigOrder(running, next.CableDrivers)
	driverErrs := reconcile.Drivers{}
	for _, n := range next.CableDrivers {
		if _, ch := changed[n]; !ch {
			if err, ok := c.driverErrs[n]; ok {
				driverErrs[n] = err
			}
			continue
		}
		driverErrs[n] = errs[n]
	}
	c.driverErrs = driverErrs
	if old != nil {
		c.reconciler = old.Successor(changed)
	} else {
		c.reconciler = reconcile.NewReconciler(c.running, c.pairLog)
	}
}

// inConfigOrder orders drivers as names lists them; drivers names leaves out come last.
func inConfigOrder(drivers []cable.Driver, names []string) []cable.Driver {
	out := slices.Clone(drivers)
	rank := func(d cable.Driver) int {
		if i := slices.Index(names, d.Name()); i >= 0 {
			return i
		}
		return len(names)
	}
	slices.SortStableFunc(out, func(x, y cable.Driver) int { return rank(x) - rank(y) })
	return out
}

// RebuildRunning builds every running driver again with live, the config in force (this node's
// address moved: the drivers take it at build), and clamps the MSS on their links.
func (c *Cables) RebuildRunning(ctx context.Context, live config.Live) {
	var names []string
	for _, d := range c.Running() {
		names = append(names, d.Name())
	}
	slices.Sort(names)
	if len(names) > 0 {
		c.Rebuild(ctx, live, names)
		c.ClampMSS()
	}
}
