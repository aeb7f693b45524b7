package reconcile

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"reflect"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/policy"
)

func sel(kv ...string) *policy.Selector {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return &policy.Selector{MatchLabels: m}
}

func prio(n int) *int { return &n }

// policyRec encodes p as the broker sends it.
func policyRec(t *testing.T, p policy.ClusterConnectionPolicy, isDefault bool) *apiv1.Policy {
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

var _ = metav1.LabelSelector{} // policy.Selector is this type

// vxlanSiteAB puts pairs between site a and site b on vxlan (vni 200), priority 10.
func vxlanSiteAB() policy.ClusterConnectionPolicy {
	return policy.ClusterConnectionPolicy{Metadata: policy.ObjectMeta{Name: "sites-vxlan"}, Spec: policy.Spec{
		LeftClusterSelector: sel("site", "a"), RightClusterSelector: sel("site", "b"), Priority: prio(10),
		CableDriver: &policy.CableDriver{Name: "vxlan", Options: map[string]string{"vni": "200"}},
	}}
}

// isolateNorth decides no-connect for every pair with north, priority 20.
func isolateNorth() policy.ClusterConnectionPolicy {
	return policy.ClusterConnectionPolicy{Metadata: policy.ObjectMeta{Name: "isolate-north"}, Spec: policy.Spec{
		LeftClusterSelector: sel("tier", "isolated"), RightClusterSelector: sel(), Priority: prio(20),
		ConnectionPolicy: policy.NoConnect,
	}}
}

func allDrivers(e *apiv1.Endpoint) *apiv1.Endpoint {
	e.Drivers = []string{"wireguard", "vxlan", "ipsec"}
	e.CablePorts = map[string]uint32{"wireguard": 51820, "vxlan": 4789, "ipsec": 500}
	return e
}

// mesh is east (site a), west (site b) and north (isolated), each with a gateway running all
// three drivers, with policies.
func mesh(t *testing.T, policies ...*apiv1.Policy) *brokerstate.State {
	t.Helper()
	st := state([]*apiv1.Cluster{
		{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}, Labels: map[string]string{"site": "a"}},
		{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}, Labels: map[string]string{"site": "b"}, PairPsk: bytes.Repeat([]byte{7}, 32)},
		{Name: "north", Id: 3, PodCidrs: []string{"10.3.0.0/16"}, Labels: map[string]string{"tier": "isolated"}},
	}, allDrivers(ep("east", "e1", "10.0.0.11", "KE")), allDrivers(ep("west", "w1", "10.0.0.12", "KW")), allDrivers(ep("north", "n1", "10.0.0.13", "KN")))
	for _, p := range policies {
		st.Policies[p.Name] = p
	}
	return st
}

func summary(ws []Want) []string {
	var out []string
	for _, w := range ws {
		s := w.Remote.Cluster + " " + w.Driver + " " + w.Policy
		if len(w.Options) > 0 {
			b, _ := json.Marshal(w.Options)
			s += " " + string(b)
		}
		out = append(out, s)
	}
	return out
}

