//go:build bench

package ingressbench

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/internal/benchresults"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// nsPrefix: "cbt" + a non-hex letter, so tests/netns/harness's sweep leaves these alone.
const nsPrefix = nstest.Prefix("cbtg")

const (
	podB        = "10.20.0.2"
	meshA       = "242.0.0.1"
	meshB       = "242.0.0.2"
	iperfPort   = 5201
	echoPort    = 7000
	ingressPerf = 30001 // → podB:5201
	ingressEcho = 30002 // → podB:7000
)

// Path is one way from podA to podB's servers.
type Path struct {
	Name       string    `json:"name"`
	IperfAddr  string    `json:"iperfAddress"`
	EchoAddr   string    `json:"connectAddress"`
	Gbits      []float64 `json:"throughputGbitPerRun"`
	P50us      []float64 `json:"connectP50usPerRun"`
	P99us      []float64 `json:"connectP99usPerRun"`
	ConnErrors int       `json:"connectErrors"`
	MedGbits   float64   `json:"medianThroughputGbit"`
	MedP50us   float64   `json:"medianConnectP50us"`
	MedP99us   float64   `json:"medianConnectP99us"`
}

// Result is what bench/results/ingress-<date>.json holds.
type Result struct {
	Date          string  `json:"date"`
	Kernel        string  `json:"kernel"`
	CPUs          int     `json:"cpus"`
	GoVersion     string  `json:"goVersion"`
	Iperf3        string  `json:"iperf3"`
	LoadAvgBefore string  `json:"loadAverageBefore"`
	LoadAvgAfter  string  `json:"loadAverageAfter"`
	Command       string  `json:"command"`
	Seconds       int     `json:"iperfSeconds"`
	Rounds        int     `json:"rounds"`
	Connects      int     `json:"connectsPerRun"`
	Anchor        Path    `json:"anchor"`
	Ingress       Path    `json:"ingress"`
	RatioGbits    float64 `json:"throughputRatioIngressToDirect"`
	RatioP50      float64 `json:"connectP50RatioIngressToDirect"`
	RatioP99      float64 `json:"connectP99RatioIngressToDirect"`
	// Paired ratios: ingress / direct within each round (the two runs of a round are back to
	// back, so a load change on the shared machine between rounds cancels out), and their median.
	RoundGbitRatios []float64 `json:"throughputRatioPerRound"`
	RoundP50Ratios  []float64 `json:"connectP50RatioPerRound"`
	PairedGbitRatio float64   `json:"medianPairedThroughputRatio"`
	PairedP50Ratio  float64   `json:"medianPairedConnectP50Ratio"`
	Notes           []string  `json:"notes"`
}

// startServer runs argv in ns until the test ends.
func startServer(t *testing.T, ns string, argv ...string) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns}, argv...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %v: %v", argv, err)
	}
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	})
}

// waitConnect waits until a TCP connect from ns to addr succeeds (the servers are starting).
func waitConnect(t *testing.T, tcpcheck, ns, addr string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		out, err := nstest.Run("ip", "netns", "exec", ns, tcpcheck, "connbench", "-addr", addr, "-count", "1", "-timeout", "1s")
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not reachable from %s: %v %s", addr, ns, err, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func iperf(t *testing.T, ns, host string, port, seconds int) float64 {
	t.Helper()
	out, err := nstest.RunWithin(time.Duration(seconds+60)*time.Second, "ip", "netns", "exec", ns,
		"iperf3", "-c", host, "-p", strconv.Itoa(port), "-t", strconv.Itoa(seconds), "-J")
	if err != nil {
		t.Fatalf("iperf3 to %s:%d: %v", host, port, err)
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
			} `json:"sum_received"`
		} `json:"end"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("decode iperf3 JSON: %v", err)
	}
	return r.End.SumReceived.BitsPerSecond / 1e9
}

func connbench(t *testing.T, tcpcheck, ns, addr string, n int) (p50, p99 float64, errs int) {
	t.Helper()
	out, err := nstest.RunWithin(10*time.Minute, "ip", "netns", "exec", ns, tcpcheck, "connbench", "-addr", addr, "-count", strconv.Itoa(n), "-timeout", "2s")
	if err != nil {
		t.Fatalf("connbench %s: %v", addr, err)
	}
	var s struct {
		Errors int     `json:"errors"`
		P50    float64 `json:"p50us"`
		P99    float64 `json:"p99us"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &s); err != nil {
		t.Fatalf("decode connbench %q: %v", out, err)
	}
	return s.P50, s.P99, s.Errors
}

