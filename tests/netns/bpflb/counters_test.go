package bpflb

import (
	"context"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/bpf"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

func TestCountersCountEachRemoteClusterBySubnetOnAVeth(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	opts := bpf.Options{PinDir: e.pinDir, Log: e.opts.Log}
	ctr, err := bpf.OpenCounters(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctr.Close() })
	// tcx resolves the interface in the calling thread's namespace: attach from the client's.
	if err := inNamespace(e.clientNS, func() error { return ctr.Attach(clientDev) }); err != nil {
		t.Fatal(err)
	}
	err = ctr.SetSubnets(map[netip.Prefix]uint32{
		netip.PrefixFrom(backendA4, 32):        1,
		netip.MustParsePrefix("10.231.0.3/32"): 2,
		netip.MustParsePrefix("fd00:231::/64"): 3,
	})
	if err != nil {
		t.Fatal(err)
	}

	ping := func(count, size string, dst netip.Addr) {
		nstest.MustRun(t, "ip", "netns", "exec", e.clientNS, "ping", "-c", count, "-s", size, "-i", "0.05", "-W", "2", dst.String())
	}
	ping("5", "100", backendA4)
	ping("3", "200", backendB4)
	ping("4", "100", backendA6)

	got, err := ctr.Read()
	if err != nil {
		t.Fatal(err)
	}
	// IPv4 echo: 14 (Ethernet) + 20 (IP) + 8 (ICMP) + payload bytes each way, and nothing else
	// (ARP is not IP).
	want1 := bpf.ClusterCounters{RxPackets: 5, RxBytes: 5 * 142, TxPackets: 5, TxBytes: 5 * 142}
	want2 := bpf.ClusterCounters{RxPackets: 3, RxBytes: 3 * 242, TxPackets: 3, TxBytes: 3 * 242}
	if got[1] != want1 {
		t.Errorf("cluster 1 (10.231.0.2/32): %+v, want %+v", got[1], want1)
	}
	if got[2] != want2 {
		t.Errorf("cluster 2 (10.231.0.3/32): %+v, want %+v", got[2], want2)
	}
	// IPv6 echo: 14 + 40 + 8 + 100; neighbour discovery from and to the peer adds some.
	if c := got[3]; c.TxPackets < 4 || c.RxPackets < 4 || c.TxBytes < 4*162 || c.RxBytes < 4*162 {
		t.Errorf("cluster 3 (fd00:231::/64): %+v, want at least 4 packets of 162 bytes each way", c)
	}
	if len(got) != 3 {
		t.Errorf("counters of %d clusters, want 3: %+v", len(got), got)
	}

	// A restarted agent adopts the links and the counts.
	before, err := ctr.Attachments()
	if err != nil {
		t.Fatal(err)
	}
	ctr.Close()
	ctr, err = bpf.OpenCounters(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctr.Close() })
	if err := inNamespace(e.clientNS, func() error { return ctr.Attach(clientDev) }); err != nil {
		t.Fatal(err)
	}
	after, err := ctr.Attachments()
	if err != nil {
		t.Fatal(err)
	}
	ids := func(as []bpf.Attachment) map[string]uint32 {
		m := map[string]uint32{}
		for _, a := range as {
			m[a.Hook] = a.LinkID
		}
		return m
	}
	if b, a := ids(before), ids(after); len(a) != 2 || a["ctr_"+clientDev+"_ingress"] != b["ctr_"+clientDev+"_ingress"] || a["ctr_"+clientDev+"_egress"] != b["ctr_"+clientDev+"_egress"] {
		t.Errorf("links after reopening: %v, want the same as before: %v", a, b)
	}
	ping("1", "100", backendA4)
	got, err = ctr.Read()
	if err != nil {
		t.Fatal(err)
	}
	if got[1].TxPackets != 6 || got[1].RxPackets != 6 {
		t.Errorf("cluster 1 after reopening and one more ping: %+v, want 6 packets each way", got[1])
	}

	if err := ctr.Remove(); err != nil {
		t.Fatal(err)
	}
	for _, a := range after {
		if l, err := linkFromID(a.LinkID); err == nil {
			l.Close()
			t.Errorf("counter link %s (%d) still exists after Remove", a.Hook, a.LinkID)
		}
	}
}

