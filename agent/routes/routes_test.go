package routes

import (
	"net/netip"
	"reflect"
	"testing"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable/route"
)

func TestDesiredRoutesGoViaTheLocalGateway(t *testing.T) {
	s := brokerstate.New()
	s.Clusters["east"] = &apiv1.Cluster{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}}
	s.Clusters["west"] = &apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}, ServiceCidrs: []string{"10.96.2.0/24"}}
	s.Clusters["north"] = &apiv1.Cluster{Name: "north", Id: 3, PodCidrs: []string{"10.3.0.0/16"}}
	ep := func(c, n, ip string) *apiv1.Endpoint {
		return &apiv1.Endpoint{Cluster: c, Node: n, PrivateIp: ip, CableAttributes: map[string]*apiv1.CableAttributes{"wireguard": {Values: map[string]string{"publicKey": "K"}}}, CablePorts: map[string]uint32{"wireguard": 51820}}
	}
	s.Endpoints["east/e2"] = ep("east", "e2", "10.0.0.22")
	s.Endpoints["east/e1"] = ep("east", "e1", "10.0.0.21")
	s.Endpoints["west/w1"] = ep("west", "w1", "10.0.0.31")
	gw := netip.MustParseAddr("10.0.0.21")
	want := []Route{{netip.MustParsePrefix("10.2.0.0/16"), gw}, {netip.MustParsePrefix("10.96.2.0/24"), gw}}
	if got := Desired(s, "east", nil, reconcile.Guard{}); !reflect.DeepEqual(got, want) {
		t.Errorf("Desired = %v, want %v", got, want)
	}
	delete(s.Endpoints, "east/e1")
	delete(s.Endpoints, "east/e2")
	if got := Desired(s, "east", nil, reconcile.Guard{}); got != nil {
		t.Errorf("without a local gateway Desired = %v, want nothing", got)
	}
}

func TestApplyPlansOnlyTheGatewayRoutes(t *testing.T) {
	gw1, gw2 := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	a, b := netip.MustParsePrefix("10.2.0.0/16"), netip.MustParsePrefix("10.3.0.0/16")
	tests := []struct {
		name              string
		desired, observed []Route
		replace, remove   []Route
	}{
		{"a missing route is added", []Route{{a, gw1}}, nil, []Route{{a, gw1}}, nil},
		{"an unchanged route is left alone", []Route{{a, gw1}}, []Route{{a, gw1}}, nil, nil},
		{"a route via another gateway is replaced", []Route{{a, gw2}}, []Route{{a, gw1}}, []Route{{a, gw2}}, nil},
		{"a route no longer wanted is removed", []Route{{a, gw1}}, []Route{{a, gw1}, {b, gw1}}, nil, []Route{{b, gw1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan := route.PlanRoutes(specs(tt.observed), specs(tt.desired), route.All)
			if !reflect.DeepEqual(plan.Replace, nilIfEmpty(specs(tt.replace))) || !reflect.DeepEqual(plan.Delete, nilIfEmpty(specs(tt.remove))) {
				t.Errorf("plan = %+v; want replace %v, remove %v", plan, tt.replace, tt.remove)
			}
		})
	}
}

func nilIfEmpty(s []route.Spec) []route.Spec {
	if len(s) == 0 {
		return nil
	}
	return s
}
