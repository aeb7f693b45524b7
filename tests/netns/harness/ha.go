package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// An HA mesh is a mesh whose broker is several cable-broker replicas sharing an etcd cluster
// (cable-broker --etcd-endpoints), each replica and each etcd member in a namespace of its own on
// the underlay:
//
//	<p>brk, <p>brk2, ...   broker replicas: 172.31.0.1, .2, ... port 7443
//	<p>etcd1, <p>etcd2 ... etcd members: the next addresses (172.31.0.3, ... with two replicas),
//	                       client port 2379, peer port 2380; data on tmpfs
//
// The Mesh's own broker fields (BrokerNS, BrokerAddr, BrokerDataDir, Broker) are the first
// replica's, so Cablectl runs with its admin.yaml, which lists every replica (cablectl tries them
// in turn). Agents are configured with every replica: `broker: 172.31.0.1:7443,172.31.0.2:7443`.

// EtcdPort and EtcdPeerPort are the ports of every etcd member.
const (
	EtcdPort     = 2379
	EtcdPeerPort = 2380
)

// HA is a mesh with replicated brokers on etcd.
type HA struct {
	*Mesh
	Etcd     []*EtcdMember
	Replicas []*Replica
}

// EtcdMember is one etcd process of the mesh.
type EtcdMember struct {
	Name      string
	NS        string
	Addr      netip.Addr
	ClientURL string
	DataDir   string
	LogPath   string
	Proc      *Process
	args      []string
}

// Replica is one cable-broker of the mesh.
type Replica struct {
	Index   int
	NS      string
	Addr    netip.Addr
	DataDir string
	LogPath string
	// Bin is the cable-broker the replica runs; "" for the mesh's (Mesh.Bin.Broker).
	Bin  string
	Proc *Process
}

// Address is host:port of the replica.
func (r *Replica) Address() string { return fmt.Sprintf("%s:%d", r.Addr, BrokerPort) }

// AdminConfig is the replica's admin.yaml.
func (r *Replica) AdminConfig() string { return filepath.Join(r.DataDir, "admin.yaml") }

// NewHA builds a mesh (underlay, no clusters) with an etcd cluster of members and replicas
// cable-broker replicas, all started, and registers its teardown with t.Cleanup. It skips the
// test when no etcd binary is installed.
func NewHA(t testing.TB, members, replicas int) *HA {
	t.Helper()
	return NewHAOn(t, members, replicas, "")
}

// NewHAOn is NewHA whose replicas run the cable-broker at broker ("" for the mesh's): an
// upgrade test starts the mesh on an earlier version's broker.
func NewHAOn(t testing.TB, members, replicas int, broker string) *HA {
	t.Helper()
	RequireRoot(t)
	etcdBin := etcdtest.Require(t)
	if members+replicas > 9 {
		t.Fatalf("NewHA: %d etcd members and %d replicas do not fit below the gateways' addresses (.10 on)", members, replicas)
	}
	ctx, cancel := context.WithCancel(context.Background())
	bins, err := Build(ctx)
	if err != nil {
		cancel()
		t.Fatalf("%v", err)
	}
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
	m.Logf("HA mesh prefix %s, dir %s", m.Prefix, m.Dir)
	m.must(m.mountDatapath())
	m.must(AddNamespace(ctx, m.UnderlayNS))
	m.ip("-n", m.UnderlayNS, "link", "add", "br0", "type", "bridge")
	m.ip("-n", m.UnderlayNS, "link", "set", "br0", "up")

	h := &HA{Mesh: m}
	idx := 1
	for i := range replicas {
		r := &Replica{Index: i, NS: m.Prefix + "brk", Addr: netip.MustParseAddr(fmt.Sprintf("172.31.0.%d", idx)),
			DataDir: filepath.Join(m.Dir, "broker"), LogPath: filepath.Join(m.Dir, "broker.log"), Bin: broker}
		if i > 0 {
			r.NS = fmt.Sprintf("%sbrk%d", m.Prefix, i+1)
			r.DataDir = filepath.Join(m.Dir, fmt.Sprintf("broker%d", i+1))
			r.LogPath = filepath.Join(m.Dir, fmt.Sprintf("broker%d.log", i+1))
		}
		m.must(AddNamespace(ctx, r.NS))
		m.attachUnderlay(r.NS, idx, r.Addr)
		h.Replicas = append(h.Replicas, r)
		idx++
	}
	m.BrokerNS, m.BrokerAddr, m.BrokerDataDir = h.Replicas[0].NS, h.Replicas[0].Addr, h.Replicas[0].DataDir

	// etcd keeps its data on tmpfs where there is one: its fsyncs would otherwise dominate.
	base := ""
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		base = "/dev/shm"
	}
	etcdDir, err := os.MkdirTemp(base, m.Prefix+"etcd-")
	m.must(err)
	t.Cleanup(func() { os.RemoveAll(etcdDir) })
	var initial []string
	for i := range members {
		addr := netip.MustParseAddr(fmt.Sprintf("172.31.0.%d", idx))
		e := &EtcdMember{Name: fmt.Sprintf("etcd%d", i+1), NS: fmt.Sprintf("%setcd%d", m.Prefix, i+1), Addr: addr,
			ClientURL: fmt.Sprintf("http://%s:%d", addr, EtcdPort), DataDir: filepath.Join(etcdDir, fmt.Sprintf("etcd%d", i+1)),
			LogPath: filepath.Join(m.Dir, fmt.Sprintf("etcd%d.log", i+1))}
		m.must(AddNamespace(ctx, e.NS))
		m.attachUnderlay(e.NS, idx, addr)
		initial = append(initial, fmt.Sprintf("%s=http://%s:%d", e.Name, addr, EtcdPeerPort))
		h.Etcd = append(h.Etcd, e)
		idx++
	}
	for _, e := range h.Etcd {
		e.args = append([]string{etcdBin}, etcdtest.MemberArgs(e.Name, e.DataDir, e.ClientURL,
			fmt.Sprintf("http://%s:%d", e.Addr, EtcdPeerPort), strings.Join(initial, ","))...)
		h.StartEtcd(e)
	}
	for _, r := range h.Replicas {
		h.StartReplica(r)
	}
	return h
}

