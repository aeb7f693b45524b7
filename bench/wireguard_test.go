//go:build bench

package bench

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/internal/benchresults"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// WireGuard in userspace at full speed: pod to pod, interleaved run by run in
// one mesh, over the same two gateways and the same underlay veth and bridge:
//
//	plain      no tunnel: plain routing between the gateways (the limit of this path)
//	wg-go      standalone wireguard-go (the binary of the module version in go.mod, configured
//	           by wg(8)) on its own TUN and port in each gateway namespace
//	cable      the wireguard cable (wireguard-go inside the agent)
//	vxlan      the vxlan cable, after a policy moves the pair to it, against plain again
//
// Each path has its own pair of "pod" namespaces behind the gateways, wired like the clusters'
// pods (a veth to the gateway, default route via it). Per run it records, on the sending and the
// receiving gateway, the UDP datagrams the kernel counted against the packets on the underlay
// link (segments per UDP send: UDP GSO; per receive: UDP GRO) and the average packet on the
// tunnel's TUN (above the MTU: TSO/GRO super-packets); and once per device the TUN's features and
// the UDP sockets' UDP_GRO (bench/cmd/wgoffloads).
//
//	CABLEMESH_WGSPEED_REPS   runs per path (5)

const (
	saPort = 51830 // standalone wireguard-go's port
)

// SpeedRun is one iperf3 run over one path with the gateways' counters around it.
type SpeedRun struct {
	Run
	// SendBytesPerUDP is the sending gateway's underlay bytes out per UDP datagram the kernel
	// counted sent, RecvBytesPerUDP the receiving gateway's underlay bytes in per UDP datagram
	// received: about one packet (under 1500) each without UDP GSO/GRO, several with them, as
	// the kernel counts a GSO or GRO datagram once. UlTxAvgBytes and UlRxAvgBytes are the
	// average packet on the underlay veth (above 1500: GSO super-packets crossing the veth
	// unsegmented). Zero for paths without UDP.
	SendBytesPerUDP float64 `json:"sendBytesPerUDP,omitempty"`
	RecvBytesPerUDP float64 `json:"recvBytesPerUDP,omitempty"`
	UlTxAvgBytes    float64 `json:"underlayTxAvgBytes,omitempty"`
	UlRxAvgBytes    float64 `json:"underlayRxAvgBytes,omitempty"`
	// TunTxAvgBytes is the average packet the kernel handed the sender's TUN (above the MTU:
	// TSO super-packets); TunRxAvgBytes the average packet wireguard-go wrote to the receiver's
	// TUN (above the MTU: coalesced by its GRO).
	TunTxAvgBytes float64 `json:"tunTxAvgBytes,omitempty"`
	TunRxAvgBytes float64 `json:"tunRxAvgBytes,omitempty"`
	// SendCPUPerGB and RecvCPUPerGB are the CPU seconds the sending and the receiving gateway's
	// datapath process (the agent, or wireguard-go) used per GB carried: what the datapath costs,
	// whatever else competes for the CPUs.
	SendCPUPerGB float64 `json:"sendCPUSecondsPerGB,omitempty"`
	RecvCPUPerGB float64 `json:"recvCPUSecondsPerGB,omitempty"`
}

// SpeedPath is one path's runs.
type SpeedPath struct {
	Name       string     `json:"name"`
	What       string     `json:"what"`
	From       string     `json:"from"`
	To         string     `json:"to"`
	Runs       []SpeedRun `json:"runs"`
	MedianGbps float64    `json:"medianGbps"`
	// MedianSendCPUPerGB and MedianRecvCPUPerGB are the medians of the runs' CPU costs.
	MedianSendCPUPerGB float64 `json:"medianSendCPUSecondsPerGB,omitempty"`
	MedianRecvCPUPerGB float64 `json:"medianRecvCPUSecondsPerGB,omitempty"`
}