func TestDesiredFollowsPolicies(t *testing.T) {
	allRun := Drivers{"wireguard": nil, "vxlan": nil, "ipsec": nil}
	tests := []struct {
		name         string
		st           func(t *testing.T) *brokerstate.State
		drivers      Drivers
		want         []string
		wantProblems []string
		wantNoConn   []string // clusters decided no-connect
	}{
		{
			name: "with no policy at all (a broker older than policies) every pair is full mesh over wireguard",
			st:   func(t *testing.T) *brokerstate.State { return mesh(t) },
			want: []string{"north wireguard default", "west wireguard default"},
		},
		{
			name: "the mesh default policy's driver applies when no other policy covers a pair",
			st: func(t *testing.T) *brokerstate.State {
				return mesh(t, policyRec(t, policy.DefaultPolicy("ipsec"), true))
			},
			want: []string{"north ipsec default", "west ipsec default"},
		},
		{
			name: "a higher-priority policy puts its pair on its driver with its options",
			st: func(t *testing.T) *brokerstate.State {
				return mesh(t, policyRec(t, policy.DefaultPolicy("wireguard"), true), policyRec(t, vxlanSiteAB(), false))
			},
			want: []string{`north wireguard default`, `west vxlan sites-vxlan {"vni":"200"}`},
		},
		{
			name: "a no-connect policy leaves the pair out and the decision says which policy did",
			st: func(t *testing.T) *brokerstate.State {
				return mesh(t, policyRec(t, policy.DefaultPolicy("wireguard"), true), policyRec(t, isolateNorth(), false))
			},
			want:       []string{"west wireguard default"},
			wantNoConn: []string{"north isolate-north"},
		},
		{
			name: "a pair on a driver the remote gateway does not run is an error naming the driver",
			st: func(t *testing.T) *brokerstate.State {
				st := mesh(t, policyRec(t, policy.DefaultPolicy("wireguard"), true), policyRec(t, vxlanSiteAB(), false))
				w := st.Endpoints["west/w1"]
				w.Drivers = []string{"wireguard", "ipsec"}
				delete(w.CablePorts, "vxlan")
				return st
			},
			want:         []string{"north wireguard default"},
			wantProblems: []string{"west vxlan: remote gateway does not run driver vxlan"},
		},
		{
			name: "a pair on a driver whose initialisation failed on this node is an error naming it",
			st: func(t *testing.T) *brokerstate.State {
				return mesh(t, policyRec(t, policy.DefaultPolicy("ipsec"), true), policyRec(t, vxlanSiteAB(), false))
			},
			drivers:      Drivers{"wireguard": nil, "vxlan": nil, "ipsec": errors.New("charon not found")},
			want:         []string{`west vxlan sites-vxlan {"vni":"200"}`},
			wantProblems: []string{"north ipsec: driver ipsec unavailable on this node: charon not found"},
		},
		{
			name: "a pair on a driver this node is not configured with is an error",
			st: func(t *testing.T) *brokerstate.State {
				return mesh(t, policyRec(t, policy.DefaultPolicy("wireguard"), true), policyRec(t, vxlanSiteAB(), false))
			},
			drivers:      Drivers{"wireguard": nil},
			want:         []string{"north wireguard default"},
			wantProblems: []string{"west vxlan: driver vxlan is not configured on this node (cableDrivers)"},
		},
		{
			name: "the endpoint is the smallest node that runs the decided driver",
			st: func(t *testing.T) *brokerstate.State {
				st := mesh(t, policyRec(t, policy.DefaultPolicy("wireguard"), true), policyRec(t, vxlanSiteAB(), false))
				w0 := ep("west", "w0", "10.0.0.20", "KW0") // wireguard only: cannot carry vxlan
				st.Endpoints["west/w0"] = w0
				return st
			},
			want: []string{`north wireguard default`, `west vxlan sites-vxlan {"vni":"200"}`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := tt.st(t)
			drivers := tt.drivers
			if drivers == nil {
				drivers = allRun
			}
			res, bad := Resolver(st)
			if len(bad) > 0 {
				t.Fatalf("policies rejected: %v", bad)
			}
			wants, problems, decisions := Desired(st, "east", res, drivers, Guard{})
			if got := summary(wants); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("wants = %q, want %q", got, tt.want)
			}
			var gotP []string
			for _, p := range problems {
				gotP = append(gotP, p.Cluster+" "+p.Driver+": "+p.Message)
			}
			if !reflect.DeepEqual(gotP, tt.wantProblems) {
				t.Errorf("problems = %q, want %q", gotP, tt.wantProblems)
			}
			var noConn []string
			for _, d := range decisions {
				if !d.Connect {
					noConn = append(noConn, d.Cluster+" "+d.Policy)
				}
			}
			if !reflect.DeepEqual(noConn, tt.wantNoConn) {
				t.Errorf("no-connect decisions = %q, want %q", noConn, tt.wantNoConn)
			}
			if len(decisions) != 2 {
				t.Errorf("decisions = %+v, want one per remote cluster", decisions)
			}
			// Both ends reach the same decision: what west plans for east is what east plans
			// for west.
			wwants, _, wdec := Desired(st, "west", res, drivers, Guard{})
			for _, d := range decisions {
				if d.Cluster != "west" {
					continue
				}
				for _, o := range wdec {
					if o.Cluster == "east" && (o.Connect != d.Connect || o.Driver != d.Driver || o.Policy != d.Policy) {
						t.Errorf("asymmetric decision: east->west %+v, west->east %+v", d, o)
					}
				}
			}
			_ = wwants
		})
	}
}

