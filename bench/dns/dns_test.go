//go:build bench

package dnsbench

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	agentdns "github.com/cablemesh/cablemesh/agent/dns"
	"github.com/cablemesh/cablemesh/internal/benchresults"
)

// serveEnv makes the test binary a DNS server child (see TestMain).
const serveEnv = "CABLEMESH_DNS_BENCH_SERVE"

const (
	clusterSetIPServices = 1000
	headlessServices     = 50
	endpointsPerHeadless = 3
	queryLines           = 20000
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(serveEnv); addr != "" {
		os.Exit(serve(addr))
	}
	os.Exit(m.Run())
}

// serve runs the agent's DNS server with the bench's services until stdin closes (the
// parent went away) or a signal arrives. It prints "ready <addr>" once listening.
func serve(addr string) int {
	s, err := agentdns.NewServer(agentdns.Config{Listen: addr, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := s.Update(benchServices()); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop() }()
	if err := s.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println("ready", s.Addr())
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = s.Shutdown(sctx)
	return 0
}

// benchServices are the imports both servers answer: ClusterSetIP services with two named
// ports, and headless services with three ready endpoints in three clusters.
func benchServices() []agentdns.Service {
	var out []agentdns.Service
	for i := range clusterSetIPServices {
		out = append(out, agentdns.Service{
			Namespace: fmt.Sprintf("ns%d", i%20), Name: fmt.Sprintf("svc%d", i), Type: agentdns.ClusterSetIP,
			VIPs:  []netip.Addr{netip.AddrFrom4([4]byte{241, 0, byte(i >> 8), byte(i)})},
			Ports: []agentdns.Port{{Name: "http", Port: 80}, {Name: "grpc", Port: 9090}},
		})
	}
	clusters := []string{"east", "west", "north"}
	for i := range headlessServices {
		s := agentdns.Service{Namespace: "db", Name: fmt.Sprintf("pg%d", i), Type: agentdns.Headless,
			Ports: []agentdns.Port{{Name: "pg", Port: 5432}}}
		for j := range endpointsPerHeadless {
			s.Endpoints = append(s.Endpoints, agentdns.Endpoint{Cluster: clusters[j], Hostname: fmt.Sprintf("pg-%d", j),
				IP: netip.AddrFrom4([4]byte{10, byte(j + 1), byte(i >> 8), byte(i)}), Ready: true})
		}
		out = append(out, s)
	}
	return out
}

type question struct {
	Name  string
	Qtype uint16
	Kind  string
}

// queryMix is the query file both servers get. Full zone: 60% ClusterSetIP A, 10% AAAA of
// those (NODATA), 10% SRV of a named port, 10% headless A (three records), 5% one
// endpoint's A, 5% unknown services (NXDOMAIN). Addresses only: the same without SRV (its
// share goes to ClusterSetIP A). Deterministic.
func queryMix(withSRV bool) []question {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]question, 0, queryLines)
	for range queryLines {
		i := r.IntN(clusterSetIPServices)
		svc := fmt.Sprintf("svc%d.ns%d.svc.clusterset.local.", i, i%20)
		h := r.IntN(headlessServices)
		hl := fmt.Sprintf("pg%d.db.svc.clusterset.local.", h)
		switch p := r.IntN(100); {
		case p < 60 || (p < 70 && !withSRV):
			out = append(out, question{svc, mdns.TypeA, "ClusterSetIP A"})
		case p < 70:
			out = append(out, question{"_http._tcp." + svc, mdns.TypeSRV, "SRV"})
		case p < 80:
			out = append(out, question{svc, mdns.TypeAAAA, "AAAA NODATA"})
		case p < 90:
			out = append(out, question{hl, mdns.TypeA, "headless A"})
		case p < 95:
			out = append(out, question{fmt.Sprintf("pg-%d.%s.%s", r.IntN(endpointsPerHeadless), []string{"east", "west", "north"}[r.IntN(3)], hl), mdns.TypeA, "endpoint A"})
		default:
			out = append(out, question{fmt.Sprintf("nope%d.ns%d.svc.clusterset.local.", i, i%20), mdns.TypeA, "NXDOMAIN"})
		}
	}
	return out
}