// Offloads is what wgoffloads reported for one device.
type Offloads struct {
	Gateway string          `json:"gateway"`
	Link    string          `json:"link"`
	Port    int             `json:"port"`
	Report  json.RawMessage `json:"report"`
}

// SpeedResult is what bench/results/wgspeed-<date>.json holds.
type SpeedResult struct {
	Date            string      `json:"date"`
	Kernel          string      `json:"kernel"`
	CPUs            int         `json:"cpus"`
	Revision        string      `json:"revision"`
	Tool            string      `json:"tool"`
	DurationSeconds int         `json:"durationSeconds"`
	Command         string      `json:"command"`
	Paths           []SpeedPath `json:"paths"`
	// Ratios of medians: cable / wg-go, cable / plain, wg-go / plain, vxlan / plain (the plain
	// runs interleaved with the vxlan ones).
	Ratios   map[string]float64 `json:"ratios"`
	Offloads []Offloads         `json:"offloads"`
	LoadAvg  [2]float64         `json:"loadAvgStartEnd"`
	BusyCPU  float64            `json:"busyCPU"`
	Notes    []string           `json:"notes"`
}

// TestWireGuardSpeed measures the paths above and writes bench/results/wgspeed-<date>.*.
func TestWireGuardSpeed(t *testing.T) {
	harness.RequireRoot(t)
	reps := envInt("CABLEMESH_WGSPEED_REPS", 5)
	m := harness.New(t)
	extra := harness.MultiDriverConfig()
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "bench=yes", extra)
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "bench=yes", extra)
	both := []*harness.Cluster{east, west}
	started := time.Now()
	for _, c := range both {
		c.StartAgent()
	}
	m.WaitWants(2*time.Minute, started, both, nil, harness.Connected(harness.DriverWireGuard))

	tools := t.TempDir()
	wgGo, offloads := filepath.Join(tools, "wireguard-go"), filepath.Join(tools, "wgoffloads")
	root, err := harness.ModuleRoot(m.Ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range [][2]string{{wgGo, "golang.zx2c4.com/wireguard"}, {offloads, "./bench/cmd/wgoffloads"}} {
		if r := harness.RunTimeout(m.Ctx, 10*time.Minute, "go", "-C", root, "build", "-o", b[0], b[1]); r.Err != nil {
			t.Fatalf("build %s: %s", b[1], r)
		}
	}

	// Plain routing: pods 10.91.<i>.10 behind each gateway, routed over the underlay.
	plain := pods(t, m, both, "pl", 91)
	for i, c := range both {
		o := both[1-i]
		mustIP(t, m, "-n", c.GwNS, "route", "add", plain[1-i].Prefix.String(), "via", o.GwUnderlay.String())
	}
	// Standalone wireguard-go: pods 10.92.<i>.10, device wgsa-<cluster> on port 51830.
	sa := pods(t, m, both, "sa", 92)
	saLinks := standalone(t, m, wgGo, both, sa)

	ds := []struct {
		gw      *harness.Cluster
		link    string
		port    int
		display string
	}{{east, east.WGInterface, harness.WGPort, "cable"}, {west, west.WGInterface, harness.WGPort, "cable"},
		{east, saLinks[0], saPort, "wg-go"}, {west, saLinks[1], saPort, "wg-go"}}
	var res SpeedResult
	pids := map[string]int{} // link on a gateway -> the datapath process holding its UDP socket
	for _, d := range ds {
		r := harness.NSRun(m.Ctx, d.gw.GwNS, offloads, "-link", d.link, "-port", strconv.Itoa(d.port))
		if r.Err != nil {
			t.Fatalf("wgoffloads in %s: %s", d.gw.GwNS, r)
		}
		res.Offloads = append(res.Offloads, Offloads{Gateway: d.gw.Name + " (" + d.display + ")", Link: d.link, Port: d.port, Report: json.RawMessage(strings.TrimSpace(r.Stdout))})
		var rep struct {
			Sockets []struct {
				PID int `json:"pid"`
			} `json:"sockets"`
		}
		if err := json.Unmarshal([]byte(r.Stdout), &rep); err == nil && len(rep.Sockets) > 0 {
			pids[d.gw.Name+"/"+d.link] = rep.Sockets[0].PID
		}
	}

	paths := map[string]*SpeedPath{
		"plain": {Name: "plain", What: "no tunnel: plain routing between the gateways over the underlay", From: plain[0].Addr.String(), To: plain[1].Addr.String()},
		"wg-go": {Name: "wg-go", What: "standalone wireguard-go (same module version), configured by wg(8)", From: sa[0].Addr.String(), To: sa[1].Addr.String()},
		"cable": {Name: "cable", What: "the wireguard cable (wireguard-go in the agent)", From: east.PodIP.String(), To: west.PodIP.String()},
	}
	type target struct {
		path         string
		fromNS, toNS string
		to           netip.Addr
		tunTx, tunRx string // TUN links on the sending and receiving gateway ("" for none)
	}
	wgTargets := []target{
		{"cable", east.PodNS, west.PodNS, west.PodIP, east.WGInterface, west.WGInterface},
		{"wg-go", sa[0].NS, sa[1].NS, sa[1].Addr, saLinks[0], saLinks[1]},
		{"plain", plain[0].NS, plain[1].NS, plain[1].Addr, "", ""},
	}
	res.LoadAvg[0] = loadAvg()
	idle0, total0 := cpuTimes()
	for i := range reps {
		for _, tg := range wgTargets {
			r := speedRun(t, m, fmt.Sprintf("%s-%d", tg.path, i), east, west, tg.fromNS, tg.toNS, tg.to, tg.tunTx, tg.tunRx,
				pids["east/"+tg.tunTx], pids["west/"+tg.tunRx])
			t.Logf("rep %d %s: %.2f Gbit/s, CPU s/GB send %.2f recv %.2f (bytes per UDP datagram sent %.0f, received %.0f; underlay avg packet tx %.0f rx %.0f B; TUN avg packet tx %.0f rx %.0f B)", i+1, tg.path,
				r.BitsPerSecond/1e9, r.SendCPUPerGB, r.RecvCPUPerGB, r.SendBytesPerUDP, r.RecvBytesPerUDP, r.UlTxAvgBytes, r.UlRxAvgBytes, r.TunTxAvgBytes, r.TunRxAvgBytes)
			paths[tg.path].Runs = append(paths[tg.path].Runs, r)
		}
	}

	// VXLAN against plain routing, interleaved again.
	t0 := m.Apply(m.PolicyFile("bench-vxlan.yaml", benchPolicy(harness.DriverVXLAN)))
	m.WaitWants(time.Minute, t0, both, nil, harness.Connected(harness.DriverVXLAN))
	m.Ping(east.PodNS, west.PodIP, 2, 200*time.Millisecond)
	paths["vxlan"] = &SpeedPath{Name: "vxlan", What: "the vxlan cable (kernel VXLAN)", From: east.PodIP.String(), To: west.PodIP.String()}
	paths["plain-vx"] = &SpeedPath{Name: "plain (vxlan runs)", What: "plain routing, interleaved with the vxlan runs", From: plain[0].Addr.String(), To: plain[1].Addr.String()}
	for i := range reps {
		for _, tg := range []target{{"vxlan", east.PodNS, west.PodNS, west.PodIP, "", ""}, {"plain-vx", plain[0].NS, plain[1].NS, plain[1].Addr, "", ""}} {
			r := speedRun(t, m, fmt.Sprintf("%s-%d", tg.path, i), east, west, tg.fromNS, tg.toNS, tg.to, "", "", 0, 0)
			t.Logf("rep %d %s: %.2f Gbit/s (underlay avg packet tx %.0f rx %.0f B)", i+1, tg.path, r.BitsPerSecond/1e9, r.UlTxAvgBytes, r.UlRxAvgBytes)
			paths[tg.path].Runs = append(paths[tg.path].Runs, r)
		}
	}
	idle1, total1 := cpuTimes()
	res.LoadAvg[1] = loadAvg()
	if total1 > total0 {
		res.BusyCPU = 1 - float64(idle1-idle0)/float64(total1-total0)
	}

	for _, k := range []string{"plain", "wg-go", "cable", "vxlan", "plain-vx"} {
		p := paths[k]
		var rs []Run
		for _, r := range p.Runs {
			rs = append(rs, r.Run)
		}
		p.MedianGbps = median(rs) / 1e9
		var sc, rc []float64
		for _, r := range p.Runs {
			if r.SendCPUPerGB > 0 {
				sc, rc = append(sc, r.SendCPUPerGB), append(rc, r.RecvCPUPerGB)
			}
		}
		slices.Sort(sc)
		slices.Sort(rc)
		p.MedianSendCPUPerGB, p.MedianRecvCPUPerGB = percentile(sc, 0.5), percentile(rc, 0.5)
		res.Paths = append(res.Paths, *p)
	}
	ratio := func(a, b string) float64 {
		if paths[b].MedianGbps == 0 {
			return 0
		}
		return paths[a].MedianGbps / paths[b].MedianGbps
	}
	res.Ratios = map[string]float64{
		"cable/wg-go": ratio("cable", "wg-go"), "cable/plain": ratio("cable", "plain"),
		"wg-go/plain": ratio("wg-go", "plain"), "vxlan/plain": ratio("vxlan", "plain-vx"),
	}
	res.Date = time.Now().UTC().Format(time.RFC3339)
	res.Kernel, res.CPUs, res.Revision = kernelRelease(), runtime.NumCPU(), gitRevision()
	res.Tool, res.DurationSeconds = "iperf3, one TCP stream", int(duration.Seconds())
	res.Command = "CABLEMESH_BIN=<dir> BENCH_RUN='^TestWireGuardSpeed$' ./bench/throughput.sh (or: go test -tags bench -run '^TestWireGuardSpeed$' -v -count=1 -timeout 60m ./bench/)"
	res.Notes = []string{
		"All paths run between the same two gateway namespaces over the same underlay veths and bridge; each has its own pair of pod namespaces wired alike (veth to the gateway, default route via it).",
		"Runs are interleaved: each repetition runs cable, wg-go and plain in turn; after the policy moves the pair to vxlan, vxlan and plain in turn.",
		"iperf3 client, server, both gateways' datapaths and the agents share the machine's 2 CPUs.",
		"Underlay average packet: the gateways' eth0 (veth to the underlay bridge) bytes over packets during the run, both directions' traffic included; far above 1500 B means GSO super-packets crossing the veth unsegmented.",
		"Standalone wireguard-go runs with the Go runtime's defaults (GOGC, GOMAXPROCS unset), as the agent does.",
	}
	writeSpeedResults(t, res)
}

