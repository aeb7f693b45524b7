package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kubefake "k8s.io/client-go/kubernetes/fake"
	mcsfake "sigs.k8s.io/mcs-api/pkg/client/clientset/versioned/fake"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/internal/testbroker"
	"github.com/cablemesh/cablemesh/agent/kube"
	"github.com/cablemesh/cablemesh/agent/kube/kubetest"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/reload"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/internal/syncbuf"
)

// The agent tests build no real driver, and the fakes registered as wireguard and vxlan take no
// settings: the config file's block that changes is this driver's, which accepts a numeric port.
const reloadVX = "reload-vx"

var reloadDriversOnce sync.Once

func registerReloadDrivers() {
	reloadDriversOnce.Do(func() {
		for _, name := range []string{reloadVX} {
			cable.Register(cable.Registration{Name: name,
				New: func(cable.LocalNode, cable.Settings) (cable.Driver, error) {
					return nil, errors.New("the reload tests build drivers through Options.NewDriver")
				},
				ParseSettings: func(s cable.Settings) error {
					for k, v := range s {
						if k != "port" {
							return fmt.Errorf("%s.%s: unknown setting", name, k)
						}
						if _, err := strconv.ParseUint(v, 10, 16); err != nil {
							return fmt.Errorf("%s.port: %q is not a port", name, v)
						}
					}
					return nil
				}})
		}
	})
}

// builds is a driver factory that builds a new fake on every call, publishing the block's port,
// and remembers each, so that a test can tell a rebuilt driver from the one it replaced.
type builds struct {
	mu  sync.Mutex
	all map[string][]*fakedriver.Driver
}

func (b *builds) factory(name string, _ cable.LocalNode, s cable.Settings) (cable.Driver, error) {
	port := map[string]uint16{"wireguard": 51820, reloadVX: 4789}[name]
	if p, err := strconv.ParseUint(s["port"], 10, 16); err == nil {
		port = uint16(p)
	}
	d := fakedriver.NewNamed(name, port)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.all[name] = append(b.all[name], d)
	return d, nil
}

func (b *builds) of(name string) []*fakedriver.Driver {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.all[name])
}

func reloadConfigText(b *testbroker.Broker, cfg *config.Config, drivers []string, extra string) string {
	return fmt.Sprintf(`cluster: east
node: east-gw1
broker: %s
joinTokenFile: %s
stateDir: %s
gateway: true
advertiseAddress: 127.0.0.11
podCIDRs: [10.1.0.0/16]
statusSocket: %s
cableDrivers: [%s]
leaseSeconds: 2
heartbeatInterval: 100ms
resyncInterval: 1s
`, b.Addr(), cfg.JoinTokenFile, cfg.StateDir, cfg.StatusSocket, strings.Join(drivers, ", ")) + extra
}

// Driver sets for reloadConfigText.
var (
	bothDrivers   = []string{"wireguard", reloadVX}
	wireguardOnly = []string{"wireguard"}
)

// westOnReloadVX gives the broker a policy that pairs east and west over reload-vx and west's
// endpoint, which has wireguard and reload-vx (port 4789).
func westOnReloadVX(t *testing.T, b *testbroker.Broker) {
	t.Helper()
	b.UpsertPolicy(policyRecord(t, eastWestOn(reloadVX), false))
	west := remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5")
	west.Drivers = []string{"wireguard", reloadVX}
	west.CablePorts[reloadVX] = 4789
	b.UpsertEndpoint(west)
}

// startReloadAgent writes text as the agent's config file, loads it and starts an agent that
// reloads from that file and builds its drivers with bl; mod, when not nil, sets more options.
func startReloadAgent(t *testing.T, text string, mod func(*Options)) (r *running, cfg *config.Config, path string, bl *builds) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "agent.yaml")
	writeRenamed(t, path, text)
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	bl = &builds{all: map[string][]*fakedriver.Driver{}}
	r = startAgentWith(t, cfg, nil, func(o *Options) {
		o.Host.NewDriver = bl.factory
		o.ConfigPath = path
		if mod != nil {
			mod(o)
		}
	})
	return r, cfg, path, bl
}

// writeRenamed replaces path as a ConfigMap update does: a new file renamed over the old one.
func writeRenamed(t *testing.T, path, text string) time.Time {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
	return at
}

