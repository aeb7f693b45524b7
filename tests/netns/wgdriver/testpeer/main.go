// Command testpeer runs the wireguard cable driver alone, for the netns test of the driver: run
// it inside a node's network namespace with `ip netns exec`. It calls RunIsolated, then New, Init
// and Connect (twice, to record that the second changes nothing), and serves until a signal as
// package tests/netns/nstest/peer describes (SIGTERM and SIGINT Close the driver and report the
// driver's goroutines left after it).
//
// It writes a JSON Status to -status every 200ms and after every action.
package main

import (
	"context"
	"flag"
	"os"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/wireguard"
	"github.com/cablemesh/cablemesh/tests/netns/nstest/peer"
	"github.com/cablemesh/cablemesh/tests/netns/wgdriver"
)

func main() {
	peer.Main(func() error {
		parentDone, code, err := wireguard.RunIsolated()
		if err != nil {
			return err
		}
		if parentDone {
			os.Exit(code)
		}
		return run()
	})
}

func run() error {
	var f peer.Flags
	f.Register(flag.CommandLine, 51820)
	iface := flag.String("interface", "", "wireguard interface setting (empty: default)")
	port := flag.String("port", "", "wireguard port setting (empty: default)")
	rKey := flag.String("remote-key", "", "remote public key (base64)")
	rDevice := flag.String("remote-device", "", "device kind the remote publishes (kernel, userspace; empty: none)")
	flag.Parse()
	local, remote, err := f.Endpoints()
	if err != nil {
		return err
	}
	remote.Attributes = map[string]string{wireguard.AttrPublicKey: *rKey}
	if *rDevice != "" {
		remote.Attributes[wireguard.AttrDevice] = *rDevice
	}
	settings := cable.Settings{}
	if *iface != "" {
		settings["interface"] = *iface
	}
	if *port != "" {
		settings["port"] = *port
	}
	d, err := wireguard.NewDriver(local, settings)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var st wgdriver.Status
	st.PID = os.Getpid()
	write := func() {
		if st.Live() {
			conns, err := d.Connections(ctx)
			if err != nil {
				st.Error = err.Error()
			}
			st.Connections = conns
		}
		st.Stats = d.Stats()
		st.Handshakes = d.HandshakeStats()
		_, serr := os.Stat(wireguard.UAPISocketPath(d.Interface()))
		st.SocketExists = serr == nil
		peer.WriteJSON(f.StatusPath, st)
	}

	if err := d.Init(ctx); err != nil {
		return err
	}
	st.Kind = d.DeviceKind()
	le := d.LocalEndpoint()
	st.PublicKey, st.Port = le.Attributes[wireguard.AttrPublicKey], le.Port
	if err := st.ConnectTwice(ctx, d, remote, nil); err != nil {
		return err
	}
	write()
	return peer.Serve(ctx, d, remote, nil, &st.Status, write, st.CloseChecked(d, write), nil)
}