// podNS is one extra pod namespace.
type podNS struct {
	NS     string
	Addr   netip.Addr
	Prefix netip.Prefix
}

// pods adds a pod namespace behind each gateway: <prefix><cluster>-<tag>, 10.<octet>.<i+1>.10/24,
// gateway side 10.<octet>.<i+1>.1 on the veth <tag>0.
func pods(t *testing.T, m *harness.Mesh, cs []*harness.Cluster, tag string, octet int) []podNS {
	t.Helper()
	var out []podNS
	for i, c := range cs {
		ns := m.Prefix + c.Name + "-" + tag
		if err := harness.AddNamespace(m.Ctx, ns); err != nil {
			t.Fatal(err)
		}
		gw, pod := fmt.Sprintf("10.%d.%d.1", octet, i+1), fmt.Sprintf("10.%d.%d.10", octet, i+1)
		mustIP(t, m, "-n", c.GwNS, "link", "add", tag+"0", "type", "veth", "peer", "name", "eth0", "netns", ns)
		mustIP(t, m, "-n", c.GwNS, "addr", "add", gw+"/24", "dev", tag+"0")
		mustIP(t, m, "-n", c.GwNS, "link", "set", tag+"0", "up")
		mustIP(t, m, "-n", ns, "addr", "add", pod+"/24", "dev", "eth0")
		mustIP(t, m, "-n", ns, "link", "set", "eth0", "up")
		mustIP(t, m, "-n", ns, "link", "set", "lo", "up")
		mustIP(t, m, "-n", ns, "route", "add", "default", "via", gw)
		out = append(out, podNS{NS: ns, Addr: netip.MustParseAddr(pod), Prefix: netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", octet, i+1))})
	}
	return out
}

func mustIP(t *testing.T, m *harness.Mesh, args ...string) {
	t.Helper()
	if _, err := harness.MustRun(m.Ctx, "ip", args...); err != nil {
		t.Fatal(err)
	}
}

// standalone runs wireguard-go in each gateway namespace, configured with wg(8) like the cable
// (MTU 1420, keepalive 25s), and routes the sa pods over it. It returns the links' names.
func standalone(t *testing.T, m *harness.Mesh, bin string, cs []*harness.Cluster, sa []podNS) []string {
	t.Helper()
	links := make([]string, len(cs))
	keys := make([][2]string, len(cs)) // private key file, public key
	for i, c := range cs {
		links[i] = "wgsa-" + c.Name
		// With the Go runtime's defaults, whatever the bench's environment says to the agents.
		p, err := harness.StartProcess("wireguard-go "+c.Name, c.GwNS, filepath.Join(m.Dir, "wireguard-go-"+c.Name+".log"),
			"env", "-u", "GOGC", "-u", "GOMAXPROCS", "-u", "GODEBUG", "-u", "GOMEMLIMIT", bin, "-f", links[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Stop(5 * time.Second) })
		priv := harness.Run(m.Ctx, "wg", "genkey")
		if priv.Err != nil {
			t.Fatalf("wg genkey: %s", priv)
		}
		file := filepath.Join(m.Dir, links[i]+".key")
		if err := os.WriteFile(file, []byte(priv.Stdout), 0o600); err != nil {
			t.Fatal(err)
		}
		pub := harness.RunTimeout(m.Ctx, 10*time.Second, "sh", "-c", "wg pubkey < "+file)
		if pub.Err != nil {
			t.Fatalf("wg pubkey: %s", pub)
		}
		keys[i] = [2]string{file, strings.TrimSpace(pub.Stdout)}
	}
	for i, c := range cs {
		o := cs[1-i]
		if err := harness.WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, string) {
			r := harness.NSRun(m.Ctx, c.GwNS, "wg", "show", links[i])
			return r.Err == nil, r.String()
		}); err != nil {
			t.Fatalf("wireguard-go %s: %v", links[i], err)
		}
		r := harness.NSRun(m.Ctx, c.GwNS, "wg", "set", links[i], "private-key", keys[i][0], "listen-port", strconv.Itoa(saPort),
			"peer", keys[1-i][1], "endpoint", fmt.Sprintf("%s:%d", o.GwUnderlay, saPort), "allowed-ips", sa[1-i].Prefix.String(),
			"persistent-keepalive", "25")
		if r.Err != nil {
			t.Fatalf("wg set: %s", r)
		}
		mustIP(t, m, "-n", c.GwNS, "link", "set", links[i], "mtu", "1420", "up")
		mustIP(t, m, "-n", c.GwNS, "route", "add", sa[1-i].Prefix.String(), "dev", links[i])
	}
	if ok, r := m.PingOK(sa[0].NS, sa[1].Addr, 3); !ok {
		t.Fatalf("standalone wireguard-go path: %v %s", r.Err, r.Output)
	}
	return links
}

