// Command cable-agent is the Cablemesh node agent: `cable-agent --config FILE`.
//
// Exit codes: 0 after a signal (SIGINT/SIGTERM), 1 when the agent cannot run (e.g. its join
// token is refused), 2 for bad usage or a bad config file (reported before anything is created).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cablemesh/cablemesh/agent"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/routes"
	"github.com/cablemesh/cablemesh/cable"
	_ "github.com/cablemesh/cablemesh/cable/drivers" // registers every cable driver
	"github.com/cablemesh/cablemesh/cable/mss"
	"github.com/cablemesh/cablemesh/cable/wireguard"
)

// mssPrefixes are the names of the links tunnelled traffic leaves through: every cablemesh link
// (cbl-wg0, cbl-vx*) and kernel-libipsec's ipsec0.
var mssPrefixes = []string{"cbl-", "ipsec"}

func main() {
	// First thing: without kernel WireGuard the driver re-executes the agent in its own mount
	// namespace (private UAPI socket dir); the parent only waits and relays the exit code.
	parentDone, code, err := wireguard.RunIsolated()
	if err != nil {
		fmt.Fprintln(os.Stderr, "cable-agent:", err)
		os.Exit(1)
	}
	if parentDone {
		os.Exit(code)
	}
	os.Exit(run(os.Args[1:], os.Stderr))
}

func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("cable-agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "agent config file (YAML; unknown fields are errors)")
	logLevel := fs.String("log-level", "", "override the config's logLevel: debug | info | warn | error")
	cleanup := fs.Bool("cleanup-on-exit", false, "on exit remove every link, route and socket the agent made (tests, teardown); by default tunnels are left as they are so a restart does not flap them")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *configPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "cable-agent: usage: cable-agent --config FILE [--log-level LEVEL] [--cleanup-on-exit]")
		return 2
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent:", err)
		return 2
	}
	if *logLevel != "" {
		cfg.LogLevel = *logLevel
		if err := cfg.Validate(); err != nil {
			fmt.Fprintln(stderr, "cable-agent: --log-level:", err)
			return 2
		}
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level(cfg.LogLevel)}))
	slog.SetDefault(log)

	newDriver := func(name string, subnets []netip.Prefix) (cable.Driver, error) {
		return cable.New(name, cable.LocalNode{
			Cluster:          cfg.Cluster,
			Node:             cfg.Node,
			StateDir:         cfg.StateDir,
			AdvertiseAddress: cfg.AdvertiseAddr(),
			LocalSubnets:     subnets,
		}, cable.Settings(cfg.DriverSettings(name)))
	}
	// Every configured driver must exist (on any node: the config is strict) and, on a gateway,
	// accept its settings before anything is created: building a driver only validates, Init is
	// what touches the host.
	if err := cfg.CheckRegistered(cable.Names()); err != nil {
		fmt.Fprintln(stderr, "cable-agent:", err)
		return 2
	}
	if cfg.Gateway {
		for _, name := range cfg.CableDrivers {
			if _, err := newDriver(name, nil); err != nil {
				fmt.Fprintf(stderr, "cable-agent: %s: %v\n", name, err)
				return 2
			}
		}
	}
	opts := agent.Options{Config: cfg, NewDriver: newDriver, Log: log}
	if cfg.Gateway {
		opts.MSS = func() error { return mss.Ensure(mssPrefixes) }
	}
	a, err := agent.New(opts)
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent:", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	runErr := a.Run(ctx)
	if *cleanup {
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		for _, d := range a.Drivers() {
			if err := d.Cleanup(cctx); err != nil {
				log.Error("cleanup failed", "driver", d.Name(), "err", err)
			}
		}
		if cfg.Gateway {
			if err := mss.Remove(); err != nil {
				log.Error("MSS clamp cleanup failed", "err", err)
			}
		}
		if !cfg.Gateway {
			if err := routes.Apply(nil, log); err != nil {
				log.Error("route cleanup failed", "err", err)
			}
		}
		log.Info("cleaned up")
	}
	if runErr != nil && !errors.Is(runErr, context.Canceled) {
		log.Error("agent stopped", "err", runErr)
		fmt.Fprintln(stderr, "cable-agent:", runErr)
		return 1
	}
	log.Info("agent stopped")
	return 0
}

func level(s string) slog.Level {
	switch s {
	case "debug":
		return slog.LevelDebug
	case "warn":
		return slog.LevelWarn
	case "error":
		return slog.LevelError
	}
	return slog.LevelInfo
}
