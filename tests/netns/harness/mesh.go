// Package harness builds Cablemesh meshes out of network namespaces on one machine and runs the
// real binaries in them, for the end-to-end tests in tests/netns and the benchmark in bench/.
//
// Layout of one mesh (every name starts with the run's prefix, e.g. "cbt7a3f-"):
//
//	<p>ul            underlay: bridge br0; one veth per node (u1, u2, ...), nothing else
//	<p>brk           broker node: eth0 172.31.0.1/24 on the underlay; runs cable-broker
//	<p><cluster>-gw  gateway node: eth0 172.31.0.1x/24 on the underlay, pod0 with the first address
//	                 of the cluster's first pod /24 (e.g. 10.1.0.1/24); ip_forward=1; runs cable-agent
//	<p><cluster>-pod a pod: eth0 with 10.x.0.10/24, default route via the gateway
//
// Nothing is created in the host's own network namespace: veth pairs are created inside the
// underlay namespace with their peer moved straight into the node's namespace.
package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

const (
	// UnderlayCIDR is the underlay /24, used only inside the mesh's namespaces.
	UnderlayCIDR = "172.31.0.0/24"
	// BrokerPort is the port cable-broker listens on in the broker namespace.
	BrokerPort = 7443
	// WGInterface is the WireGuard interface an agent uses unless its cluster sets another
	// (Cluster.WGInterface); each agent runs in its own namespace.
	WGInterface = "cbl-wg0"
	// WGPort is the WireGuard UDP port of every gateway.
	WGPort = 51820
	// KeepEnv, when set to 1, keeps the run's temp dir (logs, configs, state) after the test.
	KeepEnv = "CABLEMESH_KEEP"
)

// Mesh is one broker and its clusters, each in namespaces of one prefix.
type Mesh struct {
	T      testing.TB
	Ctx    context.Context
	Prefix string
	Dir    string // temp dir: broker data, per-cluster configs, state and logs
	Bin    Binaries

	UnderlayNS    string
	BrokerNS      string
	BrokerAddr    netip.Addr
	BrokerDataDir string
	Broker        *Process
	// BrokerArgs are more cable-broker flags; StartBroker passes them (New starts the broker
	// without: a test that needs them sets them, then StopBroker and StartBroker).
	BrokerArgs []string
	// BPFFS is the mesh's bpf filesystem (see services.go).
	BPFFS string

	mu        sync.Mutex
	clusters  map[string]*Cluster
	order     []string
	procs     []*Process
	nextHost  int
	hostLinks map[string]bool
	cancel    context.CancelFunc
}

// Cluster is one cluster of the mesh: a gateway node and a pod behind it.
type Cluster struct {
	m    *Mesh
	Name string
	// Node is the gateway's node name in its config; "" leaves `node:` out, so the agent takes
	// its host name.
	Node    string
	PodCIDR netip.Prefix
	// WGInterface is the gateway's WireGuard link name (`wireguard: {interface: ...}`); default
	// the package's WGInterface. Change it before WriteConfig.
	WGInterface string
	// Hostname, when set, is the gateway's host name: its agent runs in a UTS namespace of its
	// own (`unshare --uts`) named so. Default: the host's.
	Hostname string
	// DNSExtra are flow-mapping entries added to the gateway's dns block (`upstream: ...`;
	// with `listen: ...` it replaces the default listen address). Set it before WriteConfig.
	DNSExtra string

	GwNS, PodNS   string
	GwUnderlay    netip.Addr // the gateway's underlay address (its advertiseAddress)
	GwPodIP       netip.Addr // the gateway's address on the pod link
	PodIP         netip.Addr // the pod's address
	Dir           string
	ConfigPath    string
	TokenPath     string
	StateDir      string
	StatusSocket  string
	LogPath       string
	Agent         *Process
	AgentStarted  time.Time
	underlayIndex int

	// AgentBin is the cable-agent the gateway runs; "" for the mesh's (Mesh.Bin.Agent).
	AgentBin string
	// AgentWrapper, when set, is the command the agent is started under (e.g. unshare --pid:
	// another PID namespace, as a DaemonSet's next pod runs in).
	AgentWrapper []string
}

// RequireRoot skips the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: the netns tests need root (they create network namespaces, veth pairs and TUN devices); run `make test` as root")
	}
}

// New builds an empty mesh (underlay and broker namespaces, broker started) and registers its
// teardown with t.Cleanup.
func New(t testing.TB) *Mesh {
	t.Helper()
	RequireRoot(t)
	bins, err := Build(context.Background())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return NewWithBinaries(t, bins)
}

