package policy

import (
	"errors"
	"strings"
	"testing"
)

func clusterPol(t *testing.T, name string, labels map[string]string) ClusterConnectionPolicy {
	t.Helper()
	p := pol(t, name, 0, "", "", "*", "", Connect, "vxlan")
	p.Metadata.Labels = labels
	return p
}

func TestClusterScopedRefusesAPolicyWithoutTheOriginLabel(t *testing.T) {
	tests := []struct {
		name   string
		labels map[string]string
		want   string
	}{
		{"no labels at all", nil, MissingOriginLabelMessage},
		{"other labels only", map[string]string{"team": "net"}, MissingOriginLabelMessage},
		{"the label with another value", map[string]string{LabelOrigin: "zone"}, `"zone" is not "cluster"`},
		{"the label naming another cluster", map[string]string{LabelOrigin: OriginClusterLabel, LabelCluster: "b"}, `"b" is not this cluster`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ClusterScoped(clusterPol(t, "p", tt.labels), "a")
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want one containing %q", err, tt.want)
			}
			var fe *FieldError
			if !errors.As(err, &fe) || !strings.HasPrefix(fe.Field, "metadata.labels") {
				t.Errorf("err %v does not name the labels field", err)
			}
		})
	}
}

func TestClusterScopedNamesAndLabelsTheSyncedCopy(t *testing.T) {
	in := clusterPol(t, "to-b", map[string]string{LabelOrigin: OriginClusterLabel, "team": "net"})
	out, err := ClusterScoped(in, "a")
	if err != nil {
		t.Fatal(err)
	}
	if want := ClusterPolicyName("to-b", "a"); out.Metadata.Name != want || !strings.HasPrefix(want, "to-b-") || len(want) != len("to-b-")+clusterHashLen {
		t.Errorf("name %q, want %q of the form to-b-<%d hex>", out.Metadata.Name, want, clusterHashLen)
	}
	if out.Origin != "a" || out.Metadata.Labels[LabelCluster] != "a" || out.Metadata.Labels["team"] != "net" {
		t.Errorf("origin %q labels %v", out.Origin, out.Metadata.Labels)
	}
	if in.Metadata.Name != "to-b" || in.Metadata.Labels[LabelCluster] != "" {
		t.Errorf("input changed: %+v", in.Metadata)
	}
	if err := CheckSyncedClusterPolicy(out, "a"); err != nil {
		t.Errorf("the synced copy fails the broker's check: %v", err)
	}
	if err := out.Validate(); err != nil {
		t.Errorf("the synced copy is invalid: %v", err)
	}
}

func TestClusterPolicyNameIsStableAndPerCluster(t *testing.T) {
	// A fixed value: the name must not change between releases, or every agent would
	// re-create its cluster's policies under new names after an upgrade.
	if got := ClusterPolicyName("to-b", "a"); got != ClusterPolicyName("to-b", "a") || got != "to-b-"+fixedHash(t) {
		t.Errorf("ClusterPolicyName(to-b, a) = %q", got)
	}
	if ClusterPolicyName("to-b", "a") == ClusterPolicyName("to-b", "b") {
		t.Error("two clusters' policies of one name collide")
	}
	if !IsClusterPolicyName(ClusterPolicyName("x-y", "a"), "a") {
		t.Error("a name with a dash is not recognised")
	}
	for _, bad := range []string{"to-b", ClusterPolicyName("to-b", "b"), "-" + fixedHash(t), ""} {
		if IsClusterPolicyName(bad, "a") {
			t.Errorf("%q taken for a name of cluster a's policies", bad)
		}
	}
}

// fixedHash is the first 10 hex digits of sha256("a/to-b"), computed once by hand with
// `printf a/to-b | sha256sum`.
func fixedHash(t *testing.T) string {
	t.Helper()
	return "980586133b"
}

func TestClusterScopedRefusesANameTooLongToSync(t *testing.T) {
	long := strings.Repeat("n", MaxClusterPolicyNameLen+1)
	_, err := ClusterScoped(clusterPol(t, long, map[string]string{LabelOrigin: OriginClusterLabel}), "a")
	if err == nil || !strings.Contains(err.Error(), "metadata.name") {
		t.Fatalf("err %v", err)
	}
	ok := strings.Repeat("n", MaxClusterPolicyNameLen)
	out, err := ClusterScoped(clusterPol(t, ok, map[string]string{LabelOrigin: OriginClusterLabel}), "a")
	if err != nil || len(out.Metadata.Name) != 63 {
		t.Fatalf("%d-character name: %v, synced %q", len(ok), err, out.Metadata.Name)
	}
}

