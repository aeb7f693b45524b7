package harness

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// AddGateway creates another gateway node of cluster c, in namespaces of its own, with no token,
// config or agent yet. It is a *Cluster of the same name and pod CIDRs as c (so StartAgent,
// Status and WGStats work on it), with node name node, WireGuard link wgIface (the UAPI socket
// path is shared by every namespace on the host: two agents need two names) and a pod in
// podSubnet (a /24 inside c's pod CIDR, away from the other nodes'). Its cgroup and bpffs pins
// are its own (see WriteGatewayConfig). Layout:
//
//	<p><tmp>-gw    gateway node: eth0 on the underlay, pod0 with podSubnet's first address
//	<p><tmp>-pod   a pod behind it
//
// where tmp is c's name with the node's index, so namespace names stay unique.
func (c *Cluster) AddGateway(node, wgIface, podSubnet string) *Cluster {
	m := c.m
	m.T.Helper()
	pfx, err := netip.ParsePrefix(podSubnet)
	m.must(err)
	if !c.PodCIDR.Contains(pfx.Addr()) {
		m.T.Fatalf("gateway %s pod subnet %s is not inside %s's pod CIDR %s", node, pfx, c.Name, c.PodCIDR)
	}
	if len(wgIface) > 15 || wgIface == c.WGInterface {
		m.T.Fatalf("gateway %s: WireGuard link %q must be at most 15 characters and differ from %s's %q", node, wgIface, c.Node, c.WGInterface)
	}
	tmp := fmt.Sprintf("%s%d", c.Name, len(m.Clusters()))
	g := m.NewCluster(tmp, pfx.String())
	g.Name, g.PodCIDR, g.Node, g.WGInterface = c.Name, c.PodCIDR, node, wgIface
	g.LogPath = filepath.Join(m.Dir, "agent-"+node+".log")
	return g
}

// GatewayConfigYAML is the agent config of a gateway added with AddGateway: ConfigYAML with the
// node's own cgroup and bpffs pin directory (ConfigYAML names them after the cluster, which
// would share the first gateway's).
func (c *Cluster) GatewayConfigYAML(extra string) string {
	shared := c.m.datapathConfig(c.Name+"-gw", c.GwPodIP)
	own := c.m.datapathConfig(c.Node, c.GwPodIP)
	return strings.Replace(c.ConfigYAML(extra), shared, own, 1)
}

// WriteGatewayConfig writes GatewayConfigYAML(extra).
func (c *Cluster) WriteGatewayConfig(extra string) {
	c.m.T.Helper()
	c.m.must(os.WriteFile(c.ConfigPath, []byte(c.GatewayConfigYAML(extra)), 0o600))
}

// JoinAnother gets a join token for one more node of the existing cluster c (a token is used
// once), with extra flags of `cablectl cluster join-token` (e.g. "--gateway-mode"), and writes it
// to g's token file.
func (c *Cluster) JoinAnother(g interface{ WriteToken(string) }, extra ...string) {
	c.m.T.Helper()
	r := c.m.Cablectl(append([]string{"cluster", "join-token", c.Name}, extra...)...)
	if r.Err != nil || strings.TrimSpace(r.Stdout) == "" {
		c.m.T.Fatalf("join token for another node of %s: %s", c.Name, r)
	}
	g.WriteToken(strings.TrimSpace(r.Stdout))
}

// RouteOnGateways routes the worker's pod subnet via the worker on each of gws, as a CNI would
// on every node of the cluster.
func (w *Worker) RouteOnGateways(gws ...*Cluster) {
	w.m.T.Helper()
	for _, g := range gws {
		w.m.ip("-n", g.GwNS, "route", "replace", w.PodSubnet.String(), "via", w.Underlay.String())
	}
}

// KillNode makes gateway node c a dead node: its underlay link goes down (nothing reaches it or
// leaves it any more) and its agent is killed with SIGKILL (no cleanup, no goodbye to the
// broker). It returns the time the node died: when its link went down.
func (c *Cluster) KillNode() time.Time {
	m := c.m
	m.T.Helper()
	m.ip("-n", c.GwNS, "link", "set", "eth0", "down")
	died := time.Now()
	if c.Agent != nil {
		if ok, _ := c.Agent.Exited(); !ok {
			_ = syscall.Kill(-c.Agent.Pid(), syscall.SIGKILL)
			if _, err := c.Agent.Wait(10 * time.Second); err != nil {
				m.T.Fatalf("kill agent of %s: %v", c.Node, err)
			}
		}
	}
	m.Logf("node %s dead at %s (eth0 down, agent killed)", c.Node, died.UTC().Format(time.RFC3339Nano))
	return died
}

// StartTimedPinger starts `ping -D` from ns to addr every interval until stopped: every reply
// line carries its arrival time, for ReplyTimes.
func (m *Mesh) StartTimedPinger(name, ns string, addr netip.Addr, interval time.Duration) *Process {
	m.T.Helper()
	p, err := StartProcess(name, ns, filepath.Join(m.Dir, name+".log"), "ping", "-n", "-D",
		"-i", strconv.FormatFloat(interval.Seconds(), 'f', 3, 64), "-W", "1", addr.String())
	m.must(err)
	m.track(p)
	return p
}

var pingReplyRE = regexp.MustCompile(`^\[(\d+)\.(\d+)\] \d+ bytes from .*icmp_seq=(\d+)`)

// ReplyTimes reads the arrival times of the echo replies a StartTimedPinger has logged so far.
func ReplyTimes(p *Process) []time.Time {
	var out []time.Time
	for _, l := range strings.Split(p.Log(), "\n") {
		mm := pingReplyRE.FindStringSubmatch(strings.TrimSpace(l))
		if mm == nil {
			continue
		}
		sec, err1 := strconv.ParseInt(mm[1], 10, 64)
		frac := (mm[2] + "000000")[:6]
		usec, err2 := strconv.ParseInt(frac, 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out = append(out, time.Unix(sec, usec*1000))
	}
	return out
}

// Outage is the longest stop of traffic around an event at t: the longest gap between two
// consecutive replies of which the later came after t (a reply in flight at t does not end the
// outage), and how long after t that later reply came (Resumed). ok is false when no reply came
// after t, or none before it to measure from.
func Outage(replies []time.Time, t time.Time) (gap, resumed time.Duration, ok bool) {
	for i := 1; i < len(replies); i++ {
		if !replies[i].After(t) {
			continue
		}
		if d := replies[i].Sub(replies[i-1]); d > gap {
			gap, resumed, ok = d, replies[i].Sub(t), true
		}
	}
	return gap, resumed, ok
}
