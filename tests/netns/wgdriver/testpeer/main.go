// Command testpeer runs the wireguard cable driver alone, for the netns test of the driver: run
// it inside a node's network namespace with `ip netns exec`. It calls RunIsolated, then New, Init
// and Connect (twice, to record that the second changes nothing), and serves until a signal:
//
//	SIGTERM, SIGINT  stop without cleanup, as an agent restart does
//	SIGUSR2          Cleanup, then exit 0
//	SIGHUP           Disconnect the remote cluster
//	SIGUSR1          Connect the remote cluster again
//
// It writes a JSON Status to -status every 200ms and after every action.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/wireguard"
)

// Status is what the test reads.
type Status struct {
	PID                int                      `json:"pid"`
	Kind               string                   `json:"kind"`
	PublicKey          string                   `json:"publicKey"`
	Port               uint16                   `json:"port"`
	AfterFirstConnect  wireguard.Stats          `json:"afterFirstConnect"`
	AfterSecondConnect wireguard.Stats          `json:"afterSecondConnect"`
	Stats              wireguard.Stats          `json:"stats"`
	Connections        []cable.ConnectionStatus `json:"connections"`
	Disconnected       bool                     `json:"disconnected"`
	CleanedUp          bool                     `json:"cleanedUp"`
	SocketExists       bool                     `json:"socketExists"`
	Error              string                   `json:"error,omitempty"`
}

func main() {
	parentDone, code, err := wireguard.RunIsolated()
	if err != nil {
		fmt.Fprintln(os.Stderr, "testpeer:", err)
		os.Exit(1)
	}
	if parentDone {
		os.Exit(code)
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testpeer:", err)
		os.Exit(1)
	}
}

func prefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

func run() error {
	var (
		cluster      = flag.String("cluster", "a", "local cluster")
		node         = flag.String("node", "gw", "local node")
		stateDir     = flag.String("state-dir", "", "state directory")
		advertise    = flag.String("advertise", "", "underlay address")
		localSubnets = flag.String("local-subnets", "", "comma-separated local CIDRs")
		iface        = flag.String("interface", "", "wireguard interface setting (empty: default)")
		port         = flag.String("port", "", "wireguard port setting (empty: default)")
		rCluster     = flag.String("remote-cluster", "", "remote cluster")
		rNode        = flag.String("remote-node", "gw", "remote node")
		rAddr        = flag.String("remote-address", "", "remote underlay address")
		rPort        = flag.Uint("remote-port", 51820, "remote port")
		rKey         = flag.String("remote-key", "", "remote public key (base64)")
		rSubnets     = flag.String("remote-subnets", "", "comma-separated remote CIDRs")
		statusPath   = flag.String("status", "", "status file")
	)
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))

	local, err := prefixes(*localSubnets)
	if err != nil {
		return fmt.Errorf("-local-subnets: %w", err)
	}
	remoteSubnets, err := prefixes(*rSubnets)
	if err != nil {
		return fmt.Errorf("-remote-subnets: %w", err)
	}
	adv, err := netip.ParseAddr(*advertise)
	if err != nil {
		return fmt.Errorf("-advertise: %w", err)
	}
	raddr, err := netip.ParseAddr(*rAddr)
	if err != nil {
		return fmt.Errorf("-remote-address: %w", err)
	}
	settings := cable.Settings{}
	if *iface != "" {
		settings["interface"] = *iface
	}
	if *port != "" {
		settings["port"] = *port
	}
	d, err := wireguard.NewDriver(cable.LocalNode{Cluster: *cluster, Node: *node, StateDir: *stateDir,
		AdvertiseAddress: adv, LocalSubnets: local}, settings)
	if err != nil {
		return err
	}
	remote := cable.RemoteEndpoint{Cluster: *rCluster, Node: *rNode, Address: raddr, Port: uint16(*rPort),
		PublicKey: *rKey, Subnets: remoteSubnets}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := Status{PID: os.Getpid()}
	write := func() {
		conns, err := d.Connections(ctx)
		if err != nil && !st.CleanedUp {
			st.Error = err.Error()
		}
		st.Connections = conns
		st.Stats = d.Stats()
		_, serr := os.Stat(wireguard.UAPISocketPath(d.Interface()))
		st.SocketExists = serr == nil
		data, _ := json.Marshal(st)
		tmp := *statusPath + ".tmp"
		if os.WriteFile(tmp, data, 0o644) == nil {
			os.Rename(tmp, *statusPath)
		}
	}

	if err := d.Init(ctx); err != nil {
		return err
	}
	st.Kind = d.DeviceKind()
	le := d.LocalEndpoint()
	st.PublicKey, st.Port = le.PublicKey, le.Port
	if err := d.Connect(ctx, remote, nil); err != nil {
		return err
	}
	st.AfterFirstConnect = d.Stats()
	if err := d.Connect(ctx, remote, nil); err != nil {
		return err
	}
	st.AfterSecondConnect = d.Stats()
	write()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			write()
		case s := <-sigs:
			switch s {
			case syscall.SIGTERM, syscall.SIGINT:
				return d.Close()
			case syscall.SIGHUP:
				if err := d.Disconnect(ctx, remote.Cluster); err != nil {
					st.Error = err.Error()
				}
				st.Disconnected = true
				write()
			case syscall.SIGUSR1:
				if err := d.Connect(ctx, remote, nil); err != nil {
					st.Error = err.Error()
				}
				st.Disconnected = false
				write()
			case syscall.SIGUSR2:
				if err := d.Cleanup(ctx); err != nil {
					st.Error = err.Error()
				}
				st.CleanedUp = true
				write()
				return nil
			}
		}
	}
}
