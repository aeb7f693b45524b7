package reconcile

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
)

func cl(name string, id uint32, pod ...string) *apiv1.Cluster {
	return &apiv1.Cluster{Name: name, Id: id, PodCidrs: pod}
}

func ep(cluster, node, ip, key string) *apiv1.Endpoint {
	return &apiv1.Endpoint{Cluster: cluster, Node: node, PrivateIp: ip, CableAttributes: wgKey(key),
		CablePorts: map[string]uint32{"wireguard": 51820}, Drivers: []string{"wireguard"}}
}

func state(clusters []*apiv1.Cluster, eps ...*apiv1.Endpoint) *brokerstate.State {
	s := brokerstate.New()
	for _, c := range clusters {
		s.Clusters[c.Name] = c
	}
	for _, e := range eps {
		s.Endpoints[brokerstate.EndpointKey(e.Cluster, e.Node)] = e
	}
	return s
}

func remote(cluster string, id uint32, node, ip, key string, subnets ...string) cable.RemoteEndpoint {
	r := cable.RemoteEndpoint{Cluster: cluster, ClusterID: id, Node: node, Address: netip.MustParseAddr(ip), Port: 51820, Attributes: map[string]string{"publicKey": key}}
	for _, s := range subnets {
		r.Subnets = append(r.Subnets, netip.MustParsePrefix(s))
	}
	return r
}

func TestDesired(t *testing.T) {
	three := []*apiv1.Cluster{cl("east", 1, "10.1.0.0/16"), cl("west", 2, "10.2.0.0/16"), cl("north", 3, "10.3.0.0/16")}
	tests := []struct {
		name         string
		st           *brokerstate.State
		want         []cable.RemoteEndpoint
		wantProblems int
	}{
		{
			name: "our own cluster is skipped and every other cluster with an endpoint is wanted",
			st:   state(three, ep("east", "e1", "10.0.0.11", "KE"), ep("west", "w1", "10.0.0.12", "KW"), ep("north", "n1", "10.0.0.13", "KN")),
			want: []cable.RemoteEndpoint{remote("north", 3, "n1", "10.0.0.13", "KN", "10.3.0.0/16"), remote("west", 2, "w1", "10.0.0.12", "KW", "10.2.0.0/16")},
		},
		{
			name: "a cluster without endpoints is skipped",
			st:   state(three, ep("west", "w1", "10.0.0.12", "KW")),
			want: []cable.RemoteEndpoint{remote("west", 2, "w1", "10.0.0.12", "KW", "10.2.0.0/16")},
		},
		{
			name: "the lexically smallest node with a key is chosen whatever the map order",
			st: state(three, ep("west", "w3", "10.0.0.33", "K3"), ep("west", "w1", "10.0.0.31", ""),
				ep("west", "w2", "10.0.0.32", "K2"), ep("west", "w4", "10.0.0.34", "K4")),
			want: []cable.RemoteEndpoint{remote("west", 2, "w2", "10.0.0.32", "K2", "10.2.0.0/16")},
		},
		{
			name:         "a cluster whose only endpoint has no key is skipped with a problem",
			st:           state(three, ep("west", "w1", "10.0.0.12", "")),
			wantProblems: 1,
		},
		{
			name: "service CIDRs join pod CIDRs",
			st: state([]*apiv1.Cluster{{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}, ServiceCidrs: []string{"10.96.2.0/24"}}},
				ep("west", "w1", "10.0.0.12", "KW")),
			want: []cable.RemoteEndpoint{remote("west", 2, "w1", "10.0.0.12", "KW", "10.2.0.0/16", "10.96.2.0/24")},
		},
		{
			name: "a cluster record without CIDRs falls back to the endpoint's subnets",
			st: func() *brokerstate.State {
				e := ep("west", "w1", "10.0.0.12", "KW")
				e.Subnets = []string{"10.9.0.0/16"}
				return state([]*apiv1.Cluster{cl("west", 2)}, e)
			}(),
			want: []cable.RemoteEndpoint{remote("west", 2, "w1", "10.0.0.12", "KW", "10.9.0.0/16")},
		},
		{
			name: "an endpoint of a cluster the state does not hold is ignored",
			st:   state(nil, ep("west", "w1", "10.0.0.12", "KW")),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wants, problems, _ := Desired(tt.st, "east", nil, Drivers{"wireguard": nil}, Guard{})
			var got []cable.RemoteEndpoint
			for _, w := range wants {
				if w.Driver != "wireguard" || w.Policy != "default" {
					t.Errorf("want %s over %s by policy %q, want wireguard by default", w.Remote.Cluster, w.Driver, w.Policy)
				}
				got = append(got, w.Remote)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Desired =\n %+v\nwant\n %+v", got, tt.want)
			}
			if len(problems) != tt.wantProblems {
				t.Errorf("problems = %+v, want %d", problems, tt.wantProblems)
			}
		})
	}
}