// A TUN device (as wireguard-go and kernel-libipsec use) has no link-layer header: the
// counters must find the IP header at offset 0 there.
func TestCountersOnATUNDeviceCountIPPacketsWithoutALinkLayer(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	const dev = "cbtl-t"
	tun := openTUN(t, e, dev, "10.232.0.1/24")
	ctr := attachCounters(t, e, dev)
	if err := ctr.SetSubnets(map[netip.Prefix]uint32{netip.MustParsePrefix("10.232.0.0/24"): 4}); err != nil {
		t.Fatal(err)
	}

	// Out: three 100-byte UDP datagrams to the far side of the TUN (IP 20 + UDP 8 + 100).
	err := inNamespace(e.clientNS, func() error {
		c, err := net.Dial("udp", "10.232.0.2:9")
		if err != nil {
			return err
		}
		defer c.Close()
		for range 3 {
			if _, err := c.Write(make([]byte, 100)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// In: two packets from the far side, written into the TUN. tcx ingress sees them before IP
	// checks them, so a bare header is enough.
	in := make([]byte, 48)
	in[0], in[3], in[9] = 0x45, 48, 17 // IPv4, total length 48, UDP
	copy(in[12:16], []byte{10, 232, 0, 2})
	copy(in[16:20], []byte{10, 232, 0, 1})
	for range 2 {
		if _, err := tun.Write(in); err != nil {
			t.Fatal(err)
		}
	}

	want := bpf.ClusterCounters{TxPackets: 3, TxBytes: 3 * 128, RxPackets: 2, RxBytes: 2 * 48}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := ctr.Read()
		if err != nil {
			t.Fatal(err)
		}
		if got[4] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("cluster 4 on the TUN device: %+v, want %+v", got[4], want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// attachCounters opens the counters pinned in the test's pin directory and attaches them to dev
// in the client's namespace; they are closed with the test.
func attachCounters(t *testing.T, e *env, dev string) *bpf.Counters {
	t.Helper()
	ctr, err := bpf.OpenCounters(context.Background(), bpf.Options{PinDir: e.pinDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctr.Close() })
	if err := inNamespace(e.clientNS, func() error { return ctr.Attach(dev) }); err != nil {
		t.Fatal(err)
	}
	return ctr
}

// openTUN creates the TUN device dev in the client's namespace, with addr on it, up; it goes
// with the test.
func openTUN(t *testing.T, e *env, dev, addr string) *os.File {
	t.Helper()
	var tun *os.File
	err := inNamespace(e.clientNS, func() error {
		f, err := os.OpenFile("/dev/net/tun", os.O_RDWR, 0)
		if err != nil {
			return err
		}
		ifr, err := unix.NewIfreq(dev)
		if err != nil {
			f.Close()
			return err
		}
		ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
		if err := unix.IoctlIfreq(int(f.Fd()), unix.TUNSETIFF, ifr); err != nil {
			f.Close()
			return err
		}
		tun = f
		return nil
	})
	if err != nil {
		t.Skipf("needs a TUN device: %v", err)
	}
	t.Cleanup(func() { tun.Close() })
	nstest.MustRun(t, "ip", "-n", e.clientNS, "addr", "add", addr, "dev", dev)
	nstest.MustRun(t, "ip", "-n", e.clientNS, "link", "set", dev, "up")
	return tun
}

// The programs remember each CPU's last lookup: a subnet that moves to another cluster, or a
// more specific subnet added over an address, must count the next packet to the new cluster.
// Every datagram is sent from one thread pinned to one CPU (tcx egress runs there), so without
// the generation the loader bumps, the cached answer would be reused and this test would fail.
func TestCountersFollowSubnetChangesAtOnce(t *testing.T) {
	e := newEnv(t, bpf.DestroyAuto)
	const dev = "cbtl-g"
	openTUN(t, e, dev, "10.233.0.1/24")
	ctr := attachCounters(t, e, dev)
	send := func(n int) {
		t.Helper()
		err := inNamespace(e.clientNS, func() error {
			var orig, one unix.CPUSet
			if err := unix.SchedGetaffinity(0, &orig); err != nil {
				return err
			}
			defer unix.SchedSetaffinity(0, &orig)
			one.Set(0)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return err
			}
			c, err := net.Dial("udp", "10.233.0.2:9")
			if err != nil {
				return err
			}
			defer c.Close()
			for range n {
				if _, err := c.Write(make([]byte, 100)); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	set := func(subnets map[netip.Prefix]uint32) {
		t.Helper()
		if err := ctr.SetSubnets(subnets); err != nil {
			t.Fatal(err)
		}
	}
	wantTx := func(want map[uint32]uint64) {
		t.Helper()
		got, err := ctr.Read()
		if err != nil {
			t.Fatal(err)
		}
		for id, n := range want {
			if got[id].TxPackets != n {
				t.Errorf("cluster %d: %d packets out, want %d (all: %+v)", id, got[id].TxPackets, n, got)
			}
		}
	}

	set(map[netip.Prefix]uint32{netip.MustParsePrefix("10.233.0.0/24"): 4})
	send(3)
	wantTx(map[uint32]uint64{4: 3, 5: 0, 6: 0})
	set(map[netip.Prefix]uint32{netip.MustParsePrefix("10.233.0.0/24"): 5})
	send(2)
	wantTx(map[uint32]uint64{4: 3, 5: 2, 6: 0})
	set(map[netip.Prefix]uint32{netip.MustParsePrefix("10.233.0.0/24"): 5, netip.MustParsePrefix("10.233.0.2/32"): 6})
	send(4)
	wantTx(map[uint32]uint64{4: 3, 5: 2, 6: 4})
	set(map[netip.Prefix]uint32{})
	send(1)
	wantTx(map[uint32]uint64{4: 3, 5: 2, 6: 4})
}
