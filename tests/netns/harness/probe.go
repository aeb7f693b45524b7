package harness

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// WaitFor polls cond every interval until it returns true or timeout passes. cond's string
// describes what it saw; the last one is in the error.
func WaitFor(timeout, interval time.Duration, cond func() (bool, string)) error {
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok, desc := cond()
		if ok {
			return nil
		}
		last = desc
		if time.Now().After(deadline) {
			return fmt.Errorf("not true after %s; last seen: %s", timeout, last)
		}
		time.Sleep(interval)
	}
}

// PingResult is what `ping -q` reported.
type PingResult struct {
	Transmitted, Received int
	Output                string
	Err                   error
}

// Lost is the number of echo requests without a reply.
func (p PingResult) Lost() int { return p.Transmitted - p.Received }

var pingStatsRE = regexp.MustCompile(`(\d+) packets transmitted, (\d+) received`)

// Ping sends count echo requests from namespace ns to addr, interval apart, each waiting at
// most 1s for its reply.
func (m *Mesh) Ping(ns string, addr netip.Addr, count int, interval time.Duration) PingResult {
	args := []string{"-n", "-q", "-c", strconv.Itoa(count), "-i", fmt.Sprintf("%.3f", interval.Seconds()), "-W", "1", addr.String()}
	r := RunTimeout(m.Ctx, time.Duration(count)*interval+30*time.Second, "ip", append([]string{"netns", "exec", ns, "ping"}, args...)...)
	res := PingResult{Output: r.Stdout + r.Stderr, Err: r.Err}
	if mm := pingStatsRE.FindStringSubmatch(r.Stdout); mm != nil {
		res.Transmitted, _ = strconv.Atoi(mm[1])
		res.Received, _ = strconv.Atoi(mm[2])
	}
	return res
}

// PingOK pings and reports whether every request got a reply.
func (m *Mesh) PingOK(ns string, addr netip.Addr, count int) (bool, PingResult) {
	r := m.Ping(ns, addr, count, 200*time.Millisecond)
	return r.Err == nil && r.Transmitted == count && r.Received == count, r
}

// StartPinger starts a long ping (count requests, interval apart) as a tracked process; read
// its summary from its log once it exits.
func (m *Mesh) StartPinger(name, ns string, addr netip.Addr, count int, interval time.Duration) *Process {
	m.T.Helper()
	p, err := StartProcess(name, ns, m.Dir+"/"+name+".log", "ping", "-n", "-q", "-c", strconv.Itoa(count),
		"-i", fmt.Sprintf("%.3f", interval.Seconds()), "-W", "1", addr.String())
	m.must(err)
	m.track(p)
	return p
}

// ParsePing reads ping's summary out of output.
func ParsePing(output string) (PingResult, error) {
	mm := pingStatsRE.FindStringSubmatch(output)
	if mm == nil {
		return PingResult{Output: output}, fmt.Errorf("no ping summary in %q", output)
	}
	res := PingResult{Output: output}
	res.Transmitted, _ = strconv.Atoi(mm[1])
	res.Received, _ = strconv.Atoi(mm[2])
	return res, nil
}

// TCPServerPort is where StartTCPServer listens.
const TCPServerPort = 7000

// StartTCPServer starts a tcpcheck echo server in the cluster's pod namespace and waits until it
// listens.
func (c *Cluster) StartTCPServer() *Process {
	m := c.m
	m.T.Helper()
	p, err := StartProcess("tcpcheck-serve "+c.Name, c.PodNS, m.Dir+"/tcpserver-"+c.Name+".log",
		m.Bin.TCPCheck, "serve", "-listen", fmt.Sprintf(":%d", TCPServerPort))
	m.must(err)
	m.track(p)
	if err := WaitFor(10*time.Second, 50*time.Millisecond, func() (bool, string) {
		return strings.Contains(p.Log(), "listening"), p.Log()
	}); err != nil {
		m.T.Fatalf("tcp server in %s: %v", c.PodNS, err)
	}
	return p
}

// TCPCheck connects from namespace ns to addr:TCPServerPort and checks one echoed payload.
func (m *Mesh) TCPCheck(ns string, addr netip.Addr) Result {
	return NSRun(m.Ctx, ns, m.Bin.TCPCheck, "dial", "-addr", netip.AddrPortFrom(addr, TCPServerPort).String(), "-timeout", "5s")
}

