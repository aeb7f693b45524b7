package admission

import (
	"encoding/json"
	"strings"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/policy"
)

func apiPolicy(t *testing.T, name, js string) *apiv1.Policy {
	t.Helper()
	return &apiv1.Policy{Name: name, Json: []byte(js)}
}

const onPrem = `{"kind":"ClusterConnectionPolicy","metadata":{"name":"on-prem"},"spec":{"clusterSelector":{"location":"on-premise"},"cableDriver":{"name":"vxlan"},"priority":3}}`

func TestParsePoliciesRefusesTheWholeRequestNamingEveryProblem(t *testing.T) {
	good := apiPolicy(t, "on-prem", onPrem)
	tests := []struct {
		name      string
		in        []*apiv1.Policy
		fragments []string
	}{
		{"an empty request", nil, []string{"no policies to apply"}},
		{"an unknown topology", []*apiv1.Policy{good, apiPolicy(t, "bad", `{"kind":"ClusterConnectionPolicy","metadata":{"name":"bad"},"spec":{"topology":"star"}}`)},
			[]string{"nothing applied: ", `policy "bad"`, "spec.topology", `"star"`}},
		{"an unknown field", []*apiv1.Policy{apiPolicy(t, "x", `{"metadata":{"name":"x"},"spec":{"colour":"red"}}`)}, []string{`policy "x"`, `unknown field "colour"`}},
		{"a name that differs from metadata.name", []*apiv1.Policy{apiPolicy(t, "x", `{"metadata":{"name":"y"},"spec":{}}`)}, []string{`metadata.name "y" differs from the name "x"`}},
		{"two policies of one name", []*apiv1.Policy{good, good}, []string{`policy "on-prem": metadata.name "on-prem" is also the name of policy 1`}},
		{"no JSON and no name", []*apiv1.Policy{{}}, []string{"policy 1 (no name): json is empty"}},
		{"trailing data", []*apiv1.Policy{apiPolicy(t, "x", `{"metadata":{"name":"x"}} {}`)}, []string{"json: data after the policy object"}},
		{"two bad policies", []*apiv1.Policy{apiPolicy(t, "a", `{`), apiPolicy(t, "b", `{"metadata":{"name":"c"}}`)}, []string{`policy "a": json: `, `; policy "b": metadata.name "c"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			_, err := ParsePolicies(tt.in)
			wantErr[*InvalidError](t, err, tt.fragments...)
		})
	}
	ps, err := ParsePolicies([]*apiv1.Policy{good})
	if err != nil || len(ps) != 1 || ps[0].Policy.Origin != policy.OriginMesh || ps[0].Policy.APIVersion != policy.APIVersion || !strings.Contains(string(ps[0].JSON), `"origin":"mesh"`) {
		t.Fatalf("a good policy: %+v %v; want it canonical with origin mesh", ps, err)
	}
}

func TestPlanApply(t *testing.T) {
	canon := func(js string) Canonical {
		ps, err := ParsePolicies([]*apiv1.Policy{apiPolicy(t, nameOf(t, js), js)})
		if err != nil {
			t.Fatal(err)
		}
		return ps[0]
	}
	stored := func(c Canonical, rev uint64, isDefault bool) *apiv1.Policy {
		return &apiv1.Policy{Name: c.Policy.Metadata.Name, Json: c.JSON, Revision: rev, IsDefault: isDefault}
	}
	p := canon(onPrem)
	p4 := canon(strings.Replace(onPrem, `"priority":3`, `"priority":4`, 1))
	// What an older broker might have stored: the same policy, spelled otherwise.
	oldSpelling := &apiv1.Policy{Name: "on-prem", Revision: 6,
		Json: []byte(`{"kind":"ClusterConnectionPolicies","metadata":{"name":"on-prem"},"spec":{"clusterSelector":{"matchLabels":{"location":"on-premise"}},"topology":"","cableDriver":{"name":"vxlan"},"priority":3},"origin":"mesh"}`)}
	def := canon(`{"metadata":{"name":"default"},"spec":{"cableDriver":{"name":"ipsec"}}}`)

	tests := []struct {
		name    string
		apply   Canonical
		stored  []*apiv1.Policy
		outcome string
		wantRev uint64
		isDef   bool
	}{
		{"a new policy is created", p, nil, OutcomeCreated, 0, false},
		{"the same policy is unchanged and keeps its record", p, []*apiv1.Policy{stored(p, 6, false)}, OutcomeUnchanged, 6, false},
		{"the same policy stored in an older spelling is unchanged", p, []*apiv1.Policy{oldSpelling}, OutcomeUnchanged, 6, false},
		{"a changed policy is configured over the revision it replaces", p4, []*apiv1.Policy{stored(p, 6, false)}, OutcomeConfigured, 6, false},
		{"the default policy stays the default", def, []*apiv1.Policy{{Name: "default", Json: []byte(`{"metadata":{"name":"default"},"spec":{}}`), IsDefault: true, Revision: 1}}, OutcomeConfigured, 1, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := PlanApply([]Canonical{tt.apply}, tt.stored)
			if err != nil || len(got) != 1 {
				t.Fatalf("plan: %v %v", got, err)
			}
			if got[0].Outcome != tt.outcome || got[0].Policy.Revision != tt.wantRev || got[0].Policy.IsDefault != tt.isDef {
				t.Fatalf("got %s %v; want %s at revision %d (default %v)", got[0].Outcome, got[0].Policy, tt.outcome, tt.wantRev, tt.isDef)
			}
			if tt.outcome == OutcomeUnchanged && got[0].Policy != tt.stored[0] {
				t.Fatal("an unchanged policy does not report the stored record")
			}
		})
	}
	if _, err := PlanApply([]Canonical{p}, []*apiv1.Policy{{Name: "on-prem", Json: []byte("{")}}); err == nil || !strings.Contains(err.Error(), `stored policy "on-prem"`) {
		t.Fatalf("a corrupt stored policy: %v", err)
	}
}

func nameOf(t *testing.T, js string) string {
	t.Helper()
	var p struct {
		Metadata struct{ Name string } `json:"metadata"`
	}
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatal(err)
	}
	return p.Metadata.Name
}

func TestDeletingPolicies(t *testing.T) {
	names, err := ParseDeleteNames([]string{"a", "b", "a"})
	if err != nil || strings.Join(names, ",") != "a,b" {
		t.Fatalf("names %v %v, want a,b", names, err)
	}
	_, err = ParseDeleteNames(nil)
	wantErr[*InvalidError](t, err, "no policy names to delete")
	_, err = ParseDeleteNames([]string{"a", ""})
	wantErr[*InvalidError](t, err, "a policy name is empty")
	_, err = ParseDeleteNames([]string{"a", "default"})
	if e := wantErr[*ProtectedError](t, err, `policy "default" is the mesh default policy and cannot be deleted`, "nothing deleted"); e.Name != "default" {
		t.Fatalf("protected %+v", e)
	}

	stored := []*apiv1.Policy{{Name: "default"}, {Name: "on-prem"}}
	if err := CheckPoliciesExist([]string{"on-prem"}, stored); err != nil {
		t.Fatal(err)
	}
	err = CheckPoliciesExist([]string{"on-prem", "nope", "gone"}, stored)
	if e := wantErr[*NotFoundError](t, err, `policy "nope", "gone" not found; nothing deleted`); strings.Join(e.Names, ",") != "nope,gone" {
		t.Fatalf("not found %+v", e)
	}
}

func TestExplainRequests(t *testing.T) {
	tests := []struct {
		name     string
		a, b     string
		field    string
		fragment string
	}{
		{"a bad first name", "A", "b", "cluster_a", `cluster name "A"`},
		{"a bad second name", "a", "b_", "cluster_b", `cluster name "b_"`},
		{"a cluster with itself", "a", "a", "cluster_b", `cluster_a and cluster_b are both "a": a cluster does not connect to itself`},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			err := CheckExplainRequest(&apiv1.ExplainConnectionRequest{ClusterA: tt.a, ClusterB: tt.b})
			if e := wantErr[*InvalidError](t, err, tt.fragment); e.Field != tt.field {
				t.Fatalf("field %q, want %q", e.Field, tt.field)
			}
		})
	}
	names := []string{"venus", "mars"}
	wantErr[*NotFoundError](t, RequireClusters(names, []*apiv1.Cluster{nil, nil}), `cluster "venus" and "mars" not found`)
	wantErr[*NotFoundError](t, RequireClusters(names, []*apiv1.Cluster{{Name: "venus"}, nil}), `cluster "mars" not found`)
	if err := RequireClusters(names, []*apiv1.Cluster{{Name: "venus"}, {Name: "mars"}}); err != nil {
		t.Fatal(err)
	}
}

func TestTheDefaultPolicyRecord(t *testing.T) {
	rec, p, err := DefaultPolicy("vxlan")
	if err != nil || rec.Name != policy.DefaultPolicyName || !rec.IsDefault || p.Spec.CableDriver.Name != "vxlan" || p.Origin != policy.OriginMesh {
		t.Fatalf("default policy %v %+v %v", rec, p, err)
	}
	others, def, err := MeshPolicies([]*apiv1.Policy{rec, apiPolicy(t, "on-prem", onPrem)})
	if err != nil || len(others) != 1 || others[0].Metadata.Name != "on-prem" || def.Metadata.Name != policy.DefaultPolicyName {
		t.Fatalf("mesh policies: %v %v %v", others, def, err)
	}
}