// EtcdEndpoints is the --etcd-endpoints value: every member's client URL.
func (h *HA) EtcdEndpoints() string {
	var out []string
	for _, e := range h.Etcd {
		out = append(out, e.ClientURL)
	}
	return strings.Join(out, ",")
}

// BrokerList is the agents' `broker:` value: every replica.
func (h *HA) BrokerList() string {
	var out []string
	for _, r := range h.Replicas {
		out = append(out, r.Address())
	}
	return strings.Join(out, ",")
}

// StartEtcd starts (or restarts, on its data) an etcd member.
func (h *HA) StartEtcd(e *EtcdMember) {
	h.T.Helper()
	p, err := StartProcess("etcd "+e.Name, e.NS, e.LogPath, e.args...)
	h.must(err)
	h.track(p)
	e.Proc = p
	h.Logf("%s started at %s (pid %d)", e.Name, e.ClientURL, p.Pid())
}

// Kill SIGKILLs a process group and waits for it to end: a crash, not a shutdown.
func (h *HA) Kill(p *Process) {
	h.T.Helper()
	if ok, _ := p.Exited(); ok {
		return
	}
	_ = syscall.Kill(-p.Pid(), syscall.SIGKILL)
	if _, err := p.Wait(10 * time.Second); err != nil {
		h.T.Fatalf("kill %s: %v", p.Name, err)
	}
	h.Logf("%s killed (SIGKILL)", p.Name)
}

// StartReplica starts a cable-broker replica on the etcd cluster and waits until it answers
// cablectl through its own address. Every replica after the first gets a copy of the first's
// secret key first, as the operator does (docs: the key that seals the mesh's secrets in etcd).
func (h *HA) StartReplica(r *Replica) {
	h.T.Helper()
	if r.Index > 0 {
		b, err := os.ReadFile(filepath.Join(h.Replicas[0].DataDir, "secret.key"))
		h.must(err)
		h.must(os.MkdirAll(r.DataDir, 0o700))
		h.must(os.WriteFile(filepath.Join(r.DataDir, "secret.key"), b, 0o600))
	}
	bin := h.Bin.Broker
	if r.Bin != "" {
		bin = r.Bin
	}
	p, err := StartProcess(fmt.Sprintf("cable-broker %d", r.Index+1), r.NS, r.LogPath,
		bin, "--data-dir", r.DataDir, "--listen", r.Address(), "--etcd-endpoints", h.EtcdEndpoints())
	h.must(err)
	h.track(p)
	r.Proc = p
	if r.Index == 0 {
		h.Broker = p
	}
	var last Result
	err = WaitFor(60*time.Second, 200*time.Millisecond, func() (bool, string) {
		if ok, code := p.Exited(); ok {
			h.T.Fatalf("cable-broker %d exited with code %d:\n%s", r.Index+1, code, p.LogTail(40))
		}
		if _, err := os.Stat(r.AdminConfig()); err != nil {
			return false, "no admin.yaml yet"
		}
		last = h.CablectlVia(r, "cluster", "list")
		return last.Err == nil, last.String()
	})
	if err != nil {
		h.T.Fatalf("broker %d not ready: %v\nbroker log:\n%s", r.Index+1, err, p.LogTail(40))
	}
	h.Logf("broker %d up at %s (pid %d)", r.Index+1, r.Address(), p.Pid())
}

