package harness

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// Worker is a non-gateway node of a cluster (`gateway: false`): it runs no cable, only routes the
// remote clusters' CIDRs via its cluster's gateway. Layout (added to the mesh's):
//
//	<p><cluster>-<name>     worker node: eth0 172.31.0.x/24 on the underlay, pod0 with the first
//	                        address of its pod subnet (e.g. 10.1.5.1/24); ip_forward=1
//	<p><cluster>-<name>p    a pod on the worker: eth0 10.x.y.10/24, default route via the worker
//
// Nothing routes the worker's pod subnet on the gateway: that is a CNI's job, the test adds it
// (see RouteOnGateway).
type Worker struct {
	m       *Mesh
	Cluster *Cluster
	Name    string // short name, part of the namespace names
	Node    string // the agent's node name

	NS, PodNS    string
	Underlay     netip.Addr   // the worker's underlay address
	PodSubnet    netip.Prefix // the worker's pod subnet, inside the cluster's pod CIDR
	NodePodIP    netip.Addr   // the worker's address on its pod link
	PodIP        netip.Addr   // the worker pod's address
	Dir          string
	ConfigPath   string
	TokenPath    string
	StateDir     string
	StatusSocket string
	LogPath      string
	Agent        *Process
}

// AddWorker creates a worker node of cluster c with a pod in podSubnet (a /24 inside the
// cluster's pod CIDR, away from the gateway's), with no token, config or agent yet.
func (c *Cluster) AddWorker(name, podSubnet string) *Worker {
	m := c.m
	m.T.Helper()
	pfx, err := netip.ParsePrefix(podSubnet)
	m.must(err)
	if !c.PodCIDR.Contains(pfx.Addr()) {
		m.T.Fatalf("worker pod subnet %s is not inside %s's pod CIDR %s", pfx, c.Name, c.PodCIDR)
	}
	m.mu.Lock()
	idx := m.nextHost
	m.nextHost++
	m.mu.Unlock()

	w := &Worker{
		m:         m,
		Cluster:   c,
		Name:      name,
		Node:      c.Name + "-" + name,
		NS:        m.Prefix + c.Name + "-" + name,
		PodNS:     m.Prefix + c.Name + "-" + name + "p",
		Underlay:  netip.MustParseAddr(fmt.Sprintf("172.31.0.%d", idx)),
		PodSubnet: pfx.Masked(),
		Dir:       filepath.Join(m.Dir, c.Name+"-"+name),
	}
	w.NodePodIP = w.PodSubnet.Addr().Next()
	w.PodIP = w.NodePodIP
	for i := 0; i < 9; i++ {
		w.PodIP = w.PodIP.Next()
	}
	w.ConfigPath = filepath.Join(w.Dir, "agent.yaml")
	w.TokenPath = filepath.Join(w.Dir, "join-token")
	w.StateDir = filepath.Join(w.Dir, "state")
	w.StatusSocket = filepath.Join(w.Dir, "agent.sock")
	w.LogPath = filepath.Join(m.Dir, "agent-"+w.Node+".log")
	m.must(os.MkdirAll(w.Dir, 0o700))

	m.must(AddNamespace(m.Ctx, w.NS))
	m.must(AddNamespace(m.Ctx, w.PodNS))
	m.attachUnderlay(w.NS, idx, w.Underlay)
	bits := fmt.Sprintf("/%d", w.PodSubnet.Bits())
	m.ip("-n", w.NS, "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", w.PodNS)
	m.ip("-n", w.NS, "addr", "add", w.NodePodIP.String()+bits, "dev", "pod0")
	m.ip("-n", w.NS, "link", "set", "pod0", "up")
	m.ip("-n", w.PodNS, "addr", "add", w.PodIP.String()+bits, "dev", "eth0")
	m.ip("-n", w.PodNS, "link", "set", "eth0", "up")
	m.ip("-n", w.PodNS, "route", "add", "default", "via", w.NodePodIP.String())
	_, err = MustRun(m.Ctx, "ip", "netns", "exec", w.NS, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	m.must(err)
	return w
}

// RouteOnGateway routes the worker's pod subnet on its cluster's gateway via the worker's
// underlay address, as a CNI would.
func (w *Worker) RouteOnGateway() {
	w.m.T.Helper()
	w.m.ip("-n", w.Cluster.GwNS, "route", "replace", w.PodSubnet.String(), "via", w.Underlay.String())
}

// WriteToken writes the worker's join token file.
func (w *Worker) WriteToken(token string) {
	w.m.T.Helper()
	w.m.must(os.WriteFile(w.TokenPath, []byte(token+"\n"), 0o600))
}

// ConfigYAML is the worker's agent config: gateway false, no advertiseAddress, no pod CIDRs (the
// cluster's at the broker apply); extra is appended verbatim.
func (w *Worker) ConfigYAML(extra string) string {
	return fmt.Sprintf(`cluster: %s
node: %s
broker: %s
joinTokenFile: %s
stateDir: %s
gateway: false
statusSocket: %s
%s%s`, w.Cluster.Name, w.Node, w.m.BrokerAddress(), w.TokenPath, w.StateDir, w.StatusSocket, w.m.datapathConfig(w.Node, netip.Addr{}), extra)
}

// WriteConfig writes the worker's agent config (extra appended verbatim).
func (w *Worker) WriteConfig(extra string) {
	w.m.T.Helper()
	w.m.must(os.WriteFile(w.ConfigPath, []byte(w.ConfigYAML(extra)), 0o600))
}

// StartAgent starts cable-agent in the worker namespace with extra flags (e.g.
// "--cleanup-on-exit"). It returns at once; the mesh's teardown stops it.
func (w *Worker) StartAgent(extra ...string) {
	w.m.T.Helper()
	argv := append([]string{w.m.Bin.Agent, "--config", w.ConfigPath}, extra...)
	p, err := StartProcess("cable-agent "+w.Node, w.NS, w.LogPath, argv...)
	w.m.must(err)
	w.m.track(p)
	w.Agent = p
	w.m.Logf("agent %s started (pid %d, flags %v)", w.Node, p.Pid(), extra)
}

// StopAgent stops the worker's agent with SIGTERM and returns its exit code.
func (w *Worker) StopAgent() int {
	w.m.T.Helper()
	return w.m.stopAgent(w.Agent, w.Node)
}

// Status reads the worker agent's status document with `cablectl status --socket S -o json`.
func (w *Worker) Status() (statusapi.Status, error) {
	return w.m.agentStatus(w.StatusSocket, w.Node)
}

// PodArgv is argv run in the worker's pod namespace inside the worker's cgroup, so that even its
// first connect goes through the worker agent's hooks.
func (w *Worker) PodArgv(argv ...string) []string {
	return podArgv(w.m.HostCgroup(w.Node), w.PodNS, argv...)
}

// Ask is Cluster.Ask for the worker's pod: tcpcheck ask (or udpask) to addr from its pod
// namespace and cgroup.
func (w *Worker) Ask(udp bool, addr netip.AddrPort, timeout time.Duration) (Hello, error) {
	return w.m.ask(w.PodArgv, udp, addr, timeout)
}

// RouteEntry is one line of `ip route show`: destination and next hop ("" if none).
type RouteEntry struct {
	Dst, Via, Dev string
}

func (r RouteEntry) String() string { return fmt.Sprintf("%s via %s dev %s", r.Dst, r.Via, r.Dev) }

// Routes lists the routes of namespace ns with rtnetlink protocol proto (`ip route show proto`).
func (m *Mesh) Routes(ns string, proto int) ([]RouteEntry, error) {
	out, err := MustRun(m.Ctx, "ip", "-n", ns, "-4", "route", "show", "proto", fmt.Sprint(proto))
	if err != nil {
		return nil, err
	}
	return ParseRoutes(out), nil
}

// ParseRoutes reads `ip route show` output (one route a line: DST [via GW] [dev DEV] ...).
func ParseRoutes(out string) []RouteEntry {
	var rs []RouteEntry
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		r := RouteEntry{Dst: f[0]}
		for i := 1; i+1 < len(f); i++ {
			switch f[i] {
			case "via":
				r.Via = f[i+1]
			case "dev":
				r.Dev = f[i+1]
			}
		}
		rs = append(rs, r)
	}
	return rs
}
