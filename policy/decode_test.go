package policy

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const head = "kind: ClusterConnectionPolicy\nmetadata:\n  name: p\n"

func TestDecodeYAMLErrors(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want []string // each must appear in the error
	}{
		{
			name: "an unknown topology is named with the allowed ones",
			in:   head + "spec:\n  topology: star\n",
			want: []string{`spec.topology: "star" is not one of full-mesh, point-to-point, client-server`},
		},
		{
			name: "an unknown field is named with its line",
			in:   head + "spec:\n  cableDriver:\n    name: vxlan\n    priority: 3\n",
			want: []string{"line 7: spec.cableDriver.priority: unknown field"},
		},
		{
			name: "an unknown top-level field is an error",
			in:   head + "spec: {}\nextra: 1\n",
			want: []string{"line 5: extra: unknown field"},
		},
		{
			name: "a duplicate key is an error",
			in:   head + "spec:\n  priority: 1\n  priority: 2\n",
			want: []string{"line 6: spec.priority: duplicate key"},
		},
		{
			name: "clusterSelector cannot be mixed with left/right",
			in:   head + "spec:\n  clusterSelector: {location: cloud}\n  leftClusterSelector: {env: production}\n",
			want: []string{"spec.clusterSelector: cannot be used together with spec.leftClusterSelector or spec.rightClusterSelector"},
		},
		{
			name: "client-server needs left and right",
			in:   head + "spec:\n  clusterSelector: {location: cloud}\n  topology: client-server\n",
			want: []string{`spec.topology: "client-server" needs spec.leftClusterSelector`},
		},
		{
			name: "a connection policy other than connect or no-connect is an error",
			in:   head + "spec:\n  connectionPolicy: maybe\n",
			want: []string{`spec.connectionPolicy: "maybe" is not one of connect, no-connect`},
		},
		{
			name: "a cable driver without a name is an error",
			in:   head + "spec:\n  cableDriver:\n    options: {vni: 100}\n",
			want: []string{"spec.cableDriver.name: required"},
		},
		{
			name: "final that is not a boolean is named",
			in:   head + "spec:\n  final: yes\n",
			want: []string{`spec.final: "yes" is not true or false`},
		},
		{
			name: "a no-connect policy with a cable driver is an error",
			in:   head + "spec:\n  connectionPolicy: no-connect\n  cableDriver: {name: vxlan}\n",
			want: []string{`spec.cableDriver: "vxlan": a no-connect policy takes no cable driver`},
		},
		{
			name: "a name that is not a DNS label is an error",
			in:   "kind: ClusterConnectionPolicy\nmetadata:\n  name: On_Prem\nspec: {}\n",
			want: []string{`metadata.name: "On_Prem" is not a DNS label`},
		},
		{
			name: "a missing name is an error",
			in:   "kind: ClusterConnectionPolicy\nspec: {}\n",
			want: []string{"metadata.name: required"},
		},
		{
			name: "a missing kind is an error",
			in:   "metadata: {name: p}\nspec: {}\n",
			want: []string{"kind: required"},
		},
		{
			name: "another kind is an error",
			in:   "kind: ConfigMap\nmetadata: {name: p}\n",
			want: []string{`kind: "ConfigMap" is not ClusterConnectionPolicy`},
		},
		{
			name: "a priority that is not an integer is an error",
			in:   head + "spec:\n  priority: high\n",
			want: []string{`line 5: spec.priority: "high" is not an integer`},
		},
		{
			name: "an invalid label value in a selector names the selector",
			in:   head + "spec:\n  leftClusterSelector:\n    env: \"pro duction\"\n",
			want: []string{`spec.leftClusterSelector.matchLabels.env: label value "pro duction"`},
		},
		{
			name: "a YAML tag followed by a value is refused",
			in:   head + "spec:\n  leftClusterSelector:\n    env: !prod uction\n",
			want: []string{`line 6: spec.leftClusterSelector.env: YAML tag "!prod" followed by "uction"`},
		},
		{
			name: "a YAML tag outside a selector is refused",
			in:   head + "spec:\n  topology: !full-mesh\n",
			want: []string{`spec.topology: unexpected YAML tag "!full-mesh"`},
		},
		{
			name: "a bad operator is named",
			in:   head + "spec:\n  clusterSelector:\n    matchExpressions:\n    - {key: env, operator: Gt, values: [\"1\"]}\n",
			want: []string{`spec.clusterSelector.matchExpressions[0].operator: "Gt" is not one of In, NotIn, Exists, DoesNotExist`},
		},
		{
			name: "the structured form rejects unknown keys",
			in:   head + "spec:\n  clusterSelector:\n    matchLabels: {a: b}\n    env: x\n",
			want: []string{"spec.clusterSelector.env: unknown field (want matchLabels, matchExpressions)"},
		},
		{
			name: "two documents of the same name are an error",
			in:   head + "spec: {}\n---\n" + head + "spec: {}\n",
			want: []string{`document 2 (p): metadata.name: "p" is also the name of document 1`},
		},
		{
			name: "every bad document is reported, by number",
			in:   head + "spec: {topology: star}\n---\nkind: ClusterConnectionPolicy\nmetadata: {name: q}\nspec: {priority: x}\n",
			want: []string{"document 1 (p): spec.topology", "document 2 (q): line 8: spec.priority"},
		},
		{
			name: "YAML that cannot be repaired keeps the parser's error",
			in:   head + "spec: [unclosed\n",
			want: []string{"document 1: yaml:"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := DecodeYAML([]byte(tt.in))
			if err == nil {
				t.Fatalf("accepted: %+v", ps)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
		})
	}
}

