package plan

import (
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// failoverState is east with gateways e1 and e2, west with gateway w1, all on wireguard.
func failoverState() *brokerstate.State {
	s := brokerstate.New()
	s.Revision = 3
	s.Clusters["east"] = &apiv1.Cluster{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}}
	s.Clusters["west"] = &apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}}
	for _, e := range []struct{ c, n, ip string }{{"east", "e1", "10.0.0.21"}, {"east", "e2", "10.0.0.22"}, {"west", "w1", "10.0.0.31"}} {
		s.Endpoints[brokerstate.EndpointKey(e.c, e.n)] = &apiv1.Endpoint{Cluster: e.c, Node: e.n, PrivateIp: e.ip, Drivers: []string{"wireguard"}, LeaseSeconds: 30,
			CableAttributes: map[string]*apiv1.CableAttributes{"wireguard": {Values: map[string]string{"publicKey": "K" + e.n}}},
			CablePorts:      map[string]uint32{"wireguard": 51820}}
	}
	return s
}

func TestAvoidedGatewaysHandThePairToTheNextOne(t *testing.T) {
	tests := []struct {
		name     string
		avoid    []string
		wantNode string
		wantAddr string
	}{
		{"with nothing avoided the pair goes to the smallest node", nil, "e1", "10.0.0.21"},
		{"an avoided gateway hands the pair to the next one", []string{"east/e1"}, "e2", "10.0.0.22"},
		{"avoiding a gateway that carries nothing changes nothing", []string{"east/e2"}, "e1", "10.0.0.21"},
		{"with every gateway avoided the first one stays", []string{"east/e1", "east/e2"}, "e1", "10.0.0.21"},
		{"an avoided gateway the broker no longer lists is ignored", []string{"east/e0"}, "e1", "10.0.0.21"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := failoverState()
			k := Key{State: st, Revision: st.Revision}
			in := Inputs{Cluster: "west", Node: "w1", Drivers: reconcile.Drivers{"wireguard": nil}, Avoid: tt.avoid}
			p := New(slog.New(slog.DiscardHandler)).Get(k, in, func() (Key, *brokerstate.State) { return k, st.Clone() })
			if len(p.Wants) != 1 {
				t.Fatalf("wants %+v, want one connection to east (problems %+v, decisions %+v)", p.Wants, p.Problems, p.Decisions)
			}
			w := p.Wants[0]
			if w.Remote.Cluster != "east" || w.Remote.Node != tt.wantNode || w.Remote.Address != netip.MustParseAddr(tt.wantAddr) {
				t.Errorf("connection to %s/%s at %s, want east/%s at %s", w.Remote.Cluster, w.Remote.Node, w.Remote.Address, tt.wantNode, tt.wantAddr)
			}
			if len(p.Problems) != 0 {
				t.Errorf("problems %+v, want none: avoiding changes the carrier, never whether the pair connects", p.Problems)
			}
			if len(p.State.Endpoints) != 3 {
				t.Errorf("the plan's state lists %d endpoints, want all 3: avoided gateways stay in the state the other consumers read", len(p.State.Endpoints))
			}
		})
	}
}

func TestAChangedAvoidSetMakesANewPlan(t *testing.T) {
	st := failoverState()
	k := Key{State: st, Revision: st.Revision}
	snap := func() (Key, *brokerstate.State) { return k, st.Clone() }
	p := New(slog.New(slog.DiscardHandler))
	in := Inputs{Cluster: "west", Node: "w1", Drivers: reconcile.Drivers{"wireguard": nil}}
	first := p.Get(k, in, snap)
	in.Avoid = []string{"east/e1"}
	second := p.Get(k, in, snap)
	if second == first || second.Wants[0].Remote.Node != "e2" {
		t.Fatalf("avoiding e1 kept the plan (same %v) or its carrier %s", second == first, second.Wants[0].Remote.Node)
	}
	if again := p.Get(k, Inputs{Cluster: "west", Node: "w1", Drivers: reconcile.Drivers{"wireguard": nil}, Avoid: []string{"east/e1"}}, snap); again != second {
		t.Error("an equal avoid set made another plan")
	}
}
