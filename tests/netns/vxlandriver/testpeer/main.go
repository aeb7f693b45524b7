// Command testpeer runs the vxlan cable driver alone, for the netns test of the driver: run it
// inside a node's network namespace with `ip netns exec`.
//
//	testpeer peer [flags]   New, Init, Connect twice (recording that the second changes
//	                        nothing), then serve until a signal:
//	    SIGTERM, SIGINT  stop without cleanup, as an agent restart does
//	    SIGUSR2          Cleanup, then exit 0
//	    SIGHUP           Disconnect the remote cluster
//	    SIGUSR1          Connect the remote cluster again (with -options)
//	    SIGWINCH         Connect the remote cluster with -alt-options (a policy change)
//	  It writes a JSON Status to -status every 200ms and after every action.
//	testpeer multi [flags]  New, Init, Connect every remote of -remotes (a JSON list), then
//	                        serve until SIGTERM; on SIGUSR1 it runs the Command in -control and
//	                        records its Seq in the status (Connections, Stats, LastSeq, Error).
//	testpeer sink -listen ADDR -bytes N      accept one TCP connection, read it to EOF, print
//	                                         {"bytes":..,"sha256":..}; exit 1 unless N arrived
//	testpeer source -addr ADDR -bind IP -bytes N -seed S
//	                                         send N pseudo-random bytes, print the same JSON
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/vxlan"
)

// Status is what the test reads.
type Status struct {
	PID                int                      `json:"pid"`
	VTEP               string                   `json:"vtep"`
	MTU                int                      `json:"mtu"`
	Port               uint16                   `json:"port"`
	AfterInit          vxlan.Stats              `json:"afterInit"`
	AfterFirstConnect  vxlan.Stats              `json:"afterFirstConnect"`
	AfterSecondConnect vxlan.Stats              `json:"afterSecondConnect"`
	Stats              vxlan.Stats              `json:"stats"`
	Connections        []cable.ConnectionStatus `json:"connections"`
	Options            string                   `json:"options"`
	Disconnected       bool                     `json:"disconnected"`
	CleanedUp          bool                     `json:"cleanedUp"`
	Error              string                   `json:"error,omitempty"`
}

