package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/cables"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/host"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/internal/testbroker"
	"github.com/cablemesh/cablemesh/agent/metrics"
	"github.com/cablemesh/cablemesh/agent/routes"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
)

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for: %s", what)
}

// newBroker runs the real broker (with o, if given) with the clusters east, west and north, and
// west's and north's gateways.
func newBroker(t *testing.T, o ...testbroker.Options) *testbroker.Broker {
	t.Helper()
	b := testbroker.New(t, append(o, testbroker.Options{})[0])
	if err := b.Start("127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	b.UpsertCluster(&apiv1.Cluster{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}})
	b.UpsertCluster(&apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}, ServiceCidrs: []string{"10.96.2.0/24"}})
	b.UpsertCluster(&apiv1.Cluster{Name: "north", Id: 3, PodCidrs: []string{"10.3.0.0/16"}})
	b.UpsertEndpoint(remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5"))
	b.UpsertEndpoint(remoteEndpoint("north", "n1", "127.0.0.13", "S05PUlRILWtleQ=="))
	return b
}

func remoteEndpoint(cluster, node, ip, key string) *apiv1.Endpoint {
	return &apiv1.Endpoint{Cluster: cluster, Node: node, PrivateIp: ip, CableAttributes: wgKey(key),
		CablePorts: map[string]uint32{"wireguard": 51820}, Drivers: []string{"wireguard"}}
}

// testConfig is an east gateway config with short timers and a socket path short enough for
// sun_path (t.TempDir paths of long test names are not).
func testConfig(t *testing.T, b *testbroker.Broker, gateway bool) *config.Config {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "cbta-sock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	tok := filepath.Join(t.TempDir(), "join-token")
	if err := os.WriteFile(tok, []byte(b.Token("east", time.Hour)), 0o600); err != nil {
		t.Fatal(err)
	}
	node := "east-gw1"
	if !gateway {
		node = "east-node2"
	}
	c := &config.Config{
		Cluster: "east", Node: node, Broker: b.Addr(), JoinTokenFile: tok,
		StateDir: filepath.Join(t.TempDir(), "state"), Gateway: gateway,
		AdvertiseAddress: "127.0.0.11", PodCIDRs: []string{"10.1.0.0/16"},
		StatusSocket:      filepath.Join(sockDir, "agent.sock"),
		CableDrivers:      []string{"wireguard"},
		LeaseSeconds:      2,
		HeartbeatInterval: 100 * time.Millisecond,
		ResyncInterval:    time.Second,
	}
	c.ApplyDefaults(nil)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	return c
}

type running struct {
	once   sync.Once
	agent  *Agent
	cancel context.CancelFunc
	done   chan error
	ready  chan struct{}
}

func startAgent(t *testing.T, cfg *config.Config, d *fakedriver.Driver, applyRoutes func([]routes.Route) error) *running {
	t.Helper()
	return startAgentWith(t, cfg, d, func(o *Options) { o.Host.ApplyRoutes = applyRoutes })
}

// startAgentWith starts an agent with the test defaults, changed by mod.
func startAgentWith(t *testing.T, cfg *config.Config, d *fakedriver.Driver, mod func(*Options)) *running {
	t.Helper()
	r := &running{done: make(chan error, 1), ready: make(chan struct{})}
	var once sync.Once
	opts := Options{
		Config: cfg,
		Host: host.Hooks{
			NewDriver: func(name string, _ cable.LocalNode, _ cable.Settings) (cable.Driver, error) {
				if name != d.Name() {
					return nil, errors.New("test agent has no driver " + name)
				}
				return d, nil
			},
			MSS: &fakeMSS{}, // never the host's nftables
		},
		Log:        slog.New(slog.NewTextHandler(io.Discard, nil)),
		MinBackoff: 50 * time.Millisecond,
		MaxBackoff: 200 * time.Millisecond,
		Ready:      func() { once.Do(func() { close(r.ready) }) },
	}
	fakeDatapath(&opts, nil, nil, map[string]int{}) // never the host's cgroups and bpffs
	if mod != nil {
		mod(&opts)
	}
	a, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.agent, r.cancel = a, cancel
	go func() { r.done <- a.Run(ctx) }()
	t.Cleanup(r.stop)
	return r
}

// waitReady waits until r is ready, failing the test when its Run ended first (with its error)
// or it is not ready within 10 seconds.
func waitReady(t *testing.T, r *running) {
	t.Helper()
	select {
	case <-r.ready:
	case err := <-r.done:
		r.done <- err // for the cleanup's stop()
		t.Fatalf("the agent stopped before it was ready: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready")
	}
}