// StartTCPStream starts a tcpcheck stream from ns to addr for d as a tracked process.
func (m *Mesh) StartTCPStream(name, ns string, addr netip.Addr, d time.Duration) *Process {
	m.T.Helper()
	p, err := StartProcess(name, ns, m.Dir+"/"+name+".log", m.Bin.TCPCheck, "stream",
		"-addr", netip.AddrPortFrom(addr, TCPServerPort).String(), "-duration", d.String(), "-timeout", "5s")
	m.must(err)
	m.track(p)
	return p
}

// LinkStats are a link's packet and byte counters.
type LinkStats struct {
	RxBytes, TxBytes, RxPackets, TxPackets uint64
}

// WGStats reads the WireGuard interface's counters in the gateway namespace (`ip -s -j link`).
func (c *Cluster) WGStats() (LinkStats, error) {
	return LinkCounters(c.m, c.GwNS, c.WGInterface)
}

// LinkCounters reads link's counters in namespace ns.
func LinkCounters(m *Mesh, ns, link string) (LinkStats, error) {
	r := Run(m.Ctx, "ip", "-n", ns, "-s", "-j", "link", "show", "dev", link)
	if r.Err != nil {
		return LinkStats{}, fmt.Errorf("%s", r)
	}
	var links []struct {
		Stats64 struct {
			Rx struct{ Bytes, Packets uint64 } `json:"rx"`
			Tx struct{ Bytes, Packets uint64 } `json:"tx"`
		} `json:"stats64"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &links); err != nil || len(links) != 1 {
		return LinkStats{}, fmt.Errorf("decode `ip -s -j link show %s` in %s: %v: %q", link, ns, err, r.Stdout)
	}
	s := links[0].Stats64
	return LinkStats{RxBytes: s.Rx.Bytes, TxBytes: s.Tx.Bytes, RxPackets: s.Rx.Packets, TxPackets: s.Tx.Packets}, nil
}

// Links lists the link names in namespace ns.
func (m *Mesh) Links(ns string) []string {
	out := Run(m.Ctx, "ip", "-n", ns, "-o", "link", "show").Stdout
	var names []string
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			n, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			names = append(names, n)
		}
	}
	return names
}

// ConnectedTo reports whether st shows a connected connection to every cluster in peers.
func ConnectedTo(st statusapi.Status, peers ...string) (bool, string) {
	var missing []string
	for _, p := range peers {
		cn, ok := Connection(st, p)
		switch {
		case !ok:
			missing = append(missing, p+"=absent")
		case cn.State != "connected":
			missing = append(missing, fmt.Sprintf("%s=%s(%s)", p, cn.State, cn.Message))
		}
	}
	return len(missing) == 0, strings.Join(missing, ", ")
}

// WaitConnected waits until every listed cluster's agent reports every other listed cluster
// connected, sending a ping over each pair that is not connected yet (WireGuard hands shake on
// traffic). It returns, per cluster, when it was first seen connected to all the others.
func (m *Mesh) WaitConnected(timeout time.Duration, clusters ...*Cluster) map[string]time.Time {
	m.T.Helper()
	seen := map[string]time.Time{}
	err := WaitFor(timeout, 250*time.Millisecond, func() (bool, string) {
		var problems []string
		for _, c := range clusters {
			if _, done := seen[c.Name]; done {
				continue
			}
			if c.Agent != nil {
				if ok, code := c.Agent.Exited(); ok {
					m.T.Fatalf("agent %s exited with code %d:\n%s", c.Name, code, c.Agent.LogTail(40))
				}
			}
			var peers []string
			for _, o := range clusters {
				if o != c {
					peers = append(peers, o.Name)
				}
			}
			st, err := c.Status()
			if err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", c.Name, err))
				continue
			}
			ok, desc := ConnectedTo(st, peers...)
			if ok {
				seen[c.Name] = time.Now()
				continue
			}
			problems = append(problems, fmt.Sprintf("%s: %s", c.Name, desc))
			for _, o := range clusters {
				if cn, ok := Connection(st, o.Name); ok && cn.State != "connected" {
					m.Ping(c.PodNS, o.PodIP, 1, 100*time.Millisecond)
				}
			}
		}
		return len(problems) == 0, strings.Join(problems, "; ")
	})
	if err != nil {
		m.T.Fatalf("clusters not all connected: %v", err)
	}
	return seen
}
