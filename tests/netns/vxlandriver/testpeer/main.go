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
	"github.com/cablemesh/cablemesh/tests/netns/nstest/peer"
	"github.com/cablemesh/cablemesh/tests/netns/vxlandriver"
)

func main() {
	modes := map[string]func([]string) error{"peer": peerMode, "multi": multi, "sink": sink, "source": source}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testpeer peer|multi|sink|source [flags]")
		os.Exit(2)
	}
	mode, ok := modes[os.Args[1]]
	if !ok {
		fmt.Fprintf(os.Stderr, "testpeer: unknown mode %q\n", os.Args[1])
		os.Exit(2)
	}
	peer.Main(func() error { return mode(os.Args[2:]) })
}

// refresh reads the driver's connections (none after Cleanup) and counters into st.
func refresh(ctx context.Context, d *vxlan.Driver, st *peer.Status[vxlan.Stats]) {
	if st.Live() {
		conns, err := d.Connections(ctx)
		if err != nil {
			st.Error = err.Error()
		}
		st.Connections = conns
	}
	st.Stats = d.Stats()
}

func peerMode(args []string) error {
	fs := flag.NewFlagSet("peer", flag.ContinueOnError)
	var f peer.Flags
	f.Register(fs, vxlan.DefaultPort)
	var (
		settingsFlag = fs.String("settings", "", "driver settings k=v,...")
		optionsFlag  = fs.String("options", "", "connection options k=v,...")
		altOptions   = fs.String("alt-options", "", "connection options for SIGWINCH")
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	local, remote, err := f.Endpoints()
	if err != nil {
		return err
	}
	settings, err := peer.KeyValues(*settingsFlag)
	if err != nil {
		return fmt.Errorf("-settings: %w", err)
	}
	opts, err := peer.KeyValues(*optionsFlag)
	if err != nil {
		return fmt.Errorf("-options: %w", err)
	}
	alt, err := peer.KeyValues(*altOptions)
	if err != nil {
		return fmt.Errorf("-alt-options: %w", err)
	}
	d, err := vxlan.NewDriver(local, settings)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := vxlandriver.Status{VTEP: d.VTEP().String(), Options: *optionsFlag}
	st.PID = os.Getpid()
	write := func() {
		refresh(ctx, d, &st.Status)
		peer.WriteJSON(f.StatusPath, st)
	}

	if err := d.Init(ctx); err != nil {
		return err
	}
	st.AfterInit = d.Stats()
	st.MTU = d.MTU()
	st.Port = d.LocalEndpoint().Port
	if err := st.ConnectTwice(ctx, d, remote, opts); err != nil {
		return err
	}
	write()
	// The VXLAN link outlives the process (the kernel keeps it): Close changes nothing on the host.
	return peer.Serve(ctx, d, remote, opts, &st.Status, write, st.CloseChecked(d, write), map[os.Signal]func(){
		syscall.SIGUSR1: func() {
			st.Connect(ctx, d, remote, opts)
			st.Options = *optionsFlag
		},
		syscall.SIGWINCH: func() {
			st.Connect(ctx, d, remote, alt)
			st.Options = *altOptions
		},
	})
}

// endpoint is the RemoteEndpoint of one entry of -remotes.
func endpoint(r vxlandriver.Remote) (cable.RemoteEndpoint, error) {
	a, err := netip.ParseAddr(r.Address)
	if err != nil {
		return cable.RemoteEndpoint{}, fmt.Errorf("remote %s address: %w", r.Cluster, err)
	}
	subnets, err := peer.Prefixes(strings.Join(r.Subnets, ","))
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
	peer.LogToStderr()
	local, err := peer.Prefixes(*localSubnets)
	if err != nil {
		return fmt.Errorf("-local-subnets: %w", err)
	}
	adv, err := netip.ParseAddr(*advertise)
	if err != nil {
		return fmt.Errorf("-advertise: %w", err)
	}
	var remotes []vxlandriver.Remote
	if err := json.Unmarshal([]byte(*remotesJSON), &remotes); err != nil {
		return fmt.Errorf("-remotes: %w", err)
	}
	byName := map[string]vxlandriver.Remote{}
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
	var st vxlandriver.MultiStatus
	st.PID = os.Getpid()
	write := func() {
		refresh(ctx, d, &st.Status)
		peer.WriteJSON(*statusPath, st)
	}
	connect := func(name string, opts map[string]string) error {
		r, ok := byName[name]
		if !ok {
			return fmt.Errorf("cluster %q is not in -remotes", name)
		}
		ep, err := endpoint(r)
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
			var cmd vxlandriver.Command
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
	out, _ := json.Marshal(vxlandriver.Transfer{Bytes: n, SHA256: hex.EncodeToString(h.Sum(nil))})
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
	out, _ := json.Marshal(vxlandriver.Transfer{Bytes: sent, SHA256: hex.EncodeToString(h.Sum(nil))})
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
