// Package mss_test shows, as root in network namespaces (prefix "cbtm-"), that cable/mss clamps
// the MSS of TCP SYNs forwarded out of a tunnel link to the route's MTU, with the link given as
// the drivers' Links() name them (an exact name, or a prefix ending in '*'), and that Remove
// leaves nothing behind.
//
// Topology: client ns A -- router ns R -- server ns C. R's interface towards C is called
// "cbl-tmc" (a tunnel name) and R's route to C's subnet has mtu 1300, so a clamped SYN carries
// MSS 1260 (1300 - 40) and the server's accepted socket reports TCP_MAXSEG <= 1260; unclamped it
// carries A's 1460.
package mss_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/cable/mss"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

const nsPrefix = "cbtm-"

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func sweep() {
	out, _ := exec.Command("ip", "netns", "list").Output()
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], nsPrefix) {
			_ = exec.Command("ip", "netns", "del", f[0]).Run()
		}
	}
}

type topo struct{ a, r, c string }

func setup(t *testing.T) topo {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for network namespaces and nftables")
	}
	id := os.Getpid() % 100000
	tp := topo{a: fmt.Sprintf("%s%d-a", nsPrefix, id), r: fmt.Sprintf("%s%d-r", nsPrefix, id), c: fmt.Sprintf("%s%d-c", nsPrefix, id)}
	// Namespaces of an earlier run of this test that died before its cleanup.
	sweep()
	t.Cleanup(func() {
		for _, ns := range []string{tp.a, tp.r, tp.c} {
			_ = exec.Command("ip", "netns", "del", ns).Run()
		}
	})
	for _, ns := range []string{tp.a, tp.r, tp.c} {
		run(t, "ip", "netns", "add", ns)
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	run(t, "ip", "link", "add", "cbtm-a0", "netns", tp.a, "type", "veth", "peer", "name", "r-a", "netns", tp.r)
	run(t, "ip", "link", "add", "cbtm-c0", "netns", tp.c, "type", "veth", "peer", "name", "cbl-tmc", "netns", tp.r)
	run(t, "ip", "-n", tp.a, "addr", "add", "10.77.1.2/24", "dev", "cbtm-a0")
	run(t, "ip", "-n", tp.a, "link", "set", "cbtm-a0", "up")
	run(t, "ip", "-n", tp.a, "route", "add", "default", "via", "10.77.1.1")
	run(t, "ip", "-n", tp.r, "addr", "add", "10.77.1.1/24", "dev", "r-a")
	run(t, "ip", "-n", tp.r, "addr", "add", "10.77.2.1/24", "dev", "cbl-tmc")
	run(t, "ip", "-n", tp.r, "link", "set", "r-a", "up")
	run(t, "ip", "-n", tp.r, "link", "set", "cbl-tmc", "up")
	run(t, "ip", "-n", tp.r, "route", "replace", "10.77.2.0/24", "dev", "cbl-tmc", "src", "10.77.2.1", "mtu", "1300")
	run(t, "ip", "netns", "exec", tp.r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	run(t, "ip", "-n", tp.c, "addr", "add", "10.77.2.2/24", "dev", "cbtm-c0")
	run(t, "ip", "-n", tp.c, "link", "set", "cbtm-c0", "up")
	run(t, "ip", "-n", tp.c, "route", "add", "default", "via", "10.77.2.1")
	return tp
}

// serverMSS connects from A to a server in C and returns TCP_MAXSEG of the server's accepted
// socket: the MSS it may send, bounded by what the client's SYN advertised as it arrived.
func serverMSS(t *testing.T, tp topo) int {
	t.Helper()
	var ln net.Listener
	if err := nstest.Within(tp.c, func() (err error) {
		ln, err = net.Listen("tcp4", "10.77.2.2:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type res struct {
		mss int
		err error
	}
	got := make(chan res, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- res{err: err}
			return
		}
		defer c.Close()
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			got <- res{err: err}
			return
		}
		var mss int
		var serr error
		if err := raw.Control(func(fd uintptr) { mss, serr = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) }); err != nil {
			serr = err
		}
		got <- res{mss: mss, err: serr}
	}()
	if err := nstest.Within(tp.a, func() error {
		c, err := net.DialTimeout("tcp4", ln.Addr().String(), 5*time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	}); err != nil {
		t.Fatalf("connect A -> C: %v", err)
	}
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.mss
	case <-time.After(5 * time.Second):
		t.Fatal("the server accepted nothing")
	}
	return 0
}

func TestForwardedSYNsAreClampedToTheRouteMTU(t *testing.T) {
	tp := setup(t)

	if mss := serverMSS(t, tp); mss <= 1260 {
		t.Fatalf("without clamping the server already sees MSS %d: the topology does not test anything", mss)
	}

	// An exact name matches that link alone: "cbl-tm" is not "cbl-tmc".
	if err := nstest.Within(tp.r, func() error { return mss.Ensure([]string{"cbl-tm"}) }); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if mss := serverMSS(t, tp); mss <= 1260 {
		t.Fatalf("clamping the exact link cbl-tm clamped cbl-tmc too: the server sees MSS %d", mss)
	}
	if err := nstest.Within(tp.r, func() error { return mss.Ensure([]string{"cbl-tmc", "ipsec0"}) }); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	if mss := serverMSS(t, tp); mss > 1260 {
		t.Fatalf("with the exact link cbl-tmc clamped the server sees MSS %d, want at most 1260 (route mtu 1300 - 40)", mss)
	}

	links := []string{"cbl-*", "ipsec0"}
	if err := nstest.Within(tp.r, func() error { return mss.Ensure(links) }); err != nil {
		t.Fatalf("Ensure: %v", err)
	}
	// Idempotent: a second Ensure leaves the same table.
	if err := nstest.Within(tp.r, func() error { return mss.Ensure(links) }); err != nil {
		t.Fatalf("second Ensure: %v", err)
	}
	if err := nstest.Within(tp.r, func() error {
		spec, ok, err := mss.Installed()
		if err != nil || !ok || !spec.Equal(mss.Want(links)) {
			return fmt.Errorf("installed = %v, %v, %v", spec, ok, err)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if mss := serverMSS(t, tp); mss > 1260 {
		t.Fatalf("with clamping the server sees MSS %d, want at most 1260 (route mtu 1300 - 40)", mss)
	} else {
		t.Logf("clamped MSS seen by the server: %d", mss)
	}
	// The namespaces the rule is not in are untouched.
	for _, ns := range []string{tp.a, tp.c} {
		if err := nstest.Within(ns, func() error {
			if _, ok, err := mss.Installed(); ok || err != nil {
				return fmt.Errorf("table in %s: %v %v", ns, ok, err)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}

	if err := nstest.Within(tp.r, mss.Remove); err != nil {
		t.Fatalf("Remove: %v", err)
	}
	if err := nstest.Within(tp.r, func() error {
		if _, ok, err := mss.Installed(); ok || err != nil {
			return fmt.Errorf("after Remove: table present %v, err %v", ok, err)
		}
		return mss.Remove() // removing twice is no error
	}); err != nil {
		t.Fatal(err)
	}
	if mss := serverMSS(t, tp); mss <= 1260 {
		t.Fatalf("after Remove the server still sees a clamped MSS %d", mss)
	}
}