func TestDesiredCarriesThePairPSK(t *testing.T) {
	st := mesh(t)
	wants, _, _ := Desired(st, "east", nil, Drivers{"wireguard": nil}, Guard{})
	for _, w := range wants {
		switch w.Remote.Cluster {
		case "west":
			if !bytes.Equal(w.Remote.PreSharedKey, bytes.Repeat([]byte{7}, 32)) {
				t.Errorf("west PSK = %x, want the cluster record's pair_psk", w.Remote.PreSharedKey)
			}
		case "north":
			if w.Remote.PreSharedKey != nil {
				t.Errorf("north has no pair_psk but the want carries %x", w.Remote.PreSharedKey)
			}
		}
	}
}

func TestResolverSkipsUndecodablePolicies(t *testing.T) {
	st := mesh(t, &apiv1.Policy{Name: "broken", Json: []byte("{not json")})
	_, bad := Resolver(st)
	if len(bad) != 1 || bad[0].Policy != "broken" || !strings.Contains(bad[0].Message, "broken") {
		t.Fatalf("problems = %+v", bad)
	}
	if PolicyKey(st) == PolicyKey(mesh(t)) {
		t.Error("PolicyKey does not change with the policies")
	}
	// Equal policies in separately built states, inserted in another order, have one key.
	one := &apiv1.Policy{Name: "one", Json: []byte(`{"a":1}`)}
	two := &apiv1.Policy{Name: "two", Json: []byte(`{"b":2}`), IsDefault: true}
	if PolicyKey(mesh(t, one, two)) != PolicyKey(mesh(t, proto.Clone(two).(*apiv1.Policy), proto.Clone(one).(*apiv1.Policy))) {
		t.Error("PolicyKey differs for equal policies")
	}
	if PolicyKey(mesh(t, one, two)) == PolicyKey(mesh(t, one)) {
		t.Error("PolicyKey does not change when a policy goes")
	}
}

func want(r cable.RemoteEndpoint, driver, pol string, opts cable.Options) Want {
	return Want{Remote: r, Driver: driver, Policy: pol, Options: opts}
}

func actions(as []Action) []string {
	var out []string
	for _, a := range as {
		out = append(out, string(a.Kind)+" "+a.Cluster+" "+a.Driver)
	}
	return out
}