func TestAReloadAppliesOnlyWhatChangedAndRefusesTheClusterName(t *testing.T) {
	registerReloadDrivers()
	b := multiBroker(t)
	westOnReloadVX(t, b)
	base := testConfig(t, b, true)
	logs := &syncbuf.Buffer{}
	r, cfg, path, bl := startReloadAgent(t, reloadConfigText(b, base, bothDrivers, "reload-vx: {port: 4789}\nhealthCheck: {period: 1s}\n"), func(o *Options) {
		o.Log = slog.New(slog.NewTextHandler(logs, nil))
	})
	eventually(t, "west on vxlan, north on wireguard", func() bool {
		vx, wg := bl.of(reloadVX), bl.of("wireguard")
		return len(vx) == 1 && len(wg) == 1 && connectedClusters(vx[0]) == "west" && connectedClusters(wg[0]) == "north"
	})
	eventually(t, "endpoint with vxlan port 4789", func() bool {
		ep := b.Endpoint("east", "east-gw1")
		return ep != nil && ep.GetCablePorts()[reloadVX] == 4789
	})
	s, _ := getStatus(t, cfg.StatusSocket)
	if s.Config == nil || s.Config.Revision != 1 || !strings.HasPrefix(s.Config.Hash, "sha256:") || s.Config.Path != path {
		t.Fatalf("status config at start = %+v", s.Config)
	}
	if p := r.agent.cables.RepairEvery(); p != time.Second {
		t.Errorf("repair check every %v at start, want the configured 1s", p)
	}
	wg := bl.of("wireguard")[0]
	wg.Calls() // drains: what follows is what the reload made

	// A new vxlan port, a new export and a new probe period, in one rename.
	renamed := writeRenamed(t, path, reloadConfigText(b, base, bothDrivers, `reload-vx: {port: 4790}
healthCheck: {period: 2s}
exports:
- {name: api, namespace: shop, ports: [{port: 8080}], endpoints: [{ip: 10.1.0.6}]}
`))
	eventually(t, "revision 2 in force", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Config != nil && s.Config.Revision == 2
	})
	t.Logf("rename to revision 2 in force: %s", time.Since(renamed).Round(time.Millisecond))
	eventually(t, "the new vxlan driver connects west", func() bool {
		vx := bl.of(reloadVX)
		return len(vx) == 2 && connectedClusters(vx[1]) == "west"
	})
	if got := ops(bl.of(reloadVX)[0].Calls()); !slices.Contains(got, "cleanup ") || got[len(got)-1] != "close " {
		t.Errorf("old vxlan driver calls = %v, want a cleanup and a close last", got)
	}
	eventually(t, "the endpoint publishes vxlan port 4790", func() bool {
		return b.Endpoint("east", "east-gw1").GetCablePorts()[reloadVX] == 4790
	})
	eventually(t, "the new export reaches the broker", func() bool {
		ex, _ := b.Exports("east", "east-gw1")
		return len(ex) == 1 && ex[0].GetName() == "api"
	})
	if m := r.agent.healthManager(); m == nil || m.Settings().Period != 2*time.Second {
		t.Errorf("probe period in force: %+v", m)
	}
	// The reconcile loop's repair check follows the new period too, not only the probers.
	eventually(t, "the repair check at the new 2s period", func() bool {
		return r.agent.cables.RepairEvery() == 2*time.Second
	})
	// The wireguard pair was not touched: the same driver, no call since the reload.
	if len(bl.of("wireguard")) != 1 {
		t.Errorf("wireguard rebuilt: %d builds", len(bl.of("wireguard")))
	}
	if calls := wg.Calls(); len(calls) != 0 {
		t.Errorf("wireguard driver called during the reload: %v", ops(calls))
	}
	if connectedClusters(wg) != "north" {
		t.Errorf("wireguard connections = %s", connectedClusters(wg))
	}

	// The cluster name cannot change: the whole file is refused, even its live vxlan change.
	writeRenamed(t, path, strings.Replace(reloadConfigText(b, base, bothDrivers, "reload-vx: {port: 4791}\n"), "cluster: east", "cluster: renamed", 1))
	eventually(t, "status names the refused field", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Config != nil && len(s.Config.Refused) == 1 && s.Config.Refused[0].Field == "cluster"
	})
	s, _ = getStatus(t, cfg.StatusSocket)
	if s.Config.Revision != 2 || !strings.Contains(s.Config.Refused[0].Message, `"east"`) || !strings.Contains(s.Config.Refused[0].Message, `"renamed"`) {
		t.Errorf("refused config status = %+v", s.Config)
	}
	if !slices.ContainsFunc(s.Problems, func(p statusapi.Problem) bool { return strings.Contains(p.Message, "cluster cannot change") }) {
		t.Errorf("problems = %+v", s.Problems)
	}
	if len(bl.of(reloadVX)) != 2 || b.Endpoint("east", "east-gw1").GetCablePorts()[reloadVX] != 4790 {
		t.Error("a refused config changed the vxlan driver")
	}
	if !strings.Contains(logs.String(), "CONFIG CHANGE REFUSED") {
		t.Error("the refusal was not logged")
	}

	// A file that does not parse is refused too, naming the field.
	writeRenamed(t, path, reloadConfigText(b, base, bothDrivers, "healthCheck: {period: 1ms}\n"))
	eventually(t, "status names the bad field", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Config != nil && len(s.Config.Refused) == 1 && s.Config.Refused[0].Field == "healthCheck.period"
	})
	// Back to the config in force: nothing to refuse any more, and nothing applied.
	writeRenamed(t, path, reloadConfigText(b, base, bothDrivers, `reload-vx: {port: 4790}
healthCheck: {period: 2s}
exports:
- {name: api, namespace: shop, ports: [{port: 8080}], endpoints: [{ip: 10.1.0.6}]}
`))
	eventually(t, "the refusal clears", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Config != nil && len(s.Config.Refused) == 0
	})
	if s, _ := getStatus(t, cfg.StatusSocket); s.Config.Revision != 3 || len(bl.of(reloadVX)) != 2 {
		t.Errorf("restoring the file: revision %d, %d vxlan builds", s.Config.Revision, len(bl.of(reloadVX)))
	}
}

