package routes

import (
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// twoGatewayState is east with gateways e1 and e2 (and a worker's view of it), west with w1.
func twoGatewayState() *brokerstate.State {
	s := brokerstate.New()
	s.Clusters["east"] = &apiv1.Cluster{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}}
	s.Clusters["west"] = &apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}}
	s.Endpoints["east/e1"] = wgEndpoint("east", "e1", "10.0.0.21")
	s.Endpoints["east/e2"] = wgEndpoint("east", "e2", "10.0.0.22")
	s.Endpoints["west/w1"] = wgEndpoint("west", "w1", "10.0.0.31")
	return s
}

func wgEndpoint(c, n, ip string) *apiv1.Endpoint {
	return &apiv1.Endpoint{Cluster: c, Node: n, PrivateIp: ip, Drivers: []string{"wireguard"}, LeaseSeconds: 30,
		CableAttributes: map[string]*apiv1.CableAttributes{"wireguard": {Values: map[string]string{"publicKey": "K"}}},
		CablePorts:      map[string]uint32{"wireguard": 51820}}
}

func down(nodes ...string) Healthy {
	return func(n string) bool {
		for _, d := range nodes {
			if d == n {
				return false
			}
		}
		return true
	}
}

func TestPlanRoutesViaTheFirstHealthyCarrier(t *testing.T) {
	west := netip.MustParsePrefix("10.2.0.0/16")
	e1, e2 := netip.MustParseAddr("10.0.0.21"), netip.MustParseAddr("10.0.0.22")
	tests := []struct {
		name    string
		mutate  func(*brokerstate.State)
		healthy Healthy
		via     netip.Addr
		viaNode string
		reason  bool
	}{
		{"with every gateway healthy the pair goes via the one the remote side connects to", nil, nil, e1, "e1", false},
		{"a carrier that fails its probes is passed over for the next one", nil, down("e1"), e2, "e2", true},
		{"a gateway that fails its probes but is not the carrier changes nothing", nil, down("e2"), e1, "e1", false},
		{"with no carrier answering the first one is kept", nil, down("e1", "e2"), e1, "e1", true},
		{"once the broker withdraws the dead carrier the next one is the carrier", func(s *brokerstate.State) { delete(s.Endpoints, "east/e1") }, down("e1"), e2, "e2", false},
		{"a gateway that does not run the pair's driver is never chosen", func(s *brokerstate.State) {
			s.Endpoints["east/e1"].Drivers = []string{"vxlan"}
			s.Endpoints["east/e1"].CablePorts = map[string]uint32{"vxlan": 4789}
		}, nil, e2, "e2", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := twoGatewayState()
			if tt.mutate != nil {
				tt.mutate(s)
			}
			routes, choices := Plan(s, "east", nil, reconcile.Guard{}, tt.healthy)
			want := []Route{{west, tt.via}}
			if !reflect.DeepEqual(routes, want) {
				t.Errorf("routes = %v, want %v", routes, want)
			}
			if len(choices) != 1 || choices[0].Cluster != "west" || choices[0].Via != tt.viaNode {
				t.Fatalf("choices = %+v, want west via %s", choices, tt.viaNode)
			}
			if (choices[0].Reason != "") != tt.reason {
				t.Errorf("reason = %q, want one: %v", choices[0].Reason, tt.reason)
			}
			if tt.viaNode == "e2" && tt.reason && !strings.Contains(choices[0].Reason, "(its lease: 30s)") {
				t.Errorf("reason %q does not say how long the remote side may keep using e1 (its lease)", choices[0].Reason)
			}
		})
	}
}

func TestCarriersFollowTheRemoteSidesOrder(t *testing.T) {
	s := twoGatewayState()
	s.Endpoints["east/e0"] = wgEndpoint("east", "e0", "10.0.0.20")
	s.Endpoints["east/e0"].CablePorts = nil // publishes no port: the remote side cannot use it
	if got, want := Carriers(s, "east", "west", nil), []string{"e1", "e2"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Carriers = %v, want %v", got, want)
	}
	if got := Carriers(s, "east", "nowhere", nil); got != nil {
		t.Errorf("Carriers for an unknown cluster = %v, want none", got)
	}
	if got := Carriers(nil, "east", "west", nil); got != nil {
		t.Errorf("Carriers of no state = %v, want none", got)
	}
}

func TestPlanMatchesDesiredWhenEveryGatewayIsHealthy(t *testing.T) {
	s := twoGatewayState()
	s.Clusters["west"].ServiceCidrs = []string{"10.96.2.0/24"}
	got, _ := Plan(s, "east", nil, reconcile.Guard{}, nil)
	if want := Desired(s, "east", nil, reconcile.Guard{}); !reflect.DeepEqual(got, want) {
		t.Errorf("Plan = %v, Desired = %v: they must agree while every gateway answers", got, want)
	}
	delete(s.Endpoints, "east/e1")
	delete(s.Endpoints, "east/e2")
	if got, choices := Plan(s, "east", nil, reconcile.Guard{}, nil); got != nil || choices != nil {
		t.Errorf("without a local gateway Plan = %v %v, want nothing", got, choices)
	}
}