func TestPlanAcrossDrivers(t *testing.T) {
	west := remote("west", 2, "w1", "10.0.0.12", "KW", "10.2.0.0/16")
	north := remote("north", 3, "n1", "10.0.0.13", "KN", "10.3.0.0/16")
	westVX := west
	westVX.Port = 4789
	westPSK := westVX
	westPSK.PreSharedKey = []byte("new")
	obs := func(m map[string][]cable.RemoteEndpoint) map[string][]cable.ConnectionStatus {
		out := map[string][]cable.ConnectionStatus{"wireguard": nil, "vxlan": nil, "ipsec": nil}
		for d, rs := range m {
			out[d] = observedOf(rs...)
		}
		return out
	}
	tests := []struct {
		name     string
		desired  []Want
		observed map[string][]cable.ConnectionStatus
		applied  map[string]Want
		repair   map[string]string
		want     []string
	}{
		{
			name:     "a driver change disconnects the old driver before connecting the new one, and leaves the unchanged pair alone",
			desired:  []Want{want(westVX, "vxlan", "sites-vxlan", cable.Options{"vni": "200"}), want(north, "wireguard", "default", nil)},
			observed: obs(map[string][]cable.RemoteEndpoint{"wireguard": {west, north}}),
			applied:  map[string]Want{"west": want(west, "wireguard", "default", nil), "north": want(north, "wireguard", "default", nil)},
			want:     []string{"disconnect west wireguard", "connect west vxlan"},
		},
		{
			name:     "a pair decided no-connect loses its connection",
			desired:  []Want{want(north, "wireguard", "default", nil)},
			observed: obs(map[string][]cable.RemoteEndpoint{"wireguard": {north}, "vxlan": {westVX}}),
			applied:  map[string]Want{"west": want(westVX, "vxlan", "sites-vxlan", nil), "north": want(north, "wireguard", "default", nil)},
			want:     []string{"disconnect west vxlan"},
		},
		{
			name:     "after a restart a leftover of the pair on another driver is removed and the pair asserted on its own",
			desired:  []Want{want(westVX, "vxlan", "sites-vxlan", nil)},
			observed: obs(map[string][]cable.RemoteEndpoint{"wireguard": {west}, "ipsec": {north}, "vxlan": {westVX}}),
			want:     []string{"disconnect north ipsec", "disconnect west wireguard", "connect west vxlan"},
		},
		{
			name:     "changed options on the same driver reconnect in place",
			desired:  []Want{want(westVX, "vxlan", "sites-vxlan", cable.Options{"vni": "300"})},
			observed: obs(map[string][]cable.RemoteEndpoint{"vxlan": {westVX}}),
			applied:  map[string]Want{"west": want(westVX, "vxlan", "sites-vxlan", cable.Options{"vni": "200"})},
			want:     []string{"connect west vxlan"},
		},
		{
			name:     "a new pair PSK reconnects",
			desired:  []Want{want(westPSK, "vxlan", "p", nil)},
			observed: obs(map[string][]cable.RemoteEndpoint{"vxlan": {westVX}}),
			applied:  map[string]Want{"west": want(westVX, "vxlan", "p", nil)},
			want:     []string{"connect west vxlan"},
		},
		{
			name:     "a decision by another policy with the same driver and options touches nothing",
			desired:  []Want{want(westVX, "vxlan", "renamed", nil)},
			observed: obs(map[string][]cable.RemoteEndpoint{"vxlan": {westVX}}),
			applied:  map[string]Want{"west": want(westVX, "vxlan", "sites-vxlan", nil)},
		},
		{
			name:     "a pair whose old driver cannot be observed is left alone",
			desired:  []Want{want(westVX, "vxlan", "p", nil)},
			observed: map[string][]cable.ConnectionStatus{"vxlan": nil},
			applied:  map[string]Want{"west": want(west, "wireguard", "default", nil)},
		},
		{
			name:     "a pair to repair is re-asserted although nothing changed",
			desired:  []Want{want(west, "wireguard", "default", nil), want(north, "wireguard", "default", nil)},
			observed: obs(map[string][]cable.RemoteEndpoint{"wireguard": {west, north}}),
			applied:  map[string]Want{"west": want(west, "wireguard", "default", nil), "north": want(north, "wireguard", "default", nil)},
			repair:   map[string]string{"north": "probes failed"},
			want:     []string{"connect north wireguard"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Plan(tt.desired, tt.observed, tt.applied, tt.repair)
			if !reflect.DeepEqual(actions(got), tt.want) {
				t.Errorf("Plan = %q, want %q", actions(got), tt.want)
			}
		})
	}
}