func TestCheckSyncedClusterPolicyRefusesWhatANodeMayNotWrite(t *testing.T) {
	good, err := ClusterScoped(clusterPol(t, "p", map[string]string{LabelOrigin: OriginClusterLabel}), "a")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		edit  func(p *ClusterConnectionPolicy)
		field string
	}{
		{"a mesh policy", func(p *ClusterConnectionPolicy) { delete(p.Metadata.Labels, LabelOrigin) }, "metadata.labels." + LabelOrigin},
		{"another cluster's label", func(p *ClusterConnectionPolicy) { p.Metadata.Labels[LabelCluster] = "b" }, "metadata.labels." + LabelCluster},
		{"another cluster's origin", func(p *ClusterConnectionPolicy) { p.Origin = "b" }, "origin"},
		{"a name without the hash", func(p *ClusterConnectionPolicy) { p.Metadata.Name = "p" }, "metadata.name"},
		{"another cluster's name", func(p *ClusterConnectionPolicy) { p.Metadata.Name = ClusterPolicyName("p", "b") }, "metadata.name"},
		{"a final policy", func(p *ClusterConnectionPolicy) { p.Spec.Final = true }, "spec.final"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := good.DeepCopy()
			tt.edit(&p)
			err := CheckSyncedClusterPolicy(p, "a")
			var fe *FieldError
			if !errors.As(err, &fe) || fe.Field != tt.field {
				t.Fatalf("err %v, want one naming %s", err, tt.field)
			}
		})
	}
}

func TestMeshPolicyBeatsClusterPolicyOfEqualPriority(t *testing.T) {
	clusters := []Cluster{{Name: "a"}, {Name: "b"}, {Name: "c"}}
	mesh := pol(t, "zz-mesh", 5, "", "", "*", "", Connect, "wireguard")
	// The cluster policy's name sorts first and it says no-connect: without the origin rank it
	// would win both tie-breaks (no-connect beats connect, then the smaller name).
	local := pol(t, "aa-local", 5, "", "", "*", "", NoConnect, "")
	local.Origin = "a"
	higher := pol(t, "aa-higher", 6, "", "", "*", "", Connect, "vxlan")
	higher.Origin = "a"

	tests := []struct {
		name     string
		policies []ClusterConnectionPolicy
		pair     [2]string
		want     Decision
	}{
		{"equal priority: the mesh policy decides the cluster's pair", []ClusterConnectionPolicy{local, mesh}, [2]string{"a", "b"},
			Decision{Connect: true, Driver: "wireguard", Policy: "zz-mesh"}},
		{"higher priority: the cluster policy decides its pair", []ClusterConnectionPolicy{local, mesh, higher}, [2]string{"a", "b"},
			Decision{Connect: true, Driver: "vxlan", Policy: "aa-higher"}},
		{"without a mesh policy at its priority the cluster policy decides", []ClusterConnectionPolicy{local}, [2]string{"a", "c"},
			Decision{Connect: false, Policy: "aa-local"}},
		{"a pair without the cluster is not the cluster policy's", []ClusterConnectionPolicy{local, higher}, [2]string{"b", "c"},
			Decision{Connect: true, Driver: "wireguard", Policy: DefaultPolicyName, Default: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := ResolveAll(tt.policies, DefaultPolicy("wireguard"), clusters)
			got, _ := res.Get(tt.pair[0], tt.pair[1])
			single := Resolve(tt.policies, DefaultPolicy("wireguard"), Cluster{Name: tt.pair[1]}, Cluster{Name: tt.pair[0]})
			if !single.Equal(got) {
				t.Errorf("Resolve %+v, ResolveAll %+v", single, got)
			}
			if got.Connect != tt.want.Connect || got.Driver != tt.want.Driver || got.Policy != tt.want.Policy || got.Default != tt.want.Default {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
	e := NewResolver([]ClusterConnectionPolicy{local, mesh}, DefaultPolicy("")).Explain(Cluster{Name: "a"}, Cluster{Name: "b"})
	var outcomes []string
	for _, c := range e.Candidates {
		outcomes = append(outcomes, c.Policy+"="+c.Outcome)
	}
	if got := strings.Join(outcomes, ","); got != "zz-mesh=decided,aa-local=mesh policy of equal priority wins" {
		t.Errorf("explain candidates: %s", got)
	}
}

// FuzzClusterScoped: for any name and cluster, ClusterScoped either refuses or gives a valid
// policy that the broker's check accepts for that cluster and no other.
func FuzzClusterScoped(f *testing.F) {
	f.Add("to-b", "a")
	f.Add("x-"+strings.Repeat("y", 60), "cluster-1")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, name, cluster string) {
		p := ClusterConnectionPolicy{Kind: Kind, Metadata: ObjectMeta{Name: name, Labels: map[string]string{LabelOrigin: OriginClusterLabel}}}
		out, err := ClusterScoped(p, cluster)
		if err != nil {
			return
		}
		if err := out.Validate(); err != nil {
			t.Fatalf("ClusterScoped(%q, %q) gave an invalid policy: %v", name, cluster, err)
		}
		if err := CheckSyncedClusterPolicy(out, cluster); err != nil {
			t.Fatalf("ClusterScoped(%q, %q) gave %q the check refuses: %v", name, cluster, out.Metadata.Name, err)
		}
		if IsClusterPolicyName(out.Metadata.Name, cluster+"x") {
			t.Fatalf("%q is also a name of cluster %q", out.Metadata.Name, cluster+"x")
		}
	})
}

func TestClusterScopedRefusesAFinalPolicy(t *testing.T) {
	p := clusterPol(t, "p", map[string]string{LabelOrigin: OriginClusterLabel})
	p.Spec.Final = true
	_, err := ClusterScoped(p, "a")
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "spec.final" || !strings.Contains(err.Error(), "mesh policies only") {
		t.Fatalf("err %v, want one naming spec.final", err)
	}
}
