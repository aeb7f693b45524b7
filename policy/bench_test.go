package policy

import (
	"fmt"
	"math/rand/v2"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// benchMesh builds 255 clusters (the most a mesh can hold: IDs 1..255) and
// 1,000 policies over a realistic label vocabulary: most policies select
// a location, an env, a zone or a team, with a few set-based expressions.
func benchMesh(rng *rand.Rand) ([]Cluster, []ClusterConnectionPolicy) {
	var (
		locations = []string{"on-premise", "cloud", "edge", "colo"}
		envs      = []string{"production", "staging", "dev"}
		tiers     = []string{"gold", "silver", "bronze"}
	)
	zone := func() string { return fmt.Sprintf("zone-%d", rng.IntN(16)) }
	team := func() string { return fmt.Sprintf("team-%d", rng.IntN(40)) }
	clusters := make([]Cluster, 255)
	for i := range clusters {
		clusters[i] = Cluster{Name: fmt.Sprintf("cluster-%03d", i), Labels: map[string]string{
			"location": locations[rng.IntN(len(locations))],
			"env":      envs[rng.IntN(len(envs))],
			"tier":     tiers[rng.IntN(len(tiers))],
			"zone":     zone(),
			"team":     team(),
		}}
		if rng.IntN(10) == 0 {
			clusters[i].Labels["database-role"] = []string{"server", "client"}[rng.IntN(2)]
		}
	}
	sel := func() *Selector {
		s := &Selector{MatchLabels: map[string]string{}}
		switch rng.IntN(6) {
		case 0:
			s.MatchLabels["location"] = locations[rng.IntN(len(locations))]
		case 1:
			s.MatchLabels["zone"] = zone()
		case 2:
			s.MatchLabels["team"] = team()
			s.MatchLabels["env"] = envs[rng.IntN(len(envs))]
		case 3:
			s.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"gold", "silver"}}}
			s.MatchLabels["zone"] = zone()
		case 4:
			s.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"production"}}}
			s.MatchLabels["team"] = team()
		default:
			s.MatchLabels["database-role"] = "server"
		}
		return s
	}
	drivers := []string{"wireguard", "vxlan", "ipsec"}
	topos := []string{TopologyPointToPoint, TopologyFullMesh, TopologyClientServer}
	policies := make([]ClusterConnectionPolicy, 1000)
	for i := range policies {
		prio := rng.IntN(10)
		p := ClusterConnectionPolicy{Kind: Kind, Metadata: ObjectMeta{Name: fmt.Sprintf("policy-%04d", i)}, Spec: Spec{Priority: &prio}}
		if rng.IntN(2) == 0 {
			p.Spec.LeftClusterSelector, p.Spec.RightClusterSelector = sel(), sel()
			p.Spec.Topology = topos[rng.IntN(len(topos))]
		} else {
			p.Spec.ClusterSelector = sel()
		}
		if rng.IntN(5) == 0 {
			p.Spec.ConnectionPolicy = NoConnect
		} else {
			p.Spec.CableDriver = &CableDriver{Name: drivers[rng.IntN(len(drivers))]}
		}
		policies[i] = p
	}
	return clusters, policies
}

// BenchmarkResolveAll255x255x1000 resolves every pair of 255 clusters
// (32,385 pairs) over 1,000 policies, compiling the policies included.
func BenchmarkResolveAll255x255x1000(b *testing.B) {
	clusters, policies := benchMesh(rand.New(rand.NewPCG(255, 1000)))
	def := DefaultPolicy("")
	res := ResolveAll(policies, def, clusters)
	var decided, connected, conflicts, byDefault int
	for _, pd := range res.Pairs {
		if pd.Decision.Default {
			byDefault++
		} else {
			decided++
		}
		if pd.Decision.Connect {
			connected++
		}
		if len(pd.Decision.Conflicts) > 0 {
			conflicts++
		}
	}
	b.Logf("%d pairs: %d by a policy, %d by the default, %d connected, %d with conflicts", len(res.Pairs), decided, byDefault, connected, conflicts)
	b.ResetTimer()
	for b.Loop() {
		ResolveAll(policies, def, clusters)
	}
}

// BenchmarkResolveOnePair is an agent asking about one pair with a
// Resolver already built.
func BenchmarkResolveOnePair(b *testing.B) {
	clusters, policies := benchMesh(rand.New(rand.NewPCG(255, 1000)))
	r := NewResolver(policies, DefaultPolicy(""))
	i := 0
	for b.Loop() {
		r.Resolve(clusters[i%255], clusters[(i*7+1)%255])
		i++
	}
}

func TestResolveAllAgreesWithResolveOnTheBenchmarkMesh(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: 32,385 pairs resolved one by one")
	}
	clusters, policies := benchMesh(rand.New(rand.NewPCG(255, 1000)))
	r := NewResolver(policies, DefaultPolicy(""))
	res := r.ResolveAll(clusters)
	for _, pd := range res.Pairs {
		if d := r.Resolve(byNameIn(clusters, pd.B), byNameIn(clusters, pd.A)); !d.Equal(pd.Decision) {
			t.Fatalf("%s/%s: ResolveAll %+v, Resolve %+v", pd.A, pd.B, pd.Decision, d)
		}
	}
}

func byNameIn(cs []Cluster, name string) Cluster {
	for _, c := range cs {
		if c.Name == name {
			return c
		}
	}
	panic(name)
}
