package dashboard

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/policy"
)

func currentMesh(t *testing.T, p *Poller) Mesh {
	t.Helper()
	b, _ := p.Current()
	var m Mesh
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("the document is not JSON: %v: %s", err, b)
	}
	return m
}

func pairOf(m Mesh, a, b string) Pair {
	k := keyOf(a, b)
	for _, p := range m.Pairs {
		if p.Clusters == k {
			return p
		}
	}
	return Pair{State: "(absent)"}
}

func TestTheDocumentJudgesEveryPairFromPoliciesGatewaysAndReports(t *testing.T) {
	f := threeClusters(t)
	p := newTestPoller(f)
	p.Poll(context.Background(), t0)
	m := currentMesh(t, p)
	if m.Error != "" {
		t.Fatalf("error %q, want none", m.Error)
	}
	for _, c := range []struct{ a, b, state, policy string }{
		{"east", "west", StateConnected, "default"},
		{"east", "north", StateConnected, "default"},
		{"north", "west", StateNone, "west-north-apart"},
	} {
		got := pairOf(m, c.a, c.b)
		if got.State != c.state || !strings.HasPrefix(got.Policy, c.policy) {
			t.Errorf("%s-%s: state %q policy %q (%s), want %q by %s*", c.a, c.b, got.State, got.Policy, got.Reason, c.state, c.policy)
		}
	}
	ew := pairOf(m, "east", "west")
	if ew.Driver != "wireguard" || ew.LatencyP50Ms == nil || *ew.LatencyP50Ms != 0.4 || !slices.Equal(ew.Nodes, []string{"east/gw1", "west/gw1"}) {
		t.Errorf("east-west: %+v, want wireguard, p50 0.4 ms, served by east/gw1 and west/gw1", ew)
	}
	north := m.Clusters[slices.IndexFunc(m.Clusters, func(c Cluster) bool { return c.Name == "north" })]
	if north.GatewaysOnline != 1 || north.GatewaysTotal != 1 || !slices.Equal(north.AgentVersions, []string{"v0.9.0"}) {
		t.Errorf("north: %d/%d gateways, versions %v; want 1/1, v0.9.0", north.GatewaysOnline, north.GatewaysTotal, north.AgentVersions)
	}
	if len(north.CertWarnings) != 1 || !strings.Contains(north.CertWarnings[0], "node gw1: certificate expires in 5d") {
		t.Errorf("north's certificate warnings %q, want gw1's expiry in 5 days", north.CertWarnings)
	}
	if len(m.Services) != 1 || m.Services[0].Exporters[0].ReadyEndpoints != 1 || len(m.Services[0].Conflicts) != 1 {
		t.Errorf("services %+v, want shop/web from west with 1 of 2 ready and east's conflict", m.Services)
	}
}

func TestPoliciesListThePairsTheyDecideAndLose(t *testing.T) {
	f := threeClusters(t)
	// every-vxlan covers every pair at priority 1: it decides east's two pairs, and loses
	// north-west to west-north-apart's priority 5. The default then decides nothing.
	one := 1
	all := policy.ClusterConnectionPolicy{Metadata: policy.ObjectMeta{Name: "every-vxlan"}, Spec: policy.Spec{
		ClusterSelector: &policy.Selector{}, Priority: &one, CableDriver: &policy.CableDriver{Name: "vxlan"}}}
	_, b, err := admission.CanonicalPolicy(all, policy.OriginMesh)
	if err != nil {
		t.Fatal(err)
	}
	f.policies.Policies = append(f.policies.Policies, &apiv1.Policy{Name: "every-vxlan", Json: b, Revision: 4})
	p := newTestPoller(f)
	p.Poll(context.Background(), t0)
	m := currentMesh(t, p)
	var names []string
	for _, p := range m.Policies {
		names = append(names, p.Name)
	}
	if !slices.Equal(names, []string{"west-north-apart", "every-vxlan", "default"}) || !m.Policies[2].IsDefault {
		t.Fatalf("policies %v, want west-north-apart (priority 5), every-vxlan (1), then the default", names)
	}
	apart, every, def := m.Policies[0], m.Policies[1], m.Policies[2]
	if apart.Origin != policy.OriginMesh || apart.Priority != 5 || apart.Status.PairsDecided != 1 {
		t.Errorf("west-north-apart: origin %q priority %d status %+v", apart.Origin, apart.Priority, apart.Status)
	}
	if len(apart.Decides) != 1 || apart.Decides[0].Clusters != keyOf("west", "north") || apart.Decides[0].Connect {
		t.Errorf("west-north-apart decides %+v, want north-west, no connection", apart.Decides)
	}
	var decided []pairKey
	for _, o := range every.Decides {
		decided = append(decided, o.Clusters)
		if !o.Connect || o.Driver != "vxlan" {
			t.Errorf("every-vxlan decides %+v, want connect over vxlan", o)
		}
	}
	if !slices.Equal(decided, []pairKey{keyOf("east", "north"), keyOf("east", "west")}) {
		t.Errorf("every-vxlan decides %v, want east-north and east-west", decided)
	}
	if len(every.Loses) != 1 || every.Loses[0].Clusters != keyOf("west", "north") || every.Loses[0].Winner != "west-north-apart" || every.Loses[0].Outcome != "lower priority" {
		t.Errorf("every-vxlan loses %+v, want north-west, lower priority, to west-north-apart", every.Loses)
	}
	if len(def.Decides) != 0 || len(def.Loses) != 0 {
		t.Errorf("the default decides %+v and loses %+v, want nothing: every pair is covered", def.Decides, def.Loses)
	}
	if got := pairOf(m, "east", "west"); got.Policy != "every-vxlan" {
		t.Errorf("east-west decided by %q, want every-vxlan", got.Policy)
	}
}

