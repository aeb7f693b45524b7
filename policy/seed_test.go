package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The four clusters of the proposal's picture: two on-premise, two in the cloud,
// one of each in production and in staging.
var (
	onpremProd  = Cluster{Name: "onprem-prod", Labels: map[string]string{"location": "on-premise", "env": "production"}}
	onpremStage = Cluster{Name: "onprem-stage", Labels: map[string]string{"location": "on-premise", "env": "staging"}}
	cloudProd   = Cluster{Name: "cloud-prod", Labels: map[string]string{"location": "cloud", "env": "production"}}
	cloudStage  = Cluster{Name: "cloud-stage", Labels: map[string]string{"location": "cloud", "env": "staging"}}
	seedMesh    = []Cluster{onpremProd, onpremStage, cloudProd, cloudStage}
)

// Clusters for the proposal's database examples.
var (
	dbServer  = Cluster{Name: "db-server", Labels: map[string]string{"database-role": "server", "database-server": "true"}}
	dbServer2 = Cluster{Name: "db-server2", Labels: map[string]string{"database-role": "server", "database-server": "true"}}
	clientA   = Cluster{Name: "client-a", Labels: map[string]string{"database-role": "client"}}
	clientB   = Cluster{Name: "client-b", Labels: map[string]string{"database-role": "client"}}
	zzClient  = Cluster{Name: "zz-client", Labels: map[string]string{"database-role": "client"}}
	bystander = Cluster{Name: "bystander", Labels: map[string]string{"location": "cloud"}}
	dbMesh    = []Cluster{dbServer, dbServer2, clientA, clientB, bystander}
)

// seedPolicy decodes one of the examples of Submariner's connectivity proposal, exactly as the proposal writes
// it (testdata/seed004 holds verbatim copies of its yaml blocks).
func seedPolicy(t *testing.T, file string) ClusterConnectionPolicy {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("testdata", "seed004", file))
	if err != nil {
		t.Fatal(err)
	}
	ps, err := DecodeYAML(data)
	if err != nil {
		t.Fatalf("decode %s: %v", file, err)
	}
	if len(ps) != 1 {
		t.Fatalf("decode %s: got %d policies, want 1", file, len(ps))
	}
	return ps[0]
}

// render is a decision in a compact form: "-" (not connected), "driver" or
// "driver<initiator" (connected, initiated by that cluster), then "@policy",
// "*" when the default decided, and " lost:..." for the conflicts.
func render(d Decision, a, b string) string {
	var s string
	switch {
	case !d.Connect:
		s = "-"
	case d.Initiator == min(a, b):
		s = d.Driver
	default:
		s = d.Driver + "<" + d.Initiator
	}
	s += "@" + d.Policy
	if d.Default {
		s += "*"
	}
	if len(d.Conflicts) > 0 {
		s += " lost:" + strings.Join(d.Conflicts, ",")
	}
	return s
}