// counters are a namespace's UDP datagram counts and some links' packet and byte counts.
type counters struct {
	udpIn, udpOut uint64
	links         map[string][4]uint64 // tx packets, tx bytes, rx packets, rx bytes
}

func readCounters(t *testing.T, m *harness.Mesh, ns string, links ...string) counters {
	t.Helper()
	script := "cat /proc/net/snmp"
	for _, l := range links {
		if l == "" {
			continue
		}
		d := "/sys/class/net/" + l + "/statistics/"
		script += fmt.Sprintf("; echo link %s $(cat %stx_packets %stx_bytes %srx_packets %srx_bytes)", l, d, d, d, d)
	}
	r := harness.NSRun(m.Ctx, ns, "sh", "-c", script)
	if r.Err != nil {
		t.Fatalf("counters in %s: %s", ns, r)
	}
	c := counters{links: map[string][4]uint64{}}
	var udpHeader []string
	for _, line := range strings.Split(r.Stdout, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 1 && f[0] == "Udp:" && udpHeader == nil:
			udpHeader = f
		case len(f) > 1 && f[0] == "Udp:":
			for i, name := range udpHeader {
				v, _ := strconv.ParseUint(f[i], 10, 64)
				switch name {
				case "InDatagrams":
					c.udpIn = v
				case "OutDatagrams":
					c.udpOut = v
				}
			}
		case len(f) == 6 && f[0] == "link":
			var v [4]uint64
			for i := range v {
				v[i], _ = strconv.ParseUint(f[2+i], 10, 64)
			}
			c.links[f[1]] = v
		}
	}
	return c
}