func observedOf(rs ...cable.RemoteEndpoint) []cable.ConnectionStatus {
	var out []cable.ConnectionStatus
	for _, r := range rs {
		out = append(out, cable.ConnectionStatus{Cluster: r.Cluster, Node: r.Node, Endpoint: EndpointString(r), State: cable.StateConnected, Subnets: r.Subnets})
	}
	return out
}

func appliedOf(rs ...cable.RemoteEndpoint) map[string]Want {
	m := map[string]Want{}
	for _, r := range rs {
		m[r.Cluster] = wg(r)
	}
	return m
}

func wg(r cable.RemoteEndpoint) Want { return Want{Remote: r, Driver: "wireguard", Policy: "default"} }

func wgs(rs ...cable.RemoteEndpoint) []Want {
	var out []Want
	for _, r := range rs {
		out = append(out, wg(r))
	}
	return out
}

func onWG(cs []cable.ConnectionStatus) map[string][]cable.ConnectionStatus {
	return map[string][]cable.ConnectionStatus{"wireguard": cs}
}

func kinds(as []Action) []string {
	var out []string
	for _, a := range as {
		out = append(out, string(a.Kind)+" "+a.Cluster)
	}
	return out
}

func TestPlan(t *testing.T) {
	west := remote("west", 2, "w1", "10.0.0.12", "KW", "10.2.0.0/16")
	north := remote("north", 3, "n1", "10.0.0.13", "KN", "10.3.0.0/16")
	westNewKey := west
	westNewKey.Attributes = map[string]string{"publicKey": "KW2"}
	westMoved := west
	westMoved.Address = netip.MustParseAddr("10.0.0.99")
	tests := []struct {
		name     string
		desired  []cable.RemoteEndpoint
		observed []cable.ConnectionStatus
		applied  map[string]Want
		want     []string
	}{
		{"a new cluster is connected", []cable.RemoteEndpoint{west, north}, observedOf(west), appliedOf(west), []string{"connect north"}},
		{"a removed cluster is disconnected", []cable.RemoteEndpoint{west}, observedOf(west, north), appliedOf(west, north), []string{"disconnect north"}},
		{"unchanged inputs give no actions", []cable.RemoteEndpoint{west, north}, observedOf(west, north), appliedOf(west, north), nil},
		{"an endpoint key change reconnects", []cable.RemoteEndpoint{westNewKey}, observedOf(west), appliedOf(west), []string{"connect west"}},
		{"an endpoint address change reconnects", []cable.RemoteEndpoint{westMoved}, observedOf(west), appliedOf(west), []string{"connect west"}},
		{"a connection lost from the device is restored", []cable.RemoteEndpoint{west}, nil, appliedOf(west), []string{"connect west"}},
		{"after a restart every desired connection is asserted once", []cable.RemoteEndpoint{west, north}, observedOf(west, north), nil, []string{"connect north", "connect west"}},
		{"disconnects come before connects", []cable.RemoteEndpoint{north}, observedOf(west), nil, []string{"disconnect west", "connect north"}},
		{"nothing desired and nothing observed gives no actions", nil, nil, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := kinds(Plan(wgs(tt.desired...), onWG(tt.observed), tt.applied, nil))
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Plan = %v, want %v", got, tt.want)
			}
		})
	}
	t.Run("a connection the device reports in error is repaired", func(t *testing.T) {
		obs := observedOf(west)
		obs[0].State = cable.StateError
		obs[0].Message = "route missing"
		got := Plan(wgs(west), onWG(obs), appliedOf(west), nil)
		if len(got) != 1 || got[0].Kind != Connect || !strings.Contains(got[0].Reason, "route missing") {
			t.Errorf("Plan = %+v", got)
		}
	})
}

