// Command cable-broker runs the Cablemesh broker: the mesh's shared state, join tokens and agent
// certificates, served over gRPC with mTLS.
//
//	cable-broker --data-dir DIR [--listen 0.0.0.0:7443] [--lease 30s] [--log-level info]
//
// On first start it creates the mesh CA in DIR and writes DIR/admin.yaml, the credential cablectl
// uses (cablectl --config DIR/admin.yaml ...).
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/cablemesh/cablemesh/broker"
)

func main() {
	os.Exit(run())
}

func run() int {
	fs := flag.NewFlagSet("cable-broker", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "directory for the store, the mesh CA and admin.yaml (required)")
	listen := fs.String("listen", broker.DefaultListen, "address to serve the gRPC API on")
	lease := fs.Duration("lease", broker.DefaultLease, "default endpoint lease; agents heartbeat within it")
	logLevel := fs.String("log-level", "info", "log level: debug | info | warn | error")
	if err := fs.Parse(os.Args[1:]); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "cable-broker: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "cable-broker: --data-dir is required")
		return 2
	}
	if *lease < time.Second {
		fmt.Fprintf(os.Stderr, "cable-broker: --lease %s is shorter than 1s\n", *lease)
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(os.Stderr, "cable-broker: --log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	srv, err := broker.New(broker.Config{DataDir: *dataDir, Listen: *listen, Lease: *lease, Logger: log})
	if err != nil {
		log.Error("start broker", "err", err)
		return 1
	}
	defer srv.Close()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listen", "addr", *listen, "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := srv.Serve(ctx, lis); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	log.Info("broker stopped")
	return 0
}