// driversOf initialises named fakes.
func driversOf(t *testing.T, names ...string) (map[string]*fakedriver.Driver, []cable.Driver) {
	t.Helper()
	m := map[string]*fakedriver.Driver{}
	var list []cable.Driver
	for i, n := range names {
		d := fakedriver.NewNamed(n, uint16(1000+i))
		if err := d.Init(context.Background()); err != nil {
			t.Fatal(err)
		}
		d.Calls()
		m[n] = d
		list = append(list, d)
	}
	return m, list
}

func TestReconcilerMovesAPairBetweenDrivers(t *testing.T) {
	fakes, list := driversOf(t, "wireguard", "vxlan")
	var logs bytes.Buffer
	r := NewReconciler(list, slog.New(slog.NewTextHandler(&logs, nil)))
	ctx := context.Background()
	polWG := mesh(t)
	wants, _, _ := Desired(polWG, "east", nil, Drivers{"wireguard": nil, "vxlan": nil}, Guard{})
	if _, err := r.Reconcile(ctx, wants, 5, nil); err != nil {
		t.Fatal(err)
	}
	if got := fakes["wireguard"].Clusters(); strings.Join(got, ",") != "north,west" {
		t.Fatalf("wireguard holds %v", got)
	}
	fakes["wireguard"].Calls()

	polVX := mesh(t, policyRec(t, policy.DefaultPolicy("wireguard"), true), policyRec(t, vxlanSiteAB(), false))
	wants, _, _ = Desired(polVX, "east", nil, Drivers{"wireguard": nil, "vxlan": nil}, Guard{})
	if _, err := r.Reconcile(ctx, wants, 9, nil); err != nil {
		t.Fatal(err)
	}
	wgCalls, vxCalls := fakes["wireguard"].Calls(), fakes["vxlan"].Calls()
	if len(wgCalls) != 1 || wgCalls[0].Op != "disconnect" || wgCalls[0].Cluster != "west" {
		t.Fatalf("wireguard calls = %v, want only disconnect west (north is unchanged)", wgCalls)
	}
	if len(vxCalls) != 1 || vxCalls[0].Op != "connect" || vxCalls[0].Cluster != "west" || vxCalls[0].Options["vni"] != "200" {
		t.Fatalf("vxlan calls = %v", vxCalls)
	}
	if vxCalls[0].At.Before(wgCalls[0].At) {
		t.Error("the new driver connected before the old one disconnected")
	}
	if !strings.Contains(logs.String(), `msg="pair moved" cluster=west from=wireguard to=vxlan`) {
		t.Errorf("no pair moved log:\n%s", logs.String())
	}
	ap := r.Applied()
	if ap["west"].Revision != 9 || ap["west"].Want.Driver != "vxlan" || ap["north"].Revision != 5 {
		t.Errorf("applied = %+v", ap)
	}
	// A further pass with the same inputs touches nothing.
	if acts, err := r.Reconcile(ctx, wants, 10, nil); err != nil || len(acts) != 0 {
		t.Fatalf("second pass = %v, %v", acts, err)
	}
}

type failingDisconnect struct{ *fakedriver.Driver }

func (failingDisconnect) Disconnect(context.Context, string) error { return errors.New("netlink busy") }

func TestReconcilerDoesNotConnectTheNewDriverWhenTheOldOneCannotLetGo(t *testing.T) {
	fakes, _ := driversOf(t, "wireguard", "vxlan")
	wgBad := failingDisconnect{fakes["wireguard"]}
	r := NewReconciler([]cable.Driver{wgBad, fakes["vxlan"]}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	west := remote("west", 2, "w1", "10.0.0.12", "KW", "10.2.0.0/16")
	fakes["wireguard"].Put(west)
	westVX := west
	westVX.Port = 4789
	_, err := r.Reconcile(context.Background(), []Want{want(westVX, "vxlan", "p", nil)}, 3, nil)
	if err == nil || !strings.Contains(err.Error(), "netlink busy") {
		t.Fatalf("err = %v", err)
	}
	if got := fakes["vxlan"].Calls(); len(got) != 0 {
		t.Fatalf("vxlan connected while wireguard still held the pair: %v", got)
	}
}