// speedRun runs iperf3 from fromNS to `to` and reads the gateways' counters, and the CPU time
// of their datapath processes sendPID and recvPID, around it.
func speedRun(t *testing.T, m *harness.Mesh, name string, east, west *harness.Cluster, fromNS, toNS string, to netip.Addr, tunTx, tunRx string, sendPID, recvPID int) SpeedRun {
	t.Helper()
	s0, r0 := readCounters(t, m, east.GwNS, "eth0", tunTx), readCounters(t, m, west.GwNS, "eth0", tunRx)
	sc0, rc0 := cpuSeconds(sendPID), cpuSeconds(recvPID)
	run := SpeedRun{Run: iperf(t, m, name, fromNS, toNS, to)}
	sc1, rc1 := cpuSeconds(sendPID), cpuSeconds(recvPID)
	s1, r1 := readCounters(t, m, east.GwNS, "eth0", tunTx), readCounters(t, m, west.GwNS, "eth0", tunRx)
	ulTx := func(c counters, i int) uint64 { return c.links["eth0"][i] }
	if d := ulTx(s1, 0) - ulTx(s0, 0); d > 0 {
		run.UlTxAvgBytes = float64(ulTx(s1, 1)-ulTx(s0, 1)) / float64(d)
	}
	if d := ulTx(r1, 2) - ulTx(r0, 2); d > 0 {
		run.UlRxAvgBytes = float64(ulTx(r1, 3)-ulTx(r0, 3)) / float64(d)
	}
	if tunTx == "" {
		return run
	}
	// The CPU time covers the whole call (the server's start and the connection's set-up too, both
	// nearly idle); the bytes are iperf3's over its test time.
	if gb := run.BitsPerSecond * duration.Seconds() / 8 / 1e9; gb > 0 && sendPID > 0 && recvPID > 0 {
		run.SendCPUPerGB, run.RecvCPUPerGB = (sc1-sc0)/gb, (rc1-rc0)/gb
	}
	if d := s1.udpOut - s0.udpOut; d > 0 {
		run.SendBytesPerUDP = float64(ulTx(s1, 1)-ulTx(s0, 1)) / float64(d)
	}
	if d := r1.udpIn - r0.udpIn; d > 0 {
		run.RecvBytesPerUDP = float64(ulTx(r1, 3)-ulTx(r0, 3)) / float64(d)
	}
	if d := s1.links[tunTx][0] - s0.links[tunTx][0]; d > 0 {
		run.TunTxAvgBytes = float64(s1.links[tunTx][1]-s0.links[tunTx][1]) / float64(d)
	}
	if d := r1.links[tunRx][2] - r0.links[tunRx][2]; d > 0 {
		run.TunRxAvgBytes = float64(r1.links[tunRx][3]-r0.links[tunRx][3]) / float64(d)
	}
	return run
}

