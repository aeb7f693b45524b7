// Package peer is the skeleton of the driver testpeers: a program that runs one cable driver
// alone inside a node's network namespace (started with `ip netns exec`), connects it to one
// remote cluster and serves until a signal, writing a JSON status for the test:
//
//	SIGTERM, SIGINT  stop without cleanup, as an agent restart does
//	SIGUSR2          Cleanup, then exit 0
//	SIGHUP           Disconnect the remote cluster
//	SIGUSR1          Connect the remote cluster again
//
// Each testpeer supplies its driver, its own flags and status fields, and any other signals.
package peer

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// Main runs run and, when it fails, prints its error to standard error and exits 1.
func Main(run func() error) {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "testpeer:", err)
		os.Exit(1)
	}
}

// Flags are the flags every testpeer takes: the local node, the remote endpoint, the status file.
type Flags struct {
	Cluster, Node, StateDir, Advertise, LocalSubnets string
	RemoteCluster, RemoteNode, RemoteAddress         string
	RemotePort                                       uint
	RemoteSubnets, StatusPath                        string
}

// Register defines the flags on fs; remotePort is the driver's default port.
func (f *Flags) Register(fs *flag.FlagSet, remotePort uint) {
	fs.StringVar(&f.Cluster, "cluster", "a", "local cluster")
	fs.StringVar(&f.Node, "node", "gw", "local node")
	fs.StringVar(&f.StateDir, "state-dir", "", "state directory")
	fs.StringVar(&f.Advertise, "advertise", "", "underlay address")
	fs.StringVar(&f.LocalSubnets, "local-subnets", "", "comma-separated local CIDRs")
	fs.StringVar(&f.RemoteCluster, "remote-cluster", "", "remote cluster")
	fs.StringVar(&f.RemoteNode, "remote-node", "gw", "remote node")
	fs.StringVar(&f.RemoteAddress, "remote-address", "", "remote underlay address")
	fs.UintVar(&f.RemotePort, "remote-port", remotePort, "remote port")
	fs.StringVar(&f.RemoteSubnets, "remote-subnets", "", "comma-separated remote CIDRs")
	fs.StringVar(&f.StatusPath, "status", "", "status file")
}

// Endpoints parses the flags into the local node and the remote endpoint, and sets up logging
// to standard error (the test keeps it as the testpeer log).
func (f *Flags) Endpoints() (cable.LocalNode, cable.RemoteEndpoint, error) {
	LogToStderr()
	local, err := Prefixes(f.LocalSubnets)
	if err != nil {
		return cable.LocalNode{}, cable.RemoteEndpoint{}, fmt.Errorf("-local-subnets: %w", err)
	}
	remoteSubnets, err := Prefixes(f.RemoteSubnets)
	if err != nil {
		return cable.LocalNode{}, cable.RemoteEndpoint{}, fmt.Errorf("-remote-subnets: %w", err)
	}
	adv, err := netip.ParseAddr(f.Advertise)
	if err != nil {
		return cable.LocalNode{}, cable.RemoteEndpoint{}, fmt.Errorf("-advertise: %w", err)
	}
	raddr, err := netip.ParseAddr(f.RemoteAddress)
	if err != nil {
		return cable.LocalNode{}, cable.RemoteEndpoint{}, fmt.Errorf("-remote-address: %w", err)
	}
	return cable.LocalNode{Cluster: f.Cluster, Node: f.Node, StateDir: f.StateDir, AdvertiseAddress: adv, LocalSubnets: local},
		cable.RemoteEndpoint{Cluster: f.RemoteCluster, Node: f.RemoteNode, Address: raddr, Port: uint16(f.RemotePort), Subnets: remoteSubnets},
		nil
}

// LogToStderr sends slog's output to standard error, which the test keeps as the testpeer log.
func LogToStderr() {
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
}

// Prefixes parses comma-separated CIDRs; empty entries are skipped.
func Prefixes(s string) ([]netip.Prefix, error) {
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

// KeyValues parses "k=v,k2=v2"; empty entries are skipped.
func KeyValues(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		k, v, ok := strings.Cut(f, "=")
		if !ok {
			return nil, fmt.Errorf("%q is not key=value", f)
		}
		out[k] = v
	}
	return out, nil
}

// WriteJSON replaces path with v as JSON, through a rename so that a reader never sees half a
// file. Errors are ignored: the test notices a status that does not come.
func WriteJSON(path string, v any) {
	data, _ := json.Marshal(v)
	tmp := path + ".tmp"
	if os.WriteFile(tmp, data, 0o644) == nil {
		os.Rename(tmp, path)
	}
}