func TestDecodeYAMLFieldErrorsAreTyped(t *testing.T) {
	_, err := DecodeYAML([]byte(head + "spec:\n  topology: star\n"))
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "spec.topology" {
		t.Fatalf("error %v is not a *FieldError for spec.topology", err)
	}
}

func TestDecodeYAMLForms(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		check func(t *testing.T, p ClusterConnectionPolicy)
	}{
		{
			name: "the shorthand and structured selector forms decode to the same selector",
			in: head + "spec:\n  leftClusterSelector:\n    env: !production\n    location: cloud\n" +
				"  rightClusterSelector:\n    matchLabels: {location: cloud}\n    matchExpressions:\n    - {key: env, operator: NotIn, values: [production]}\n",
			check: func(t *testing.T, p ClusterConnectionPolicy) {
				if l, r := p.Spec.LeftClusterSelector.String(), p.Spec.RightClusterSelector.String(); l != r || l != "location=cloud,env!=production" {
					t.Errorf("left %q right %q", l, r)
				}
			},
		},
		{
			name: "a selector with no value is present and empty",
			in:   head + "spec:\n  leftClusterSelector:\n    a: b\n  rightClusterSelector:\n",
			check: func(t *testing.T, p ClusterConnectionPolicy) {
				if p.Spec.RightClusterSelector == nil || !p.Spec.RightClusterSelector.IsEmpty() {
					t.Errorf("right selector %#v", p.Spec.RightClusterSelector)
				}
			},
		},
		{
			name: "non-string scalars are taken as written",
			in:   head + "spec:\n  clusterSelector:\n    database-server: true\n    tier: 1\n  cableDriver:\n    name: vxlan\n    options: {vni: 100, port: 4789}\n",
			check: func(t *testing.T, p ClusterConnectionPolicy) {
				if got := p.Spec.ClusterSelector.String(); got != "database-server=true,tier=1" {
					t.Errorf("selector %q", got)
				}
				if !reflect.DeepEqual(p.Spec.CableDriver.Options, map[string]string{"vni": "100", "port": "4789"}) {
					t.Errorf("options %v", p.Spec.CableDriver.Options)
				}
			},
		},
		{
			name: "a quoted !value is negation too",
			in:   head + "spec:\n  clusterSelector: {env: \"!production\"}\n",
			check: func(t *testing.T, p ClusterConnectionPolicy) {
				if got := p.Spec.ClusterSelector.String(); got != "env!=production" {
					t.Errorf("selector %q", got)
				}
			},
		},
		{
			name: "JSON decodes as YAML",
			in:   `{"kind":"ClusterConnectionPolicy","metadata":{"name":"p"},"spec":{"priority":7,"connectionPolicy":"no-connect"}}`,
			check: func(t *testing.T, p ClusterConnectionPolicy) {
				if p.EffectivePriority() != 7 || p.Spec.Connects() {
					t.Errorf("spec %+v", p.Spec)
				}
			},
		},
		{
			name: "status and origin are accepted; the status is dropped",
			in:   head + "spec: {}\norigin: cluster-a\nstatus: {pairsDecided: 3}\n",
			check: func(t *testing.T, p ClusterConnectionPolicy) {
				if p.Origin != "cluster-a" || p.Status != nil {
					t.Errorf("origin %q status %+v", p.Origin, p.Status)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, err := DecodeYAML([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, ps[0])
		})
	}
}

func TestDecodeYAMLSkipsEmptyDocuments(t *testing.T) {
	ps, err := DecodeYAML([]byte("---\n# nothing\n---\n" + head + "spec: {}\n---\n"))
	if err != nil || len(ps) != 1 {
		t.Fatalf("got %d policies, %v", len(ps), err)
	}
	if ps, err := DecodeYAML(nil); err != nil || len(ps) != 0 {
		t.Fatalf("empty input: %v %v", ps, err)
	}
}

func TestEncodeYAMLRoundTrips(t *testing.T) {
	prio := 4
	in := []ClusterConnectionPolicy{{
		Kind:     Kind,
		Metadata: ObjectMeta{Name: "p", Labels: map[string]string{"team": "net"}},
		Spec: Spec{
			LeftClusterSelector:  mustSelector(t, "env=!production,tier in (a,b),gpu"),
			RightClusterSelector: &Selector{},
			Topology:             TopologyClientServer,
			Priority:             &prio,
			CableDriver:          &CableDriver{Name: "vxlan", Options: map[string]string{"vni": "100"}},
		},
		Origin: "cluster-a",
		Status: &Status{PairsDecided: 1},
	}}
	data, err := EncodeYAML(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := DecodeYAML(data)
	if err != nil {
		t.Fatalf("%v\n%s", err, data)
	}
	want := in[0].DeepCopy()
	want.APIVersion, want.Status = APIVersion, nil
	if !reflect.DeepEqual(out[0], want) {
		t.Errorf("round trip:\n got %+v\nwant %+v\n%s", out[0], want, data)
	}
}

func TestJSONRoundTrips(t *testing.T) {
	for _, f := range []string{"03-on-prem.yaml", "08-client-server-any.yaml", "06-on-prem-to-cloud-no-connect.yaml"} {
		p := seedPolicy(t, f)
		p.Origin = "mesh"
		data, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var back ClusterConnectionPolicy
		if err := json.Unmarshal(data, &back); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(back, p) {
			t.Errorf("%s: JSON round trip:\n got %+v\nwant %+v\n%s", f, back, p, data)
		}
		// Stored JSON is also a valid file for cablectl apply.
		ps, err := DecodeYAML(data)
		if err != nil || !reflect.DeepEqual(ps[0], p) {
			t.Errorf("%s: DecodeYAML of the JSON: %v\n%+v", f, err, ps)
		}
	}
}

func mustSelector(t *testing.T, s string) *Selector {
	t.Helper()
	sel, err := ParseSelector(s)
	if err != nil {
		t.Fatal(err)
	}
	return sel
}

func TestSelectorUnmarshalYAMLInAnotherDocument(t *testing.T) {
	var cfg struct {
		Peers *Selector `yaml:"peers"`
	}
	if err := yaml.Unmarshal([]byte("peers:\n  env: !production\n  location: cloud\n"), &cfg); err != nil {
		t.Fatal(err)
	}
	if got := cfg.Peers.String(); got != "location=cloud,env!=production" {
		t.Errorf("got %q", got)
	}
	if err := yaml.Unmarshal([]byte("peers:\n  matchLabels: {a: b}\n  bogus: 1\n"), &cfg); err == nil {
		t.Errorf("an unknown field was accepted")
	}
}

func TestDecodeYAMLReadsFinal(t *testing.T) {
	ps, err := DecodeYAML([]byte(head + "spec:\n  connectionPolicy: no-connect\n  final: true\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 1 || !ps[0].Spec.Final {
		t.Fatalf("got %+v, want one final policy", ps)
	}
	out, err := EncodeYAML(ps)
	if err != nil || !strings.Contains(string(out), "final: true") {
		t.Fatalf("encoded %q (%v), want final: true kept", out, err)
	}
}
