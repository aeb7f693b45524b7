package netns

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/cable/vxlanipsec"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// The combined cable vxlan+ipsec on a kernel with ESP (the VM of tests/vm): VXLAN between the
// gateways, its UDP protected by transport-mode ESP SAs that the driver's own charon negotiates.

// vxlanIPsecRouteMTU is the route MTU the driver derives on the harness's underlay: VXLAN's
// overhead and the worst case of transport-mode ESP with AES-GCM.
const vxlanIPsecRouteMTU = underlayMTU - vxlanipsec.Overhead

// TestKernelVxlanIPsec puts a two-cluster pair on vxlan+ipsec by policy and checks, from both
// gateways: the VXLAN link; two transport-mode ESP SAs (AES-GCM, no UDP encapsulation) between
// the underlay addresses and charon's transport policies narrowed to the VXLAN port; ping and a
// TCP transfer pod to pod; the route MTU (a DF ping of exactly that size crosses, one byte more
// is refused); and, captured on a gateway's underlay link during the traffic, ESP packets between
// the gateways and no plain VXLAN UDP.
func TestKernelVxlanIPsec(t *testing.T) {
	harness.RequireRoot(t)
	if _, espErr := probeKernelDatapaths(); espErr != nil {
		t.Skipf("skipping: this kernel (%s) has no kernel ESP (modules esp4, xfrm_user: %v), which vxlan+ipsec's transport mode needs; this test runs in the VM of tests/vm (make vm-test), and TestVxlanIPsecRefusedWithoutKernelESP tests the refusal here",
			kernelRelease(), espErr)
	}
	harness.RequireIPsec(t)
	m := harness.New(t)
	extra := fmt.Sprintf("cableDrivers: [wireguard, %s]\n", DriverVXLANIPsec)
	left := m.AddLabelledCluster("left", "10.1.0.0/16", "pair=switch", extra)
	right := m.AddLabelledCluster("right", "10.2.0.0/16", "pair=switch", extra)
	both := []*harness.Cluster{left, right}
	m.Apply(m.PolicyFile("switch-pair-vxlan-ipsec.yaml", pairPolicy(DriverVXLANIPsec)))
	started := time.Now()
	for _, c := range both {
		c.StartAgent()
	}
	// 4 minutes: under TCG with the machine's two cores shared, the agents' start (join, two
	// charons, IKE) took 1m32s in one run; idle it is a few seconds.
	conv := m.WaitWants(4*time.Minute, started, both, nil, harness.Connected(DriverVXLANIPsec))
	m.Logf("connected over vxlan+ipsec %s after the agents started", conv.ConnectedAfter("left", "right").Round(time.Millisecond))
	for _, c := range both {
		c.StartTCPServer()
	}
	link := fmt.Sprintf("%s%d", vxlanipsec.DefaultInterfacePrefix, vxlanipsec.DefaultVNI)
	for _, c := range both {
		o := map[*harness.Cluster]*harness.Cluster{left: right, right: left}[c]
		if kind, _ := linkKind(c, link); kind != "vxlan" {
			t.Errorf("%s: link %s has kind %q, want vxlan", c.Name, link, kind)
		}
		checkTransportSAs(t, m, c, o)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Traffic, captured on left's underlay link.
	var esp, plain, between int
	var capErr error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		esp, plain, between, capErr = captureUnderlay(left.GwNS, "eth0", left.GwUnderlay, right.GwUnderlay, vxlanipsec.DefaultVXLANPort, stop)
	}()
	time.Sleep(300 * time.Millisecond) // the socket is open before the first packet
	if ok, r := m.PingOK(left.PodNS, right.PodIP, 5); !ok {
		t.Errorf("ping left pod -> right pod: %d/%d replies: %v %s", r.Received, r.Transmitted, r.Err, r.Output)
	}
	if ok, r := m.PingOK(right.PodNS, left.PodIP, 5); !ok {
		t.Errorf("ping right pod -> left pod: %d/%d replies: %v %s", r.Received, r.Transmitted, r.Err, r.Output)
	}
	tr, err := m.TCPTransfer(left.PodNS, right.PodIP, TransferBytes)
	if err != nil {
		t.Errorf("TCP transfer left pod -> right pod: %v", err)
	} else {
		m.Logf("TCP transfer left pod -> right pod over vxlan+ipsec: %+v", tr)
	}
	close(stop)
	wg.Wait()
	m.Logf("captured on left's underlay eth0 between %s and %s: %d packets, %d ESP, %d plain UDP to or from port %d",
		left.GwUnderlay, right.GwUnderlay, between, esp, plain, vxlanipsec.DefaultVXLANPort)
	switch {
	case capErr != nil:
		t.Errorf("capture on left's underlay: %v", capErr)
	case plain != 0:
		t.Errorf("%d plain VXLAN packets (UDP port %d) crossed the underlay unencrypted", plain, vxlanipsec.DefaultVXLANPort)
	case esp < 20:
		// 10 echo requests, 10 replies and a 4 MiB transfer both ways: thousands of packets.
		t.Errorf("only %d ESP packets between the gateways during the traffic", esp)
	}
	for _, c := range both {
		o := map[*harness.Cluster]*harness.Cluster{left: right, right: left}[c]
		states, err := xfrmStates(m, c.GwNS)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		for _, sa := range pairSAs(states, c.GwUnderlay, o.GwUnderlay) {
			if sa.Packets == 0 {
				t.Errorf("%s: SA %s carried no packets", c.Name, sa)
			}
		}
	}

	// Route MTU and the DF pings at the edge, both ways.
	for _, p := range [][2]*harness.Cluster{{left, right}, {right, left}} {
		from, to := p[0], p[1]
		rt, err := getRoute(m, from.GwNS, to.PodIP)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		m.Logf("%s gateway's route to %s: dev %s mtu %d advmss %d", from.Name, to.PodIP, rt.Dev, rt.MTU, rt.AdvMSS)
		if rt.Dev != link || rt.MTU != vxlanIPsecRouteMTU {
			t.Errorf("%s gateway's route to %s: dev %s mtu %d, want %s mtu %d (%s)", from.Name, to.PodIP, rt.Dev, rt.MTU, link, vxlanIPsecRouteMTU, rt.Raw)
		}
		_ = harness.Run(m.Ctx, "ip", "-n", from.PodNS, "route", "flush", "cache")
		if r := m.PingDF(from.PodNS, to.PodIP, vxlanIPsecRouteMTU, 3); r.Err != nil || r.Received != 3 {
			t.Errorf("%d-byte DF ping %s pod -> %s pod: %d/%d replies: %v %s", vxlanIPsecRouteMTU, from.Name, to.Name, r.Received, r.Transmitted, r.Err, r.Output)
		}
		if out, received := oversizePing(m, from.PodNS, to.PodIP, vxlanIPsecRouteMTU+1); received != 0 || firstLineWith(out, "message too long") == "" {
			t.Errorf("%d-byte DF ping %s pod -> %s pod: %d replies, want none and \"message too long\": %s", vxlanIPsecRouteMTU+1, from.Name, to.Name, received, out)
		}
	}
	if t.Failed() {
		dumpCharonLogs(m, both)
		t.FailNow()
	}

	// An agent restart under a TCP stream: the next agent adopts the charon with its SAs, finds
	// the link and the guards in place, and nothing flaps (same SPIs, counters continue).
	before := map[string][]xfrmSA{}
	for _, c := range both {
		o := map[*harness.Cluster]*harness.Cluster{left: right, right: left}[c]
		states, err := xfrmStates(m, c.GwNS)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		before[c.Name] = pairSAs(states, c.GwUnderlay, o.GwUnderlay)
	}
	restartUnderStream(t, m, left, right, DriverVXLANIPsec)
	for _, c := range both {
		o := map[*harness.Cluster]*harness.Cluster{left: right, right: left}[c]
		states, err := xfrmStates(m, c.GwNS)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		after := pairSAs(states, c.GwUnderlay, o.GwUnderlay)
		m.Logf("%s: SAs before left's agent restart %v; after %v", c.Name, before[c.Name], after)
		if !slices.Equal(spis(after), spis(before[c.Name])) {
			t.Errorf("%s: the SAs were rebuilt across left's agent restart: SPIs %v -> %v", c.Name, spis(before[c.Name]), spis(after))
		}
	}
	if log := logSinceRestart(left); !strings.Contains(log, "adopted the running charon") {
		t.Errorf("left's restarted agent did not adopt vxlan+ipsec's charon; its log:\n%s", lastLines(log, 30))
	}

	// The pair moves to wireguard: the combined cable leaves nothing of the pair behind (link,
	// SAs, charon's policies, guards) and the pair carries traffic over the new cable.
	t0 := m.Apply(m.PolicyFile("switch-pair-wireguard.yaml", pairPolicy(harness.DriverWireGuard)))
	m.WaitWants(4*time.Minute, t0, both, nil, harness.Connected(harness.DriverWireGuard))
	for _, c := range both {
		o := map[*harness.Cluster]*harness.Cluster{left: right, right: left}[c]
		err := harness.WaitFor(30*time.Second, 500*time.Millisecond, func() (bool, string) {
			var leftover []string
			if kind, _ := linkKind(c, link); kind != "" {
				leftover = append(leftover, "link "+link)
			}
			if states, err := xfrmStates(m, c.GwNS); err != nil || len(pairSAs(states, c.GwUnderlay, o.GwUnderlay)) != 0 {
				leftover = append(leftover, fmt.Sprintf("ESP SAs (%v)", err))
			}
			if r := harness.Run(m.Ctx, "ip", "-n", c.GwNS, "xfrm", "policy"); r.Err != nil || strings.Contains(r.Stdout, "dport "+fmt.Sprint(vxlanipsec.DefaultVXLANPort)) {
				leftover = append(leftover, "xfrm policies: "+r.Stdout+r.Stderr)
			}
			return len(leftover) == 0, strings.Join(leftover, "; ")
		})
		if err != nil {
			t.Errorf("%s: after the pair left vxlan+ipsec: %v", c.Name, err)
		}
	}
	if r := m.TCPCheck(left.PodNS, right.PodIP); r.Err != nil || strings.TrimSpace(r.Stdout) != "ok" {
		t.Errorf("tcp left pod -> right pod after the move to wireguard: %s", r)
	}
	if t.Failed() {
		dumpCharonLogs(m, both)
	}
}