// dnsmasqConfig serves the zone from dnsmasq configuration. Full zone: A and AAAA as
// host-record lines, SRV as srv-host lines, TXT as txt-record lines. Addresses only: A and
// AAAA in a hosts file (addn-hosts), which dnsmasq keeps in its hash table (srv-host lines
// are a list dnsmasq walks on every query, which dominates its cost with thousands of them).
// local= makes every other name in the zone NXDOMAIN. It returns the configuration and the
// hosts file (empty for the full zone).
func dnsmasqConfig(z *agentdns.Zone, port int, full bool, hostsPath string) (conf, hosts string) {
	var b, h strings.Builder
	fmt.Fprintf(&b, "no-resolv\nno-hosts\nport=%d\nlisten-address=127.0.0.1\nbind-interfaces\nlocal=/clusterset.local/\nlocal-ttl=5\n", port)
	if !full {
		fmt.Fprintf(&b, "addn-hosts=%s\n", hostsPath)
	}
	for _, rr := range z.RRs() {
		name := strings.TrimSuffix(rr.Header().Name, ".")
		var ip net.IP
		switch rr := rr.(type) {
		case *mdns.A:
			ip = rr.A
		case *mdns.AAAA:
			ip = rr.AAAA
		case *mdns.SRV:
			if full {
				fmt.Fprintf(&b, "srv-host=%s,%s,%d,%d,%d\n", name, strings.TrimSuffix(rr.Target, "."), rr.Port, rr.Priority, rr.Weight)
			}
		case *mdns.TXT:
			fmt.Fprintf(&b, "txt-record=%s,%s\n", name, strings.Join(rr.Txt, ""))
		}
		switch {
		case ip == nil:
		case full:
			fmt.Fprintf(&b, "host-record=%s,%s\n", name, ip)
		default:
			fmt.Fprintf(&h, "%s %s\n", ip, name)
		}
	}
	return b.String(), h.String()
}

// freePort returns a port free on 127.0.0.1 for both UDP and TCP (at the time of asking).
func freePort(t *testing.T) int {
	t.Helper()
	for range 20 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		ln, err := net.Listen("tcp", pc.LocalAddr().String())
		pc.Close()
		if err == nil {
			ln.Close()
			return port
		}
	}
	t.Fatal("no free port")
	return 0
}

func waitAnswers(addr string) error {
	c := &mdns.Client{Timeout: 200 * time.Millisecond}
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := new(mdns.Msg).SetQuestion("dns-version.clusterset.local.", mdns.TypeTXT)
		if _, _, err := c.Exchange(m, addr); err == nil {
			return nil
		} else if time.Now().After(deadline) {
			return fmt.Errorf("%s does not answer: %w", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startAgentDNS runs the agent's server in a child process and returns its address.
func startAgentDNS(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), serveEnv+"=127.0.0.1:0")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatalf("agent dns child: %v", err)
	}
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "ready ")
	if !ok {
		t.Fatalf("agent dns child said %q", line)
	}
	if err := waitAnswers(addr); err != nil {
		t.Fatal(err)
	}
	return addr
}

