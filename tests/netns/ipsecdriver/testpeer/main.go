// Command testpeer runs the ipsec cable driver alone, for the netns test of the driver: run it
// inside a node's network namespace with `ip netns exec`. It reads the pair's pre-shared key as
// one line of hex from standard input (so it is in no file, argument or environment variable),
// then calls New, Init and Connect (twice, to record that the second changes nothing), and
// serves until a signal as package tests/netns/nstest/peer describes (SIGTERM and SIGINT Close
// the driver without cleanup, as an agent exit does: charon keeps running, for the next testpeer
// to adopt; SIGUSR2 cleans up, which stops it).
//
// It writes a JSON Status to -status every 200ms and after every action.
//
// With -hold it stops after Init, reports Ready and waits for SIGUSR1 before the first Connect,
// so a test can start the two ends' Connects in an order and at times of its choosing; it then
// records when its Connect returned and when it first saw the connection connected (a CHILD_SA
// INSTALLED), polling every 10ms.
package main

import (
	"bufio"
	"context"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/tests/netns/ipsecdriver"
	"github.com/cablemesh/cablemesh/tests/netns/nstest/peer"
)

func main() { peer.Main(run) }

func run() error {
	var f peer.Flags
	f.Register(flag.CommandLine, 500)
	settingsFlag := flag.String("settings", "", "comma-separated driver settings k=v")
	hold := flag.Bool("hold", false, "after Init, wait for SIGUSR1 before the first Connect and time it")
	flag.Parse()
	local, remote, err := f.Endpoints()
	if err != nil {
		return err
	}
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read the pre-shared key from stdin: %w", err)
	}
	remote.PreSharedKey, err = hex.DecodeString(strings.TrimSpace(line))
	if err != nil {
		return fmt.Errorf("pre-shared key on stdin is not hex")
	}
	settings := cable.Settings{}
	for _, kv := range strings.Split(*settingsFlag, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			settings[k] = v
		}
	}
	d, err := ipsec.NewDriver(local, settings)
	if err != nil {
		return err
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var st ipsecdriver.Status
	st.PID = os.Getpid()
	write := func() {
		if st.Live() {
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
		peer.WriteJSON(f.StatusPath, st)
	}

	if err := d.Init(ctx); err != nil {
		return err
	}
	st.Datapath, st.MTU, st.ViciSocket, st.Links = string(d.Datapath()), d.MTU(), d.ViciSocket(), d.Links()
	if *hold {
		// Caught before Ready is written: SIGUSR1's default action would end the process.
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGUSR1, syscall.SIGTERM, syscall.SIGINT)
		st.Ready = true
		write()
		if s := <-sigs; s != syscall.SIGUSR1 {
			return d.Close()
		}
		signal.Stop(sigs)
	}
	if err := st.ConnectTwice(ctx, d, remote, nil); err != nil {
		d.Cleanup(ctx)
		return err
	}
	st.ConnectReturned = time.Now()
	write()
	if *hold {
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if conns, err := d.Connections(ctx); err == nil && len(conns) == 1 && conns[0].State == cable.StateConnected {
				st.Installed = time.Now()
				break
			}
		}
		write()
	}
	return peer.Serve(ctx, d, remote, nil, &st.Status, write, st.CloseChecked(d, write), nil)
}
