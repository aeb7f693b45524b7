package agent

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/internal/testbroker"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/internal/syncbuf"
	"github.com/cablemesh/cablemesh/policy"
)

func policyRecord(t *testing.T, p policy.ClusterConnectionPolicy, isDefault bool) *apiv1.Policy {
	t.Helper()
	p.APIVersion, p.Kind = policy.APIVersion, policy.Kind
	if err := p.Validate(); err != nil {
		t.Fatalf("test policy %s: %v", p.Metadata.Name, err)
	}
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return &apiv1.Policy{Name: p.Metadata.Name, Json: b, IsDefault: isDefault}
}

// eastWestOn puts the east-west pair on driver (priority 10); north stays on the default.
func eastWestOn(driver string) policy.ClusterConnectionPolicy {
	ten := 10
	return policy.ClusterConnectionPolicy{Metadata: policy.ObjectMeta{Name: "east-west-" + driver}, Spec: policy.Spec{
		LeftClusterSelector:  &policy.Selector{MatchLabels: map[string]string{"site": "east"}},
		RightClusterSelector: &policy.Selector{MatchLabels: map[string]string{"site": "west"}},
		Priority:             &ten,
		CableDriver:          &policy.CableDriver{Name: driver, Options: map[string]string{"k": "v"}},
	}}
}

func isolate(cluster string) policy.ClusterConnectionPolicy {
	twenty := 20
	return policy.ClusterConnectionPolicy{Metadata: policy.ObjectMeta{Name: "isolate-" + cluster}, Spec: policy.Spec{
		LeftClusterSelector:  &policy.Selector{MatchLabels: map[string]string{"site": cluster}},
		RightClusterSelector: &policy.Selector{},
		Priority:             &twenty,
		ConnectionPolicy:     policy.NoConnect,
	}}
}

// multiBroker is newBroker with site labels, remote gateways running wireguard and vxlan, and the
// mesh default policy (full mesh over wireguard).
func multiBroker(t *testing.T) *testbroker.Broker {
	t.Helper()
	b := newBroker(t)
	for _, c := range []*apiv1.Cluster{
		{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}, Labels: map[string]string{"site": "east"}},
		{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}, ServiceCidrs: []string{"10.96.2.0/24"}, Labels: map[string]string{"site": "west"}},
		{Name: "north", Id: 3, PodCidrs: []string{"10.3.0.0/16"}, Labels: map[string]string{"site": "north"}},
	} {
		b.UpsertCluster(c)
	}
	for _, e := range []*apiv1.Endpoint{
		remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5"),
		remoteEndpoint("north", "n1", "127.0.0.13", "S05PUlRILWtleQ=="),
	} {
		e.Drivers = []string{"wireguard", "vxlan"}
		e.CablePorts["vxlan"] = 4789
		b.UpsertEndpoint(e)
	}
	b.UpsertPolicy(policyRecord(t, policy.DefaultPolicy("wireguard"), true))
	return b
}

type fleet map[string]*fakedriver.Driver

func (f fleet) factory(name string, _ cable.LocalNode, _ cable.Settings) (cable.Driver, error) {
	d, ok := f[name]
	if !ok {
		return nil, errors.New("no test driver " + name)
	}
	return d, nil
}

func newFleet(names ...string) fleet {
	f := fleet{}
	for i, n := range names {
		f[n] = fakedriver.NewNamed(n, uint16(51820+i))
	}
	return f
}

func startFleet(t *testing.T, cfg *config.Config, f fleet, logs *syncbuf.Buffer, mod func(*Options)) *running {
	t.Helper()
	cfg.CableDrivers = slices.Sorted(func(yield func(string) bool) {
		for n := range f {
			if !yield(n) {
				return
			}
		}
	})
	r := startAgentWith(t, cfg, f["wireguard"], func(o *Options) {
		o.Host.NewDriver = f.factory
		if logs != nil {
			o.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		}
		if mod != nil {
			mod(o)
		}
	})
	select {
	case <-r.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready")
	}
	return r
}

