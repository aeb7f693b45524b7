package agent

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
)

func TestHealthTargets(t *testing.T) {
	pods := []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd01::/64")}
	addrs := []netip.Addr{netip.MustParseAddr("127.0.0.1"), netip.MustParseAddr("172.31.0.11"), netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("fd01::1")}
	remote := func(cluster, node string) cable.RemoteEndpoint {
		return cable.RemoteEndpoint{Cluster: cluster, Node: node}
	}
	withHC := func(cluster, node, hc string) *apiv1.Endpoint {
		return &apiv1.Endpoint{Cluster: cluster, Node: node, HealthCheckIp: hc}
	}
	tests := []struct {
		name        string
		endpoints   []*apiv1.Endpoint
		desired     []cable.RemoteEndpoint
		addrs       []netip.Addr
		wantTargets []health.Target
		wantReasons map[string]string
	}{
		{name: "a remote with a health-check IP is probed from our pod address",
			endpoints:   []*apiv1.Endpoint{withHC("west", "w1", "10.2.0.1")},
			desired:     []cable.RemoteEndpoint{remote("west", "w1")},
			addrs:       addrs,
			wantTargets: []health.Target{{Cluster: "west", Node: "w1", Source: netip.MustParseAddr("10.1.0.1"), Destination: netip.MustParseAddr("10.2.0.1")}},
			wantReasons: map[string]string{}},
		{name: "an IPv6 health-check IP is probed from our IPv6 pod address",
			endpoints:   []*apiv1.Endpoint{withHC("west", "w1", "fd02::1")},
			desired:     []cable.RemoteEndpoint{remote("west", "w1")},
			addrs:       addrs,
			wantTargets: []health.Target{{Cluster: "west", Node: "w1", Source: netip.MustParseAddr("fd01::1"), Destination: netip.MustParseAddr("fd02::1")}},
			wantReasons: map[string]string{}},
		{name: "a remote without a health-check IP is not probed, and the reason says so",
			endpoints:   []*apiv1.Endpoint{withHC("west", "w1", "")},
			desired:     []cable.RemoteEndpoint{remote("west", "w1")},
			addrs:       addrs,
			wantReasons: map[string]string{"west": "remote endpoint west/w1 publishes no health_check_ip"}},
		{name: "a garbled health-check IP is not probed",
			endpoints:   []*apiv1.Endpoint{withHC("west", "w1", "ten.two")},
			desired:     []cable.RemoteEndpoint{remote("west", "w1")},
			addrs:       addrs,
			wantReasons: map[string]string{"west": `remote endpoint west/w1: health_check_ip "ten.two" is not an IP address`}},
		{name: "a node without an address in its pod CIDRs probes nothing",
			endpoints:   []*apiv1.Endpoint{withHC("west", "w1", "10.2.0.1")},
			desired:     []cable.RemoteEndpoint{remote("west", "w1")},
			addrs:       addrs[:2],
			wantReasons: map[string]string{"west": "this node has no IPv4 address inside its pod CIDRs to probe 10.2.0.1 from"}},
		{name: "the endpoint of the chosen node is used, not another node of the cluster",
			endpoints:   []*apiv1.Endpoint{withHC("west", "w0", "10.2.0.9"), withHC("west", "w1", "10.2.0.1")},
			desired:     []cable.RemoteEndpoint{remote("west", "w1")},
			addrs:       addrs,
			wantTargets: []health.Target{{Cluster: "west", Node: "w1", Source: netip.MustParseAddr("10.1.0.1"), Destination: netip.MustParseAddr("10.2.0.1")}},
			wantReasons: map[string]string{}},
		{name: "a gateway-mode pair is probed between the two mesh addresses, whatever the pod CIDRs",
			endpoints: []*apiv1.Endpoint{withHC("west", "w1", "10.40.0.1")},
			desired: []cable.RemoteEndpoint{{Cluster: "west", Node: "w1",
				Subnets: []netip.Prefix{netip.MustParsePrefix("242.0.0.2/32")}, LocalSubnets: []netip.Prefix{netip.MustParsePrefix("242.0.0.1/32")}}},
			addrs:       addrs[:2],
			wantTargets: []health.Target{{Cluster: "west", Node: "w1", Source: netip.MustParseAddr("242.0.0.1"), Destination: netip.MustParseAddr("242.0.0.2")}},
			wantReasons: map[string]string{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := brokerstate.New()
			for _, e := range tt.endpoints {
				st.Endpoints[e.GetCluster()+"/"+e.GetNode()] = e
			}
			got, reasons := healthTargets(st, tt.desired, pods, tt.addrs)
			if len(got) != len(tt.wantTargets) {
				t.Fatalf("targets = %v, want %v", got, tt.wantTargets)
			}
			for i := range got {
				if got[i] != tt.wantTargets[i] {
					t.Errorf("target %d = %v, want %v", i, got[i], tt.wantTargets[i])
				}
			}
			if len(reasons) != len(tt.wantReasons) {
				t.Errorf("reasons = %v, want %v", reasons, tt.wantReasons)
			}
			for k, v := range tt.wantReasons {
				if reasons[k] != v {
					t.Errorf("reason for %s = %q, want %q", k, reasons[k], v)
				}
			}
		})
	}
}