func dumpCharonLogs(m *harness.Mesh, clusters []*harness.Cluster) {
	for _, c := range clusters {
		b, _ := os.ReadFile(filepath.Join(c.StateDir, DriverVXLANIPsec, "charon.log"))
		m.Logf("%s: charon.log of vxlan+ipsec:\n%s", c.Name, lastLines(string(b), 40))
	}
}

// checkTransportSAs checks that c's kernel holds the pair's two transport-mode ESP SAs (AES-GCM,
// no UDP encapsulation) between the gateways' underlay addresses, and charon's transport-mode
// policies for UDP between the VXLAN ports beside the driver's guard policies.
func checkTransportSAs(t *testing.T, m *harness.Mesh, c, remote *harness.Cluster) {
	t.Helper()
	states, err := xfrmStates(m, c.GwNS)
	if err != nil {
		t.Errorf("%s: %v", c.Name, err)
		return
	}
	sas := pairSAs(states, c.GwUnderlay, remote.GwUnderlay)
	m.Logf("%s: kernel SAs with %s: %v", c.Name, remote.Name, sas)
	if len(sas) != 2 {
		t.Errorf("%s: %d ESP SAs between %s and %s, want 2 (one each way): %v", c.Name, len(sas), c.GwUnderlay, remote.GwUnderlay, sas)
	}
	for _, s := range sas {
		if s.Mode != "transport" || !strings.Contains(s.AEAD, "rfc4106(gcm(aes))") || s.Encap != "" {
			t.Errorf("%s: SA %s: want transport mode, rfc4106(gcm(aes)), no UDP encapsulation", c.Name, s)
		}
	}
	r := harness.Run(m.Ctx, "ip", "-n", c.GwNS, "xfrm", "policy")
	if r.Err != nil {
		t.Errorf("%s: ip xfrm policy: %s", c.Name, r)
		return
	}
	port := fmt.Sprint(vxlanipsec.DefaultVXLANPort)
	out := fmt.Sprintf("src %s/32 dst %s/32 proto udp sport %s dport %s", c.GwUnderlay, remote.GwUnderlay, port, port)
	if !strings.Contains(r.Stdout, out) || !strings.Contains(r.Stdout, "mode transport") {
		t.Errorf("%s: no transport-mode policy %q in:\n%s", c.Name, out, r.Stdout)
	}
	guard := fmt.Sprintf("src %s/32 dst %s/32 proto udp dport %s", c.GwUnderlay, remote.GwUnderlay, port)
	if !strings.Contains(r.Stdout, guard) || !strings.Contains(r.Stdout, "action block") {
		t.Errorf("%s: no guard policy %q (action block) in:\n%s", c.Name, guard, r.Stdout)
	}
}