func connOf(s statusapi.Status, cluster string) (statusapi.Connection, bool) {
	for _, c := range s.Connections {
		if c.Cluster == cluster {
			return c, true
		}
	}
	return statusapi.Connection{}, false
}

func ops(calls []fakedriver.Call) []string {
	var out []string
	for _, c := range calls {
		out = append(out, c.Op+" "+c.Cluster)
	}
	return out
}

func TestAPolicyChangeMovesAPairBetweenDrivers(t *testing.T) {
	b := multiBroker(t)
	cfg := testConfig(t, b, true)
	f := newFleet("wireguard", "vxlan")
	logs := &syncbuf.Buffer{}
	startFleet(t, cfg, f, logs, nil)

	eventually(t, "north and west on wireguard", func() bool {
		return connectedClusters(f["wireguard"]) == "north,west"
	})
	// The endpoint publishes both drivers and their ports.
	eventually(t, "endpoint registered", func() bool { return b.Endpoint("east", "east-gw1") != nil })
	ep := b.Endpoint("east", "east-gw1")
	if !slices.Equal(ep.GetDrivers(), []string{"vxlan", "wireguard"}) || ep.GetCablePorts()["vxlan"] != 51821 ||
		ep.GetCablePorts()["wireguard"] != 51820 || ep.Attributes("wireguard")["publicKey"] != f["wireguard"].Key {
		t.Errorf("endpoint = %v", ep)
	}
	// The pair's PSK reaches the driver, and the cache that holds it is private.
	west, _ := f["wireguard"].Has("west")
	psk := b.PairPSK("east", "west")
	if !bytes.Equal(west.PreSharedKey, psk) {
		t.Errorf("west PSK = %x, want %x", west.PreSharedKey, psk)
	}
	eventually(t, "cache written", func() bool {
		st, err := brokerstate.Load(cfg.StateDir)
		return err == nil && st != nil && len(st.Policies) == 1
	})
	if fi, err := os.Stat(filepath.Join(cfg.StateDir, brokerstate.FileName)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("cache file mode: %v %v", fi, err)
	}
	f["wireguard"].Calls()
	f["vxlan"].Calls()

	// The policy moves east-west to vxlan; north is not touched.
	b.UpsertPolicy(policyRecord(t, eastWestOn("vxlan"), false))
	polRev := b.Revision()
	eventually(t, "west on vxlan", func() bool { _, ok := f["vxlan"].Has("west"); return ok })
	eventually(t, "west off wireguard", func() bool { return connectedClusters(f["wireguard"]) == "north" })
	wgCalls, vxCalls := f["wireguard"].Calls(), f["vxlan"].Calls()
	if got := ops(wgCalls); !slices.Equal(got, []string{"disconnect west"}) {
		t.Errorf("wireguard calls = %v, want only the disconnect of west (north unchanged)", got)
	}
	if got := ops(vxCalls); !slices.Equal(got, []string{"connect west"}) {
		t.Fatalf("vxlan calls = %v", got)
	}
	if vxCalls[0].At.Before(wgCalls[0].At) {
		t.Error("vxlan connected west before wireguard let it go")
	}
	if vxCalls[0].Options["k"] != "v" || !bytes.Equal(vxCalls[0].Remote.PreSharedKey, psk) || vxCalls[0].Remote.Port != 4789 {
		t.Errorf("vxlan connect = %+v options %v", vxCalls[0].Remote, vxCalls[0].Options)
	}
	eventually(t, "pair moved logged", func() bool {
		return strings.Contains(logs.String(), `msg="pair moved"`) && strings.Contains(logs.String(), `cluster=west from=wireguard to=vxlan`)
	})

	// Status: driver and policy per pair, the revision it was applied at, and the decisions.
	eventually(t, "status shows west on vxlan at the policy's revision", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		c, ok := connOf(s, "west")
		return ok && c.Driver == "vxlan" && c.Policy == "east-west-vxlan" && c.AppliedRevision >= polRev && c.State == "connected"
	})
	s, m := getStatus(t, cfg.StatusSocket)
	if n, _ := connOf(s, "north"); n.Driver != "wireguard" || n.Policy != "default" {
		t.Errorf("north = %+v", n)
	}
	if len(s.Decisions) != 2 || s.Decisions[1] != (statusapi.Decision{Cluster: "west", Connect: true, Driver: "vxlan", Policy: "east-west-vxlan", Mode: "direct"}) {
		t.Errorf("decisions = %+v", s.Decisions)
	}
	if _, ok := m["decisions"]; !ok {
		t.Error("status JSON has no decisions key")
	}

	// North becomes no-connect: its tunnel goes, it leaves connections, its decision stays.
	b.UpsertPolicy(policyRecord(t, isolate("north"), false))
	eventually(t, "north disconnected", func() bool { return connectedClusters(f["wireguard"]) == "" })
	eventually(t, "north only in decisions", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		_, listed := connOf(s, "north")
		for _, d := range s.Decisions {
			if d.Cluster == "north" && !d.Connect && d.Policy == "isolate-north" {
				return !listed
			}
		}
		return false
	})
	if got := ops(f["vxlan"].Calls()); len(got) != 0 {
		t.Errorf("vxlan touched by an unrelated change: %v", got)
	}

	// Back to the default: west returns to wireguard.
	b.DeletePolicy("east-west-vxlan")
	eventually(t, "west back on wireguard", func() bool {
		_, onVX := f["vxlan"].Has("west")
		return !onVX && connectedClusters(f["wireguard"]) == "west"
	})

	// The PSK never reaches the logs.
	out := logs.String()
	for _, enc := range []string{hex.EncodeToString(psk), base64.StdEncoding.EncodeToString(psk)} {
		if strings.Contains(out, enc) {
			t.Fatal("the pair PSK appears in the logs")
		}
	}
}

