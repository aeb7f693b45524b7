package policy

import (
	"encoding/json"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseSelector(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		want    string // String() of the result
		wantErr string
	}{
		{name: "an empty string is the selector that matches everything", in: "", want: ""},
		{name: "equality terms become matchLabels", in: "location=on-premise,env==production", want: "env=production,location=on-premise"},
		{name: "inequality becomes NotIn", in: "env!=production", want: "env!=production"},
		{name: "the seed's negated value becomes NotIn", in: "env=!production", want: "env!=production"},
		{name: "set terms keep their values", in: "tier in (a, b),zone notin (x,y)", want: "tier in (a,b),zone notin (x,y)"},
		{name: "a bare key is Exists and !key is DoesNotExist", in: "gpu, !legacy", want: "gpu,!legacy"},
		{name: "every form together", in: "location=on-premise,env!=production,tier in (a,b),!legacy,gpu", want: "location=on-premise,env!=production,tier in (a,b),!legacy,gpu"},
		{name: "a prefixed key is a qualified name", in: "topology.kubernetes.io/region=eu", want: "topology.kubernetes.io/region=eu"},
		{name: "an empty term is an error", in: "a=b,,c=d", wantErr: "empty term"},
		{name: "an unknown set operator is an error", in: "a within (b)", wantErr: `operator "within"`},
		{name: "an empty set is an error", in: "a in ()", wantErr: "empty value list"},
		{name: "an unclosed set is an error", in: "a in (b", wantErr: "missing ')'"},
		{name: "an invalid label value is an error naming it", in: "a=b c", wantErr: `label value "b c"`},
		{name: "an invalid key is an error naming it", in: "-a=b", wantErr: `label key "-a"`},
		{name: "the same key twice with = is an error", in: "a=1,a=2", wantErr: `key "a" already required`},
		{name: "words without an operator are an error", in: "a b", wantErr: "want key=value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sel, err := ParseSelector(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseSelector(%q) error = %v, want it to contain %q", tt.in, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseSelector(%q): %v", tt.in, err)
			}
			if got := sel.String(); got != tt.want {
				t.Errorf("ParseSelector(%q).String() = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestSelectorMatches(t *testing.T) {
	prod := map[string]string{"env": "production", "location": "cloud"}
	staging := map[string]string{"env": "staging", "location": "cloud"}
	unlabelled := map[string]string{"location": "cloud"}
	tests := []struct {
		name     string
		selector string
		labels   map[string]string
		want     bool
	}{
		{"the empty selector matches a cluster without labels", "", nil, true},
		{"equality matches the same value", "env=production", prod, true},
		{"equality does not match another value", "env=production", staging, false},
		{"equality does not match a missing label", "env=production", unlabelled, false},
		{"negation matches another value", "env=!production", staging, true},
		{"negation matches a missing label, as NotIn does", "env=!production", unlabelled, true},
		{"negation does not match the value", "env=!production", prod, false},
		{"several labels must all match", "env=production,location=on-premise", prod, false},
		{"In matches one of its values", "env in (staging,production)", prod, true},
		{"Exists needs the label", "env", unlabelled, false},
		{"DoesNotExist needs its absence", "!env", unlabelled, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sel, err := ParseSelector(tt.selector)
			if err != nil {
				t.Fatal(err)
			}
			if got := sel.Matches(tt.labels); got != tt.want {
				t.Errorf("%q matches %v = %v, want %v", tt.selector, tt.labels, got, tt.want)
			}
		})
	}
}

// TestSelectorAgreesWithApimachinery checks our matcher against the
// Kubernetes implementation on random selectors and labels.
func TestSelectorAgreesWithApimachinery(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < 5000; i++ {
		sel := randomSelector(rng)
		ks, err := metav1.LabelSelectorAsSelector(sel.LabelSelector())
		if err != nil {
			t.Fatalf("apimachinery rejects %s: %v", sel, err)
		}
		labels := randomLabels(rng)
		if got, want := sel.Matches(labels), ks.Matches(mapLabels(labels)); got != want {
			t.Fatalf("selector %s on %v: we say %v, apimachinery says %v", sel, labels, got, want)
		}
	}
}

type mapLabels map[string]string

func (m mapLabels) Has(k string) bool              { _, ok := m[k]; return ok }
func (m mapLabels) Get(k string) string            { return m[k] }
func (m mapLabels) Lookup(k string) (string, bool) { v, ok := m[k]; return v, ok }

func TestSelectorJSONAcceptsBothForms(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want string
	}{
		{"the shorthand map is matchLabels", `{"location":"on-premise"}`, "location=on-premise"},
		{"a value starting with ! is NotIn", `{"env":"!production"}`, "env!=production"},
		{"the canonical form round-trips", `{"matchLabels":{"a":"b"},"matchExpressions":[{"key":"c","operator":"Exists"}]}`, "a=b,c"},
		{"null is the empty selector", `null`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Selector
			if err := json.Unmarshal([]byte(tt.in), &s); err != nil {
				t.Fatal(err)
			}
			if got := s.String(); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
			out, err := json.Marshal(s)
			if err != nil {
				t.Fatal(err)
			}
			var back Selector
			if err := json.Unmarshal(out, &back); err != nil {
				t.Fatal(err)
			}
			if back.String() != s.String() {
				t.Errorf("round trip: %s became %s", s.String(), back.String())
			}
		})
	}
	var s Selector
	if err := json.Unmarshal([]byte(`{"matchLabels":{},"extra":1}`), &s); err == nil {
		t.Errorf("an unknown field beside matchLabels was accepted")
	}
}

func TestParseOptions(t *testing.T) {
	got, err := ParseOptions("vni=100, port=4789,mtu=")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"vni": "100", "port": "4789", "mtu": ""}; !reflect.DeepEqual(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for _, bad := range []string{"vni", "=1", "a=1,a=2", "a b=1"} {
		if _, err := ParseOptions(bad); err == nil {
			t.Errorf("ParseOptions(%q) accepted", bad)
		}
	}
}

var (
	labelKeys   = []string{"env", "location", "tier", "example.com/zone"}
	labelValues = []string{"production", "staging", "cloud", "on-premise", "a", ""}
)

func randomLabels(rng *rand.Rand) map[string]string {
	m := map[string]string{}
	for _, k := range labelKeys {
		if rng.IntN(3) > 0 {
			m[k] = labelValues[rng.IntN(len(labelValues))]
		}
	}
	return m
}

func randomSelector(rng *rand.Rand) *Selector {
	s := &Selector{}
	for range rng.IntN(3) {
		k := labelKeys[rng.IntN(len(labelKeys))]
		if s.MatchLabels == nil {
			s.MatchLabels = map[string]string{}
		}
		s.MatchLabels[k] = labelValues[rng.IntN(len(labelValues))]
	}
	ops := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists, metav1.LabelSelectorOpDoesNotExist}
	for range rng.IntN(3) {
		r := metav1.LabelSelectorRequirement{Key: labelKeys[rng.IntN(len(labelKeys))], Operator: ops[rng.IntN(len(ops))]}
		if r.Operator == metav1.LabelSelectorOpIn || r.Operator == metav1.LabelSelectorOpNotIn {
			for range 1 + rng.IntN(2) {
				r.Values = append(r.Values, labelValues[rng.IntN(len(labelValues))])
			}
		}
		s.MatchExpressions = append(s.MatchExpressions, r)
	}
	return s
}
