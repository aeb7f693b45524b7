package cables

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/cable"
)

func TestBuildConnectionsShowsWhyAPairIsDownOrTrimmed(t *testing.T) {
	want := func(cluster string, id uint32) reconcile.Want {
		return reconcile.Want{Driver: "wireguard", Policy: "default", Remote: cable.RemoteEndpoint{Cluster: cluster, ClusterID: id, Node: cluster + "-gw",
			Address: netip.MustParseAddr("10.0.0.12"), Port: 51820, Subnets: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}}}
	}
	west, north := want("west", 2), want("north", 3)
	observed := map[string][]cable.ConnectionStatus{"wireguard": {{Cluster: "west", State: cable.StateConnected}, {Cluster: "north", State: cable.StateConnected}}}
	failed := map[string]reconcile.Failure{
		"west": {Want: west, Err: errors.New(`option "mtu": 100000 is out of range`)},
		// A failure of what was wanted before does not judge what is wanted now.
		"north": {Want: want("north", 9), Err: errors.New("stale")},
	}
	problems := []reconcile.Problem{
		{Cluster: "north", Driver: "wireguard", Partial: true, Message: "subnet 172.31.0.128/25 is not routed over the cable: it overlaps this node's underlay network"},
		{Cluster: "zeta", Driver: "ipsec", Message: "driver ipsec is not configured on this node (cableDrivers)"},
	}
	conns := BuildConnections([]reconcile.Want{north, west}, problems, observed, nil, nil, failed, func(string) uint32 { return 6 })
	conns = withPartialProblems(conns, problems)
	if len(conns) != 3 {
		t.Fatalf("connections = %+v, want north, west and zeta", conns)
	}
	for i, w := range []struct{ cluster, state, message string }{
		{"north", "connected", "subnet 172.31.0.128/25 is not routed over the cable: it overlaps this node's underlay network"},
		{"west", "error", `wireguard could not connect the pair: option "mtu": 100000 is out of range`},
		{"zeta", "error", "driver ipsec is not configured on this node (cableDrivers)"},
	} {
		if c := conns[i]; c.Cluster != w.cluster || c.State != w.state || c.Message != w.message {
			t.Errorf("row %d = %s %s %q, want %s %s %q", i, c.Cluster, c.State, c.Message, w.cluster, w.state, w.message)
		}
	}
	if got := StatusProblems(problems); len(got) != 2 || got[0].Cluster != "north" || got[1].Cluster != "zeta" {
		t.Errorf("statusProblems = %+v", got)
	}
}
