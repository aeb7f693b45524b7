package cables

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/mss"
)

// MSSClamp installs and removes the TCP MSS clamp of the traffic leaving through the tunnels'
// links, given as the drivers' Links() name them (an exact name, or a prefix ending in '*').
type MSSClamp interface {
	Ensure(links []string) error
	Remove() error
}

// KernelMSS is the clamp in nftables (cable/mss), in the agent's network namespace.
type KernelMSS struct{}

// Ensure makes the clamp cover exactly links.
func (KernelMSS) Ensure(links []string) error { return mss.Ensure(links) }

// Remove deletes the clamp.
func (KernelMSS) Remove() error { return mss.Remove() }

// Running are the cable drivers that initialised once Run has built them (none before,
// and on non-gateway nodes), in the config's order.
func (c *Cables) Running() []cable.Driver {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.running)
}

// DriverSet says, for every configured driver, whether it runs (nil) or why not.
func (c *Cables) DriverSet() reconcile.Drivers {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.driverErrs)
}

// Start builds every configured driver through the registry, with the config's block
// for it, then initialises each. A driver that cannot be built is a configuration error and ends
// the agent before anything is created; one whose Init fails (strongSwan not installed, no VXLAN
// in the kernel, a link of a killed predecessor not yet gone) is logged loudly and left out
// until a retry with backoff initialises it (initretry.go): meanwhile the node does not publish
// it, and pairs the policies put on it report why.
func (c *Cables) Start(ctx context.Context) error {
	c.startRetries(ctx)
	live := c.deps.Live()
	for _, name := range live.CableDrivers {
		d, err := c.BuildDriver(name, live)
		if err != nil {
			return err
		}
		c.mu.Lock()
		c.built = append(c.built, d)
		c.mu.Unlock()
	}
	var running []cable.Driver
	errs := reconcile.Drivers{}
	built := c.builtDrivers()
	initErrs := initDrivers(ctx, built)
	for i, d := range built {
		if err := initErrs[i]; err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			errs[d.Name()] = err
			c.log.Error("CABLE DRIVER UNAVAILABLE: initialisation failed; this node will not offer it and pairs that need it stay down",
				"driver", d.Name(), "err", err)
			continue
		}
		errs[d.Name()] = nil
		running = append(running, d)
		c.log.Info("cable driver ready", "driver", d.Name(), "port", d.LocalEndpoint().Port, "links", strings.Join(d.Links(), ","))
	}
	c.mu.Lock()
	c.running, c.driverErrs = running, errs
	c.reconciler = reconcile.NewReconciler(running, c.pairLog)
	c.mu.Unlock()
	for i, d := range built {
		if initErrs[i] != nil {
			c.retryInit(d, initErrs[i])
		}
	}
	return nil
}

// initDrivers initialises every driver at once and returns their errors in the same order. The
// drivers share nothing on the host (their own links, ports and daemons), and a node is only
// announced once they are up: one at a time, charon's start and wireguard-go's delay each other
// for nothing, and a new pair waits for the sum.
func initDrivers(ctx context.Context, drivers []cable.Driver) []error {
	errs := make([]error, len(drivers))
	var wg sync.WaitGroup
	for i, d := range drivers {
		wg.Go(func() { errs[i] = d.Init(ctx) })
	}
	wg.Wait()
	return errs
}

// BuildDriver builds driver name with live's block for it (the config in force at start, or a
// reloaded one); it touches nothing on the host.
func (c *Cables) BuildDriver(name string, live config.Live) (cable.Driver, error) {
	node := c.deps.LocalNode()
	node.Log = c.pairLog // the driver adds its own "driver" key (cable.LocalNode.Logger)
	d, err := c.deps.NewDriver(name, node, live.Drivers[name])
	if err == nil && d.Name() != name {
		err = fmt.Errorf("got a driver named %q", d.Name())
	}
	if err != nil {
		return nil, fmt.Errorf("build cable driver %s: %w", name, err)
	}
	return d, nil
}

func (c *Cables) builtDrivers() []cable.Driver {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.built)
}

// TunnelLinks is the union of the drivers' links, sorted: what the MSS clamp must cover.
func TunnelLinks(drivers []cable.Driver) []string {
	var links []string
	for _, d := range drivers {
		for _, l := range d.Links() {
			if !slices.Contains(links, l) {
				links = append(links, l)
			}
		}
	}
	slices.Sort(links)
	return links
}

// ClampMSS clamps the TCP MSS of the traffic leaving through the running drivers' links to the
// route's MTU; with no such link it removes a clamp left by an earlier run. A failure is logged,
// not fatal: the tunnels work, only TCP through paths that drop ICMP may stall.
func (c *Cables) ClampMSS() {
	links := TunnelLinks(c.Running())
	if len(links) == 0 {
		if err := c.deps.MSS.Remove(); err != nil {
			c.log.Warn("cannot remove the TCP MSS clamp of an earlier run", "err", err)
		}
		return
	}
	if err := c.deps.MSS.Ensure(links); err != nil {
		c.log.Error("TCP MSS clamping not installed; TCP through the tunnels may stall on large segments", "links", strings.Join(links, ","), "err", err)
		return
	}
	c.log.Info("TCP MSS clamped to the route MTU", "links", strings.Join(links, ","))
}

// Close closes every driver built, as the agent stops.
func (c *Cables) Close() {
	c.stopRetries()
	for _, d := range c.builtDrivers() {
		if err := d.Close(); err != nil {
			c.log.Error("cable driver did not close cleanly", "driver", d.Name(), "err", err)
		}
	}
}

// Stop ends the drivers as the agent stops: with cleanup it first removes what they made
// (Cleanup) and the MSS clamp; every driver closes; with stopProcesses it then ends the helper
// daemons Close leaves for the next run (cable.ProcessOwner), which cannot adopt them.
func (c *Cables) Stop(cleanup, stopProcesses bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if cleanup {
		c.Cleanup(ctx)
		c.log.Info("cleaned up")
	}
	c.Close()
	if !stopProcesses {
		return
	}
	for _, d := range c.builtDrivers() {
		if po, ok := d.(cable.ProcessOwner); ok {
			if err := po.StopProcesses(ctx); err != nil {
				c.log.Error("cable driver's helper daemon not stopped", "driver", d.Name(), "err", err)
			}
		}
	}
}

// Cleanup removes every link, route and socket the drivers made (Cleanup, also of a driver whose
// Init failed: it may hold what an earlier run made) and the MSS clamp.
func (c *Cables) Cleanup(ctx context.Context) {
	c.stopRetries()
	for _, d := range c.builtDrivers() {
		if err := d.Cleanup(ctx); err != nil {
			c.log.Error("cable driver cleanup failed", "driver", d.Name(), "err", err)
		}
	}
	if err := c.deps.MSS.Remove(); err != nil {
		c.log.Error("TCP MSS clamp cleanup failed", "err", err)
	}
}