// TestIngress builds the two clusters, then measures direct and ingress paths interleaved round
// by round (the one going first alternates), and writes bench/results/ingress-<date>.*.
func TestIngress(t *testing.T) {
	nstest.RequireRoot(t, "creates network namespaces, a VXLAN cable and nftables tables", "ip", "iperf3")
	seconds, rounds, connects := benchresults.EnvInt("INGRESS_BENCH_SECONDS", 4), benchresults.EnvInt("INGRESS_BENCH_ROUNDS", 5), benchresults.EnvInt("INGRESS_BENCH_CONNECTS", 2000)
	tmp := t.TempDir()
	ingressnft := nstest.Binary(t, tmp, "./tests/netns/cmd/ingressnft")
	tcpcheck := nstest.Binary(t, tmp, "./tests/netns/cmd/tcpcheck")

	podA, gwA, gwB, pb := nsPrefix.Add(t, "poda"), nsPrefix.Add(t, "gwa"), nsPrefix.Add(t, "gwb"), nsPrefix.Add(t, "podb")
	run := func(args ...string) { t.Helper(); nstest.MustRun(t, args...) }
	for _, ns := range []string{podA, gwA, gwB, pb} {
		run("ip", "-n", ns, "link", "set", "lo", "up")
	}
	nstest.Veth(t, podA, "p0", "10.10.0.2/24", gwA, "g0", "10.10.0.1/24")
	nstest.Veth(t, gwA, "u0", "172.31.0.1/24", gwB, "u0", "172.31.0.2/24")
	nstest.Veth(t, gwB, "g0", "10.20.0.1/24", pb, "p0", podB+"/24")
	// The cable: kernel VXLAN, point to point over the underlay veth.
	for _, g := range []struct{ ns, local, remote, addr string }{
		{gwA, "172.31.0.1", "172.31.0.2", "169.254.42.1/30"},
		{gwB, "172.31.0.2", "172.31.0.1", "169.254.42.2/30"},
	} {
		run("ip", "-n", g.ns, "link", "add", "vx0", "type", "vxlan", "id", "42", "local", g.local, "remote", g.remote, "dstport", "4789", "dev", "u0")
		run("ip", "-n", g.ns, "addr", "add", g.addr, "dev", "vx0")
		run("ip", "-n", g.ns, "link", "set", "vx0", "up")
		run("ip", "netns", "exec", g.ns, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	}
	run("ip", "-n", podA, "route", "add", "default", "via", "10.10.0.1")
	run("ip", "-n", pb, "route", "add", "default", "via", "10.20.0.1")
	// (a) direct: the remote pod CIDRs over the cable.
	run("ip", "-n", gwA, "route", "add", "10.20.0.0/24", "via", "169.254.42.2")
	run("ip", "-n", gwB, "route", "add", "10.10.0.0/24", "via", "169.254.42.1")
	// (b) gateway mode: the mesh addresses and the ingress tables.
	cfgA := fmt.Sprintf(`{"MeshAddress":%q,"RemoteMeshAddresses":[%q]}`, meshA, meshB)
	cfgB := fmt.Sprintf(`{"MeshAddress":%q,"RemoteMeshAddresses":[%q],"Services":[{"Namespace":"bench","Name":"podb","Ports":[`+
		`{"Name":"iperf","Protocol":"TCP","IngressPort":%d,"Backends":["%s:%d"]},`+
		`{"Name":"echo","Protocol":"TCP","IngressPort":%d,"Backends":["%s:%d"]}]}]}`,
		meshB, meshA, ingressPerf, podB, iperfPort, ingressEcho, podB, echoPort)
	run("ip", "netns", "exec", gwA, ingressnft, "apply", "-mesh-link", "-config", cfgA)
	run("ip", "netns", "exec", gwB, ingressnft, "apply", "-mesh-link", "-config", cfgB)
	run("ip", "-n", gwA, "route", "add", meshB+"/32", "via", "169.254.42.2", "src", meshA)
	run("ip", "-n", gwB, "route", "add", meshA+"/32", "via", "169.254.42.1", "src", meshB)

	startServer(t, pb, "iperf3", "-s", "-p", strconv.Itoa(iperfPort))
	startServer(t, pb, tcpcheck, "serve", "-listen", fmt.Sprintf(":%d", echoPort))
	direct := Path{Name: "direct pod-to-pod over the VXLAN cable (anchor)",
		IperfAddr: fmt.Sprintf("%s:%d", podB, iperfPort), EchoAddr: fmt.Sprintf("%s:%d", podB, echoPort)}
	ingress := Path{Name: "through the kernel ingress (SNAT on gwA, DNAT on gwB)",
		IperfAddr: fmt.Sprintf("%s:%d", meshB, ingressPerf), EchoAddr: fmt.Sprintf("%s:%d", meshB, ingressEcho)}
	waitConnect(t, tcpcheck, podA, direct.EchoAddr)
	waitConnect(t, tcpcheck, podA, ingress.EchoAddr)
	waitConnect(t, tcpcheck, podA, direct.IperfAddr)
	waitConnect(t, tcpcheck, podA, ingress.IperfAddr)

	res := Result{
		Date:          time.Now().UTC().Format(time.RFC3339),
		Kernel:        benchresults.FirstLine("uname", "-r"),
		CPUs:          runtime.NumCPU(),
		GoVersion:     runtime.Version(),
		Iperf3:        benchresults.FirstLine("iperf3", "--version"),
		LoadAvgBefore: benchresults.LoadAvg(),
		Command:       "sudo make bench-ingress (or: go test -tags bench -run '^TestIngress$' -v -count=1 -timeout 30m ./bench/ingress/)",
		Seconds:       seconds, Rounds: rounds, Connects: connects,
	}
	measure := func(p *Path) {
		host, port, _ := strings.Cut(p.IperfAddr, ":")
		n, _ := strconv.Atoi(port)
		p.Gbits = append(p.Gbits, iperf(t, podA, host, n, seconds))
		p50, p99, errs := connbench(t, tcpcheck, podA, p.EchoAddr, connects)
		p.P50us, p.P99us = append(p.P50us, p50), append(p.P99us, p99)
		p.ConnErrors += errs
		t.Logf("%s: %.2f Gbit/s, connect p50 %.0fµs p99 %.0fµs, %d errors", p.Name, p.Gbits[len(p.Gbits)-1], p50, p99, errs)
	}
	for r := range rounds {
		if r%2 == 0 {
			measure(&direct)
			measure(&ingress)
		} else {
			measure(&ingress)
			measure(&direct)
		}
	}
	res.LoadAvgAfter = benchresults.LoadAvg()
	for _, p := range []*Path{&direct, &ingress} {
		p.MedGbits, p.MedP50us, p.MedP99us = benchresults.Median(p.Gbits), benchresults.Median(p.P50us), benchresults.Median(p.P99us)
	}
	res.Anchor, res.Ingress = direct, ingress
	res.RatioGbits = ingress.MedGbits / direct.MedGbits
	res.RatioP50 = ingress.MedP50us / direct.MedP50us
	res.RatioP99 = ingress.MedP99us / direct.MedP99us
	for i := range direct.Gbits {
		res.RoundGbitRatios = append(res.RoundGbitRatios, ingress.Gbits[i]/direct.Gbits[i])
		res.RoundP50Ratios = append(res.RoundP50Ratios, ingress.P50us[i]/direct.P50us[i])
	}
	res.PairedGbitRatio, res.PairedP50Ratio = benchresults.Median(res.RoundGbitRatios), benchresults.Median(res.RoundP50Ratios)
	res.Notes = []string{
		"Both gateways hold the cablemesh-ingress table (nat hooks registered, conntrack on) on both paths: the difference measured is the SNAT on gwA and the DNAT on gwB, plus the extra /32 route look-up.",
		"Connect latency is connect() as Go's net.Dial returns (SYN/SYN-ACK over the cable); each connection is closed with a reset so no TIME_WAIT builds up.",
		"All four namespaces and iperf3 share the machine's CPUs with whatever else runs; rounds alternate which path goes first.",
	}
	if direct.ConnErrors+ingress.ConnErrors > 0 {
		t.Errorf("connect errors: direct %d, ingress %d", direct.ConnErrors, ingress.ConnErrors)
	}
	if ingress.MedGbits <= 0 || direct.MedGbits <= 0 {
		t.Errorf("no throughput measured: direct %v, ingress %v", direct.Gbits, ingress.Gbits)
	}
	benchresults.Save(t, filepath.Join("..", "results"), "ingress", res, markdown(res))
}

func joinF(xs []float64, format string) string {
	var s []string
	for _, x := range xs {
		s = append(s, fmt.Sprintf(format, x))
	}
	return strings.Join(s, ", ")
}

func markdown(res Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Kernel ingress (gateway mode): through both gateways vs direct pod-to-pod (%s)\n\n", res.Date)
	fmt.Fprintf(&b, "Kernel %s, %d CPUs, %s, %s; load average before %q, after %q. Cable: kernel VXLAN over a veth underlay. Anchor: direct pod-to-pod routing over the same cable, same run.\n\n",
		res.Kernel, res.CPUs, res.GoVersion, res.Iperf3, res.LoadAvgBefore, res.LoadAvgAfter)
	fmt.Fprintf(&b, "Command: `%s`\n\n", res.Command)
	fmt.Fprintf(&b, "%d interleaved rounds per path: iperf3 one TCP stream for %ds, then %d TCP connects.\n\n", res.Rounds, res.Seconds, res.Connects)
	b.WriteString("| path | address (iperf3 / connects) | throughput per run (Gbit/s) | median Gbit/s | connect p50 (µs, median of runs) | connect p99 (µs, median of runs) | connect errors |\n|---|---|---|---|---|---|---|\n")
	for _, p := range []Path{res.Anchor, res.Ingress} {
		fmt.Fprintf(&b, "| %s | %s / %s | %s | **%.2f** | %.0f | %.0f | %d |\n", p.Name, p.IperfAddr, p.EchoAddr, joinF(p.Gbits, "%.2f"), p.MedGbits, p.MedP50us, p.MedP99us, p.ConnErrors)
	}
	fmt.Fprintf(&b, "\nRatios ingress / direct of the medians: throughput %.3f, connect p50 %.3f, connect p99 %.3f.\n\n", res.RatioGbits, res.RatioP50, res.RatioP99)
	fmt.Fprintf(&b, "Paired per round (the two paths back to back): throughput %s, median **%.3f**; connect p50 %s, median **%.3f**.\n\n",
		joinF(res.RoundGbitRatios, "%.3f"), res.PairedGbitRatio, joinF(res.RoundP50Ratios, "%.3f"), res.PairedP50Ratio)
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}
