// Command testpeer runs the ipsec cable driver alone, for the netns test of the driver: run it
// inside a node's network namespace with `ip netns exec`. It reads the pair's pre-shared key as
// one line of hex from standard input (so it is in no file, argument or environment variable),
// then calls New, Init and Connect (twice, to record that the second changes nothing), and
// serves until a signal:
//
//	SIGTERM, SIGINT  Close (stop charon) without cleanup, as an agent exit does
//	SIGUSR2          Cleanup, then exit 0
//	SIGHUP           Disconnect the remote cluster
//	SIGUSR1          Connect the remote cluster again
//
// It writes a JSON Status to -status every 200ms and after every action.
package main

import (
	"bufio"
	"context"
	"encoding/hex"
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
	"github.com/cablemesh/cablemesh/cable/ipsec"
)

// Status is what the test reads.
type Status struct {
	PID                int                      `json:"pid"`
	CharonPID          int                      `json:"charonPID"`
	Datapath           string                   `json:"datapath"`
	MTU                int                      `json:"mtu"`
	ViciSocket         string                   `json:"viciSocket"`
	AfterFirstConnect  ipsec.Stats              `json:"afterFirstConnect"`
	AfterSecondConnect ipsec.Stats              `json:"afterSecondConnect"`
	Stats              ipsec.Stats              `json:"stats"`
	Connections        []cable.ConnectionStatus `json:"connections"`
	Disconnected       bool                     `json:"disconnected"`
	CleanedUp          bool                     `json:"cleanedUp"`
	ConnectionsError   string                   `json:"connectionsError,omitempty"`
	// Error is the error of the last action (Connect, Disconnect, Cleanup).
	Error string `json:"error,omitempty"`
}

func main() {
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
		settingsFlag = flag.String("settings", "", "comma-separated driver settings k=v")
		rCluster     = flag.String("remote-cluster", "", "remote cluster")
		rNode        = flag.String("remote-node", "gw", "remote node")
		rAddr        = flag.String("remote-address", "", "remote underlay address")
		rPort        = flag.Uint("remote-port", 500, "remote IKE port")
		rSubnets     = flag.String("remote-subnets", "", "comma-separated remote CIDRs")
		statusPath   = flag.String("status", "", "status file")
	)
	flag.Parse()
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))

	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read the pre-shared key from stdin: %w", err)
	}
	psk, err := hex.DecodeString(strings.TrimSpace(line))
	if err != nil {
		return fmt.Errorf("pre-shared key on stdin is not hex")
	}
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
	for _, kv := range strings.Split(*settingsFlag, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			settings[k] = v
		}
	}
	d, err := ipsec.NewDriver(cable.LocalNode{Cluster: *cluster, Node: *node, StateDir: *stateDir,
		AdvertiseAddress: adv, LocalSubnets: local}, settings)
	if err != nil {
		return err
	}
	remote := cable.RemoteEndpoint{Cluster: *rCluster, Node: *rNode, Address: raddr, Port: uint16(*rPort),
		Subnets: remoteSubnets, PreSharedKey: psk}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := Status{PID: os.Getpid()}
	write := func() {
		if !st.CleanedUp {
			// While charon restarts, Connections fails for a moment: keep the last good list.
			conns, err := d.Connections(ctx)
			st.ConnectionsError = ""
			if err != nil {
				st.ConnectionsError = err.Error()
			} else {
				st.Connections = conns
			}
		}
		st.Stats = d.Stats()
		st.CharonPID = d.CharonPID()
		data, _ := json.Marshal(st)
		tmp := *statusPath + ".tmp"
		if os.WriteFile(tmp, data, 0o644) == nil {
			os.Rename(tmp, *statusPath)
		}
	}

	if err := d.Init(ctx); err != nil {
		return err
	}
	st.Datapath, st.MTU, st.ViciSocket = string(d.Datapath()), d.MTU(), d.ViciSocket()
	if err := d.Connect(ctx, remote, nil); err != nil {
		d.Cleanup(ctx)
		return err
	}
	st.AfterFirstConnect = d.Stats()
	if err := d.Connect(ctx, remote, nil); err != nil {
		d.Cleanup(ctx)
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
				st.Connections = nil
				write()
				return nil
			}
		}
	}
}