// captureUnderlay counts the IPv4 packets between a and b on link dev of namespace ns (an
// AF_PACKET socket, both directions, as they are on the wire) until stop is closed: ESP ones,
// plain UDP ones to or from port, and all of them.
func captureUnderlay(ns, dev string, a, b netip.Addr, port uint16, stop <-chan struct{}) (esp, plain, between int, err error) {
	fd, err := packetSocketIn(ns, dev)
	if err != nil {
		return 0, 0, 0, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 65536)
	for {
		select {
		case <-stop:
			return esp, plain, between, nil
		default:
		}
		n, _, rerr := unix.Recvfrom(fd, buf, 0)
		if rerr != nil {
			if rerr == unix.EAGAIN || rerr == unix.EINTR {
				continue
			}
			return esp, plain, between, fmt.Errorf("read from the packet socket on %s in %s: %w", dev, ns, rerr)
		}
		f := buf[:n]
		if len(f) < 14+20 || binary.BigEndian.Uint16(f[12:14]) != unix.ETH_P_IP {
			continue
		}
		ip := f[14:]
		src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		if !(src == a && dst == b || src == b && dst == a) {
			continue
		}
		between++
		switch proto, ihl := ip[9], int(ip[0]&0x0f)*4; {
		case proto == unix.IPPROTO_ESP:
			esp++
		case proto == unix.IPPROTO_UDP && len(ip) >= ihl+4:
			if binary.BigEndian.Uint16(ip[ihl:]) == port || binary.BigEndian.Uint16(ip[ihl+2:]) == port {
				plain++
			}
		}
	}
}