func TestARestartRemovesAStaleConnectionOnAnotherDriver(t *testing.T) {
	b := multiBroker(t)
	cfg := testConfig(t, b, true)
	f := newFleet("wireguard", "vxlan")
	// A previous run had west on vxlan; the policies now say wireguard.
	f["vxlan"].Put(cable.RemoteEndpoint{Cluster: "west", Node: "w1", Address: netip.MustParseAddr("127.0.0.12"), Port: 4789})
	startFleet(t, cfg, f, nil, nil)
	eventually(t, "west moved to wireguard and gone from vxlan", func() bool {
		_, onVX := f["vxlan"].Has("west")
		return !onVX && connectedClusters(f["wireguard"]) == "north,west"
	})
	vx := ops(f["vxlan"].Calls())
	if !slices.Contains(vx, "disconnect west") || slices.Contains(vx, "connect west") {
		t.Errorf("vxlan calls = %v", vx)
	}
}

func TestADriverThatCannotStartIsNotPublishedAndItsPairsSayWhy(t *testing.T) {
	b := multiBroker(t)
	b.UpsertPolicy(policyRecord(t, eastWestOn("ipsec"), false))
	cfg := testConfig(t, b, true)
	f := newFleet("wireguard", "ipsec")
	f["ipsec"].InitErr = errors.New("charon: no such file")
	logs := &syncbuf.Buffer{}
	startFleet(t, cfg, f, logs, nil)
	eventually(t, "endpoint registered", func() bool { return b.Endpoint("east", "east-gw1") != nil })
	if ep := b.Endpoint("east", "east-gw1"); !slices.Equal(ep.GetDrivers(), []string{"wireguard"}) || ep.GetCablePorts()["ipsec"] != 0 {
		t.Errorf("endpoint claims a driver that did not start: %v", ep)
	}
	eventually(t, "west in error naming the driver", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		c, ok := connOf(s, "west")
		return ok && c.State == "error" && c.Driver == "ipsec" && c.Message == "driver ipsec unavailable on this node: charon: no such file"
	})
	s, _ := getStatus(t, cfg.StatusSocket)
	if len(s.Drivers) != 2 || s.Drivers[0].Name != "ipsec" || s.Drivers[0].Running || s.Drivers[1].Name != "wireguard" || !s.Drivers[1].Running {
		t.Errorf("drivers = %+v", s.Drivers)
	}
	if !strings.Contains(logs.String(), "CABLE DRIVER UNAVAILABLE") {
		t.Error("the failed driver was not logged loudly")
	}
	if connectedClusters(f["wireguard"]) != "north" {
		t.Errorf("wireguard holds %s, want north only", connectedClusters(f["wireguard"]))
	}
}