// Transfer is what sink and source print.
type Transfer struct {
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testpeer peer|sink|source [flags]")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "peer":
		err = peer(os.Args[2:])
	case "multi":
		err = multi(os.Args[2:])
	case "sink":
		err = sink(os.Args[2:])
	case "source":
		err = source(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "testpeer: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
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

// keyValues parses "k=v,k2=v2".
func keyValues(s string) (map[string]string, error) {
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

func peer(args []string) error {
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	var (
		cluster      = fs.String("cluster", "a", "local cluster")
		node         = fs.String("node", "gw", "local node")
		stateDir     = fs.String("state-dir", "", "state directory")
		advertise    = fs.String("advertise", "", "underlay address")
		localSubnets = fs.String("local-subnets", "", "comma-separated local CIDRs")
		settingsFlag = fs.String("settings", "", "driver settings k=v,...")
		optionsFlag  = fs.String("options", "", "connection options k=v,...")
		altOptions   = fs.String("alt-options", "", "connection options for SIGWINCH")
		rCluster     = fs.String("remote-cluster", "", "remote cluster")
		rNode        = fs.String("remote-node", "gw", "remote node")
		rAddr        = fs.String("remote-address", "", "remote underlay address")
		rPort        = fs.Uint("remote-port", vxlan.DefaultPort, "remote port")
		rSubnets     = fs.String("remote-subnets", "", "comma-separated remote CIDRs")
		statusPath   = fs.String("status", "", "status file")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
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
	settings, err := keyValues(*settingsFlag)
	if err != nil {
		return fmt.Errorf("-settings: %w", err)
	}
	opts, err := keyValues(*optionsFlag)
	if err != nil {
		return fmt.Errorf("-options: %w", err)
	}
	alt, err := keyValues(*altOptions)
	if err != nil {
		return fmt.Errorf("-alt-options: %w", err)
	}
	d, err := vxlan.NewDriver(cable.LocalNode{Cluster: *cluster, Node: *node, StateDir: *stateDir,
		AdvertiseAddress: adv, LocalSubnets: local}, settings)
	if err != nil {
		return err
	}
	remote := cable.RemoteEndpoint{Cluster: *rCluster, Node: *rNode, Address: raddr, Port: uint16(*rPort),
		Subnets: remoteSubnets}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := Status{PID: os.Getpid(), VTEP: d.VTEP().String(), Options: *optionsFlag}
	write := func() {
		if !st.CleanedUp {
			conns, err := d.Connections(ctx)
			if err != nil {
				st.Error = err.Error()
			}
			st.Connections = conns
		}
		st.Stats = d.Stats()
		data, _ := json.Marshal(st)
		tmp := *statusPath + ".tmp"
		if os.WriteFile(tmp, data, 0o644) == nil {
			os.Rename(tmp, *statusPath)
		}
	}

	if err := d.Init(ctx); err != nil {
		return err
	}
	st.AfterInit = d.Stats()
	st.MTU = d.MTU()
	st.Port = d.LocalEndpoint().Port
	if err := d.Connect(ctx, remote, opts); err != nil {
		return err
	}
	st.AfterFirstConnect = d.Stats()
	if err := d.Connect(ctx, remote, opts); err != nil {
		return err
	}
	st.AfterSecondConnect = d.Stats()
	write()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGHUP, syscall.SIGWINCH)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			write()
		case s := <-sigs:
			switch s {
			case syscall.SIGTERM, syscall.SIGINT:
				return nil
			case syscall.SIGHUP:
				if err := d.Disconnect(ctx, remote.Cluster); err != nil {
					st.Error = err.Error()
				}
				st.Disconnected = true
			case syscall.SIGUSR1:
				if err := d.Connect(ctx, remote, opts); err != nil {
					st.Error = err.Error()
				}
				st.Disconnected, st.Options = false, *optionsFlag
			case syscall.SIGWINCH:
				if err := d.Connect(ctx, remote, alt); err != nil {
					st.Error = err.Error()
				}
				st.Disconnected, st.Options = false, *altOptions
			case syscall.SIGUSR2:
				if err := d.Cleanup(ctx); err != nil {
					st.Error = err.Error()
				}
				st.CleanedUp = true
				st.Connections = nil
				write()
				return nil
			}
			write()
		}
	}
}

// Remote is one entry of multi's -remotes.
type Remote struct {
	Cluster string            `json:"cluster"`
	Address string            `json:"address"`
	Port    uint16            `json:"port"`
	Subnets []string          `json:"subnets"`
	Options map[string]string `json:"options,omitempty"`
}

// Command is what multi runs on SIGUSR1: connect (a cluster of -remotes, with Options),
// disconnect (a cluster) or cleanup.
type Command struct {
	Seq     int               `json:"seq"`
	Action  string            `json:"action"`
	Cluster string            `json:"cluster"`
	Options map[string]string `json:"options,omitempty"`
}

// MultiStatus is what multi writes.
type MultiStatus struct {
	PID         int                      `json:"pid"`
	LastSeq     int                      `json:"lastSeq"`
	Stats       vxlan.Stats              `json:"stats"`
	Connections []cable.ConnectionStatus `json:"connections"`
	CleanedUp   bool                     `json:"cleanedUp"`
	Error       string                   `json:"error,omitempty"`
}

func (r Remote) endpoint() (cable.RemoteEndpoint, error) {
	a, err := netip.ParseAddr(r.Address)
	if err != nil {
		return cable.RemoteEndpoint{}, fmt.Errorf("remote %s address: %w", r.Cluster, err)
	}
	subnets, err := prefixes(strings.Join(r.Subnets, ","))
	if err != nil {
		return cable.RemoteEndpoint{}, fmt.Errorf("remote %s subnets: %w", r.Cluster, err)
	}
	return cable.RemoteEndpoint{Cluster: r.Cluster, Node: "gw", Address: a, Port: r.Port, Subnets: subnets}, nil
}

func multi(args []string) error {
	fs := flag.NewFlagSet("multi", flag.ContinueOnError)
	var (
		cluster      = fs.String("cluster", "a", "local cluster")
		stateDir     = fs.String("state-dir", "", "state directory")
		advertise    = fs.String("advertise", "", "underlay address")
		localSubnets = fs.String("local-subnets", "", "comma-separated local CIDRs")
		remotesJSON  = fs.String("remotes", "[]", "JSON list of remotes")
		controlPath  = fs.String("control", "", "command file read on SIGUSR1")
		statusPath   = fs.String("status", "", "status file")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	local, err := prefixes(*localSubnets)
	if err != nil {
		return fmt.Errorf("-local-subnets: %w", err)
	}
	adv, err := netip.ParseAddr(*advertise)
	if err != nil {
		return fmt.Errorf("-advertise: %w", err)
	}
	var remotes []Remote
	if err := json.Unmarshal([]byte(*remotesJSON), &remotes); err != nil {
		return fmt.Errorf("-remotes: %w", err)
	}
	byName := map[string]Remote{}
	for _, r := range remotes {
		byName[r.Cluster] = r
	}
	d, err := vxlan.NewDriver(cable.LocalNode{Cluster: *cluster, Node: "gw", StateDir: *stateDir,
		AdvertiseAddress: adv, LocalSubnets: local}, nil)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := MultiStatus{PID: os.Getpid()}
	write := func() {
		if !st.CleanedUp {
			conns, err := d.Connections(ctx)
			if err != nil {
				st.Error = err.Error()
			}
			st.Connections = conns
		}
		st.Stats = d.Stats()
		data, _ := json.Marshal(st)
		tmp := *statusPath + ".tmp"
		if os.WriteFile(tmp, data, 0o644) == nil {
			os.Rename(tmp, *statusPath)
		}
	}
	connect := func(name string, opts map[string]string) error {
		r, ok := byName[name]
		if !ok {
			return fmt.Errorf("cluster %q is not in -remotes", name)
		}
		ep, err := r.endpoint()
		if err != nil {
			return err
		}
		return d.Connect(ctx, ep, opts)
	}
	if err := d.Init(ctx); err != nil {
		return err
	}
	for _, r := range remotes {
		if err := connect(r.Cluster, r.Options); err != nil {
			return err
		}
	}
	write()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGUSR1)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-tick.C:
			write()
		case s := <-sigs:
			if s != syscall.SIGUSR1 {
				return nil
			}
			var cmd Command
			data, err := os.ReadFile(*controlPath)
			if err == nil {
				err = json.Unmarshal(data, &cmd)
			}
			if err == nil {
				switch cmd.Action {
				case "connect":
					err = connect(cmd.Cluster, cmd.Options)
				case "disconnect":
					err = d.Disconnect(ctx, cmd.Cluster)
				case "cleanup":
					err = d.Cleanup(ctx)
					st.CleanedUp, st.Connections = true, nil
				default:
					err = fmt.Errorf("unknown action %q", cmd.Action)
				}
			}
			st.Error = ""
			if err != nil {
				st.Error = err.Error()
			}
			st.LastSeq = cmd.Seq
			write()
			if st.CleanedUp {
				return nil
			}
		}
	}
}