// CablectlVia runs cablectl in the replica's namespace with its admin.yaml, talking to that
// replica only (--broker).
func (h *HA) CablectlVia(r *Replica, args ...string) Result {
	return NSRun(h.Ctx, r.NS, h.Bin.Cablectl, append([]string{"--config", r.AdminConfig(), "--broker", r.Address()}, args...)...)
}

// AddCluster creates a cluster's namespaces, gets its join token and writes its agent config
// naming every replica; the agent is not started.
func (h *HA) AddCluster(name, podCIDR string) *Cluster {
	h.T.Helper()
	c := h.NewCluster(name, podCIDR)
	r := h.JoinToken(name, podCIDR)
	if r.Err != nil {
		h.T.Fatalf("join token for %s: %s", name, r)
	}
	c.WriteToken(strings.TrimSpace(r.Stdout))
	single := "broker: " + h.BrokerAddress() + "\n"
	cfg := c.ConfigYAML("")
	if !strings.Contains(cfg, single) {
		h.T.Fatalf("agent config of %s has no %q line to replace", name, strings.TrimSpace(single))
	}
	h.must(os.WriteFile(c.ConfigPath, []byte(strings.Replace(cfg, single, "broker: "+h.BrokerList()+"\n", 1)), 0o600))
	return c
}

var watchStartedRE = regexp.MustCompile(`^time=(\S+) .*msg="watch started".* cluster=(\S+)`)

// WatchStreams returns, per replica, the clusters whose agent's latest watch started there (from
// the replicas' logs: "watch started" lines).
func (h *HA) WatchStreams() [][]string {
	type at struct {
		t       time.Time
		replica int
	}
	latest := map[string]at{}
	for i, r := range h.Replicas {
		b, _ := os.ReadFile(r.LogPath)
		for _, line := range strings.Split(string(b), "\n") {
			m := watchStartedRE.FindStringSubmatch(line)
			if m == nil {
				continue
			}
			ts, err := time.Parse(time.RFC3339Nano, m[1])
			if err != nil {
				continue
			}
			if cur, ok := latest[m[2]]; !ok || ts.After(cur.t) {
				latest[m[2]] = at{ts, i}
			}
		}
	}
	out := make([][]string, len(h.Replicas))
	for _, c := range h.Clusters() {
		if a, ok := latest[c.Name]; ok {
			out[a.replica] = append(out[a.replica], c.Name)
		}
	}
	return out
}

// Watchers returns, per replica, the clusters whose gateways hold a connection to it (from the
// replica namespace's established TCP connections on the broker port).
func (h *HA) Watchers() [][]string {
	out := make([][]string, len(h.Replicas))
	for i, r := range h.Replicas {
		res := Run(h.Ctx, "ip", "netns", "exec", r.NS, "ss", "-Htn", "state", "established", fmt.Sprintf("( sport = :%d )", BrokerPort))
		for _, line := range strings.Split(res.Stdout, "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			peer, err := netip.ParseAddrPort(f[len(f)-1])
			if err != nil {
				continue
			}
			for _, c := range h.Clusters() {
				if c.GwUnderlay == peer.Addr() {
					out[i] = append(out[i], c.Name)
				}
			}
		}
	}
	return out
}

// EtcdLeader returns the index of the etcd member that leads, asking each member with etcdctl
// (etcd-client); -1 when it cannot tell.
func (h *HA) EtcdLeader() int {
	if _, err := exec.LookPath("etcdctl"); err != nil {
		return -1
	}
	for i, e := range h.Etcd {
		if ok, _ := e.Proc.Exited(); ok {
			continue
		}
		r := NSRun(h.Ctx, e.NS, "etcdctl", "--endpoints", e.ClientURL, "endpoint", "status", "-w", "json")
		if r.Err != nil {
			continue
		}
		var st []struct {
			Status struct {
				Header struct {
					MemberID uint64 `json:"member_id"`
				} `json:"header"`
				Leader uint64 `json:"leader"`
			}
		}
		if json.Unmarshal([]byte(r.Stdout), &st) == nil && len(st) == 1 && st[0].Status.Leader != 0 && st[0].Status.Header.MemberID == st[0].Status.Leader {
			return i
		}
	}
	return -1
}