func TestPairVerdict(t *testing.T) {
	k := keyOf("east", "west")
	stale := func(e LinkEnd) LinkEnd { e.Stale = true; return e }
	conn := policy.Decision{Connect: true, Driver: "wireguard", Policy: "default"}
	end := func(cluster, state string) LinkEnd {
		return LinkEnd{Cluster: cluster, Node: "gw1", State: state, Driver: "wireguard"}
	}
	for _, c := range []struct {
		name       string
		d          policy.Decision
		onA, onB   int
		link       *Link
		want       string
		wantReason string
	}{
		{"a pair the policies do not connect is none whatever is reported", policy.Decision{Policy: "apart"}, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "connected")}}, StateNone, "do not connect"},
		{"a cluster with no gateway online puts its pairs down", conn, 1, 0,
			&Link{Ends: []LinkEnd{end("east", "connected"), end("west", "connected")}, Agree: true}, StateDown, "no gateway of west"},
		{"no report yet is unknown", conn, 1, 1, nil, StateUnknown, "no link report"},
		{"both ends connected and agreeing is connected", conn, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "connected"), end("west", "connected")}, Agree: true}, StateConnected, "both ends"},
		{"an end in error is down", conn, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "connected"), end("west", "error")}}, StateDown, "west reports error"},
		{"an end still connecting is degraded", conn, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "connected"), end("west", "connecting")}}, StateDegraded, "west still connecting"},
		{"a stale report is degraded", conn, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "connected"), stale(end("west", "connected"))}, Agree: true, Stale: true}, StateDegraded, "west's report is stale"},
		{"a stale end's last word does not count: the fresh end's error puts the pair down", conn, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "error"), stale(end("west", "connected"))}, Stale: true}, StateDown, "east reports error"},
		{"a stale end's last error does not count either", conn, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "connected"), stale(end("west", "error"))}, Stale: true}, StateDegraded, "west's report is stale"},
		{"two gateways of one cluster count as one end", conn, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "connected"), {Cluster: "east", Node: "gw2", State: "connected"}}}, StateDegraded, "only east"},
		{"one end alone is degraded", conn, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "connected")}, Agree: true}, StateDegraded, "only east"},
		{"ends that disagree are degraded", conn, 1, 1,
			&Link{Ends: []LinkEnd{end("east", "connected"), end("west", "connected")}}, StateDegraded, "disagree"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.link != nil {
				c.link.Clusters = k
			}
			got := pairVerdict(k, c.d, true, c.onA, c.onB, c.link)
			if got.State != c.want || !strings.Contains(got.Reason, c.wantReason) {
				t.Errorf("state %q (%s), want %q (…%s…)", got.State, got.Reason, c.want, c.wantReason)
			}
		})
	}
}

func TestDiffNamesTheChanges(t *testing.T) {
	f := threeClusters(t)
	p := newTestPoller(f)
	p.Poll(context.Background(), t0)
	before := currentMesh(t, p)
	after := currentMesh(t, p)
	ew := slices.IndexFunc(after.Pairs, func(p Pair) bool { return p.Clusters == keyOf("east", "west") })
	after.Pairs[ew].State, after.Pairs[ew].Reason = StateDown, "west reports error"
	en := slices.IndexFunc(after.Pairs, func(p Pair) bool { return p.Clusters == keyOf("east", "north") })
	after.Pairs[en].Nodes = []string{"east/gw2", "north/gw1"}
	after.Policies = after.Policies[1:] // west-north-apart deleted
	evs := Diff(&before, &after, t0)
	var got []string
	for _, e := range evs {
		got = append(got, e.Kind+": "+e.Message)
	}
	want := []string{
		"failover: east–north: east's gateway gw2 took over from gw1",
		"pair-down: east–west is down: west reports error",
		"policy: policy west-north-apart (mesh) deleted",
	}
	if !slices.Equal(got, want) {
		t.Errorf("events\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if evs := Diff(&before, &before, t0); len(evs) != 0 {
		t.Errorf("no change gave events %+v", evs)
	}
}

func TestABrokerThatStopsAnsweringKeepsTheLastStateAndSaysSo(t *testing.T) {
	f := threeClusters(t)
	p := newTestPoller(f)
	p.Poll(context.Background(), t0)
	f.update(func(f *fakeBroker) { f.err = context.DeadlineExceeded })
	p.Poll(context.Background(), t0.Add(time.Second))
	m := currentMesh(t, p)
	if !strings.Contains(m.Error, "list clusters") || len(m.Clusters) != 3 {
		t.Errorf("error %q with %d clusters, want the failed call named and the 3 clusters kept", m.Error, len(m.Clusters))
	}
	if len(m.Events) == 0 || m.Events[0].Kind != EventBroker {
		t.Errorf("events %+v, want the broker's silence first", m.Events)
	}
}