// cpuSeconds is the user and system CPU time process pid has used (with its exited threads'),
// 0 for pid 0.
func cpuSeconds(pid int) float64 {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command (which is in parentheses and may hold spaces).
	_, rest, _ := strings.Cut(string(b), ") ")
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseFloat(f[11], 64)
	stime, _ := strconv.ParseFloat(f[12], 64)
	return (utime + stime) / 100 // USER_HZ
}

func writeSpeedResults(t *testing.T, res SpeedResult) {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "# WireGuard in userspace: cable vs standalone wireguard-go vs plain routing, and VXLAN (%s)\n\n", res.Date)
	fmt.Fprintf(&b, "Kernel %s, %d CPUs, revision %s. %s, %ds per run, runs interleaved. Load average %.2f at the start, %.2f at the end; CPUs busy %.0f%% over the bench (everything on the machine).\n\n",
		res.Kernel, res.CPUs, res.Revision, res.Tool, res.DurationSeconds, res.LoadAvg[0], res.LoadAvg[1], 100*res.BusyCPU)
	fmt.Fprintf(&b, "Command: `%s`\n\n", res.Command)
	fmt.Fprintf(&b, "| path | what | runs (Gbit/s) | median (Gbit/s) | datapath CPU s/GB, sender / receiver (medians) | underlay bytes per UDP datagram sent / received | underlay avg packet tx / rx (B) | TUN avg packet tx / rx (B) |\n|---|---|---|---|---|---|---|---|\n")
	for _, p := range res.Paths {
		var runs, udp, ul, tun []string
		for _, r := range p.Runs {
			runs = append(runs, fmt.Sprintf("%.2f", r.BitsPerSecond/1e9))
			ul = append(ul, fmt.Sprintf("%.0f/%.0f", r.UlTxAvgBytes, r.UlRxAvgBytes))
			if r.TunTxAvgBytes > 0 {
				udp = append(udp, fmt.Sprintf("%.0f/%.0f", r.SendBytesPerUDP, r.RecvBytesPerUDP))
				tun = append(tun, fmt.Sprintf("%.0f/%.0f", r.TunTxAvgBytes, r.TunRxAvgBytes))
			}
		}
		cpu := ""
		if p.MedianSendCPUPerGB > 0 {
			cpu = fmt.Sprintf("%.2f / %.2f", p.MedianSendCPUPerGB, p.MedianRecvCPUPerGB)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | **%.2f** | %s | %s | %s | %s |\n", p.Name, p.What, strings.Join(runs, ", "), p.MedianGbps,
			cpu, strings.Join(udp, ", "), strings.Join(ul, ", "), strings.Join(tun, ", "))
	}
	fmt.Fprintf(&b, "\nRatios of medians: cable / wg-go **%.3f**, cable / plain %.3f, wg-go / plain %.3f, vxlan / plain (interleaved) **%.3f**.\n",
		res.Ratios["cable/wg-go"], res.Ratios["cable/plain"], res.Ratios["wg-go/plain"], res.Ratios["vxlan/plain"])
	fmt.Fprintf(&b, "\nOffloads (TUN features as `ethtool -k` names them; UDP sockets on the port with UDP_GRO):\n\n")
	for _, o := range res.Offloads {
		fmt.Fprintf(&b, "- %s, %s, port %d: `%s`\n", o.Gateway, o.Link, o.Port, string(o.Report))
	}
	fmt.Fprintf(&b, "\nNotes:\n\n")
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	benchresults.Save(t, "results", "wgspeed", res, b.String())
}