// NewWithBinaries is New running the given binaries instead of the test's build: a benchmark
// runs an earlier build side by side with the current one.
func NewWithBinaries(t testing.TB, bins Binaries) *Mesh {
	t.Helper()
	RequireRoot(t)
	ctx, cancel := context.WithCancel(context.Background())
	var err error
	m := &Mesh{T: t, Ctx: ctx, cancel: cancel, Bin: bins, Prefix: NewPrefix(), clusters: map[string]*Cluster{}, nextHost: 10}
	if err := ClaimPrefix(m.Prefix); err != nil {
		cancel()
		t.Fatalf("claim namespace prefix: %v", err)
	}
	m.hostLinks = hostLinkNames(ctx)
	t.Cleanup(m.teardown)
	m.Dir, err = os.MkdirTemp("", m.Prefix)
	if err != nil {
		t.Fatalf("temp dir: %v", err)
	}
	m.UnderlayNS = m.Prefix + "ul"
	m.BrokerNS = m.Prefix + "brk"
	m.BrokerAddr = netip.MustParseAddr("172.31.0.1")
	m.BrokerDataDir = filepath.Join(m.Dir, "broker")
	m.Logf("mesh prefix %s, dir %s", m.Prefix, m.Dir)
	m.must(m.mountDatapath())

	m.must(AddNamespace(ctx, m.UnderlayNS))
	m.ip("-n", m.UnderlayNS, "link", "add", "br0", "type", "bridge")
	m.ip("-n", m.UnderlayNS, "link", "set", "br0", "up")
	m.must(AddNamespace(ctx, m.BrokerNS))
	m.attachUnderlay(m.BrokerNS, 1, m.BrokerAddr)
	m.StartBroker()
	return m
}

// Logf logs with the wall-clock time, so logs of the test and of the binaries line up.
func (m *Mesh) Logf(format string, a ...any) {
	m.T.Helper()
	m.T.Logf("%s %s", time.Now().UTC().Format("15:04:05.000"), fmt.Sprintf(format, a...))
}

func (m *Mesh) must(err error) {
	m.T.Helper()
	if err != nil {
		m.T.Fatalf("%v", err)
	}
}

func (m *Mesh) ip(args ...string) {
	m.T.Helper()
	_, err := MustRun(m.Ctx, "ip", args...)
	m.must(err)
}

// attachUnderlay plugs namespace ns into the underlay bridge through veth u<idx> <-> eth0.
func (m *Mesh) attachUnderlay(ns string, idx int, addr netip.Addr) {
	m.T.Helper()
	port := fmt.Sprintf("u%d", idx)
	m.ip("-n", m.UnderlayNS, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
	m.ip("-n", m.UnderlayNS, "link", "set", port, "master", "br0", "up")
	m.ip("-n", ns, "addr", "add", addr.String()+"/24", "dev", "eth0")
	m.ip("-n", ns, "link", "set", "eth0", "up")
}

// BrokerAddress is host:port of the broker on the underlay.
func (m *Mesh) BrokerAddress() string { return fmt.Sprintf("%s:%d", m.BrokerAddr, BrokerPort) }

// AdminConfig is the admin credential file the broker wrote.
func (m *Mesh) AdminConfig() string { return filepath.Join(m.BrokerDataDir, "admin.yaml") }

// StartBroker starts cable-broker in the broker namespace (same data dir every time) and waits
// until it answers `cablectl cluster list`.
func (m *Mesh) StartBroker() {
	m.T.Helper()
	if m.Broker != nil {
		if ok, _ := m.Broker.Exited(); !ok {
			m.T.Fatalf("broker already running (pid %d)", m.Broker.Pid())
		}
	}
	p, err := StartProcess("cable-broker", m.BrokerNS, filepath.Join(m.Dir, "broker.log"),
		append([]string{m.Bin.Broker, "--data-dir", m.BrokerDataDir, "--listen", m.BrokerAddress()}, m.BrokerArgs...)...)
	m.must(err)
	m.track(p)
	m.Broker = p
	var last Result
	err = WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, string) {
		if ok, code := p.Exited(); ok {
			m.T.Fatalf("cable-broker exited with code %d:\n%s", code, p.LogTail(40))
		}
		if _, err := os.Stat(m.AdminConfig()); err != nil {
			return false, "no admin.yaml yet"
		}
		last = m.Cablectl("cluster", "list")
		return last.Err == nil, last.String()
	})
	if err != nil {
		m.T.Fatalf("broker not ready: %v\nbroker log:\n%s", err, p.LogTail(40))
	}
	m.Logf("broker up at %s (pid %d)", m.BrokerAddress(), p.Pid())
}

