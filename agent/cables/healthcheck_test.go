package cables

import (
	"net/netip"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/health"
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