// packetSocketIn opens an AF_PACKET socket bound to dev inside namespace ns, on a thread that
// enters ns and comes back (the socket keeps the namespace it was made in), with a short receive
// timeout so the reader notices stop.
func packetSocketIn(ns, dev string) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		back, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		defer back.Close()
		target, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			ch <- result{-1, fmt.Errorf("enter %s: %w", ns, err)}
			return
		}
		fd, err := openPacketSocket(dev)
		if err := unix.Setns(int(back.Fd()), unix.CLONE_NEWNET); err != nil {
			// The thread stays locked and ends with the goroutine: it is in the wrong namespace.
			ch <- result{fd, fmt.Errorf("return from %s: %w", ns, err)}
			return
		}
		runtime.UnlockOSThread()
		ch <- result{fd, err}
	}()
	r := <-ch
	if r.err != nil && r.fd >= 0 {
		unix.Close(r.fd)
		return -1, r.err
	}
	return r.fd, r.err
}

func openPacketSocket(dev string) (int, error) {
	ifi, err := net.InterfaceByName(dev)
	if err != nil {
		return -1, err
	}
	proto := int(htons(unix.ETH_P_ALL))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, proto)
	if err != nil {
		return -1, fmt.Errorf("packet socket: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: ifi.Index}); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("bind the packet socket to %s: %w", dev, err)
	}
	tv := unix.NsecToTimeval((200 * time.Millisecond).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