// StopBroker stops the broker with SIGTERM.
func (m *Mesh) StopBroker() {
	m.T.Helper()
	if m.Broker == nil {
		return
	}
	code, err := m.Broker.Stop(10 * time.Second)
	if err != nil {
		m.T.Errorf("stop broker: %v", err)
	}
	m.Logf("broker stopped (exit %d)", code)
}

func (m *Mesh) track(p *Process) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.procs = append(m.procs, p)
}

// Cablectl runs `cablectl --config <admin.yaml> args...` in the broker namespace.
func (m *Mesh) Cablectl(args ...string) Result {
	return NSRun(m.Ctx, m.BrokerNS, m.Bin.Cablectl, append([]string{"--config", m.AdminConfig()}, args...)...)
}

// JoinToken asks the broker for a join token for cluster name (extra: more cablectl flags).
func (m *Mesh) JoinToken(name, podCIDR string, extra ...string) Result {
	args := append([]string{"cluster", "join-token", name, "--pod-cidr", podCIDR}, extra...)
	return m.Cablectl(args...)
}

// Cluster returns a cluster added to the mesh by name.
func (m *Mesh) Cluster(name string) *Cluster {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.clusters[name]
}

// Clusters returns the mesh's clusters in the order they were added.
func (m *Mesh) Clusters() []*Cluster {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]*Cluster, 0, len(m.order))
	for _, n := range m.order {
		out = append(out, m.clusters[n])
	}
	return out
}