func TestReconcilerIsIdempotent(t *testing.T) {
	d := fakedriver.New()
	_ = d.Init(context.Background())
	d.Calls()
	r := NewReconciler([]cable.Driver{d}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	st := state([]*apiv1.Cluster{cl("east", 1, "10.1.0.0/16"), cl("west", 2, "10.2.0.0/16")}, ep("west", "w1", "10.0.0.12", "KW"))
	desired, _, _ := Desired(st, "east", nil, Drivers{"wireguard": nil}, Guard{})
	if _, err := r.Reconcile(context.Background(), desired, 1, nil); err != nil {
		t.Fatal(err)
	}
	if got := d.Calls(); len(got) != 1 || got[0].Op != "connect" || got[0].Cluster != "west" {
		t.Fatalf("first pass calls = %v", got)
	}
	if acts, err := r.Reconcile(context.Background(), desired, 2, nil); err != nil || len(acts) != 0 {
		t.Fatalf("second pass = %v, %v", acts, err)
	}
	if got := d.Calls(); len(got) != 0 {
		t.Fatalf("second pass changed the host: %v", got)
	}
	d.ObserveErr = io.ErrUnexpectedEOF
	if _, err := r.Reconcile(context.Background(), nil, 3, nil); err == nil {
		t.Fatal("reconcile with an unobservable driver succeeded")
	}
	if got := d.Calls(); len(got) != 0 {
		t.Fatalf("an unobservable driver was changed: %v", got)
	}
}

// wgKey is what a wireguard node publishes: its public key.
func wgKey(key string) map[string]*apiv1.CableAttributes {
	return map[string]*apiv1.CableAttributes{"wireguard": {Values: map[string]string{"publicKey": key}}}
}

// TestReconcilerRemembersAFailedConnect: the driver's error of a pair whose
// Connect failed is kept for status until a Connect succeeds or the pair is wanted otherwise.
func TestReconcilerRemembersAFailedConnect(t *testing.T) {
	d := fakedriver.New()
	_ = d.Init(context.Background())
	r := NewReconciler([]cable.Driver{d}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	st := state([]*apiv1.Cluster{cl("east", 1, "10.1.0.0/16"), cl("west", 2, "10.2.0.0/16")}, ep("west", "w1", "10.0.0.12", "KW"))
	desired, _, _ := Desired(st, "east", nil, Drivers{"wireguard": nil}, Guard{})
	d.ConnectErr = errors.New(`option "vni": 0 is out of range`)
	if _, err := r.Reconcile(context.Background(), desired, 1, nil); err == nil {
		t.Fatal("a failing Connect reconciled without an error")
	}
	if f, ok := r.Failures()["west"]; !ok || !strings.Contains(f.Err.Error(), `"vni": 0 is out of range`) || !EqualWant(f.Want, desired[0]) {
		t.Fatalf("Failures() = %+v, want west's driver error", r.Failures())
	}
	d.ConnectErr = nil
	if _, err := r.Reconcile(context.Background(), desired, 2, nil); err != nil {
		t.Fatal(err)
	}
	if len(r.Failures()) != 0 {
		t.Errorf("Failures() after a successful connect = %+v", r.Failures())
	}
	d.ConnectErr = errors.New("boom")
	d.Remove("west")
	_, _ = r.Reconcile(context.Background(), desired, 3, nil)
	if _, err := r.Reconcile(context.Background(), nil, 4, nil); err != nil {
		t.Fatal(err)
	}
	if len(r.Failures()) != 0 {
		t.Errorf("Failures() of a pair no longer wanted = %+v", r.Failures())
	}
}