// A driver whose Init failed at start is retried; once it runs, the endpoint is registered again
// with it and its pairs connect.
func TestADriverThatInitialisesOnARetryIsPublishedAndConnects(t *testing.T) {
	b := multiBroker(t)
	b.UpsertPolicy(policyRecord(t, eastWestOn("vxlan"), false))
	cfg := testConfig(t, b, true)
	f := newFleet("wireguard", "vxlan")
	f["vxlan"].SetInitErr(errors.New("link cbl-x exists with type tuntap"))
	logs := &syncbuf.Buffer{}
	startFleet(t, cfg, f, logs, nil)
	defer func() {
		if t.Failed() {
			t.Logf("agent log:\n%s", logs.String())
		}
	}()
	eventually(t, "endpoint registered without vxlan", func() bool {
		ep := b.Endpoint("east", "east-gw1")
		return ep != nil && slices.Equal(ep.GetDrivers(), []string{"wireguard"})
	})
	f["vxlan"].SetInitErr(nil)
	eventually(t, "endpoint registered again with vxlan", func() bool {
		ep := b.Endpoint("east", "east-gw1")
		return ep != nil && slices.Contains(ep.GetDrivers(), "vxlan") && ep.GetCablePorts()["vxlan"] != 0
	})
	eventually(t, "west connected over vxlan", func() bool { return connectedClusters(f["vxlan"]) == "west" })
	if !strings.Contains(logs.String(), "initialisation failed; retrying") {
		t.Error("the retry was not logged")
	}
}

func TestAnUnhealthyConnectionIsReassertedAtMostOncePerInterval(t *testing.T) {
	b := multiBroker(t)
	west := remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5")
	west.HealthCheckIp = "10.2.0.1"
	b.UpsertEndpoint(west)
	cfg := testConfig(t, b, true)
	cfg.HealthCheck.Period = 50 * time.Millisecond
	cfg.HealthCheck.Timeout = 10 * time.Millisecond
	cfg.ResyncInterval = time.Hour // only the health check may trigger passes
	net := &switchPinger{}
	f := newFleet("wireguard")
	startFleet(t, cfg, f, nil, func(o *Options) {
		o.Host.NewPinger = net.open
		o.Host.InterfaceAddrs = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("10.1.0.1")} }
		o.RepairInterval = 600 * time.Millisecond
	})
	eventually(t, "west connected", func() bool { _, ok := f["wireguard"].Has("west"); return ok })
	time.Sleep(100 * time.Millisecond)
	f["wireguard"].Calls()
	time.Sleep(300 * time.Millisecond)
	if got := ops(f["wireguard"].Calls()); slices.Contains(got, "connect west") {
		t.Fatalf("west reconnected while healthy: %v", got)
	}

	// The routes vanish (the device still looks connected) and the probes fail.
	net.set(true)
	eventually(t, "west re-asserted", func() bool {
		return slices.Contains(ops(f["wireguard"].Calls()), "connect west")
	})
	start := time.Now()
	time.Sleep(400 * time.Millisecond)
	n := 0
	for _, c := range f["wireguard"].Calls() {
		if c.Op == "connect" && c.Cluster == "west" {
			n++
		}
	}
	if n != 0 && time.Since(start) < 600*time.Millisecond {
		t.Errorf("west re-asserted %d more times within the repair interval", n)
	}
	eventually(t, "west re-asserted again after the interval", func() bool {
		return slices.Contains(ops(f["wireguard"].Calls()), "connect west")
	})
	// north has no health-check address: never re-asserted.
	if slices.Contains(ops(f["wireguard"].Calls()), "connect north") {
		t.Error("north re-asserted")
	}
}