// NewCluster creates the namespaces of a cluster (gateway and pod) and its directory, with no
// token, config or agent yet.
func (m *Mesh) NewCluster(name, podCIDR string) *Cluster {
	m.T.Helper()
	pfx, err := netip.ParsePrefix(podCIDR)
	m.must(err)
	m.mu.Lock()
	if _, dup := m.clusters[name]; dup {
		m.mu.Unlock()
		m.T.Fatalf("cluster %s added twice", name)
	}
	idx := m.nextHost
	m.nextHost++
	m.mu.Unlock()

	first := pfx.Masked().Addr()
	c := &Cluster{
		m:             m,
		Name:          name,
		Node:          name + "-gw1",
		PodCIDR:       pfx,
		WGInterface:   WGInterface,
		GwNS:          m.Prefix + name + "-gw",
		PodNS:         m.Prefix + name + "-pod",
		GwUnderlay:    netip.MustParseAddr(fmt.Sprintf("172.31.0.%d", idx)),
		GwPodIP:       first.Next(),
		Dir:           filepath.Join(m.Dir, name),
		underlayIndex: idx,
	}
	c.PodIP = c.GwPodIP
	for i := 0; i < 9; i++ {
		c.PodIP = c.PodIP.Next()
	}
	c.ConfigPath = filepath.Join(c.Dir, "agent.yaml")
	c.TokenPath = filepath.Join(c.Dir, "join-token")
	c.StateDir = filepath.Join(c.Dir, "state")
	c.StatusSocket = filepath.Join(c.Dir, "agent.sock")
	c.LogPath = filepath.Join(m.Dir, "agent-"+name+".log")
	m.must(os.MkdirAll(c.Dir, 0o700))

	m.must(AddNamespace(m.Ctx, c.GwNS))
	m.must(AddNamespace(m.Ctx, c.PodNS))
	m.attachUnderlay(c.GwNS, idx, c.GwUnderlay)
	m.ip("-n", c.GwNS, "link", "add", "pod0", "type", "veth", "peer", "name", "eth0", "netns", c.PodNS)
	m.ip("-n", c.GwNS, "addr", "add", c.GwPodIP.String()+"/24", "dev", "pod0")
	m.ip("-n", c.GwNS, "link", "set", "pod0", "up")
	m.ip("-n", c.PodNS, "addr", "add", c.PodIP.String()+"/24", "dev", "eth0")
	m.ip("-n", c.PodNS, "link", "set", "eth0", "up")
	m.ip("-n", c.PodNS, "route", "add", "default", "via", c.GwPodIP.String())
	_, err = MustRun(m.Ctx, "ip", "netns", "exec", c.GwNS, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
	m.must(err)

	m.mu.Lock()
	m.clusters[name] = c
	m.order = append(m.order, name)
	m.mu.Unlock()
	return c
}

// AddCluster creates a cluster's namespaces, gets its join token and writes its agent config;
// the agent is not started (see StartAgent).
func (m *Mesh) AddCluster(name, podCIDR string) *Cluster {
	m.T.Helper()
	c := m.NewCluster(name, podCIDR)
	r := m.JoinToken(name, podCIDR)
	if r.Err != nil {
		m.T.Fatalf("join token for %s: %s", name, r)
	}
	c.WriteToken(strings.TrimSpace(r.Stdout))
	c.WriteConfig("")
	return c
}

// AddClusters adds clusters given as name=podCIDR and starts all their agents.
func (m *Mesh) AddClusters(specs ...string) []*Cluster {
	m.T.Helper()
	var out []*Cluster
	for _, s := range specs {
		name, cidr, ok := strings.Cut(s, "=")
		if !ok {
			m.T.Fatalf("cluster spec %q: want name=podCIDR", s)
		}
		out = append(out, m.AddCluster(name, cidr))
	}
	for _, c := range out {
		c.StartAgent()
	}
	return out
}

// WriteToken writes the cluster's join token file.
func (c *Cluster) WriteToken(token string) {
	c.m.T.Helper()
	c.m.must(os.WriteFile(c.TokenPath, []byte(token+"\n"), 0o600))
}

// ConfigYAML is the agent config of the cluster's gateway; extra is appended verbatim.
func (c *Cluster) ConfigYAML(extra string) string {
	node := ""
	if c.Node != "" {
		node = "node: " + c.Node + "\n"
	}
	return fmt.Sprintf(`cluster: %s
%sbroker: %s
joinTokenFile: %s
stateDir: %s
gateway: true
advertiseAddress: %s
podCIDRs: [%s]
statusSocket: %s
wireguard: {interface: %s, port: %d}
%s%s`, c.Name, node, c.m.BrokerAddress(), c.TokenPath, c.StateDir, c.GwUnderlay, c.PodCIDR,
		c.StatusSocket, c.WGInterface, WGPort, c.m.datapathConfigDNS(c.Name+"-gw", c.GwPodIP, c.DNSExtra), extra)
}

// WriteConfig writes the agent config (extra appended verbatim, for malformed-config tests).
func (c *Cluster) WriteConfig(extra string) {
	c.m.T.Helper()
	c.m.must(os.WriteFile(c.ConfigPath, []byte(c.ConfigYAML(extra)), 0o600))
}

// StartAgent starts cable-agent inside the gateway namespace (and, with Hostname set, in a UTS
// namespace of that host name), with extra flags (e.g. "--cleanup-on-exit"). It returns at once.
func (c *Cluster) StartAgent(extra ...string) {
	c.m.T.Helper()
	bin := c.m.Bin.Agent
	if c.AgentBin != "" {
		bin = c.AgentBin
	}
	argv := append([]string{bin, "--config", c.ConfigPath}, extra...)
	if c.Hostname != "" {
		// Through /proc, not hostname(1), which refuses names such as GW_1 that the kernel takes.
		// unshare and sh exec into the agent: it stays the process the harness stops.
		argv = append([]string{"unshare", "--uts", "sh", "-c", `printf %s "$0" > /proc/sys/kernel/hostname && exec "$@"`, c.Hostname}, argv...)
	}
	if len(c.AgentWrapper) > 0 {
		argv = append(slices.Clone(c.AgentWrapper), argv...)
	}
	p, err := StartProcess("cable-agent "+c.Name, c.GwNS, c.LogPath, argv...)
	c.m.must(err)
	c.m.track(p)
	c.Agent = p
	c.AgentStarted = p.Started()
	c.m.Logf("agent %s started (pid %d, flags %v)", c.Name, p.Pid(), extra)
}

// StopAgent stops the cluster's agent with SIGTERM and returns its exit code.
func (c *Cluster) StopAgent() int {
	c.m.T.Helper()
	return c.m.stopAgent(c.Agent, c.Name)
}

// stopAgent stops an agent process (nil: none) with SIGTERM and returns its exit code.
func (m *Mesh) stopAgent(p *Process, name string) int {
	m.T.Helper()
	if p == nil {
		return 0
	}
	code, err := p.Stop(15 * time.Second)
	if err != nil {
		m.T.Errorf("stop agent %s: %v", name, err)
	}
	m.Logf("agent %s stopped (exit %d)", name, code)
	return code
}

// Status reads the agent's status document with `cablectl status --socket S -o json`.
func (c *Cluster) Status() (statusapi.Status, error) {
	return c.m.agentStatus(c.StatusSocket, c.Name)
}

// agentStatus reads the status document of the agent serving socket.
func (m *Mesh) agentStatus(socket, name string) (statusapi.Status, error) {
	var st statusapi.Status
	r := Run(m.Ctx, m.Bin.Cablectl, "status", "--socket", socket, "-o", "json")
	if r.Err != nil {
		return st, fmt.Errorf("%s", r)
	}
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		return st, fmt.Errorf("decode status of %s: %w: %q", name, err, r.Stdout)
	}
	return st, nil
}

