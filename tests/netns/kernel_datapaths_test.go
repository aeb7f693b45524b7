package netns

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/cable/ipsec"
	"github.com/cablemesh/cablemesh/cable/vxlan"
	"github.com/cablemesh/cablemesh/cable/wireguard"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// The tests in this file need the kernel datapaths the test machines' own kernel lacks: a
// kernel WireGuard device and kernel ESP (xfrm SAs). They run in the VM of tests/vm (make
// vm-test), which boots Debian's stock kernel; elsewhere they skip, naming the missing module.

// underlayMTU is the MTU of the harness's underlay (veth pairs on a bridge).
const underlayMTU = 1500

// ESP in tunnel mode with AES-GCM-16 (the ipsec driver's default proposal, aes256gcm16) over
// IPv4, UDP-encapsulated (the driver's default, encap=yes), as the kernel builds it (esp4.c):
// outer IPv4 20 + UDP 8 + ESP header 8 + IV 8, the payload plus 2 trailer bytes padded to a
// multiple of 4, ICV 16.
const (
	espOuterIPv4 = 20
	espUDPEncap  = 8
	espHeader    = 8
	espGCMIV     = 8
	espTrailer   = 2
	espGCMICV    = 16
	espAlign     = 4
)

// kernelESPCeiling is the largest inner packet the kernel's ESP carries in one outer packet of
// mtu bytes (esp4_get_mtu: ((mtu - header_len - authsize) & ~(align-1)) - 2).
func kernelESPCeiling(mtu int, encap bool) int {
	hdr := espOuterIPv4 + espHeader + espGCMIV
	if encap {
		hdr += espUDPEncap
	}
	return ((mtu-hdr-espGCMICV)&^(espAlign-1) - espTrailer)
}

// ipsecKernelRouteMTU is the route MTU the ipsec driver derives for kernel ESP: the underlay's
// less the worst case of the kernel's ESP per packet (up to 3 bytes of padding), with UDP
// encapsulation, for AES-GCM (cable/ipsec tunnelMTU).
const ipsecKernelRouteMTU = underlayMTU - (espOuterIPv4 + espUDPEncap + espHeader + espGCMIV + (espAlign - 1) + espTrailer + espGCMICV)

// requireKernelDatapaths skips unless the kernel can make a WireGuard link and hold an ESP SA,
// probed in a throwaway network namespace (the modules may be built in, so /sys/module says
// little).
func requireKernelDatapaths(t *testing.T) {
	t.Helper()
	harness.RequireRoot(t)
	wgErr, espErr := probeKernelDatapaths()
	var missing []string
	if wgErr != nil {
		missing = append(missing, fmt.Sprintf("no kernel WireGuard (module wireguard: %v)", wgErr))
	}
	if espErr != nil {
		missing = append(missing, fmt.Sprintf("no kernel ESP (modules esp4, xfrm_user: %v)", espErr))
	}
	if len(missing) > 0 {
		t.Skipf("skipping: this kernel (%s) has %s; these tests run in the VM of tests/vm (make vm-test)", kernelRelease(), strings.Join(missing, " and "))
	}
}

func kernelRelease() string {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// probeKernelDatapaths adds a WireGuard link and an ESP state in a new network namespace on a
// thread of its own, which is never given back to the runtime (it ends with the goroutine).
func probeKernelDatapaths() (wgErr, espErr error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		runtime.LockOSThread() // not unlocked: the thread is in a namespace of its own
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			wgErr, espErr = err, err
			return
		}
		la := netlink.NewLinkAttrs()
		la.Name = "cbl-probe"
		wgErr = netlink.LinkAdd(&netlink.Wireguard{LinkAttrs: la})
		_, espErr = ipsec.KernelHasESP()
	}()
	<-done
	return wgErr, espErr
}