// startDnsmasq runs dnsmasq with conf (and hosts, when set) and returns its address.
func startDnsmasq(t *testing.T, dir, conf, hosts string, port int) string {
	t.Helper()
	path := filepath.Join(dir, "dnsmasq.conf")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	if hosts != "" {
		if err := os.WriteFile(filepath.Join(dir, "hosts"), []byte(hosts), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"--keep-in-foreground", "--conf-file=" + path, "--pid-file=", "--log-facility=" + filepath.Join(dir, "dnsmasq.log")}
	if os.Geteuid() == 0 {
		args = append(args, "--user=root") // Debian's dnsmasq-base has no dnsmasq user to drop to
	}
	cmd := exec.Command("dnsmasq", args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}
	t.Cleanup(stop)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitAnswers(addr); err != nil {
		log, _ := os.ReadFile(filepath.Join(dir, "dnsmasq.log"))
		t.Fatalf("%v\n%s", err, log)
	}
	return addr
}

// coreDNSEnv names the CoreDNS binary (tests/k8s/coredns/build.sh's; make bench-dns sets it).
const coreDNSEnv = "CABLEMESH_COREDNS"

// coreDNSZone is the agent's zone as an RFC 1035 zone file (SOA first), for CoreDNS's file
// plugin: the same records the agent answers from.
func coreDNSZone(z *agentdns.Zone) string {
	var b strings.Builder
	for _, rr := range z.RRs() {
		// The file plugin refuses serial 0 (it takes it for "not loaded yet"); the bench's
		// zone is built with the initial serial 0, and no question asks for the SOA.
		if soa, ok := rr.(*mdns.SOA); ok && soa.Serial == 0 {
			soa.Serial = 1
		}
		b.WriteString(rr.String())
		b.WriteByte('\n')
	}
	return b.String()
}

// startCoreDNS runs CoreDNS serving the agent's zone from a zone file (the file plugin, no
// cache, nothing else in the server block) and returns its address.
func startCoreDNS(t *testing.T, bin, dir string, z *agentdns.Zone, port int) string {
	t.Helper()
	zone := filepath.Join(dir, "clusterset.local.zone")
	if err := os.WriteFile(zone, []byte(coreDNSZone(z)), 0o644); err != nil {
		t.Fatal(err)
	}
	corefile := filepath.Join(dir, "Corefile")
	conf := fmt.Sprintf("clusterset.local:%d {\n    bind 127.0.0.1\n    file %s clusterset.local\n}\n", port, zone)
	if err := os.WriteFile(corefile, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	var logs strings.Builder
	cmd := exec.Command(bin, "-conf", corefile, "-quiet")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	if err := waitAnswers(addr); err != nil {
		t.Fatalf("%v\n%s", err, logs.String())
	}
	return addr
}

// coreDNSVersion is the first line of `coredns -version` ("CoreDNS-1.15.0").
func coreDNSVersion(bin string) string {
	out, _ := exec.Command(bin, "-version").Output()
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	return line
}

// canonical is an answer as comparable text: rcode, then the answer records without TTL,
// lower case, sorted.
func canonical(m *mdns.Msg) string {
	var rrs []string
	for _, rr := range m.Answer {
		rr = mdns.Copy(rr)
		rr.Header().Ttl = 0
		rr.Header().Name = strings.ToLower(rr.Header().Name)
		rrs = append(rrs, rr.String())
	}
	slices.Sort(rrs)
	return mdns.RcodeToString[m.Rcode] + " " + strings.Join(rrs, " | ")
}

// compare asks both servers every distinct question and returns the ones they answer
// differently (a is the agent, b the server named bName).
func compare(qs []question, a, b, bName string) (checked int, diffs []string, err error) {
	c := &mdns.Client{Timeout: 2 * time.Second}
	seen := map[question]bool{}
	for _, q := range qs {
		if seen[q] {
			continue
		}
		seen[q] = true
		m := new(mdns.Msg).SetQuestion(q.Name, q.Qtype)
		ra, _, err := c.Exchange(m, a)
		if err != nil {
			return checked, diffs, err
		}
		rb, _, err := c.Exchange(m, b)
		if err != nil {
			return checked, diffs, err
		}
		checked++
		if ca, cb := canonical(ra), canonical(rb); ca != cb {
			diffs = append(diffs, fmt.Sprintf("%s %s: agent %s; %s %s", q.Name, mdns.TypeToString[q.Qtype], ca, bName, cb))
		}
	}
	return checked, diffs, nil
}

// Run is one load run against one server.
type Run struct {
	Server    string           `json:"server"`
	Mode      string           `json:"mode"`
	Round     int              `json:"round"`
	Sent      int64            `json:"sent"`
	Completed int64            `json:"completed"`
	Lost      int64            `json:"lost"`
	QPS       float64          `json:"qps"`
	P50Ms     float64          `json:"p50Ms"`
	P99Ms     float64          `json:"p99Ms"`
	P999Ms    float64          `json:"p999Ms"`
	MaxMs     float64          `json:"maxMs"`
	Rcodes    map[string]int64 `json:"rcodes"`
}

func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

func (r *Run) setLatencies(lat []float64) {
	slices.Sort(lat)
	r.P50Ms, r.P99Ms, r.P999Ms = percentile(lat, .5)*1e3, percentile(lat, .99)*1e3, percentile(lat, .999)*1e3
	if len(lat) > 0 {
		r.MaxMs = lat[len(lat)-1] * 1e3
	}
}

// load generators

type loadgen interface {
	name() string
	run(addr string, d time.Duration, rate int) (Run, error)
}

// dnsperf runs dnsperf in verbose mode, which prints every response's latency.
type dnsperf struct{ file string }

func (dnsperf) name() string { return "dnsperf" }

func (p dnsperf) run(addr string, d time.Duration, rate int) (Run, error) {
	host, port, _ := net.SplitHostPort(addr)
	args := []string{"-s", host, "-p", port, "-d", p.file, "-l", strconv.Itoa(int(d / time.Second)), "-c", "4", "-T", "1", "-q", "64", "-t", "2", "-v"}
	if rate > 0 {
		args = append(args, "-Q", strconv.Itoa(rate))
	}
	cmd := exec.Command("dnsperf", args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return Run{}, err
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return Run{}, err
	}
	r := Run{Rcodes: map[string]int64{}}
	lat := make([]float64, 0, 1<<20)
	sc := bufio.NewScanner(out)
	field := func(line, prefix string) (string, bool) {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), prefix)
		if !ok {
			return "", false
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return "", false
		}
		return f[0], true
	}
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "> ") {
			f := strings.Fields(line)
			if len(f) >= 5 {
				r.Rcodes[f[1]]++
				if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
					lat = append(lat, v)
				}
			}
			continue
		}
		if v, ok := field(line, "Queries sent:"); ok {
			r.Sent, _ = strconv.ParseInt(v, 10, 64)
		} else if v, ok := field(line, "Queries completed:"); ok {
			r.Completed, _ = strconv.ParseInt(v, 10, 64)
		} else if v, ok := field(line, "Queries lost:"); ok {
			r.Lost, _ = strconv.ParseInt(v, 10, 64)
		} else if v, ok := field(line, "Queries per second:"); ok {
			r.QPS, _ = strconv.ParseFloat(v, 64)
		}
	}
	if err := cmd.Wait(); err != nil {
		return r, fmt.Errorf("dnsperf: %w: %s", err, stderr.String())
	}
	r.setLatencies(lat)
	return r, nil
}