func sink(args []string) error {
	fs := flag.NewFlagSet("sink", flag.ContinueOnError)
	listen := fs.String("listen", "", "address to listen on")
	want := fs.Int64("bytes", 0, "bytes expected")
	timeout := fs.Duration("timeout", 60*time.Second, "overall deadline")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintln(os.Stderr, "listening", ln.Addr())
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(*timeout))
	c, err := ln.Accept()
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(*timeout))
	h := sha256.New()
	n, err := io.Copy(h, c)
	out, _ := json.Marshal(Transfer{Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))})
	fmt.Println(string(out))
	if err != nil {
		return fmt.Errorf("after %d bytes: %w", n, err)
	}
	if n != *want {
		return fmt.Errorf("received %d bytes, want %d", n, *want)
	}
	return nil
}

func source(args []string) error {
	fs := flag.NewFlagSet("source", flag.ContinueOnError)
	addr := fs.String("addr", "", "address to connect to")
	bind := fs.String("bind", "", "local IP to send from")
	n := fs.Int64("bytes", 0, "bytes to send")
	seed := fs.Uint64("seed", 1, "seed of the pseudo-random payload")
	timeout := fs.Duration("timeout", 60*time.Second, "overall deadline")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dialer := net.Dialer{Timeout: 2 * time.Second}
	if *bind != "" {
		ip, err := netip.ParseAddr(*bind)
		if err != nil {
			return fmt.Errorf("-bind: %w", err)
		}
		dialer.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(ip, 0))
	}
	deadline := time.Now().Add(*timeout)
	var c net.Conn
	var err error
	for time.Now().Before(deadline) { // the sink may not listen yet
		if c, err = dialer.Dial("tcp", *addr); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(deadline)
	h := sha256.New()
	r := io.LimitReader(rand.NewChaCha8(seedBytes(*seed)), *n)
	sent, err := io.Copy(io.MultiWriter(c, h), r)
	if err != nil {
		return fmt.Errorf("after %d bytes: %w", sent, err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		return err
	}
	// Wait for the sink to close, so "sent" means "received".
	io.Copy(io.Discard, c)
	out, _ := json.Marshal(Transfer{Bytes: sent, SHA256: hex.EncodeToString(h.Sum(nil))})
	fmt.Println(string(out))
	return nil
}

func seedBytes(s uint64) [32]byte {
	var b [32]byte
	for i := range 4 {
		for j := range 8 {
			b[i*8+j] = byte(s >> (8 * j))
		}
	}
	return b
}