// linkKind is the kind (`ip -d link`) of link name in ns, "" when it does not exist.
func linkKind(c *harness.Cluster, name string) (kind string, ifindex int) {
	r := harness.Run(context.Background(), "ip", "-n", c.GwNS, "-d", "-j", "link", "show", "dev", name)
	var links []struct {
		Index    int `json:"ifindex"`
		LinkInfo struct {
			Kind string `json:"info_kind"`
		} `json:"linkinfo"`
	}
	if r.Err != nil || json.Unmarshal([]byte(r.Stdout), &links) != nil || len(links) != 1 {
		return "", 0
	}
	return links[0].LinkInfo.Kind, links[0].Index
}

// routeGet is `ip route get dst` in ns: the link, the route's mtu and advmss (0 when unset).
type routeGet struct {
	Dev    string
	MTU    int
	AdvMSS int
	Raw    string
}

func getRoute(m *harness.Mesh, ns string, dst netip.Addr) (routeGet, error) {
	r := harness.Run(m.Ctx, "ip", "-n", ns, "-j", "-d", "route", "get", dst.String())
	if r.Err != nil {
		return routeGet{}, fmt.Errorf("%s", r)
	}
	var routes []struct {
		Dev     string           `json:"dev"`
		Metrics []map[string]any `json:"metrics"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &routes); err != nil || len(routes) != 1 {
		return routeGet{}, fmt.Errorf("decode `ip route get %s` in %s: %v: %q", dst, ns, err, r.Stdout)
	}
	g := routeGet{Dev: routes[0].Dev, Raw: strings.TrimSpace(r.Stdout)}
	for _, mt := range routes[0].Metrics {
		if v, ok := mt["mtu"].(float64); ok {
			g.MTU = int(v)
		}
		if v, ok := mt["advmss"].(float64); ok {
			g.AdvMSS = int(v)
		}
	}
	return g, nil
}

// xfrmSA is one state of `ip -s xfrm state`.
type xfrmSA struct {
	Src, Dst string
	Proto    string
	SPI      string
	Mode     string
	AEAD     string
	Encap    string // "espinudp" with UDP encapsulation, "" without
	Bytes    uint64
	Packets  uint64
}

func (s xfrmSA) String() string {
	return fmt.Sprintf("%s %s->%s spi %s %s %s encap=%q %dB/%dpkt", s.Proto, s.Src, s.Dst, s.SPI, s.Mode, s.AEAD, s.Encap, s.Bytes, s.Packets)
}

var (
	xfrmSrcRE     = regexp.MustCompile(`^src (\S+) dst (\S+)`)
	xfrmProtoRE   = regexp.MustCompile(`proto (\S+) spi (0x[0-9a-f]+).* mode (\S+)`)
	xfrmAEADRE    = regexp.MustCompile(`^\s+aead (\S+)`)
	xfrmEncapRE   = regexp.MustCompile(`^\s+encap type (\S+)`)
	xfrmCurrentRE = regexp.MustCompile(`^\s+(\d+)\(bytes\), (\d+)\(packets\)`)
	xfrmLifeCurRE = regexp.MustCompile(`^\s+lifetime current:`)
)

// xfrmStates reads the kernel's SAs in ns. The output holds the keys: it is parsed, never logged.
func xfrmStates(m *harness.Mesh, ns string) ([]xfrmSA, error) {
	r := harness.Run(m.Ctx, "ip", "-n", ns, "-s", "xfrm", "state")
	if r.Err != nil {
		return nil, fmt.Errorf("ip -n %s -s xfrm state: exit %d: %s", ns, r.ExitCode, r.Stderr)
	}
	var out []xfrmSA
	current := false
	for _, l := range strings.Split(r.Stdout, "\n") {
		if mm := xfrmSrcRE.FindStringSubmatch(l); mm != nil {
			out = append(out, xfrmSA{Src: mm[1], Dst: mm[2]})
			current = false
			continue
		}
		if len(out) == 0 {
			continue
		}
		sa := &out[len(out)-1]
		switch {
		case xfrmProtoRE.MatchString(l):
			mm := xfrmProtoRE.FindStringSubmatch(l)
			sa.Proto, sa.SPI, sa.Mode = mm[1], mm[2], mm[3]
		case xfrmAEADRE.MatchString(l):
			sa.AEAD = xfrmAEADRE.FindStringSubmatch(l)[1]
		case xfrmEncapRE.MatchString(l):
			sa.Encap = xfrmEncapRE.FindStringSubmatch(l)[1]
		case xfrmLifeCurRE.MatchString(l):
			current = true
		case current && xfrmCurrentRE.MatchString(l):
			mm := xfrmCurrentRE.FindStringSubmatch(l)
			sa.Bytes, _ = strconv.ParseUint(mm[1], 10, 64)
			sa.Packets, _ = strconv.ParseUint(mm[2], 10, 64)
			current = false
		}
	}
	return out, nil
}

// pairSAs are the ESP states between two gateways' underlay addresses, either direction.
func pairSAs(states []xfrmSA, a, b netip.Addr) []xfrmSA {
	var out []xfrmSA
	for _, s := range states {
		if s.Proto == "esp" && (s.Src == a.String() && s.Dst == b.String() || s.Src == b.String() && s.Dst == a.String()) {
			out = append(out, s)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SPI < out[j].SPI })
	return out
}

func spis(sas []xfrmSA) []string {
	var out []string
	for _, s := range sas {
		out = append(out, s.SPI)
	}
	return out
}

// checkKernelWireGuard checks that c's WireGuard link is a kernel device, not a TUN of
// wireguard-go, and that no UAPI socket serves it.
func checkKernelWireGuard(t *testing.T, c *harness.Cluster) {
	t.Helper()
	kind, _ := linkKind(c, c.WGInterface)
	if kind != "wireguard" {
		t.Errorf("%s: link %s has kind %q, want wireguard (the kernel device, not wireguard-go's tun)", c.Name, c.WGInterface, kind)
	}
	if _, err := os.Stat(wireguard.UAPISocketPath(c.WGInterface)); err == nil {
		t.Errorf("%s: a UAPI socket %s exists: a userspace device runs beside the kernel one", c.Name, wireguard.UAPISocketPath(c.WGInterface))
	}
	if !strings.Contains(c.Agent.Log(), "kernel wireguard link") {
		t.Errorf("%s: the agent's log does not say it created or adopted a kernel wireguard link:\n%s", c.Name, c.Agent.LogTail(30))
	}
}

// checkKernelIPsec checks that c's charon installed kernel SAs for the pair with remote: two
// ESP states (one each way) in tunnel mode with AES-GCM over UDP, and nothing of kernel-libipsec
// (no ipsec0, not in charon's plugin list). It returns the pair's SAs.
func checkKernelIPsec(t *testing.T, m *harness.Mesh, c, remote *harness.Cluster) []xfrmSA {
	t.Helper()
	states, err := xfrmStates(m, c.GwNS)
	if err != nil {
		t.Errorf("%s: %v", c.Name, err)
		return nil
	}
	sas := pairSAs(states, c.GwUnderlay, remote.GwUnderlay)
	if len(sas) != 2 {
		t.Errorf("%s: %d kernel ESP SAs between %s and %s, want 2 (one each way): %v", c.Name, len(sas), c.GwUnderlay, remote.GwUnderlay, sas)
	}
	for _, s := range sas {
		if s.Mode != "tunnel" || !strings.Contains(s.AEAD, "rfc4106(gcm(aes))") || s.Encap != "espinudp" {
			t.Errorf("%s: SA %s: want tunnel mode, rfc4106(gcm(aes)), UDP encapsulation (espinudp)", c.Name, s)
		}
	}
	if kind, _ := linkKind(c, "ipsec0"); kind != "" {
		t.Errorf("%s: link ipsec0 (%s) exists: kernel-libipsec runs though the kernel has ESP", c.Name, kind)
	}
	conf, err := os.ReadFile(filepath.Join(c.StateDir, "ipsec", "strongswan.conf"))
	if err != nil {
		t.Errorf("%s: charon's config: %v", c.Name, err)
	} else if load := regexp.MustCompile(`(?m)^\s*load = .*$`).Find(conf); load == nil || strings.Contains(string(load), "kernel-libipsec") {
		t.Errorf("%s: charon's plugin list %q loads kernel-libipsec (or is missing)", c.Name, load)
	}
	if !regexp.MustCompile(`datapath=kernel`).MatchString(c.Agent.Log()) {
		t.Errorf("%s: the agent's log does not report datapath=kernel for ipsec", c.Name)
	}
	return sas
}

// wantRouteMTU is the route MTU each driver gives the pair on this underlay with the kernel
// datapaths.
func wantRouteMTU(driver string) int {
	switch driver {
	case harness.DriverWireGuard:
		return underlayMTU - wireguard.Overhead
	case harness.DriverVXLAN:
		return underlayMTU - vxlan.Overhead
	case harness.DriverIPsec:
		return ipsecKernelRouteMTU
	}
	return 0
}

// checkPathMTU checks, from both ends of the pair, the route MTU and advmss the driver gave the
// remote pod CIDR, that a DF ping of exactly that size crosses pod to pod and one byte more
// does not ("message too long" once the pod knows the path MTU, "Frag needed" the first time),
// and the MSS a pod's SYN arrives with at the other pod.
func checkPathMTU(t *testing.T, m *harness.Mesh, a, b *harness.Cluster, driver string) {
	t.Helper()
	want := wantRouteMTU(driver)
	// A pod remembers for 10 minutes a path MTU an earlier cable taught it (ICMP "Frag needed"),
	// and a TCP socket's MSS follows it: forget it on both pods, so the checks probe this cable.
	for _, c := range []*harness.Cluster{a, b} {
		if r := harness.Run(m.Ctx, "ip", "-n", c.PodNS, "route", "flush", "cache"); r.Err != nil {
			t.Errorf("%s: %s", driver, r)
		}
	}
	for _, p := range [][2]*harness.Cluster{{a, b}, {b, a}} {
		from, to := p[0], p[1]
		rt, err := getRoute(m, from.GwNS, to.PodIP)
		if err != nil {
			t.Errorf("%s: %v", driver, err)
			continue
		}
		m.Logf("%s: %s gateway's route to %s: dev %s mtu %d advmss %d", driver, from.Name, to.PodIP, rt.Dev, rt.MTU, rt.AdvMSS)
		if rt.MTU == 0 {
			// The route has no mtu metric: the link's MTU applies.
			if l, ok := from.Host().Links[rt.Dev]; ok {
				rt.MTU = l.MTU
			}
		}
		if rt.MTU != want {
			t.Errorf("%s: %s gateway's route to %s: mtu %d, want %d (%s)", driver, from.Name, to.PodIP, rt.MTU, want, rt.Raw)
		}
		if driver == harness.DriverIPsec {
			if rt.AdvMSS != want-40 {
				t.Errorf("%s: %s gateway's route to %s: advmss %d, want %d", driver, from.Name, to.PodIP, rt.AdvMSS, want-40)
			}
			if ceil := kernelESPCeiling(underlayMTU, true); rt.MTU > ceil || rt.MTU <= ipsec.LibipsecMTU {
				t.Errorf("%s: route mtu %d is not in (%d, %d]: above the kernel's ESP ceiling drops, at or below libipsec's cap wastes", driver, rt.MTU, ipsec.LibipsecMTU, ceil)
			}
		}
		// One reply proves a packet of exactly the route MTU crosses: a black hole drops every
		// one. Under TCG on a loaded host one of three may be lost to the probes' load alone.
		if r := m.PingDF(from.PodNS, to.PodIP, rt.MTU, 3); r.Err != nil || r.Received == 0 {
			t.Errorf("%s: %d-byte DF ping %s pod -> %s pod: %d/%d replies: %v %s", driver, rt.MTU, from.Name, to.Name, r.Received, r.Transmitted, r.Err, r.Output)
		}
		out, received := oversizePing(m, from.PodNS, to.PodIP, rt.MTU+1)
		if refused := firstLineWith(out, "message too long"); received != 0 || refused == "" {
			t.Errorf("%s: %d-byte DF ping %s pod -> %s pod: %d replies, want none and \"message too long\": %s", driver, rt.MTU+1, from.Name, to.Name, received, out)
		} else {
			m.Logf("%s: %d-byte DF ping %s pod -> %s pod refused: %s", driver, rt.MTU+1, from.Name, to.Name, refused)
		}
		// The DF pings just taught the client pod the path MTU, and a SYN's MSS follows it: forget
		// it again, so the SYN shows what the cable itself (route advmss, MSS clamp) makes of it.
		for _, ns := range []string{from.PodNS, to.PodNS} {
			if r := harness.Run(m.Ctx, "ip", "-n", ns, "route", "flush", "cache"); r.Err != nil {
				t.Errorf("%s: %s", driver, r)
			}
		}
		mss, err := acceptedMSS(m, from.PodNS, to.PodNS, to.PodIP, driver)
		if err != nil {
			t.Errorf("%s: MSS %s pod -> %s pod: %v", driver, from.Name, to.Name, err)
		} else if mss > want-40 {
			t.Errorf("%s: a SYN from %s pod reaches %s pod with MSS %d, more than the cable's MTU %d allows (%d): the path relies on PMTU discovery", driver, from.Name, to.Name, mss, want, want-40)
		} else {
			m.Logf("%s: SYN from %s pod arrives with MSS %d (route MTU %d)", driver, from.Name, mss, want)
		}
	}
}

// acceptedMSS is harness.AcceptedMSS with a log of its own per call: AcceptedMSS appends every
// call's server output to one log per namespace and so, called again, finds the earlier call's
// "listening" and result lines (it dials before the new server listens, or reads an old MSS).
func acceptedMSS(m *harness.Mesh, clientNS, serverNS string, server netip.Addr, tag string) (int, error) {
	addr := netip.AddrPortFrom(server, harness.MSSPort).String()
	logPath := filepath.Join(m.Dir, fmt.Sprintf("mss-%s-%s-%d.log", tag, serverNS, time.Now().UnixNano()))
	p, err := harness.StartProcess("tcpcheck-accept "+serverNS, serverNS, logPath, m.Bin.TCPCheck, "accept", "-listen", addr, "-timeout", "20s")
	if err != nil {
		return 0, err
	}
	defer p.Stop(5 * time.Second)
	if err := harness.WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, string) {
		return strings.Contains(p.Log(), "listening"), p.Log()
	}); err != nil {
		return 0, fmt.Errorf("server in %s: %w", serverNS, err)
	}
	if r := harness.NSRun(m.Ctx, clientNS, m.Bin.TCPCheck, "dial", "-addr", addr, "-timeout", "5s"); r.Err != nil {
		return 0, fmt.Errorf("dial from %s: %s", clientNS, r)
	}
	var res struct {
		MSS int `json:"mss"`
	}
	err = harness.WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, string) {
		for _, l := range strings.Split(p.Log(), "\n") {
			if strings.HasPrefix(l, "{") && json.Unmarshal([]byte(l), &res) == nil {
				return true, ""
			}
		}
		return false, p.Log()
	})
	return res.MSS, err
}

// oversizePing sends 3 DF echo requests of size bytes (IP header included) from ns to addr,
// without -q so that ping prints why each failed: the first usually draws the gateway's ICMP
// "Frag needed", after which the pod's kernel knows the path MTU and refuses the next ones
// itself ("local error: message too long, mtu=N").
func oversizePing(m *harness.Mesh, ns string, addr netip.Addr, size int) (string, int) {
	r := harness.RunTimeout(m.Ctx, 30*time.Second, "ip", "netns", "exec", ns, "ping", "-n", "-M", "do", "-s", strconv.Itoa(size-28),
		"-c", "3", "-i", "0.3", "-W", "2", addr.String())
	out := r.Stdout + r.Stderr
	received := -1
	if mm := regexp.MustCompile(`(\d+) received`).FindStringSubmatch(out); mm != nil {
		received, _ = strconv.Atoi(mm[1])
	}
	return out, received
}

func firstLineWith(s string, subs ...string) string {
	for _, l := range strings.Split(s, "\n") {
		for _, sub := range subs {
			if strings.Contains(l, sub) {
				return strings.TrimSpace(l)
			}
		}
	}
	return ""
}

// TestKernelThreeClusters is TestThreeClusters on the kernel datapath: every gateway's WireGuard
// link is a kernel device, the pods reach each other by ping and TCP, the route MTU is the
// underlay's less WireGuard's overhead and a DF ping of exactly that size crosses.
func TestKernelThreeClusters(t *testing.T) {
	requireKernelDatapaths(t)
	m := harness.New(t)
	clusters := m.AddClusters(threeClusters...)
	seen := m.WaitConnected(ConnectTimeout, clusters...)
	for _, c := range clusters {
		m.Logf("%s connected to both others %s after its agent started", c.Name, seen[c.Name].Sub(c.AgentStarted).Round(time.Millisecond))
		c.StartTCPServer()
		checkKernelWireGuard(t, c)
	}
	for _, from := range clusters {
		for _, to := range clusters {
			if from == to {
				continue
			}
			if ok, r := m.PingOK(from.PodNS, to.PodIP, 3); !ok {
				t.Errorf("ping %s pod -> %s pod: %d/%d replies: %v %s", from.Name, to.Name, r.Received, r.Transmitted, r.Err, r.Output)
			}
			if r := m.TCPCheck(from.PodNS, to.PodIP); r.Err != nil || strings.TrimSpace(r.Stdout) != "ok" {
				t.Errorf("tcp %s pod -> %s pod: %s", from.Name, to.Name, r)
			}
		}
	}
	for _, c := range clusters {
		h := c.Host()
		if !h.WGRead {
			t.Errorf("%s: the kernel device's peers cannot be read with wg: %s", c.Name, h.WGError)
			continue
		}
		if len(h.WGPeers) != len(clusters)-1 {
			t.Errorf("%s: %d WireGuard peers on the kernel device, want %d", c.Name, len(h.WGPeers), len(clusters)-1)
		}
		for _, p := range h.WGPeers {
			if p.LastHandshake.IsZero() || p.RxBytes == 0 || p.TxBytes == 0 {
				t.Errorf("%s: peer %s: handshake %v rx %d tx %d, want a handshake and traffic both ways", c.Name, p.Endpoint, p.LastHandshake, p.RxBytes, p.TxBytes)
			}
		}
	}
	checkPathMTU(t, m, clusters[0], clusters[1], harness.DriverWireGuard)
}

// checkKernelDatapath checks the pair over driver on the kernel datapaths: the kernel WireGuard
// device, the VXLAN link, the kernel ESP SAs; and for every driver the route MTU, DF pings of
// that size and one byte more, and the MSS a pod's SYN arrives with.
func checkKernelDatapath(t *testing.T, m *harness.Mesh, left, right *harness.Cluster, driver string, _ bool) {
	t.Helper()
	both := []*harness.Cluster{left, right}
	switch driver {
	case harness.DriverWireGuard:
		for _, c := range both {
			checkKernelWireGuard(t, c)
		}
	case harness.DriverVXLAN:
		for _, c := range both {
			if kind, _ := linkKind(c, fmt.Sprintf("%s%d", harness.VXLANLinkPrefix, harness.VXLANVNI)); kind != "vxlan" {
				t.Errorf("%s: the VXLAN link has kind %q, want vxlan", c.Name, kind)
			}
		}
	case harness.DriverIPsec:
		for _, c := range both {
			sas := checkKernelIPsec(t, m, c, map[*harness.Cluster]*harness.Cluster{left: right, right: left}[c])
			m.Logf("%s: kernel SAs: %v", c.Name, sas)
		}
	}
	checkPathMTU(t, m, left, right, driver)
}

// logKernelESPCeiling logs the route MTU of kernel ESP against the kernel's own ceiling.
func logKernelESPCeiling(m *harness.Mesh) {
	m.Logf("kernel ESP: route MTU %d; the kernel's own ceiling for AES-GCM in tunnel mode on a %d-byte underlay is %d with UDP encapsulation, %d without",
		ipsecKernelRouteMTU, underlayMTU, kernelESPCeiling(underlayMTU, true), kernelESPCeiling(underlayMTU, false))
}

// restartStreamFor is how long the TCP stream across an agent restart runs.
const restartStreamFor = 25 * time.Second

// restartNoFlapGap is the longest stall of the stream that still counts as no flap: the kernel
// keeps forwarding while the agent is down, so only scheduling noise (TCG) shows.
const restartNoFlapGap = 3 * time.Second

// TestKernelAgentRestart restarts one gateway's agent while a TCP stream crosses the pair, once
// over kernel WireGuard and once over kernel IPsec. DESIGN.md promises that an agent restart
// does not flap unchanged tunnels: the stream survives without a stall, and the cable is the
// same one afterwards: for WireGuard the same link (ifindex), the same peer with the same
// handshake and its counters continuing; for IPsec the same SAs (SPIs) with their counters
// continuing.
func TestKernelAgentRestart(t *testing.T) {
	requireKernelDatapaths(t)
	harness.RequireIPsec(t)
	m, left, right := startSwitchPair(t, "kernel wireguard")
	both := []*harness.Cluster{left, right}
	for _, c := range both {
		checkKernelWireGuard(t, c)
	}

	t.Run("kernel WireGuard", func(t *testing.T) {
		_, ifBefore := linkKind(left, left.WGInterface)
		before := wgPeerOf(t, left, right)
		restartUnderStream(t, m, left, right, "wireguard")
		_, ifAfter := linkKind(left, left.WGInterface)
		after := wgPeerOf(t, left, right)
		m.Logf("left's peer right: before handshake %s rx %d tx %d; after handshake %s rx %d tx %d; ifindex %d -> %d",
			before.LastHandshake.Format(time.TimeOnly), before.RxBytes, before.TxBytes, after.LastHandshake.Format(time.TimeOnly), after.RxBytes, after.TxBytes, ifBefore, ifAfter)
		if ifAfter != ifBefore {
			t.Errorf("the WireGuard link was re-created across the restart: ifindex %d -> %d", ifBefore, ifAfter)
		}
		if after.PublicKey != before.PublicKey {
			t.Errorf("the peer's key changed across the restart: %s -> %s", before.PublicKey, after.PublicKey)
		}
		if after.RxBytes < before.RxBytes || after.TxBytes < before.TxBytes {
			t.Errorf("the peer's counters went back across the restart (rx %d -> %d, tx %d -> %d): the peer was removed and added again",
				before.RxBytes, after.RxBytes, before.TxBytes, after.TxBytes)
		}
		// WireGuard hands shake again on its own after 120s (REKEY_AFTER_TIME); sooner than that
		// a new handshake means the session was thrown away.
		if !after.LastHandshake.Equal(before.LastHandshake) && after.LastHandshake.Sub(before.LastHandshake) < 110*time.Second {
			t.Errorf("a new handshake %s after the one before the restart: the session was rebuilt", after.LastHandshake.Sub(before.LastHandshake))
		}
		log := logSinceRestart(left)
		if !strings.Contains(log, "adopted existing kernel wireguard link") {
			t.Errorf("the restarted agent did not adopt the kernel link; its log:\n%s", lastLines(log, 30))
		}
		for _, bad := range []string{"peer configured", "removing stale peer"} {
			if strings.Contains(log, bad) {
				t.Errorf("the restarted agent changed the device (%q in its log)", bad)
			}
		}
	})

	t.Run("kernel IPsec", func(t *testing.T) {
		t0 := m.Apply(m.PolicyFile("switch-pair-ipsec.yaml", pairPolicy(harness.DriverIPsec)))
		m.WaitWants(PolicyTimeout, t0, both, nil, harness.Connected(harness.DriverIPsec))
		waitHostsClean(m, both, nil, harness.Connected(harness.DriverIPsec))
		before := map[string][]xfrmSA{}
		for _, c := range both {
			before[c.Name] = checkKernelIPsec(t, m, c, map[*harness.Cluster]*harness.Cluster{left: right, right: left}[c])
		}
		if t.Failed() {
			t.FailNow()
		}
		restartUnderStream(t, m, left, right, "ipsec")
		for _, c := range both {
			states, err := xfrmStates(m, c.GwNS)
			if err != nil {
				t.Errorf("%s: %v", c.Name, err)
				continue
			}
			o := map[*harness.Cluster]*harness.Cluster{left: right, right: left}[c]
			after := pairSAs(states, c.GwUnderlay, o.GwUnderlay)
			m.Logf("%s: SAs before the restart %v; after %v", c.Name, before[c.Name], after)
			if !slices.Equal(spis(after), spis(before[c.Name])) {
				t.Errorf("%s: the SAs were rebuilt across left's agent restart: SPIs %v -> %v", c.Name, spis(before[c.Name]), spis(after))
				continue
			}
			for i := range after {
				if after[i].Bytes < before[c.Name][i].Bytes {
					t.Errorf("%s: SA %s: counters went back (%d -> %d bytes)", c.Name, after[i].SPI, before[c.Name][i].Bytes, after[i].Bytes)
				}
			}
		}
		if t.Failed() {
			m.Logf("left's agent log since the restart (charon's lines included):\n%s", lastLines(logSinceRestart(left), 60))
		}
	})
}

// restartUnderStream runs a TCP stream left pod -> right pod, restarts left's agent in its
// middle, waits until left reports the pair connected again over driver, and checks the stream
// survived without a stall longer than restartNoFlapGap.
func restartUnderStream(t *testing.T, m *harness.Mesh, left, right *harness.Cluster, driver string) {
	t.Helper()
	name := "restart-stream-" + driver
	stream := m.StartGapStream(name, left.PodNS, right.PodIP, restartStreamFor, StreamStallLimit)
	time.Sleep(3 * time.Second)
	if ok, code := stream.Exited(); ok {
		t.Fatalf("%s: the stream ended (exit %d) before the restart:\n%s", driver, code, stream.Log())
	}
	left.StopAgent()
	left.StartAgent()
	t0 := time.Now()
	conv := m.WaitWants(PolicyTimeout, t0, []*harness.Cluster{left, right}, nil, harness.Connected(driver))
	m.Logf("%s: left's agent restarted; both ends report the pair connected %s later", driver, conv.ConnectedAfter("left", "right").Round(time.Millisecond))
	sr, code, err := harness.ReadStream(stream, restartStreamFor+StreamStallLimit+10*time.Second)
	switch {
	case err != nil:
		t.Errorf("%s: %v", driver, err)
	case code != 0:
		t.Errorf("%s: the TCP stream across the agent restart broke (exit %d): %s\n%s", driver, code, sr.Error, stream.Log())
	case sr.MaxGapMs > float64(restartNoFlapGap.Milliseconds()):
		t.Errorf("%s: the TCP stream stalled %.0fms across the agent restart (gaps %+v): the cable flapped", driver, sr.MaxGapMs, sr.Gaps)
	}
	m.Logf("%s: stream across left's agent restart: %d echoes, longest stall %.0fms, gaps %+v", driver, sr.Rounds, sr.MaxGapMs, sr.Gaps)
}

// wgPeerOf is c's WireGuard peer for remote, read from the kernel with wg.
func wgPeerOf(t *testing.T, c, remote *harness.Cluster) harness.WGPeer {
	t.Helper()
	h := c.Host()
	if !h.WGRead {
		t.Fatalf("%s: peers of %s: %s", c.Name, c.WGInterface, h.WGError)
	}
	for _, p := range h.WGPeers {
		if strings.HasPrefix(p.Endpoint, remote.GwUnderlay.String()+":") {
			return p
		}
	}
	t.Fatalf("%s: no WireGuard peer with endpoint %s: %+v", c.Name, remote.GwUnderlay, h.WGPeers)
	return harness.WGPeer{}
}

// logSinceRestart is c's agent log since its last start (the harness appends every start's
// output to one file, each after a "=== <time>: <command>" line).
func logSinceRestart(c *harness.Cluster) string {
	b, err := os.ReadFile(c.LogPath)
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndex(s, "\n=== "); i >= 0 {
		s = s[i+1:]
	}
	return s
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