func TestApplyHealthMergesDeviceAndProbeState(t *testing.T) {
	settings := health.Settings{Period: 3 * time.Second, Timeout: 2 * time.Second, FailureThreshold: 3, Window: 128}
	tgt := health.Target{Cluster: "west", Node: "w1", Source: netip.MustParseAddr("10.1.0.1"), Destination: netip.MustParseAddr("10.2.0.1")}
	answering := health.Result{Target: tgt, Sent: 10, Failed: 1, HasRTT: true, LastError: "timeout after 2s",
		RTT: health.Summary{Samples: 9, Last: 400 * time.Microsecond, Min: 200 * time.Microsecond, Avg: 500 * time.Microsecond,
			Max: 1100 * time.Microsecond, P50: 450 * time.Microsecond, P95: time.Millisecond, P99: 1100 * time.Microsecond}}
	failing := answering
	failing.ConsecutiveFailures, failing.Failed = 3, 4
	movedAway := answering
	movedAway.Target.Node = "w0"
	tests := []struct {
		name        string
		device      statusapi.Connection
		probe       *health.Result
		reason      string
		wantState   string
		wantMsg     string
		wantRTT     bool
		wantHealthy bool
		wantProbing bool
		wantHealth  bool
	}{
		{name: "a connected device with answering probes is connected, with RTT",
			device: statusapi.Connection{Cluster: "west", Node: "w1", State: "connected"}, probe: &answering,
			wantState: "connected", wantRTT: true, wantHealthy: true, wantProbing: true, wantHealth: true},
		{name: "a connected device whose probes failed three times is in error",
			device: statusapi.Connection{Cluster: "west", Node: "w1", State: "connected"}, probe: &failing,
			wantState: "error", wantMsg: "health probe: 3 consecutive failures (last: timeout after 2s)", wantRTT: true, wantProbing: true, wantHealth: true},
		{name: "a device in error keeps its message over failing probes",
			device: statusapi.Connection{Cluster: "west", Node: "w1", State: "error", Message: "connection is wanted but missing on the device"}, probe: &failing,
			wantState: "error", wantMsg: "connection is wanted but missing on the device", wantRTT: true, wantProbing: true, wantHealth: true},
		{name: "a connection that is not probed keeps the device's state and says why",
			device:    statusapi.Connection{Cluster: "west", Node: "w1", State: "connecting", Message: "waiting for first handshake"},
			reason:    "remote endpoint west/w1 publishes no health_check_ip",
			wantState: "connecting", wantMsg: "waiting for first handshake", wantHealthy: true, wantHealth: true},
		{name: "a prober still aiming at the cluster's previous node does not count",
			device: statusapi.Connection{Cluster: "west", Node: "w1", State: "connected"}, probe: &movedAway,
			wantState: "connected"},
		{name: "a problem row (no usable endpoint) gets no health block",
			device:    statusapi.Connection{Cluster: "west", State: "error", Message: "no usable wireguard endpoint"},
			wantState: "error", wantMsg: "no usable wireguard endpoint"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			probe := func(string) (health.Result, bool) {
				if tt.probe == nil {
					return health.Result{}, false
				}
				return *tt.probe, true
			}
			reasons := map[string]string{}
			if tt.reason != "" {
				reasons["west"] = tt.reason
			}
			got := applyHealth([]statusapi.Connection{tt.device}, probe, reasons, settings)[0]
			if got.State != tt.wantState || got.Message != tt.wantMsg {
				t.Errorf("state %s %q, want %s %q", got.State, got.Message, tt.wantState, tt.wantMsg)
			}
			if (got.RTT != nil) != tt.wantRTT {
				t.Errorf("RTT = %+v, want present %v", got.RTT, tt.wantRTT)
			}
			if tt.wantRTT && *got.RTT != (statusapi.RTT{LastMs: 0.4, MinMs: 0.2, AvgMs: 0.5, MaxMs: 1.1, P50Ms: 0.45, P95Ms: 1, P99Ms: 1.1}) {
				t.Errorf("RTT = %+v", *got.RTT)
			}
			if (got.Health != nil) != tt.wantHealth {
				t.Fatalf("health = %+v, want present %v", got.Health, tt.wantHealth)
			}
			if h := got.Health; h != nil {
				if h.Healthy != tt.wantHealthy || h.Probing != tt.wantProbing || (tt.reason != "" && h.Reason != tt.reason) {
					t.Errorf("health = %+v", h)
				}
				if h.Probing && (h.Source != "10.1.0.1" || h.Target != "10.2.0.1" || h.ProbesSent != 10 || h.FailureThreshold != 3 || h.PeriodMs != 3000) {
					t.Errorf("health details = %+v", h)
				}
			}
		})
	}
}

