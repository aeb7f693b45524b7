package agent

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

// cleanupTimeout bounds the teardown of Options.CleanupOnExit.
const cleanupTimeout = 30 * time.Second

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

// runningDrivers are the cable drivers that initialised once Run has built them (none before,
// and on non-gateway nodes), in the config's order.
func (a *Agent) runningDrivers() []cable.Driver {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.running)
}

// driverSet says, for every configured driver, whether it runs (nil) or why not.
func (a *Agent) driverSet() reconcile.Drivers {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.driverErrs)
}

// startDrivers builds every configured driver through the registry, with the config's block
// for it, then initialises each. A driver that cannot be built is a configuration error and ends
// the agent before anything is created; one whose Init fails (strongSwan not installed, no VXLAN
// in the kernel) is logged loudly and left out: the node does not publish it, and pairs the
// policies put on it report why.
func (a *Agent) startDrivers(ctx context.Context) error {
	for _, name := range a.cfg.CableDrivers {
		d, err := a.buildDriver(name, a.cfg)
		if err != nil {
			return err
		}
		a.mu.Lock()
		a.built = append(a.built, d)
		a.mu.Unlock()
	}
	var running []cable.Driver
	errs := reconcile.Drivers{}
	built := a.builtDrivers()
	initErrs := initDrivers(ctx, built)
	for i, d := range built {
		if err := initErrs[i]; err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			errs[d.Name()] = err
			a.log.Error("CABLE DRIVER UNAVAILABLE: initialisation failed; this node will not offer it and pairs that need it stay down",
				"driver", d.Name(), "err", err)
			continue
		}
		errs[d.Name()] = nil
		running = append(running, d)
		a.log.Info("cable driver ready", "driver", d.Name(), "port", d.LocalEndpoint().Port, "links", strings.Join(d.Links(), ","))
	}
	a.mu.Lock()
	a.running, a.driverErrs = running, errs
	a.reconciler = reconcile.NewReconciler(running, a.pairLog)
	a.mu.Unlock()
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

// buildDriver builds driver name with cfg's block for it (the config in force at start, or a
// reloaded one); it touches nothing on the host.
func (a *Agent) buildDriver(name string, cfg *config.Config) (cable.Driver, error) {
	node := cable.LocalNode{
		Cluster:          a.cfg.Cluster,
		Node:             a.cfg.Node,
		StateDir:         a.cfg.StateDir,
		AdvertiseAddress: a.advertiseAddr(),
		LocalSubnets:     a.localSubnets(),
		Log:              a.pairLog, // the driver adds its own "driver" key (cable.LocalNode.Logger)
	}
	d, err := a.opts.NewDriver(name, node, cfg.Drivers[name])
	if err == nil && d.Name() != name {
		err = fmt.Errorf("got a driver named %q", d.Name())
	}
	if err != nil {
		return nil, fmt.Errorf("build cable driver %s: %w", name, err)
	}
	return d, nil
}

func (a *Agent) builtDrivers() []cable.Driver {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.built)
}

// tunnelLinks is the union of the drivers' links, sorted: what the MSS clamp must cover.
func tunnelLinks(drivers []cable.Driver) []string {
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

// clampMSS clamps the TCP MSS of the traffic leaving through the running drivers' links to the
// route's MTU; with no such link it removes a clamp left by an earlier run. A failure is logged,
// not fatal: the tunnels work, only TCP through paths that drop ICMP may stall.
func (a *Agent) clampMSS() {
	links := tunnelLinks(a.runningDrivers())
	if len(links) == 0 {
		if err := a.opts.MSS.Remove(); err != nil {
			a.log.Warn("cannot remove the TCP MSS clamp of an earlier run", "err", err)
		}
		return
	}
	if err := a.opts.MSS.Ensure(links); err != nil {
		a.log.Error("TCP MSS clamping not installed; TCP through the tunnels may stall on large segments", "links", strings.Join(links, ","), "err", err)
		return
	}
	a.log.Info("TCP MSS clamped to the route MTU", "links", strings.Join(links, ","))
}

// stop ends what Run started on the host as Run returns: with Options.CleanupOnExit it first
// removes what the agent made, then it closes every driver it built.
func (a *Agent) stop() {
	if dp := a.datapath(); dp != nil {
		dp.Stop(a.opts.CleanupOnExit)
	}
	if a.opts.CleanupOnExit {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		a.cleanup(ctx)
		cancel()
	}
	for _, d := range a.builtDrivers() {
		if err := d.Close(); err != nil {
			a.log.Error("cable driver did not close cleanly", "driver", d.Name(), "err", err)
		}
	}
}

// cleanup removes every link, route and socket the agent made: on gateways each driver's
// (Cleanup, also of a driver whose Init failed: it may hold what an earlier run made) and the MSS
// clamp, elsewhere the routes via the gateway.
func (a *Agent) cleanup(ctx context.Context) {
	for _, d := range a.builtDrivers() {
		if err := d.Cleanup(ctx); err != nil {
			a.log.Error("cable driver cleanup failed", "driver", d.Name(), "err", err)
		}
	}
	if a.cfg.Gateway {
		if err := a.opts.MSS.Remove(); err != nil {
			a.log.Error("TCP MSS clamp cleanup failed", "err", err)
		}
	} else if err := a.opts.ApplyRoutes(nil); err != nil {
		a.log.Error("route cleanup failed", "err", err)
	}
	a.log.Info("cleaned up")
}
