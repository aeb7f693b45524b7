package policy

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"testing"
)

// pol builds a policy from CLI-form selectors; "" leaves a selector out,
// "*" gives the empty selector.
func pol(t testing.TB, name string, prio int, left, right, set, topo, conn, driver string) ClusterConnectionPolicy {
	t.Helper()
	sel := func(s string) *Selector {
		switch s {
		case "":
			return nil
		case "*":
			return &Selector{}
		}
		out, err := ParseSelector(s)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	p := ClusterConnectionPolicy{Kind: Kind, Metadata: ObjectMeta{Name: name}, Spec: Spec{
		LeftClusterSelector: sel(left), RightClusterSelector: sel(right), ClusterSelector: sel(set),
		Topology: topo, Priority: &prio, ConnectionPolicy: conn,
	}}
	if driver != "" {
		p.Spec.CableDriver = &CableDriver{Name: driver}
	}
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestTopologies(t *testing.T) {
	def := DefaultPolicy("wireguard")
	tests := []struct {
		name   string
		policy ClusterConnectionPolicy
		want   map[[2]string]string
	}{
		{
			name:   "point-to-point covers only left-right pairs and leaves pairs inside one side to the default",
			policy: pol(t, "p2p", 1, "location=on-premise", "location=cloud", "", TopologyPointToPoint, "", "ipsec"),
			want: withPairs(allPairs(seedMesh, "ipsec@p2p"),
				"onprem-prod", "onprem-stage", "wireguard@default*",
				"cloud-prod", "cloud-stage", "wireguard@default*"),
		},
		{
			name:   "left/right without a topology is point-to-point",
			policy: pol(t, "p2p", 1, "location=on-premise", "location=cloud", "", "", "", "ipsec"),
			want: withPairs(allPairs(seedMesh, "ipsec@p2p"),
				"onprem-prod", "onprem-stage", "wireguard@default*",
				"cloud-prod", "cloud-stage", "wireguard@default*"),
		},
		{
			name:   "full-mesh with left and right meshes everything either side selects",
			policy: pol(t, "fm", 1, "env=production", "location=on-premise", "", TopologyFullMesh, "", "vxlan"),
			want: withPairs(allPairs(seedMesh, "vxlan@fm"),
				"cloud-stage", "onprem-prod", "wireguard@default*",
				"cloud-prod", "cloud-stage", "wireguard@default*",
				"cloud-stage", "onprem-stage", "wireguard@default*"),
		},
		{
			name:   "a no-connect policy cuts exactly the pairs it covers",
			policy: pol(t, "cut", 1, "", "", "env=staging", "", NoConnect, ""),
			want:   withPairs(allPairs(seedMesh, "wireguard@default*"), "cloud-stage", "onprem-stage", "-@cut"),
		},
		{
			name:   "a connect policy without a driver uses the default's",
			policy: pol(t, "nodriver", 1, "", "", "location=cloud", "", "", ""),
			want:   withPairs(allPairs(seedMesh, "wireguard@default*"), "cloud-prod", "cloud-stage", "wireguard@nodriver"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := ResolveAll([]ClusterConnectionPolicy{tt.policy}, def, seedMesh)
			for pair, w := range tt.want {
				d, _ := res.Get(pair[0], pair[1])
				if got := render(d, pair[0], pair[1]); got != w {
					t.Errorf("%s/%s = %s, want %s", pair[0], pair[1], got, w)
				}
			}
		})
	}
}

func TestDefaultDriverOptionsAreInherited(t *testing.T) {
	def := DefaultPolicy("vxlan")
	def.Spec.CableDriver.Options = map[string]string{"vni": "77"}
	p := pol(t, "cloud", 1, "", "", "location=cloud", "", "", "")
	d := Resolve([]ClusterConnectionPolicy{p}, def, cloudProd, cloudStage)
	if d.Driver != "vxlan" || d.Options["vni"] != "77" || d.Policy != "cloud" {
		t.Errorf("got %+v", d)
	}
	// Under a no-connect default there is no default driver: DefaultDriver.
	noConn := pol(t, "none", 0, "", "", "", "", NoConnect, "")
	if d := Resolve([]ClusterConnectionPolicy{p}, noConn, cloudProd, cloudStage); d.Driver != DefaultDriver {
		t.Errorf("got %+v", d)
	}
}

func TestOriginLimitsAClusterPolicyToItsOwnPairs(t *testing.T) {
	p := pol(t, "mine", 5, "", "", "*", "", NoConnect, "")
	p.Origin = "cloud-prod"
	res := ResolveAll([]ClusterConnectionPolicy{p}, DefaultPolicy(""), seedMesh)
	for _, pd := range res.Pairs {
		involved := pd.A == "cloud-prod" || pd.B == "cloud-prod"
		if pd.Decision.Connect == involved {
			t.Errorf("%s/%s: %+v (involves the origin: %v)", pd.A, pd.B, pd.Decision, involved)
		}
		if single := Resolve([]ClusterConnectionPolicy{p}, DefaultPolicy(""), byName(pd.A), byName(pd.B)); !single.Equal(pd.Decision) {
			t.Errorf("%s/%s: Resolve %+v, ResolveAll %+v", pd.A, pd.B, single, pd.Decision)
		}
	}
	if got := res.Status["mine"].PairsDecided; got != 3 {
		t.Errorf("mine decided %d pairs, want 3", got)
	}
}

func byName(name string) Cluster {
	for _, c := range append(seedMesh, dbMesh...) {
		if c.Name == name {
			return c
		}
	}
	panic(name)
}

func TestResolveAllStatus(t *testing.T) {
	connect := pol(t, "a-connect", 3, "", "", "*", "", "", "vxlan")
	cut := pol(t, "b-cut", 3, "", "", "location=cloud", "", NoConnect, "")
	low := pol(t, "c-low", 1, "", "", "*", "", "", "ipsec")
	bad := pol(t, "d-bad", 9, "", "", "*", "", "", "ipsec")
	bad.Spec.Topology = "star"
	def := DefaultPolicy("")
	res := ResolveAll([]ClusterConnectionPolicy{low, cut, connect, bad, def}, def, seedMesh)
	want := map[string]Status{
		"a-connect": {PairsDecided: 5, PairsConnected: 5, ConflictsLost: 1, Conflicts: []Conflict{{ClusterA: "cloud-prod", ClusterB: "cloud-stage", Winner: "b-cut"}}},
		"b-cut":     {PairsDecided: 1},
		"c-low":     {},
		"d-bad":     {Error: `spec.topology: "star" is not one of full-mesh, point-to-point, client-server`},
		"default":   {},
	}
	if !reflect.DeepEqual(res.Status, want) {
		t.Errorf("status:\n got %+v\nwant %+v", res.Status, want)
	}
	d, _ := res.Get("cloud-stage", "cloud-prod")
	if d.Connect || d.Policy != "b-cut" || !reflect.DeepEqual(d.Conflicts, []string{"a-connect"}) {
		t.Errorf("cloud pair: %+v", d)
	}
}

func TestStatusConflictsAreBounded(t *testing.T) {
	var clusters []Cluster
	for i := range 20 {
		clusters = append(clusters, Cluster{Name: fmt.Sprintf("c%02d", i)})
	}
	a := pol(t, "a", 0, "", "", "*", "", "", "vxlan")
	b := pol(t, "b", 0, "", "", "*", "", "", "ipsec")
	res := ResolveAll([]ClusterConnectionPolicy{a, b}, DefaultPolicy(""), clusters)
	st := res.Status["b"]
	if st.ConflictsLost != 190 || len(st.Conflicts) != MaxStatusConflicts || st.Conflicts[0] != (Conflict{ClusterA: "c00", ClusterB: "c01", Winner: "a"}) {
		t.Errorf("status %+v", st)
	}
}

func TestExplain(t *testing.T) {
	onPrem := pol(t, "on-prem", 3, "location=on-premise", "location=on-premise", "", TopologyPointToPoint, "", "vxlan")
	rival := pol(t, "all-ipsec", 3, "", "", "*", "", "", "ipsec")
	low := pol(t, "low", 1, "", "", "*", "", NoConnect, "")
	r := NewResolver([]ClusterConnectionPolicy{onPrem, rival, low}, DefaultPolicy(""))
	e := r.Explain(onpremStage, onpremProd)
	want := []Candidate{
		{Policy: "all-ipsec", Priority: 3, Connect: true, Driver: "ipsec", Outcome: "decided"},
		{Policy: "on-prem", Priority: 3, Connect: true, Driver: "vxlan", Outcome: "lost conflict"},
		{Policy: "low", Priority: 1, Outcome: "lower priority"},
	}
	if e.A != "onprem-prod" || e.Decision.Policy != "all-ipsec" || !reflect.DeepEqual(e.Candidates, want) {
		t.Errorf("explain: %+v", e)
	}
	if !e.Decision.Equal(r.Resolve(onpremProd, onpremStage)) {
		t.Errorf("Explain and Resolve disagree")
	}
	e = NewResolver(nil, DefaultPolicy("")).Explain(cloudProd, onpremProd)
	if !e.Decision.Default || len(e.Candidates) != 1 || e.Candidates[0].Policy != "default" {
		t.Errorf("explain with no policy: %+v", e)
	}
}

func TestAClusterIsNeverConnectedToItself(t *testing.T) {
	if d := Resolve(nil, DefaultPolicy(""), cloudProd, cloudProd); d.Connect {
		t.Errorf("got %+v", d)
	}
}

func TestAnInvalidDefaultConnectsNothing(t *testing.T) {
	def := DefaultPolicy("")
	def.Spec.Topology = "ring"
	res := ResolveAll(nil, def, seedMesh)
	for _, pd := range res.Pairs {
		if pd.Decision.Connect {
			t.Errorf("%s/%s connected: %+v", pd.A, pd.B, pd.Decision)
		}
	}
	if res.Status["default"].Error == "" {
		t.Errorf("the invalid default's status has no error")
	}
}

// TestResolveIsSymmetric is the property test: for random policies, labels
// and defaults, Resolve(a, b) == Resolve(b, a), ResolveAll agrees with
// Resolve, Explain agrees with Resolve, and a connected pair has a driver.
func TestResolveIsSymmetric(t *testing.T) {
	rng := rand.New(rand.NewPCG(4, 2))
	iterations := 300
	if testing.Short() {
		iterations = 30
	}
	for it := range iterations {
		policies := randomPolicies(rng, 1+rng.IntN(12))
		clusters := randomClusters(rng, 2+rng.IntN(10))
		def := DefaultPolicy([]string{"wireguard", "vxlan"}[rng.IntN(2)])
		if rng.IntN(3) == 0 {
			def = ClusterConnectionPolicy{Metadata: ObjectMeta{Name: "default"}, Spec: Spec{ClusterSelector: randomSelector(rng), ConnectionPolicy: NoConnect}}
		} else if rng.IntN(3) == 0 {
			def.Spec.ClusterSelector = randomSelector(rng)
		}
		r := NewResolver(policies, def)
		res := r.ResolveAll(clusters)
		for _, a := range clusters {
			for _, b := range clusters {
				if a.Name == b.Name {
					continue
				}
				ab, ba := r.Resolve(a, b), r.Resolve(b, a)
				if !ab.Equal(ba) {
					t.Fatalf("iteration %d: Resolve(%v, %v) = %+v, reversed %+v\npolicies %s", it, a, b, ab, ba, dump(policies))
				}
				if all, _ := res.Get(a.Name, b.Name); !all.Equal(ab) {
					t.Fatalf("iteration %d: ResolveAll(%v, %v) = %+v, Resolve %+v\npolicies %s", it, a, b, all, ab, dump(policies))
				}
				if e := r.Explain(b, a); !e.Decision.Equal(ab) {
					t.Fatalf("iteration %d: Explain %+v, Resolve %+v", it, e.Decision, ab)
				}
				if ab.Connect && (ab.Driver == "" || (ab.Initiator != a.Name && ab.Initiator != b.Name)) {
					t.Fatalf("iteration %d: connected without a driver or initiator: %+v", it, ab)
				}
			}
		}
	}
}

func dump(ps []ClusterConnectionPolicy) string {
	out, _ := EncodeYAML(ps)
	return string(out)
}

func randomClusters(rng *rand.Rand, n int) []Cluster {
	var cs []Cluster
	for i := range n {
		cs = append(cs, Cluster{Name: fmt.Sprintf("c%d", i), Labels: randomLabels(rng)})
	}
	rng.Shuffle(len(cs), func(i, j int) { cs[i], cs[j] = cs[j], cs[i] })
	return cs
}

func randomPolicies(rng *rand.Rand, n int) []ClusterConnectionPolicy {
	var ps []ClusterConnectionPolicy
	topos := []string{"", TopologyFullMesh, TopologyPointToPoint, TopologyClientServer}
	drivers := []string{"wireguard", "vxlan", "ipsec"}
	for i := range n {
		prio := rng.IntN(3)
		p := ClusterConnectionPolicy{Kind: Kind, Metadata: ObjectMeta{Name: fmt.Sprintf("p%d", rng.IntN(n+2))}, Spec: Spec{Priority: &prio}}
		if rng.IntN(2) == 0 {
			p.Spec.LeftClusterSelector = randomSelector(rng)
			if rng.IntN(4) > 0 {
				p.Spec.RightClusterSelector = randomSelector(rng)
			}
			p.Spec.Topology = topos[rng.IntN(len(topos))]
		} else {
			if rng.IntN(4) > 0 {
				p.Spec.ClusterSelector = randomSelector(rng)
			}
			p.Spec.Topology = topos[rng.IntN(3)]
		}
		switch rng.IntN(4) {
		case 0:
			p.Spec.ConnectionPolicy = NoConnect
		case 1:
			// connect with the default driver
		default:
			p.Spec.CableDriver = &CableDriver{Name: drivers[rng.IntN(len(drivers))]}
			if rng.IntN(2) == 0 {
				p.Spec.CableDriver.Options = map[string]string{"vni": fmt.Sprint(rng.IntN(2))}
			}
		}
		if rng.IntN(3) == 0 {
			p.Origin = fmt.Sprintf("c%d", rng.IntN(10))
		}
		p.Spec.Final = rng.IntN(6) == 0 // on a cluster's policy: ignored
		if rng.IntN(20) == 0 {
			p.Spec.Topology = "ring" // invalid: must cover nothing
		}
		_ = i
		ps = append(ps, p)
	}
	return ps
}