func (r *running) stop() {
	r.once.Do(func() {
		r.cancel()
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			panic("agent did not stop")
		}
	})
}

func getStatus(t *testing.T, socket string) (statusapi.Status, map[string]any) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	resp, err := c.Get("http://agent" + statusapi.Path)
	if err != nil {
		t.Fatalf("GET status: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var s statusapi.Status
	var m map[string]any
	if err := json.Unmarshal(body, &s); err != nil {
		t.Fatalf("decode status: %v\n%s", err, body)
	}
	_ = json.Unmarshal(body, &m)
	return s, m
}

func connectedClusters(d *fakedriver.Driver) string { return strings.Join(d.Clusters(), ",") }

func TestGatewayAgentAgainstABroker(t *testing.T) {
	b := newBroker(t)
	cfg := testConfig(t, b, true)
	d := fakedriver.New()
	r := startAgent(t, cfg, d, nil)

	// Join persists the identity.
	eventually(t, "the agent joined and stored its certificate", func() bool {
		_, err := brokerclient.LoadIdentity(cfg.StateDir)
		return err == nil
	})
	if fi, err := os.Stat(filepath.Join(cfg.StateDir, brokerclient.KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("agent.key: %v, %v", fi, err)
	}

	// The snapshot leads to a connection to every other cluster.
	eventually(t, "connections to north and west", func() bool { return connectedClusters(d) == "north,west" })
	// The agent accepts zstd, and the broker compresses what gains from it (a message of 512
	// bytes or more): north relabelled is a delta that large, and it comes compressed.
	labels := map[string]string{}
	for i := range 12 {
		labels[fmt.Sprintf("note%d", i)] = strings.Repeat("x", 60)
	}
	b.UpsertCluster(&apiv1.Cluster{Name: "north", Id: 3, PodCidrs: []string{"10.3.0.0/16"}, Labels: labels})
	for deadline := time.Now().Add(10 * time.Second); b.EncodedSent() == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the broker sent no compressed watch message; the agent's watch asked for %v", b.WatchRequests()[0].GetAcceptEncodings())
		}
	}
	west, _ := d.Has("west")
	if west.Address != netip.MustParseAddr("127.0.0.12") || west.Port != 51820 || west.Attributes["publicKey"] != "S1dFU1Qta2V5" || west.ClusterID != 2 ||
		!slices.Equal(west.Subnets, []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16"), netip.MustParsePrefix("10.96.2.0/24")}) {
		t.Errorf("west connection = %+v", west)
	}

	// The gateway registered its endpoint with the driver's key and port.
	eventually(t, "east endpoint registered and heartbeating", func() bool {
		_, _, beats := b.Counts()
		return b.Endpoint("east", "east-gw1") != nil && beats > 0
	})
	ep := b.Endpoint("east", "east-gw1")
	if ep.GetPrivateIp() != "127.0.0.11" || ep.GetCablePorts()["wireguard"] != 51820 || ep.Attributes("wireguard")["publicKey"] != d.Key ||
		!slices.Equal(ep.GetSubnets(), []string{"10.1.0.0/16"}) || !slices.Equal(ep.GetDrivers(), []string{"wireguard"}) {
		t.Errorf("registered endpoint = %v", ep)
	}

	// The cache on disk follows the broker.
	eventually(t, "the cache holds the broker's revision", func() bool {
		st, err := brokerstate.Load(cfg.StateDir)
		return err == nil && st != nil && st.Revision == b.Revision()
	})

	// Status over the unix socket carries the contract keys.
	d.SetHandshake(time.Now().Add(-5 * time.Second))
	eventually(t, "status says the broker is connected", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Broker.Connected
	})
	s, m := getStatus(t, cfg.StatusSocket)
	for _, k := range []string{"cluster", "clusterID", "node", "gateway", "broker", "connections"} {
		if _, ok := m[k]; !ok {
			t.Errorf("status lacks key %q", k)
		}
	}
	bm := m["broker"].(map[string]any)
	for _, k := range []string{"address", "connected", "revision", "lastContact", "cached"} {
		if _, ok := bm[k]; !ok {
			t.Errorf("status.broker lacks key %q", k)
		}
	}
	conns := m["connections"].([]any)
	if len(conns) != 2 {
		t.Fatalf("status has %d connections, want 2: %v", len(conns), conns)
	}
	for _, c := range conns {
		for _, k := range []string{"cluster", "clusterID", "driver", "state", "endpoint", "rxBytes", "txBytes", "lastHandshake"} {
			if _, ok := c.(map[string]any)[k]; !ok {
				t.Errorf("status connection lacks key %q: %v", k, c)
			}
		}
	}
	if s.Cluster != "east" || s.ClusterID != 1 || s.Node != "east-gw1" || !s.Gateway || s.Broker.Revision != b.Revision() || s.Broker.Cached {
		t.Errorf("status = %+v", s)
	}
	if c := s.Connections[1]; c.Cluster != "west" || c.ClusterID != 2 || c.State != "connected" || c.Endpoint != "127.0.0.12:51820" ||
		c.RxBytes != 1234 || c.TxBytes != 5678 || c.LastHandshake == nil || c.Driver != "wireguard" {
		t.Errorf("west status = %+v", c)
	}

	// Metrics read the same status.
	reg := prometheus.NewRegistry()
	reg.MustRegister(&metrics.Collector{Status: r.agent.Status, Probes: r.agent.metrics})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range m.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			found[key] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	for k, want := range map[string]float64{
		"cablemesh_agent_connection_state,cluster=west,driver=wireguard,state=connected": 1,
		"cablemesh_agent_connection_state,cluster=west,driver=wireguard,state=error":     0,
		"cablemesh_agent_connection_rx_bytes_total,cluster=west,driver=wireguard":        1234,
		"cablemesh_agent_connection_tx_bytes_total,cluster=west,driver=wireguard":        5678,
		"cablemesh_agent_broker_connected":                                               1,
	} {
		if got, ok := found[k]; !ok || got != want {
			t.Errorf("metric %s = %v (present %v), want %v", k, got, ok, want)
		}
	}

	// State is read from the device: a connection lost behind the agent's back shows as an
	// error until the next pass restores it.
	d.Remove("west")
	s, _ = getStatus(t, cfg.StatusSocket)
	if c := s.Connections[1]; c.Cluster != "west" || c.State != "error" || c.Message == "" {
		t.Errorf("status of a connection missing on the device = %+v", c)
	}
	eventually(t, "the resync restores west", func() bool { return connectedClusters(d) == "north,west" })

	// A delta that withdraws north's only endpoint disconnects it; nothing else changes.
	d.Calls()
	b.DeleteEndpoint("north", "n1")
	eventually(t, "north disconnected", func() bool { return connectedClusters(d) == "west" })
	if calls := d.Calls(); len(calls) != 1 || calls[0].Op != "disconnect" || calls[0].Cluster != "north" {
		t.Errorf("calls after the delta = %v, want only disconnect north", calls)
	}

	// An endpoint key change reconnects with the new key.
	b.UpsertEndpoint(remoteEndpoint("west", "w1", "127.0.0.12", "TkVXLWtleQ=="))
	eventually(t, "west reconnected with the new key", func() bool {
		w, _ := d.Has("west")
		return w.Attributes["publicKey"] == "TkVXLWtleQ=="
	})

	// The broker goes away: the agent keeps its connections and says it is disconnected.
	b.Stop()
	eventually(t, "status says the broker is disconnected", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return !s.Broker.Connected && s.Broker.Error != ""
	})
	time.Sleep(1500 * time.Millisecond) // more than one resync interval
	if got := connectedClusters(d); got != "west" {
		t.Fatalf("with the broker down the connections became %q", got)
	}
	for _, c := range d.Calls() {
		if c.Op != "connect" {
			t.Errorf("with the broker down the agent called %v", c)
		}
	}

	// Restart the agent while the broker is down, with a fresh device (the userspace device
	// dies with the process): it reconnects from its cache.
	r.stop()
	if _, err := os.Stat(cfg.StatusSocket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("status socket left behind after stop: %v", err)
	}
	d2 := fakedriver.New()
	r2 := startAgent(t, cfg, d2, nil)
	select {
	case <-r2.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("restarted agent not ready")
	}
	if got := connectedClusters(d2); got != "west" {
		t.Fatalf("restarted agent reconnected %q from its cache, want west", got)
	}
	s, _ = getStatus(t, cfg.StatusSocket)
	if !s.Broker.Cached || s.Broker.Connected || s.Broker.Revision == 0 {
		t.Errorf("restarted agent's broker status = %+v", s.Broker)
	}
	joins, _, _ := b.Counts()
	if joins != 1 {
		t.Errorf("joins = %d: the restarted agent should reuse its certificate", joins)
	}

	// The broker comes back on the same address with a new cluster: the agent resyncs,
	// re-registers and connects it without touching west.
	if err := b.Start(b.Addr()); err != nil {
		t.Fatal(err)
	}
	d2.Calls()
	b.UpsertCluster(&apiv1.Cluster{Name: "south", Id: 4, PodCidrs: []string{"10.4.0.0/16"}})
	b.UpsertEndpoint(remoteEndpoint("south", "s1", "127.0.0.14", "U09VVEgta2V5"))
	eventually(t, "south connected after the broker returns", func() bool { return connectedClusters(d2) == "south,west" })
	for _, c := range d2.Calls() {
		if c.Cluster == "west" {
			t.Errorf("the resync touched west: %v", c)
		}
	}
	eventually(t, "status resynced", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Broker.Connected && !s.Broker.Cached && s.Broker.Revision == b.Revision()
	})
}