func TestSeed004Examples(t *testing.T) {
	var (
		defaultConnect   = seedPolicy(t, "01-default-connect.yaml")
		defaultNoConnect = seedPolicy(t, "02-default-no-connect.yaml")
		onPrem           = seedPolicy(t, "03-on-prem.yaml")
		onPremToCloud    = seedPolicy(t, "04-on-prem-to-cloud.yaml")
		cloudDefault     = seedPolicy(t, "05-cloud-a-default.yaml")
		noConnect        = seedPolicy(t, "06-on-prem-to-cloud-no-connect.yaml")
		clientServer     = seedPolicy(t, "07-client-server-policy.yaml")
		clientServerAny  = seedPolicy(t, "08-client-server-any.yaml")
		builtin          = DefaultPolicy("")
		allIPsec         = mustDecode(t, `kind: ClusterConnectionPolicy
metadata: {name: all-ipsec}
spec: {topology: full-mesh, cableDriver: {name: ipsec}, priority: 3}`)
		notProduction = mustDecode(t, `kind: ClusterConnectionPolicy
metadata: {name: not-production}
spec:
  clusterSelector:
    env: !production
  cableDriver: {name: vxlan}
  priority: 3`)
	)
	tests := []struct {
		name     string
		policies []ClusterConnectionPolicy
		def      ClusterConnectionPolicy
		clusters []Cluster
		want     map[[2]string]string // by pair, names in order
	}{
		{
			name: "the seed's connect default connects every pair over ipsec",
			def:  defaultConnect, clusters: seedMesh,
			want: allPairs(seedMesh, "ipsec@public-internet*"),
		},
		{
			name:     "the seed's connect default given as an ordinary policy decides every pair itself",
			policies: []ClusterConnectionPolicy{defaultConnect}, def: builtin, clusters: seedMesh,
			want: allPairs(seedMesh, "ipsec@public-internet"),
		},
		{
			name: "the seed's no-connect default connects nothing",
			def:  defaultNoConnect, clusters: seedMesh,
			want: allPairs(seedMesh, "-@public-internet*"),
		},
		{
			name:     "on-prem alone joins the two on-premise clusters over vxlan and leaves the rest to the default",
			policies: []ClusterConnectionPolicy{onPrem}, def: builtin, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "wireguard@default*"), "onprem-prod", "onprem-stage", "vxlan@on-prem"),
		},
		{
			name:     "on-prem-to-cloud alone joins the two production clusters over ipsec",
			policies: []ClusterConnectionPolicy{onPremToCloud}, def: builtin, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "wireguard@default*"), "cloud-prod", "onprem-prod", "ipsec@on-prem-to-cloud"),
		},
		{
			name:     "cloud-a-default alone meshes the cloud clusters over vxlan",
			policies: []ClusterConnectionPolicy{cloudDefault}, def: builtin, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "wireguard@default*"), "cloud-prod", "cloud-stage", "vxlan@cloud-a-default"),
		},
		{
			name:     "the three policies of the picture give each pair its cable and the rest falls to the default",
			policies: []ClusterConnectionPolicy{onPrem, onPremToCloud, cloudDefault}, def: builtin, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "wireguard@default*"),
				"onprem-prod", "onprem-stage", "vxlan@on-prem",
				"cloud-prod", "onprem-prod", "ipsec@on-prem-to-cloud",
				"cloud-prod", "cloud-stage", "vxlan@cloud-a-default"),
		},
		{
			name:     "the three policies of the picture under a no-connect default leave the other pairs apart",
			policies: []ClusterConnectionPolicy{onPrem, onPremToCloud, cloudDefault}, def: defaultNoConnect, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "-@public-internet*"),
				"onprem-prod", "onprem-stage", "vxlan@on-prem",
				"cloud-prod", "onprem-prod", "ipsec@on-prem-to-cloud",
				"cloud-prod", "cloud-stage", "vxlan@cloud-a-default"),
		},
		{
			name:     "on-prem-to-cloud-no-connect keeps the production clusters apart",
			policies: []ClusterConnectionPolicy{noConnect}, def: builtin, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "wireguard@default*"), "cloud-prod", "onprem-prod", "-@on-prem-to-cloud-no-connect"),
		},
		{
			name:     "no-connect beats connect at equal priority and the loser is reported",
			policies: []ClusterConnectionPolicy{onPremToCloud, noConnect}, def: builtin, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "wireguard@default*"),
				"cloud-prod", "onprem-prod", "-@on-prem-to-cloud-no-connect lost:on-prem-to-cloud"),
		},
		{
			name:     "between two connect policies of equal priority the smaller name wins and the other is reported",
			policies: []ClusterConnectionPolicy{onPrem, allIPsec}, def: builtin, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "ipsec@all-ipsec"), "onprem-prod", "onprem-stage", "ipsec@all-ipsec lost:on-prem"),
		},
		{
			name:     "a higher priority decides without a conflict",
			policies: []ClusterConnectionPolicy{onPrem, withPriority(allIPsec, 5)}, def: builtin, clusters: seedMesh,
			want: allPairs(seedMesh, "ipsec@all-ipsec"),
		},
		{
			name:     "policies of equal priority that agree do not conflict",
			policies: []ClusterConnectionPolicy{withName(onPrem, "on-prem-again"), onPrem}, def: builtin, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "wireguard@default*"), "onprem-prod", "onprem-stage", "vxlan@on-prem"),
		},
		{
			name:     "env: !production selects the clusters that are not in production",
			policies: []ClusterConnectionPolicy{notProduction}, def: builtin, clusters: seedMesh,
			want: withPairs(allPairs(seedMesh, "wireguard@default*"), "cloud-stage", "onprem-stage", "vxlan@not-production"),
		},
		{
			name:     "client-server connects servers with clients, client dialing, and nothing else it covers",
			policies: []ClusterConnectionPolicy{clientServer}, def: builtin, clusters: dbMesh,
			want: withPairs(allPairs(dbMesh, "wireguard@default*"),
				"client-a", "db-server", "vxlan@client-server-policy", // client-a < db-server: it initiates
				"client-a", "db-server2", "vxlan@client-server-policy",
				"client-b", "db-server", "vxlan@client-server-policy",
				"client-b", "db-server2", "vxlan@client-server-policy",
				"client-a", "client-b", "-@client-server-policy",
				"db-server", "db-server2", "-@client-server-policy"),
		},
		{
			name:     "client-server with an empty client selector lets every cluster reach the servers and no one else",
			policies: []ClusterConnectionPolicy{clientServerAny}, def: builtin, clusters: dbMesh,
			want: withPairs(allPairs(dbMesh, "-@client-server-policy"),
				"bystander", "db-server", "vxlan@client-server-policy",
				"bystander", "db-server2", "vxlan@client-server-policy",
				"client-a", "db-server", "vxlan@client-server-policy",
				"client-a", "db-server2", "vxlan@client-server-policy",
				"client-b", "db-server", "vxlan@client-server-policy",
				"client-b", "db-server2", "vxlan@client-server-policy",
				"db-server", "db-server2", "vxlan@client-server-policy"),
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewResolver(tt.policies, tt.def)
			all := r.ResolveAll(tt.clusters)
			if len(all.Pairs) != len(tt.want) {
				t.Errorf("ResolveAll gave %d pairs, want %d", len(all.Pairs), len(tt.want))
			}
			for _, a := range tt.clusters {
				for _, b := range tt.clusters {
					if a.Name >= b.Name {
						continue
					}
					w := tt.want[[2]string{a.Name, b.Name}]
					ab, ba := r.Resolve(a, b), r.Resolve(b, a)
					if got := render(ab, a.Name, b.Name); got != w {
						t.Errorf("Resolve(%s, %s) = %s, want %s", a.Name, b.Name, got, w)
					}
					if !ab.Equal(ba) {
						t.Errorf("Resolve(%s, %s) = %+v but Resolve(%s, %s) = %+v", a.Name, b.Name, ab, b.Name, a.Name, ba)
					}
					if got, ok := all.Get(b.Name, a.Name); !ok || !got.Equal(ab) {
						t.Errorf("ResolveAll(%s, %s) = %+v, Resolve = %+v", a.Name, b.Name, got, ab)
					}
				}
			}
		})
	}
}