// switchPinger is a fake network: every target answers with a fixed RTT until told not to.
type switchPinger struct {
	mu   sync.Mutex
	down bool
}

func (s *switchPinger) set(down bool) { s.mu.Lock(); s.down = down; s.mu.Unlock() }

func (s *switchPinger) open(health.Target) (health.Pinger, error) { return s, nil }

func (s *switchPinger) Ping(_ context.Context, timeout time.Duration) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return 0, &health.TimeoutError{After: timeout}
	}
	return 700 * time.Microsecond, nil
}

func (s *switchPinger) Close() error { return nil }

func TestGatewayProbesRemoteGatewaysAndReportsRTT(t *testing.T) {
	b := newBroker(t)
	west := remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5")
	west.HealthCheckIp = "10.2.0.1"
	b.UpsertEndpoint(west) // north keeps publishing no health-check address
	cfg := testConfig(t, b, true)
	cfg.HealthCheck.Period = 100 * time.Millisecond
	cfg.HealthCheck.Timeout = 20 * time.Millisecond
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	net := &switchPinger{}
	d := fakedriver.New()
	d.SetHandshake(time.Now())
	r := startAgentWith(t, cfg, d, func(o *Options) {
		o.NewPinger = net.open
		o.InterfaceAddrs = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("10.1.0.1")} }
	})
	select {
	case <-r.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready")
	}

	eventually(t, "west has RTT figures in status", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return len(s.Connections) == 2 && s.Connections[1].RTT != nil
	})
	s, m := getStatus(t, cfg.StatusSocket)
	w, n := s.Connections[1], s.Connections[0]
	if w.Cluster != "west" || w.State != "connected" || w.RTT.LastMs != 0.7 || w.RTT.P99Ms != 0.7 || w.Health == nil || !w.Health.Healthy ||
		w.Health.Source != "10.1.0.1" || w.Health.Target != "10.2.0.1" || w.Health.ProbesSent == 0 {
		t.Errorf("west = %+v, health %+v", w, w.Health)
	}
	rtt := m["connections"].([]any)[1].(map[string]any)["rtt"].(map[string]any)
	for _, k := range []string{"lastMs", "minMs", "avgMs", "maxMs", "p50Ms", "p95Ms", "p99Ms"} {
		if _, ok := rtt[k]; !ok {
			t.Errorf("rtt lacks %q: %v", k, rtt)
		}
	}
	if n.Cluster != "north" || n.RTT != nil || n.Health == nil || n.Health.Probing || !strings.Contains(n.Health.Reason, "no health_check_ip") || n.State != "connected" {
		t.Errorf("north (no health-check IP) = %+v, health %+v", n, n.Health)
	}

	// The remote gateway stops answering: error after three failures, though the device is fine.
	net.set(true)
	eventually(t, "west in error from its probes", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Connections[1].State == "error"
	})
	s, _ = getStatus(t, cfg.StatusSocket)
	if w := s.Connections[1]; !strings.HasPrefix(w.Message, "health probe: ") || !strings.HasSuffix(w.Message, " consecutive failures (last: timeout after 20ms)") {
		t.Errorf("west message = %q", w.Message)
	}
	metrics := gather(t, r.agent)
	if metrics["cablemesh_agent_probe_failures_total,cluster=west"] < 3 || metrics["cablemesh_agent_connection_state,cluster=west,driver=wireguard,state=error"] != 1 ||
		metrics["cablemesh_agent_connection_healthy,cluster=west,driver=wireguard"] != 0 {
		t.Errorf("metrics while failing: %v", metrics)
	}
	if metrics["cablemesh_agent_connection_rtt_seconds_count,cluster=west"] == 0 || metrics["cablemesh_agent_probes_total,cluster=west"] == 0 {
		t.Errorf("rtt histogram or probe counter missing: %v", metrics)
	}
	if _, ok := metrics["cablemesh_agent_probes_total,cluster=north"]; ok {
		t.Error("north is not probed but has a probe counter")
	}

	// It answers again: connected.
	net.set(false)
	eventually(t, "west recovers", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Connections[1].State == "connected" && s.Connections[1].Health.Healthy
	})
}

// gather scrapes the agent's collector into name,label=value... -> value (histograms as _count).
func gather(t *testing.T, a *Agent) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(&collector{a: a})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if h := m.GetHistogram(); h != nil {
				name += "_count"
				v = float64(h.GetSampleCount())
			}
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			found[name] = v
		}
	}
	return found
}