// Status holds what every testpeer reports; a testpeer's status embeds it, with the driver's
// Stats type as S, and so does the test's mirror of it.
type Status[S any] struct {
	PID                int                      `json:"pid"`
	AfterFirstConnect  S                        `json:"afterFirstConnect"`
	AfterSecondConnect S                        `json:"afterSecondConnect"`
	Stats              S                        `json:"stats"`
	Connections        []cable.ConnectionStatus `json:"connections"`
	Disconnected       bool                     `json:"disconnected"`
	CleanedUp          bool                     `json:"cleanedUp"`
	// Closed is set once the driver's Close returned (on SIGTERM or SIGINT, see CloseChecked);
	// LeftAfterClose are the stacks of the driver's goroutines still running after it.
	Closed         bool     `json:"closed,omitempty"`
	LeftAfterClose []string `json:"leftAfterClose,omitempty"`
	// Error is the error of the last action that failed.
	Error string `json:"error,omitempty"`
}

// Live reports whether the driver may still be asked for its connections: neither cleaned up
// nor closed.
func (st *Status[S]) Live() bool { return !st.CleanedUp && !st.Closed }

// DriverPackages are the packages whose goroutines count as a driver's: the cable drivers and
// the libraries they run in this process (wireguard-go and wgctrl, govici).
var DriverPackages = []string{"github.com/cablemesh/cablemesh/cable/", "golang.zx2c4.com/wireguard", "github.com/strongswan/govici"}

// closeGrace is how long goroutines may take to end after Close returned (wireguard-go's end
// when their sockets and TUN report closed).
const closeGrace = 5 * time.Second

// CloseChecked is the stop action for Serve: it closes d, records in st which of the driver's
// goroutines are still running closeGrace later (none, when Close owns them all), and writes the
// status.
func (st *Status[S]) CloseChecked(d cable.Driver, write func()) func() error {
	return func() error {
		err := d.Close()
		st.Closed = true
		st.LeftAfterClose = goroutinesOf(DriverPackages, closeGrace)
		write()
		return err
	}
}

// CloseProblem says what is wrong with how the driver's Close went ("" when nothing): not
// called, or goroutines of the driver's left running after it.
func (st Status[S]) CloseProblem() string {
	switch {
	case !st.Closed:
		return "the driver was not closed"
	case len(st.LeftAfterClose) > 0:
		return fmt.Sprintf("%d goroutines of the driver still run %s after Close:\n%s", len(st.LeftAfterClose), closeGrace, strings.Join(st.LeftAfterClose, "\n\n"))
	}
	return ""
}

// goroutinesOf returns the stacks of the goroutines (but the calling one) with a frame in one of
// pkgs, waiting up to wait for them to end.
func goroutinesOf(pkgs []string, wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	for {
		buf := make([]byte, 1<<20)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		var left []string
		for i, g := range strings.Split(string(buf), "\n\n") {
			if i == 0 {
				continue // this goroutine
			}
			for _, p := range pkgs {
				if strings.Contains(g, p) {
					left = append(left, g)
					break
				}
			}
		}
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Driver is a cable driver that counts its changes to the host.
type Driver[S any] interface {
	cable.Driver
	Stats() S
}

// ConnectTwice connects remote twice with the same input, recording the stats after each: the
// test checks that the second changes nothing.
func (st *Status[S]) ConnectTwice(ctx context.Context, d Driver[S], remote cable.RemoteEndpoint, opts cable.Options) error {
	if err := d.Connect(ctx, remote, opts); err != nil {
		return err
	}
	st.AfterFirstConnect = d.Stats()
	if err := d.Connect(ctx, remote, opts); err != nil {
		return err
	}
	st.AfterSecondConnect = d.Stats()
	return nil
}

// Connect connects remote again (after a Disconnect, or with other options).
func (st *Status[S]) Connect(ctx context.Context, d Driver[S], remote cable.RemoteEndpoint, opts cable.Options) {
	if err := d.Connect(ctx, remote, opts); err != nil {
		st.Error = err.Error()
	}
	st.Disconnected = false
}

// Serve writes the status (write) every 200ms and after every action, and runs the actions of
// the package comment on signals, until SIGTERM or SIGINT (it returns stop()) or SIGUSR2 (it
// cleans up, writes and returns nil). more adds actions for other signals or replaces these.
func Serve[S any](ctx context.Context, d Driver[S], remote cable.RemoteEndpoint, opts cable.Options, st *Status[S],
	write func(), stop func() error, more map[os.Signal]func()) error {
	actions := map[os.Signal]func(){
		syscall.SIGHUP: func() {
			if err := d.Disconnect(ctx, remote.Cluster); err != nil {
				st.Error = err.Error()
			}
			st.Disconnected = true
		},
		syscall.SIGUSR1: func() { st.Connect(ctx, d, remote, opts) },
	}
	for s, a := range more {
		actions[s] = a
	}
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR2)
	for s := range actions {
		signal.Notify(sigs, s)
	}
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			write()
		case s := <-sigs:
			switch s {
			case syscall.SIGTERM, syscall.SIGINT:
				return stop()
			case syscall.SIGUSR2:
				if err := d.Cleanup(ctx); err != nil {
					st.Error = err.Error()
				}
				st.CleanedUp = true
				st.Connections = nil
				write()
				return nil
			}
			actions[s]()
			write()
		}
	}
}