func TestSeed004ClientServerInitiator(t *testing.T) {
	cs := seedPolicy(t, "07-client-server-policy.yaml")
	csAny := seedPolicy(t, "08-client-server-any.yaml")
	tests := []struct {
		name   string
		policy ClusterConnectionPolicy
		a, b   Cluster
		want   string
	}{
		{"the client dials the server whatever the argument order", cs, dbServer, clientB, "client-b"},
		{"the client dials the server when its name sorts first", cs, clientA, dbServer, "client-a"},
		{"the client dials the server when its name sorts last", cs, dbServer, zzClient, "zz-client"},
		{"a cluster with no role dials a server under the empty client selector", csAny, bystander, dbServer2, "bystander"},
		{"between two servers that are also clients the smaller name dials", csAny, dbServer2, dbServer, "db-server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := Resolve([]ClusterConnectionPolicy{tt.policy}, DefaultPolicy(""), tt.a, tt.b)
			if !d.Connect || d.Initiator != tt.want {
				t.Errorf("got %+v, want connected with initiator %s", d, tt.want)
			}
		})
	}
}

func TestSeed004KindsBothDecode(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "seed004", "*.yaml"))
	if err != nil || len(files) != 8 {
		t.Fatalf("want the 8 examples of seed 004, got %d (%v)", len(files), err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		singular := strings.Replace(string(data), "kind: ClusterConnectionPolicies", "kind: ClusterConnectionPolicy", 1)
		if singular == string(data) {
			t.Fatalf("%s: does not say kind: ClusterConnectionPolicies", f)
		}
		for _, text := range []string{string(data), singular} {
			ps, warnings, err := DecodeYAMLWithWarnings([]byte(text))
			if err != nil {
				t.Errorf("%s: %v", f, err)
				continue
			}
			if ps[0].Kind != Kind || ps[0].EffectivePriority() != 0 && ps[0].EffectivePriority() != 3 {
				t.Errorf("%s: kind %q priority %d", f, ps[0].Kind, ps[0].EffectivePriority())
			}
			// Only the two client-server examples are mis-indented.
			if mis := strings.Contains(f, "client-server"); mis != (len(warnings) == 1) {
				t.Errorf("%s: warnings %q", f, warnings)
			}
		}
	}
	// All eight in one multi-document file, with unique names.
	var docs []string
	for i, f := range files {
		data, _ := os.ReadFile(f)
		docs = append(docs, strings.Replace(string(data), "name: ", "name: n"+string(rune('a'+i))+"-", 1))
	}
	ps, err := DecodeYAML([]byte(strings.Join(docs, "---\n")))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 8 {
		t.Fatalf("got %d policies from the multi-document file, want 8", len(ps))
	}
	for _, p := range ps {
		if p.Spec.CableDriver != nil && p.Spec.CableDriver.Name == "vxlan" && strings.Contains(p.Metadata.Name, "client-server") && p.EffectivePriority() != 3 {
			t.Errorf("%s: the mis-indented priority was lost", p.Metadata.Name)
		}
	}
}

func allPairs(cs []Cluster, d string) map[[2]string]string {
	m := map[[2]string]string{}
	for _, a := range cs {
		for _, b := range cs {
			if a.Name < b.Name {
				m[[2]string{a.Name, b.Name}] = d
			}
		}
	}
	return m
}

func withPairs(m map[[2]string]string, kv ...string) map[[2]string]string {
	for i := 0; i+2 < len(kv); i += 3 {
		a, b := kv[i], kv[i+1]
		if a > b {
			a, b = b, a
		}
		if _, ok := m[[2]string{a, b}]; !ok {
			panic("no pair " + a + "/" + b)
		}
		m[[2]string{a, b}] = kv[i+2]
	}
	return m
}

func mustDecode(t *testing.T, text string) ClusterConnectionPolicy {
	t.Helper()
	ps, err := DecodeYAML([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return ps[0]
}

func withPriority(p ClusterConnectionPolicy, prio int) ClusterConnectionPolicy {
	p = p.DeepCopy()
	p.Spec.Priority = &prio
	return p
}

func withName(p ClusterConnectionPolicy, name string) ClusterConnectionPolicy {
	p = p.DeepCopy()
	p.Metadata.Name = name
	return p
}