// nodeBuilds records the local node every driver was built for.
type nodeBuilds struct {
	mu    sync.Mutex
	nodes []cable.LocalNode
}

func (n *nodeBuilds) factory(name string, node cable.LocalNode, _ cable.Settings) (cable.Driver, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.nodes = append(n.nodes, node)
	return fakedriver.NewNamed(name, 51820), nil
}

func (n *nodeBuilds) last() (cable.LocalNode, int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.nodes) == 0 {
		return cable.LocalNode{}, 0
	}
	return n.nodes[len(n.nodes)-1], len(n.nodes)
}

func nodeWithAddresses(name string, addrs ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Addresses: addrs}}
}

// On Kubernetes a gateway without advertiseAddress takes its Node's InternalIP as its private
// address (the drivers' local end and the endpoint's private IP) and its ExternalIP as the
// endpoint's public IP; a change of the Node's addresses rebuilds the drivers and registers the
// endpoint again.
func TestAKubernetesGatewayTakesItsAddressesFromItsNode(t *testing.T) {
	b := newBroker(t)
	cfg := testConfig(t, b, true)
	cfg.AdvertiseAddress = ""
	cfg.Kubernetes.Enabled = true
	if err := cfg.Validate(); err != nil {
		t.Fatalf("a Kubernetes gateway without advertiseAddress: %v", err)
	}
	kc := kubefake.NewSimpleClientset(nodeWithAddresses("east-gw1",
		corev1.NodeAddress{Type: corev1.NodeHostName, Address: "east-gw1"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "127.0.0.21"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.7"}))
	mc := listOnlyMCS{mcsfake.NewSimpleClientset()}
	nb := &nodeBuilds{}
	r := startAgentWith(t, cfg, nil, func(o *Options) {
		o.Host.NewDriver = nb.factory
		o.Kubernetes = kube.New(kubetest.Clientsets(kc, mc), cfg.Cluster, nil, kube.WithStatusUpdates(false))
		o.NodeAddresses = &kube.NodeWatcher{Client: kubetest.Clientsets(kc, nil), Node: cfg.Node}
	})
	eventually(t, "the endpoint with the Node's addresses", func() bool {
		ep := b.Endpoint("east", "east-gw1")
		return ep != nil && ep.GetPrivateIp() == "127.0.0.21" && ep.GetPublicIp() == "203.0.113.7"
	})
	if n, builds := nb.last(); builds != 1 || n.AdvertiseAddress != netip.MustParseAddr("127.0.0.21") {
		t.Errorf("driver built %d times, for address %s", builds, n.AdvertiseAddress)
	}

	// The Node moves: its new addresses reach the drivers and the broker.
	moved := nodeWithAddresses("east-gw1",
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "127.0.0.22"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.8"})
	if _, err := kc.CoreV1().Nodes().UpdateStatus(context.Background(), moved, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the endpoint with the Node's new addresses", func() bool {
		ep := b.Endpoint("east", "east-gw1")
		return ep != nil && ep.GetPrivateIp() == "127.0.0.22" && ep.GetPublicIp() == "203.0.113.8"
	})
	if n, builds := nb.last(); builds != 2 || n.AdvertiseAddress != netip.MustParseAddr("127.0.0.22") {
		t.Errorf("after the move: driver built %d times, last for address %s", builds, n.AdvertiseAddress)
	}
	// The guard against cable routes protects the node's new address, no longer the old one.
	protects := func(addr string) bool {
		p := netip.PrefixFrom(netip.MustParseAddr(addr), 32)
		return slices.ContainsFunc(r.agent.guards.Current().Protected, func(x reconcile.Protected) bool { return x.Prefix == p })
	}
	if !protects("127.0.0.21") && !protects("127.0.0.22") {
		t.Error("the guard protects neither the old nor the new address")
	}
	eventually(t, "the guard protects the new address", func() bool { return protects("127.0.0.22") && !protects("127.0.0.21") })

	// A public address change alone re-registers without rebuilding the drivers.
	public := nodeWithAddresses("east-gw1",
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "127.0.0.22"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.9"})
	if _, err := kc.CoreV1().Nodes().UpdateStatus(context.Background(), public, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the endpoint with the new public address", func() bool {
		return b.Endpoint("east", "east-gw1").GetPublicIp() == "203.0.113.9"
	})
	if _, builds := nb.last(); builds != 2 {
		t.Errorf("a public address change rebuilt the drivers (%d builds)", builds)
	}
}

// A config's advertiseAddress wins over the Node's InternalIP; the ExternalIP is still published.
func TestAnAdvertiseAddressInTheConfigWinsOverTheNodes(t *testing.T) {
	b := newBroker(t)
	cfg := testConfig(t, b, true)
	cfg.Kubernetes.Enabled = true
	kc := kubefake.NewSimpleClientset(nodeWithAddresses("east-gw1",
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "127.0.0.21"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.7"}))
	nb := &nodeBuilds{}
	startAgentWith(t, cfg, nil, func(o *Options) {
		o.Host.NewDriver = nb.factory
		o.Kubernetes = kube.New(kubetest.Clientsets(kc, listOnlyMCS{mcsfake.NewSimpleClientset()}), cfg.Cluster, nil, kube.WithStatusUpdates(false))
		o.NodeAddresses = &kube.NodeWatcher{Client: kubetest.Clientsets(kc, nil), Node: cfg.Node}
	})
	eventually(t, "the endpoint with the config's address and the Node's public one", func() bool {
		ep := b.Endpoint("east", "east-gw1")
		return ep != nil && ep.GetPrivateIp() == "127.0.0.11" && ep.GetPublicIp() == "203.0.113.7"
	})
	if n, _ := nb.last(); n.AdvertiseAddress != netip.MustParseAddr("127.0.0.11") {
		t.Errorf("driver built for %s", n.AdvertiseAddress)
	}
}

// The other live fields: DNS upstreams and TTL reach the running DNS server, the log level its
// handler, and a driver left out of cableDrivers stops (its pairs and its port leave the
// endpoint) and starts again when it is back.
func TestAReloadChangesDNSTheLogLevelAndTheDriverSet(t *testing.T) {
	registerReloadDrivers()
	b := multiBroker(t)
	westOnReloadVX(t, b)
	base := testConfig(t, b, true)
	lv := new(slog.LevelVar)
	r, cfg, path, bl := startReloadAgent(t, reloadConfigText(b, base, bothDrivers, "dns: {listen: \"127.0.0.1:0\", upstream: [10.0.0.53], ttl: 5}\n"), func(o *Options) {
		o.LogLevel = lv
	})
	eventually(t, "west on reload-vx", func() bool {
		vx := bl.of(reloadVX)
		return len(vx) == 1 && connectedClusters(vx[0]) == "west"
	})
	dnsServer := func() []string {
		dp := r.agent.dp
		if dp.DNS() == nil {
			return nil
		}
		return dp.DNS().Upstreams()
	}
	if got := strings.Join(dnsServer(), ","); got != "10.0.0.53:53" {
		t.Fatalf("dns upstreams at start: %q", got)
	}

	// New upstreams and TTL, debug logs, and reload-vx left out of cableDrivers.
	writeRenamed(t, path, reloadConfigText(b, base, wireguardOnly, "dns: {listen: \"127.0.0.1:0\", upstream: [10.0.0.54], ttl: 9}\nlogLevel: debug\n"))
	eventually(t, "revision 2 in force", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Config != nil && s.Config.Revision == 2
	})
	if got := strings.Join(dnsServer(), ","); got != "10.0.0.54:53" {
		t.Errorf("dns upstreams after the reload: %q", got)
	}
	if lv.Level() != slog.LevelDebug {
		t.Errorf("log level after the reload: %s", lv.Level())
	}
	eventually(t, "the endpoint no longer publishes reload-vx", func() bool {
		ep := b.Endpoint("east", "east-gw1")
		return ep != nil && !slices.Contains(ep.GetDrivers(), reloadVX)
	})
	if got := ops(bl.of(reloadVX)[0].Calls()); !slices.Contains(got, "cleanup ") || got[len(got)-1] != "close " {
		t.Errorf("the removed driver's calls = %v, want a cleanup and a close last", got)
	}
	s, _ := getStatus(t, cfg.StatusSocket)
	for _, d := range s.Drivers {
		if d.Name == reloadVX {
			t.Errorf("status still lists the removed driver: %+v", s.Drivers)
		}
	}

	// Back in the list: built and started again, and west reconnected over it.
	writeRenamed(t, path, reloadConfigText(b, base, bothDrivers, "dns: {listen: \"127.0.0.1:0\", upstream: [10.0.0.54], ttl: 9}\nlogLevel: debug\n"))
	eventually(t, "reload-vx back, west on it", func() bool {
		vx := bl.of(reloadVX)
		return len(vx) == 2 && connectedClusters(vx[1]) == "west"
	})
	eventually(t, "the endpoint publishes reload-vx again", func() bool {
		return slices.Contains(b.Endpoint("east", "east-gw1").GetDrivers(), reloadVX)
	})
}

// A mounted ConfigMap is updated by writing a new timestamped directory and swapping the
// `..data` symlink the file's own symlink goes through (kubelet's AtomicWriter): the agent sees
// it through its watch of the directory, well before its 10 s poll.
func TestAConfigMapSymlinkSwapIsAppliedAtOnce(t *testing.T) {
	b := newBroker(t)
	base := testConfig(t, b, true)
	dir := t.TempDir()
	text := func(period string) string {
		return reloadConfigText(b, base, wireguardOnly, "healthCheck: {period: "+period+"}\n")
	}
	version := func(name, content string) {
		t.Helper()
		if err := os.Mkdir(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, "agent.yaml"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(name, filepath.Join(dir, "..data_tmp")); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
			t.Fatal(err)
		}
	}
	version("..2026_11_23_22_00_00.1", text("1s"))
	path := filepath.Join(dir, "agent.yaml")
	if err := os.Symlink("..data/agent.yaml", path); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	r := startAgentWith(t, cfg, fakedriver.New(), func(o *Options) { o.ConfigPath = path })
	eventually(t, "the prober at 1s", func() bool { m := r.agent.healthManager(); return m != nil && m.Settings().Period == time.Second })
	// The endpoint is registered by a loop started with the watch: the watch is up by then.
	eventually(t, "endpoint registered", func() bool { return b.Endpoint("east", "east-gw1") != nil })

	swapped := time.Now()
	version("..2026_11_23_22_05_00.2", text("2s"))
	eventually(t, "revision 2 in force", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Config != nil && s.Config.Revision == 2
	})
	if d := time.Since(swapped); d > reload.PollInterval/2 {
		t.Errorf("the swap took %s to apply: the poll, not the watch, found it", d)
	}
	if p := r.agent.healthManager().Settings().Period; p != 2*time.Second {
		t.Errorf("probe period %s after the swap", p)
	}
}

// A config file that goes away leaves the running config in force, said once in the status.
func TestADeletedConfigFileKeepsTheRunningConfig(t *testing.T) {
	b := newBroker(t)
	base := testConfig(t, b, true)
	path := filepath.Join(t.TempDir(), "agent.yaml")
	writeRenamed(t, path, reloadConfigText(b, base, wireguardOnly, ""))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncbuf.Buffer{}
	r := startAgentWith(t, cfg, fakedriver.New(), func(o *Options) {
		o.ConfigPath = path
		o.Log = slog.New(slog.NewTextHandler(logs, nil))
	})
	waitReady(t, r)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	// Read directly (the watch may or may not be up yet, and its poll is 10 s away): three times,
	// as three polls would.
	for range 3 {
		r.agent.ReloadConfig(context.Background(), nil)
	}
	if s, _ := getStatus(t, cfg.StatusSocket); s.Config == nil || len(s.Config.Refused) != 1 || !strings.Contains(s.Config.Refused[0].Message, "cannot read the file") {
		t.Errorf("status config after the file went away: %+v", s.Config)
	}
	if n := strings.Count(logs.String(), "cannot read the file"); n != 1 {
		t.Errorf("the unreadable file was logged %d times, want once", n)
	}
	if s, _ := getStatus(t, cfg.StatusSocket); s.Config.Revision != 1 {
		t.Errorf("revision %d after the file went away", s.Config.Revision)
	}
}

// healthCheck.enabled and imports.selector are live: probing stops and starts again (with the
// reconcile loop's repair check), and the broker watch is opened again, asking for a full
// snapshot, with the new selector.
func TestAReloadTurnsProbesOffAndOnAndChangesTheImportSelector(t *testing.T) {
	registerReloadDrivers()
	b := multiBroker(t)
	base := testConfig(t, b, true)
	r, cfg, path, _ := startReloadAgent(t, reloadConfigText(b, base, bothDrivers, "healthCheck: {period: 1s}\n"), nil)
	revision := func(want int) func() bool {
		return func() bool {
			s, _ := getStatus(t, cfg.StatusSocket)
			return s.Config != nil && s.Config.Revision == want && len(s.Config.Refused) == 0
		}
	}
	repairEvery := func() time.Duration { return r.agent.cables.RepairEvery() }
	eventually(t, "probes and the repair check at 1s", func() bool { return r.agent.healthManager() != nil && repairEvery() == time.Second })
	watches := len(b.WatchRequests())

	writeRenamed(t, path, reloadConfigText(b, base, bothDrivers, "healthCheck: {period: 1s, enabled: false}\n"))
	eventually(t, "revision 2 in force, nothing refused", revision(2))
	eventually(t, "no probes, no repair check", func() bool { return r.agent.healthManager() == nil && repairEvery() == 0 })

	writeRenamed(t, path, reloadConfigText(b, base, bothDrivers, "healthCheck: {period: 1s, enabled: true}\nimports: {selector: \"team=shop\"}\n"))
	eventually(t, "revision 3 in force, nothing refused", revision(3))
	eventually(t, "probes and the repair check again", func() bool { return r.agent.healthManager() != nil && repairEvery() == time.Second })
	eventually(t, "a new watch with the new selector, from a full snapshot", func() bool {
		ws := b.WatchRequests()
		last := ws[len(ws)-1]
		return len(ws) > watches && last.GetImportSelector() == "team=shop" && last.GetSinceRevision() == 0
	})
	s, _ := getStatus(t, cfg.StatusSocket)
	if s.Services == nil || s.Services.ImportSelector != "team=shop" {
		t.Errorf("status services %+v, want the new selector", s.Services)
	}
	// The new stream carries what the broker sends from now on: the exports the selector selects.
	web := webImport()
	for _, c := range web.Clusters {
		c.Labels = map[string]string{"team": "shop"}
	}
	b.SetImports("east", web)
	eventually(t, "the imports sent on the new stream", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Services != nil && len(s.Services.Imports) == 1
	})
}
