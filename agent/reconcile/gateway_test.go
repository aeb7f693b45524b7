package reconcile

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/policy"
)

func meshEP(cluster, node, ip, key, mesh string) *apiv1.Endpoint {
	e := ep(cluster, node, ip, key)
	e.MeshAddress = mesh
	return e
}

func gwCluster(name string, id uint32, gateway bool, pod ...string) *apiv1.Cluster {
	c := cl(name, id, pod...)
	c.GatewayMode = gateway
	return c
}

// The pair mode and what a gateway-mode pair carries: only the two mesh addresses.
func TestDesiredGatewayMode(t *testing.T) {
	gatewayPolicy := func(mode string) *policy.Resolver {
		def := policy.DefaultPolicy(DefaultDriver)
		def.Spec.CableDriver.Options = map[string]string{policy.ModeOption: mode, "keepalive": "10s"}
		return policy.NewResolver(nil, def)
	}
	tests := []struct {
		name        string
		st          *brokerstate.State
		res         *policy.Resolver
		node        string
		wantMode    string
		wantSubnets []string
		wantLocal   []string
		wantProblem string
		wantOptions map[string]string
	}{
		{
			name: "two gateway-mode clusters with the same pod CIDR carry only their mesh addresses",
			st: state([]*apiv1.Cluster{gwCluster("a", 1, true, "10.40.0.0/16"), gwCluster("b", 2, true, "10.40.0.0/16")},
				meshEP("a", "a1", "10.0.0.1", "KA", "242.0.0.1"), meshEP("b", "b1", "10.0.0.2", "KB", "242.0.0.2")),
			node: "a1", wantMode: ModeGateway, wantSubnets: []string{"242.0.0.2/32"}, wantLocal: []string{"242.0.0.1/32"},
		},
		{
			name: "one gateway-mode cluster is enough to put the pair in gateway mode",
			st: state([]*apiv1.Cluster{gwCluster("a", 1, false, "10.43.0.0/16"), gwCluster("b", 2, true, "10.40.0.0/16")},
				meshEP("a", "a1", "10.0.0.1", "KA", "242.0.0.3"), meshEP("b", "b1", "10.0.0.2", "KB", "242.0.0.2")),
			node: "a1", wantMode: ModeGateway, wantSubnets: []string{"242.0.0.2/32"}, wantLocal: []string{"242.0.0.3/32"},
		},
		{
			name: "the policy's mode: gateway puts a pair of direct clusters in gateway mode, and mode never reaches the driver",
			st: state([]*apiv1.Cluster{cl("a", 1, "10.1.0.0/16"), cl("b", 2, "10.2.0.0/16")},
				meshEP("a", "a1", "10.0.0.1", "KA", "242.0.0.1"), meshEP("b", "b1", "10.0.0.2", "KB", "242.0.0.2")),
			res: gatewayPolicy(policy.ModeGateway), node: "a1", wantMode: ModeGateway,
			wantSubnets: []string{"242.0.0.2/32"}, wantLocal: []string{"242.0.0.1/32"}, wantOptions: map[string]string{"keepalive": "10s"},
		},
		{
			name: "mode: direct between direct clusters carries the pod CIDRs",
			st: state([]*apiv1.Cluster{cl("a", 1, "10.1.0.0/16"), cl("b", 2, "10.2.0.0/16")},
				meshEP("a", "a1", "10.0.0.1", "KA", "242.0.0.1"), meshEP("b", "b1", "10.0.0.2", "KB", "242.0.0.2")),
			res: gatewayPolicy(policy.ModeDirect), node: "a1", wantMode: ModeDirect,
			wantSubnets: []string{"10.2.0.0/16"}, wantOptions: map[string]string{"keepalive": "10s"},
		},
		{
			name: "a remote gateway without a mesh address yet is a problem, not a pod-CIDR connection",
			st: state([]*apiv1.Cluster{gwCluster("a", 1, true, "10.40.0.0/16"), gwCluster("b", 2, true, "10.40.0.0/16")},
				meshEP("a", "a1", "10.0.0.1", "KA", "242.0.0.1"), meshEP("b", "b1", "10.0.0.2", "KB", "")),
			node: "a1", wantMode: ModeGateway, wantProblem: "remote gateway b1 has no mesh address",
		},
		{
			name: "this gateway without a mesh address yet is a problem",
			st: state([]*apiv1.Cluster{gwCluster("a", 1, true, "10.40.0.0/16"), gwCluster("b", 2, true, "10.40.0.0/16")},
				meshEP("a", "a1", "10.0.0.1", "KA", ""), meshEP("b", "b1", "10.0.0.2", "KB", "242.0.0.2")),
			node: "a1", wantMode: ModeGateway, wantProblem: "this gateway a1 has no mesh address",
		},
		{
			name: "a non-gateway node (no node name) routes the remote mesh address without needing its own",
			st: state([]*apiv1.Cluster{gwCluster("a", 1, true, "10.40.0.0/16"), gwCluster("b", 2, true, "10.40.0.0/16")},
				meshEP("a", "a1", "10.0.0.1", "KA", ""), meshEP("b", "b1", "10.0.0.2", "KB", "242.0.0.2")),
			wantMode: ModeGateway, wantSubnets: []string{"242.0.0.2/32"},
		},
		{
			name: "a mesh address that is not IPv4 counts as none",
			st: state([]*apiv1.Cluster{gwCluster("a", 1, true, "10.40.0.0/16"), gwCluster("b", 2, true, "10.40.0.0/16")},
				meshEP("a", "a1", "10.0.0.1", "KA", "242.0.0.1"), meshEP("b", "b1", "10.0.0.2", "KB", "fd00::2")),
			node: "a1", wantMode: ModeGateway, wantProblem: "has no mesh address",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wants, problems, decisions := DesiredAt(tt.st, "a", tt.node, tt.res, nil, Guard{})
			if len(decisions) != 1 || decisions[0].Mode != tt.wantMode {
				t.Fatalf("decisions = %+v, want one with mode %s", decisions, tt.wantMode)
			}
			if tt.wantProblem != "" {
				if len(wants) != 0 || len(problems) != 1 || !strings.Contains(problems[0].Message, tt.wantProblem) {
					t.Fatalf("wants %+v problems %+v, want no connection and a problem containing %q", wants, problems, tt.wantProblem)
				}
				return
			}
			if len(wants) != 1 || len(problems) != 0 {
				t.Fatalf("wants %+v problems %+v, want one connection", wants, problems)
			}
			w := wants[0]
			if got := prefixStrings(w.Remote.Subnets); !slices.Equal(got, tt.wantSubnets) {
				t.Errorf("subnets = %v, want %v", got, tt.wantSubnets)
			}
			if got := prefixStrings(w.Remote.LocalSubnets); !slices.Equal(got, tt.wantLocal) {
				t.Errorf("local subnets = %v, want %v", got, tt.wantLocal)
			}
			if w.GatewayMode != (tt.wantMode == ModeGateway) {
				t.Errorf("GatewayMode = %v, want mode %s", w.GatewayMode, tt.wantMode)
			}
			if tt.wantMode == ModeGateway && w.RemoteMesh != netip.MustParseAddr(strings.TrimSuffix(tt.wantSubnets[0], "/32")) {
				t.Errorf("RemoteMesh = %v", w.RemoteMesh)
			}
			if len(w.Options) != len(tt.wantOptions) || (tt.wantOptions != nil && w.Options["keepalive"] != tt.wantOptions["keepalive"]) || w.Options[policy.ModeOption] != "" {
				t.Errorf("options = %v, want %v", w.Options, tt.wantOptions)
			}
		})
	}
}

// A mesh address appearing changes the wanted connection, so Plan reconnects it.
func TestLocalSubnetsChangeTheWant(t *testing.T) {
	st := state([]*apiv1.Cluster{gwCluster("a", 1, true, "10.40.0.0/16"), gwCluster("b", 2, true, "10.40.0.0/16")},
		meshEP("a", "a1", "10.0.0.1", "KA", "242.0.0.1"), meshEP("b", "b1", "10.0.0.2", "KB", "242.0.0.2"))
	w1, _, _ := DesiredAt(st, "a", "a1", nil, nil, Guard{})
	st.Endpoints[brokerstate.EndpointKey("a", "a1")].MeshAddress = "242.0.0.9"
	w2, _, _ := DesiredAt(st, "a", "a1", nil, nil, Guard{})
	if len(w1) != 1 || len(w2) != 1 || EqualWant(w1[0], w2[0]) {
		t.Fatalf("a changed own mesh address left the want equal: %+v / %+v", w1, w2)
	}
}

func prefixStrings(ps []netip.Prefix) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.String())
	}
	return out
}