// goLoad is the fallback load generator: workers with one UDP socket each, one query
// outstanding per worker; with a rate, each worker paces its share of it.
type goLoad struct{ queries [][]byte }

func (goLoad) name() string { return "go" }

func (g goLoad) run(addr string, d time.Duration, rate int) (Run, error) {
	const workers = 16
	var sent, done, lost atomic.Int64
	var mu sync.Mutex
	var all []float64
	rcodes := map[string]int64{}
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	var firstErr error
	var errOnce sync.Once
	for w := range workers {
		wg.Go(func() {
			conn, err := net.Dial("udp", addr)
			if err != nil {
				errOnce.Do(func() { firstErr = err })
				return
			}
			defer conn.Close()
			buf := make([]byte, 65535)
			var qbuf []byte
			lat := make([]float64, 0, 1<<16)
			codes := map[string]int64{}
			var interval time.Duration
			if rate > 0 {
				interval = time.Duration(float64(time.Second) * workers / float64(rate))
			}
			next := start.Add(time.Duration(w) * interval / workers)
			for i := w; time.Now().Before(end); i += workers {
				if interval > 0 {
					if wait := time.Until(next); wait > 0 {
						time.Sleep(wait)
					}
					next = next.Add(interval)
				}
				q := append(qbuf[:0], g.queries[i%len(g.queries)]...)
				id := uint16(i)
				binary.BigEndian.PutUint16(q[:2], id)
				t0 := time.Now()
				if _, err := conn.Write(q); err != nil {
					errOnce.Do(func() { firstErr = err })
					return
				}
				sent.Add(1)
				_ = conn.SetReadDeadline(t0.Add(2 * time.Second))
				for {
					n, err := conn.Read(buf)
					if err != nil {
						lost.Add(1)
						break
					}
					if n < 12 || binary.BigEndian.Uint16(buf[:2]) != id {
						continue
					}
					lat = append(lat, time.Since(t0).Seconds())
					codes[mdns.RcodeToString[int(buf[3]&0xF)]]++
					done.Add(1)
					break
				}
			}
			mu.Lock()
			all = append(all, lat...)
			for k, v := range codes {
				rcodes[k] += v
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	r := Run{Sent: sent.Load(), Completed: done.Load(), Lost: lost.Load(), Rcodes: rcodes,
		QPS: float64(done.Load()) / elapsed.Seconds()}
	r.setLatencies(all)
	return r, firstErr
}

// packQueries packs every question once; the Go load generator copies each before writing
// its id.
func packQueries(qs []question) [][]byte {
	out := make([][]byte, 0, len(qs))
	for _, q := range qs {
		b, err := new(mdns.Msg).SetQuestion(q.Name, q.Qtype).Pack()
		if err != nil {
			panic(err)
		}
		out = append(out, b)
	}
	return out
}

// Series is one server's runs in one profile and mode, and their medians.
type Series struct {
	Profile     string  `json:"profile"`
	Server      string  `json:"server"`
	Mode        string  `json:"mode"`
	Runs        []Run   `json:"runs"`
	MedianQPS   float64 `json:"medianQps"`
	MedianP50Ms float64 `json:"medianP50Ms"`
	MedianP99Ms float64 `json:"medianP99Ms"`
	LostTotal   int64   `json:"lostTotal"`
}

// Profile is one dnsmasq configuration, its query mix, and the agent's ratios to it.
type Profile struct {
	Name           string         `json:"name"`
	Dnsmasq        string         `json:"dnsmasq"`
	QueryMix       map[string]int `json:"queryMix"`
	QuestionsCheck int            `json:"distinctQuestionsCompared"`
	AnswerDiffs    []string       `json:"answerDifferences"`
	QPSRatioMax    float64        `json:"qpsRatioAgentToDnsmasqMax"`
	P99RatioMax    float64        `json:"p99RatioAgentToDnsmasqMax"`
	P99RatioFixed  float64        `json:"p99RatioAgentToDnsmasqFixed"`
	// CoreDNS, when it ran: its answers compared with the agent's, and the agent's p99 over
	// CoreDNS's at each fixed rate ("fixed 2000 qps": ratio).
	CoreDNSQuestionsCheck int                `json:"coreDNSDistinctQuestionsCompared,omitempty"`
	CoreDNSAnswerDiffs    []string           `json:"coreDNSAnswerDifferences,omitempty"`
	P99RatioCoreDNSFixed  map[string]float64 `json:"p99RatioAgentToCoreDNSFixed,omitempty"`
}

// Result is what bench/results/dns-<date>.json holds.
type Result struct {
	Date          string    `json:"date"`
	Kernel        string    `json:"kernel"`
	CPUs          int       `json:"cpus"`
	LoadAvgBefore string    `json:"loadAverageBefore"`
	LoadAvgAfter  string    `json:"loadAverageAfter"`
	GoVersion     string    `json:"goVersion"`
	Anchor        string    `json:"anchor"`
	LoadGenerator string    `json:"loadGenerator"`
	Command       string    `json:"command"`
	RunSeconds    int       `json:"runSeconds"`
	Rounds        int       `json:"rounds"`
	FixedRate     int       `json:"fixedRateQps"`
	FixedRates    []int     `json:"fixedRatesQps"`
	CoreDNS       string    `json:"coreDNS,omitempty"`
	Services      int       `json:"services"`
	ZoneNames     int       `json:"zoneNames"`
	Profiles      []Profile `json:"profiles"`
	Series        []Series  `json:"series"`
	Notes         []string  `json:"notes"`
}

// dnsperfVersion is the version dnsperf -h prints ("Version 2.10.0").
func dnsperfVersion() string {
	out, _ := exec.Command("dnsperf", "-h").CombinedOutput()
	for _, l := range strings.Split(string(out), "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(l), "Version "); ok {
			return v
		}
	}
	return "(unknown version)"
}

// fixedRates are the paced rates (queries/s): DNS_BENCH_RATES, a comma-separated list (default
// 2000,20000), or DNS_BENCH_RATE alone.
func fixedRates() ([]int, error) {
	spec := os.Getenv("DNS_BENCH_RATES")
	if spec == "" {
		spec = os.Getenv("DNS_BENCH_RATE")
	}
	if spec == "" {
		return []int{2000, 20000}, nil
	}
	var rates []int
	for _, f := range strings.Split(spec, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r <= 0 {
			return nil, fmt.Errorf("DNS_BENCH_RATES: %q is not a positive number of queries per second", f)
		}
		rates = append(rates, r)
	}
	return rates, nil
}

// TestDNS measures queries per second and latency of the agent's DNS server and of dnsmasq
// serving the same names, interleaved run by run, and writes bench/results/dns-<date>.*.
func TestDNS(t *testing.T) {
	if _, err := exec.LookPath("dnsmasq"); err != nil {
		t.Skip("dnsmasq is not installed (Debian: dnsmasq-base); it is the anchor of this benchmark")
	}
	secs := benchresults.EnvInt("DNS_BENCH_SECONDS", 10)
	rounds := benchresults.EnvInt("DNS_BENCH_ROUNDS", 1)
	rates, err := fixedRates()
	if err != nil {
		t.Fatal(err)
	}
	coreDNS := os.Getenv(coreDNSEnv)
	if coreDNS != "" {
		if _, err := os.Stat(coreDNS); err != nil {
			t.Fatalf("%s=%q: %v (tests/k8s/coredns/build.sh prints its directory)", coreDNSEnv, coreDNS, err)
		}
	}

	svcs := benchServices()
	z, err := agentdns.BuildZone(svcs, agentdns.ZoneOptions{})
	if err != nil {
		t.Fatal(err)
	}
	res := Result{
		Date:          time.Now().UTC().Format(time.RFC3339),
		Kernel:        benchresults.FirstLine("uname", "-r"),
		CPUs:          runtime.NumCPU(),
		LoadAvgBefore: benchresults.LoadAvg(),
		GoVersion:     runtime.Version(),
		Anchor:        benchresults.FirstLine("dnsmasq", "--version"),
		RunSeconds:    secs,
		Rounds:        rounds,
		FixedRate:     rates[0],
		FixedRates:    rates,
		Services:      len(svcs),
		ZoneNames:     z.Names(),
		Command:       "go test -tags bench -run '^TestDNS$' -v -count=1 -timeout 30m ./bench/dns/",
	}
	agentAddr := startAgentDNS(t)
	t.Logf("agent dns at %s", agentAddr)
	coreDNSAddr := ""
	if coreDNS != "" {
		res.CoreDNS = coreDNSVersion(coreDNS)
		coreDNSAddr = startCoreDNS(t, coreDNS, t.TempDir(), z, freePort(t))
		t.Logf("%s at %s", res.CoreDNS, coreDNSAddr)
	} else {
		t.Logf("%s is not set: no CoreDNS anchor (make bench-dns sets it)", coreDNSEnv)
	}

	profiles := []struct {
		name, dnsmasq string
		full          bool
	}{
		{"full zone", "host-record, srv-host and txt-record lines in its configuration file", true},
		{"addresses only", "a hosts file (addn-hosts) with every A and AAAA record, no SRV", false},
	}
	for _, prof := range profiles {
		dir := t.TempDir()
		qs := queryMix(prof.full)
		p := Profile{Name: prof.name, Dnsmasq: prof.dnsmasq, QueryMix: map[string]int{}}
		var file strings.Builder
		for _, q := range qs {
			p.QueryMix[q.Kind]++
			fmt.Fprintf(&file, "%s %s\n", q.Name, mdns.TypeToString[q.Qtype])
		}
		queryFile := filepath.Join(dir, "queries.txt")
		if err := os.WriteFile(queryFile, []byte(file.String()), 0o644); err != nil {
			t.Fatal(err)
		}
		port := freePort(t)
		conf, hosts := dnsmasqConfig(z, port, prof.full, filepath.Join(dir, "hosts"))
		dnsmasqAddr := startDnsmasq(t, dir, conf, hosts, port)
		t.Logf("%s: dnsmasq at %s", prof.name, dnsmasqAddr)

		// Both must give the same answers before their speeds mean anything.
		p.QuestionsCheck, p.AnswerDiffs, err = compare(qs, agentAddr, dnsmasqAddr, "dnsmasq")
		if err != nil {
			t.Fatal(err)
		}
		if len(p.AnswerDiffs) > 0 {
			t.Errorf("%s: %d of %d questions answered differently, e.g. %s", prof.name, len(p.AnswerDiffs), p.QuestionsCheck, p.AnswerDiffs[0])
		}
		if coreDNSAddr != "" {
			p.CoreDNSQuestionsCheck, p.CoreDNSAnswerDiffs, err = compare(qs, agentAddr, coreDNSAddr, "coredns")
			if err != nil {
				t.Fatal(err)
			}
			if len(p.CoreDNSAnswerDiffs) > 0 {
				t.Errorf("%s: CoreDNS answered %d of %d questions differently, e.g. %s", prof.name, len(p.CoreDNSAnswerDiffs), p.CoreDNSQuestionsCheck, p.CoreDNSAnswerDiffs[0])
			}
		}

		var gen loadgen = goLoad{queries: packQueries(qs)}
		if _, err := exec.LookPath("dnsperf"); err == nil && os.Getenv("DNS_BENCH_LOADGEN") != "go" {
			gen = dnsperf{file: queryFile}
			res.LoadGenerator = "dnsperf " + dnsperfVersion() + " -c 4 -T 1 -q 64 -t 2 -v (per-query latencies)"
		} else {
			res.LoadGenerator = "Go: 16 UDP sockets, one query outstanding each"
		}
		servers := []struct{ name, addr string }{{"agent", agentAddr}, {"dnsmasq", dnsmasqAddr}}
		if coreDNSAddr != "" {
			servers = append(servers, struct{ name, addr string }{"coredns", coreDNSAddr})
		}
		modes := []struct {
			name string
			rate int
		}{{"max", 0}}
		for _, rate := range rates {
			modes = append(modes, struct {
				name string
				rate int
			}{fmt.Sprintf("fixed %d qps", rate), rate})
		}
		series := map[string]*Series{}
		for _, mode := range modes {
			for round := 1; round <= rounds; round++ {
				order := servers
				if round%2 == 0 { // alternate who goes first
					order = slices.Clone(servers)
					slices.Reverse(order)
				}
				for _, srv := range order {
					r, err := gen.run(srv.addr, time.Duration(secs)*time.Second, mode.rate)
					if err != nil {
						t.Fatalf("%s %s %s round %d: %v", prof.name, srv.name, mode.name, round, err)
					}
					r.Server, r.Mode, r.Round = srv.name, mode.name, round
					t.Logf("%-14s %-8s %-16s round %d: %8.0f qps  p50 %.3f ms  p99 %.3f ms  lost %d", prof.name, r.Server, r.Mode, round, r.QPS, r.P50Ms, r.P99Ms, r.Lost)
					key := srv.name + "/" + mode.name
					if series[key] == nil {
						series[key] = &Series{Profile: prof.name, Server: srv.name, Mode: mode.name}
					}
					series[key].Runs = append(series[key].Runs, r)
				}
			}
		}
		for _, mode := range modes {
			for _, srv := range servers {
				s := series[srv.name+"/"+mode.name]
				var qps, p50, p99 []float64
				for _, r := range s.Runs {
					qps, p50, p99 = append(qps, r.QPS), append(p50, r.P50Ms), append(p99, r.P99Ms)
					s.LostTotal += r.Lost
				}
				s.MedianQPS, s.MedianP50Ms, s.MedianP99Ms = benchresults.Median(qps), benchresults.Median(p50), benchresults.Median(p99)
				res.Series = append(res.Series, *s)
			}
		}
		maxA, maxD := series["agent/max"], series["dnsmasq/max"]
		fixA, fixD := series["agent/"+modes[1].name], series["dnsmasq/"+modes[1].name]
		p.QPSRatioMax = maxA.MedianQPS / maxD.MedianQPS
		p.P99RatioMax = maxA.MedianP99Ms / maxD.MedianP99Ms
		p.P99RatioFixed = fixA.MedianP99Ms / fixD.MedianP99Ms
		if coreDNSAddr != "" {
			p.P99RatioCoreDNSFixed = map[string]float64{}
			for _, mode := range modes[1:] {
				p.P99RatioCoreDNSFixed[mode.name] = series["agent/"+mode.name].MedianP99Ms / series["coredns/"+mode.name].MedianP99Ms
			}
		}
		res.Profiles = append(res.Profiles, p)
	}
	res.LoadAvgAfter = benchresults.LoadAvg()
	res.Notes = []string{
		"Loopback only; the load generator and both servers share the machine's CPUs, so 'max' measures the three together, not a server alone. Other work on the machine shows in the load averages above.",
		"The agent's server runs in its own process (this test binary re-executed) and uses every CPU (GOMAXPROCS default); dnsmasq is single-threaded by design.",
		"max: as fast as the load generator goes with 64 queries outstanding, so its latency is mostly queueing; fixed: a paced rate, so its latency is closer to the servers' own.",
		"Both servers answer the same names from the agent's zone. Answers were compared question by question before the runs (rcode and answer section; TTLs and the authority section, where dnsmasq puts no SOA, not compared).",
		"dnsmasq keeps srv-host records in a list it walks on every query, so thousands of them slow every answer (full zone); from a hosts file its addresses are hashed (addresses only), which is its best case.",
		"Runs are interleaved: in every round the servers run back to back, and the order reverses every other round.",
		"CoreDNS (built from github.com/coredns/coredns by tests/k8s/coredns/build.sh) serves the agent's zone as a zone file with its file plugin alone (no cache plugin, GOMAXPROCS default), on loopback like the others; its answers were compared with the agent's the same way.",
	}
	benchresults.Save(t, filepath.Join("..", "results"), "dns", res, markdown(res))
}

func markdown(res Result) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# clusterset.local DNS: agent vs dnsmasq and CoreDNS (%s)\n\n", res.Date)
	fmt.Fprintf(&b, "Kernel %s, %d CPUs, %s; load average before %q, after %q. Anchor: %s. Load: %s.\n\n",
		res.Kernel, res.CPUs, res.GoVersion, res.LoadAvgBefore, res.LoadAvgAfter, res.Anchor, res.LoadGenerator)
	if res.CoreDNS != "" {
		fmt.Fprintf(&b, "Second anchor: %s (file plugin).\n\n", res.CoreDNS)
	}
	fmt.Fprintf(&b, "Zone: %d services (%d names). %d run(s) of %ds per profile, server and mode, interleaved. Command: `%s`\n\n",
		res.Services, res.ZoneNames, res.Rounds, res.RunSeconds, res.Command)
	for _, p := range res.Profiles {
		fmt.Fprintf(&b, "## %s\n\ndnsmasq serves %s.\n\n", p.Name, p.Dnsmasq)
		kinds := make([]string, 0, len(p.QueryMix))
		total := 0
		for k, n := range p.QueryMix {
			kinds = append(kinds, k)
			total += n
		}
		slices.Sort(kinds)
		var mix []string
		for _, k := range kinds {
			mix = append(mix, fmt.Sprintf("%s %.0f%%", k, 100*float64(p.QueryMix[k])/float64(total)))
		}
		fmt.Fprintf(&b, "Query mix: %s. Same answers: %d distinct questions compared, %d differences.\n\n", strings.Join(mix, ", "), p.QuestionsCheck, len(p.AnswerDiffs))
		b.WriteString("| mode | server | runs (qps) | median qps | median p50 (ms) | median p99 (ms) | p99 per run (ms) | lost |\n|---|---|---|---|---|---|---|---|\n")
		for _, s := range res.Series {
			if s.Profile != p.Name {
				continue
			}
			var runs, p99s []string
			for _, r := range s.Runs {
				runs = append(runs, fmt.Sprintf("%.0f", r.QPS))
				p99s = append(p99s, fmt.Sprintf("%.3f", r.P99Ms))
			}
			fmt.Fprintf(&b, "| %s | %s | %s | **%.0f** | %.3f | **%.3f** | %s | %d |\n", s.Mode, s.Server, strings.Join(runs, ", "),
				s.MedianQPS, s.MedianP50Ms, s.MedianP99Ms, strings.Join(p99s, ", "), s.LostTotal)
		}
		fmt.Fprintf(&b, "\nAgent / dnsmasq: max qps ratio **%.2f**, max p99 ratio %.2f, fixed-rate p99 ratio **%.2f** (at %d qps).\n\n", p.QPSRatioMax, p.P99RatioMax, p.P99RatioFixed, res.FixedRate)
		if p.CoreDNSQuestionsCheck > 0 {
			fmt.Fprintf(&b, "Agent / CoreDNS: %d distinct questions compared, %d differences; fixed-rate p99 ratio", p.CoreDNSQuestionsCheck, len(p.CoreDNSAnswerDiffs))
			for _, r := range res.FixedRates {
				mode := fmt.Sprintf("fixed %d qps", r)
				fmt.Fprintf(&b, " **%.2f** at %d qps;", p.P99RatioCoreDNSFixed[mode], r)
			}
			b.WriteString("\n\n")
			for _, d := range p.CoreDNSAnswerDiffs[:min(len(p.CoreDNSAnswerDiffs), 20)] {
				fmt.Fprintf(&b, "- %s\n", d)
			}
		}
		if len(p.AnswerDiffs) > 0 {
			b.WriteString("Differences:\n\n")
			for _, d := range p.AnswerDiffs[:min(len(p.AnswerDiffs), 20)] {
				fmt.Fprintf(&b, "- %s\n", d)
			}
			b.WriteString("\n")
		}
	}
	b.WriteString("Notes:\n\n")
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "- %s\n", n)
	}
	return b.String()
}