func TestAgentWithARefusedTokenExitsAndCreatesNothing(t *testing.T) {
	b := newBroker(t)
	cfg := testConfig(t, b, true)
	if err := os.WriteFile(cfg.JoinTokenFile, []byte(b.Token("east", -time.Minute)), 0o600); err != nil {
		t.Fatal(err)
	}
	r := startAgent(t, cfg, fakedriver.New(), nil)
	var err error
	select {
	case err = <-r.done:
		r.done <- err // for the cleanup's stop()
	case <-time.After(10 * time.Second):
		t.Fatal("agent with an expired token kept running")
	}
	if err == nil || !strings.Contains(err.Error(), "join token has expired") {
		t.Fatalf("Run = %v, want the broker's words about the expired token", err)
	}
	if _, serr := os.Stat(cfg.StateDir); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("state dir created: %v", serr)
	}
	if _, serr := os.Stat(cfg.StatusSocket); !errors.Is(serr, os.ErrNotExist) {
		t.Errorf("status socket created: %v", serr)
	}
}

func TestNonGatewayRoutesViaItsGateway(t *testing.T) {
	b := newBroker(t)
	b.UpsertEndpoint(remoteEndpoint("east", "east-gw1", "127.0.0.11", "RUFTVC1rZXk="))
	cfg := testConfig(t, b, false)
	var mu sync.Mutex
	var last []routes.Route
	d := fakedriver.New()
	startAgent(t, cfg, d, func(r []routes.Route) error {
		mu.Lock()
		defer mu.Unlock()
		last = r
		return nil
	})
	gw := netip.MustParseAddr("127.0.0.11")
	eventually(t, "routes to north and west via the gateway", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Equal(last, []routes.Route{
			{Dst: netip.MustParsePrefix("10.2.0.0/16"), Gw: gw},
			{Dst: netip.MustParsePrefix("10.3.0.0/16"), Gw: gw},
			{Dst: netip.MustParsePrefix("10.96.2.0/24"), Gw: gw},
		})
	})
	if calls := d.Calls(); len(calls) != 0 {
		t.Errorf("a non-gateway node used the cable driver: %v", calls)
	}
	if _, _, _ = b.Counts(); b.Endpoint("east", "east-node2") != nil {
		t.Error("a non-gateway node registered an endpoint")
	}
}