// StatusTable is `cablectl status` as a person reads it.
func (c *Cluster) StatusTable() string {
	r := Run(c.m.Ctx, c.m.Bin.Cablectl, "status", "--socket", c.StatusSocket)
	return r.Stdout + r.Stderr
}

// Connection returns the status row for remote cluster name, if any.
func Connection(st statusapi.Status, name string) (statusapi.Connection, bool) {
	for _, cn := range st.Connections {
		if cn.Cluster == name {
			return cn, true
		}
	}
	return statusapi.Connection{}, false
}

// teardown stops every process, deletes every namespace of the prefix and the temp dir. On
// failure it first logs the tail of each process log and the gateways' state.
func (m *Mesh) teardown() {
	t := m.T
	ctx := context.Background()
	if t.Failed() {
		for _, c := range m.Clusters() {
			if c.Agent != nil {
				t.Logf("---- cable-agent %s status:\n%s", c.Name, c.StatusTable())
			}
			for _, args := range [][]string{{"-br", "addr"}, {"route"}, {"-s", "link", "show", c.WGInterface}} {
				r := Run(ctx, "ip", append([]string{"-n", c.GwNS}, args...)...)
				t.Logf("---- %s: ip %s\n%s%s", c.GwNS, strings.Join(args, " "), r.Stdout, r.Stderr)
			}
			// The cables as the host shows them (all drivers: links, routes incl. table 220, FDB,
			// WireGuard peers, charon's SAs).
			t.Logf("---- %s: host view of the cables\n%s", c.GwNS, c.Host().Dump())
		}
		m.mu.Lock()
		logs := map[string]bool{}
		for _, p := range m.procs {
			logs[p.LogPath] = true
		}
		m.mu.Unlock()
		paths := make([]string, 0, len(logs))
		for p := range logs {
			paths = append(paths, p)
		}
		sort.Strings(paths)
		for _, p := range paths {
			t.Logf("---- %s (last 80 lines):\n%s", filepath.Base(p), tail(p, 80))
		}
	}
	m.mu.Lock()
	procs := append([]*Process(nil), m.procs...)
	m.mu.Unlock()
	// Agents first (they clean up their devices on SIGTERM), then the broker and the helpers.
	for i := len(procs) - 1; i >= 0; i-- {
		if strings.HasPrefix(procs[i].Name, "cable-agent") {
			if _, err := procs[i].Stop(15 * time.Second); err != nil {
				t.Errorf("teardown: %v", err)
			}
		}
	}
	for _, p := range procs {
		if _, err := p.Stop(10 * time.Second); err != nil {
			t.Errorf("teardown: %v", err)
		}
	}
	safe, errs := m.unmountDatapath()
	for _, err := range errs {
		t.Errorf("teardown: %v", err)
	}
	if removed, err := SweepNamespaces(m.Prefix); err != nil {
		t.Errorf("teardown: delete namespaces of %s: %v", m.Prefix, err)
	} else if len(removed) > 0 {
		t.Logf("teardown: deleted namespaces %v", removed)
	}
	ReleasePrefix(m.Prefix)
	// Nothing of the mesh may have appeared in the host's own namespace.
	for name := range hostLinkNames(ctx) {
		if !m.hostLinks[name] && strings.HasPrefix(name, "cbl-") {
			t.Errorf("teardown: link %s appeared in the host's network namespace during the test", name)
		}
	}
	if m.Dir != "" && !safe {
		t.Errorf("teardown: kept %s: something is still mounted below it", m.Dir)
	} else if m.Dir != "" {
		if os.Getenv(KeepEnv) == "1" {
			_ = os.WriteFile(filepath.Join(m.Dir, KeptMarker), nil, 0o644)
			t.Logf("teardown: kept %s (%s=1)", m.Dir, KeepEnv)
		} else {
			_ = os.RemoveAll(m.Dir)
		}
	}
	m.cancel()
}

func hostLinkNames(ctx context.Context) map[string]bool {
	out := Run(ctx, "ip", "-o", "link", "show").Stdout
	names := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 {
			n, _, _ := strings.Cut(strings.TrimSuffix(f[1], ":"), "@")
			names[n] = true
		}
	}
	return names
}
