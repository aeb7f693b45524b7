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
	"os"
	"os/signal"
	"syscall"

	"github.com/cablemesh/cablemesh/agent"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/cable"
	_ "github.com/cablemesh/cablemesh/cable/drivers" // registers every cable driver
)

func main() {
	// First thing: a driver may re-execute the agent (without kernel WireGuard, the wireguard
	// driver runs it in its own mount namespace for a private UAPI socket dir); the parent then
	// only waits and relays the exit code.
	parentDone, code, err := cable.PrepareProcess()
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
	// The config is checked whole before anything is created, the drivers' blocks by the drivers.
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

	a, err := agent.New(agent.Options{Config: cfg, Log: log, CleanupOnExit: *cleanup})
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		log.Error("agent stopped", "err", err)
		fmt.Fprintln(stderr, "cable-agent:", err)
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