func TestHealthCheckIPIsAnAddressInsidePodCIDRs(t *testing.T) {
	pods := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("10.1.2.3")}
	if got := cables.HealthCheckIP(pods, addrs); got != netip.MustParseAddr("10.1.2.3") {
		t.Errorf("healthCheckIP = %v", got)
	}
	if got := cables.HealthCheckIP(pods, addrs[:1]); got.IsValid() {
		t.Errorf("healthCheckIP without a pod address = %v", got)
	}
}

func TestAgentWaitsForABrokerThatIsNotUpYet(t *testing.T) {
	b := newBroker(t)
	cfg := testConfig(t, b, true)
	b.Stop()
	d := fakedriver.New()
	r := startAgent(t, cfg, d, nil)
	time.Sleep(300 * time.Millisecond)
	if _, err := os.Stat(cfg.StateDir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("state dir created before the join: %v", err)
	}
	if err := b.Start(b.Addr()); err != nil {
		t.Fatal(err)
	}
	eventually(t, "joined and connected once the broker is up", func() bool { return connectedClusters(d) == "north,west" })
	select {
	case err := <-r.done:
		t.Fatalf("agent stopped: %v", err)
	default:
	}
}

// wgKey is what a wireguard node publishes: its public key.
func wgKey(key string) map[string]*apiv1.CableAttributes {
	return map[string]*apiv1.CableAttributes{"wireguard": {Values: map[string]string{"publicKey": key}}}
}
