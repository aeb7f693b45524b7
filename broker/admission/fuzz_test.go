package admission

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/cablemesh/cablemesh/policy"
)

// FuzzDecodePolicyJSON feeds ApplyPolicies' parser (policy.DecodeJSON) arbitrary bytes. It must not panic, and a
// policy it accepts and validates must reach a fixed point in one canonicalisation: re-applying
// what the broker stored (what export prints) is then recognised as unchanged.
func FuzzDecodePolicyJSON(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("..", "..", "policy", "testdata", "seed004", "*.yaml"))
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		ps, err := policy.DecodeYAML(b)
		if err != nil {
			f.Fatal(err)
		}
		for _, p := range ps {
			js, _ := json.Marshal(&p)
			f.Add(js)
		}
	}
	f.Add([]byte(`{"kind":"ClusterConnectionPolicy","metadata":{"name":"x"},"spec":{"clusterSelector":{"matchExpressions":[{"key":"a","operator":"NotIn","values":["b","c"]}]},"cableDriver":{"name":"vxlan","options":{"vni":"7"}}}}`))
	f.Add([]byte(`{"metadata":{"name":"x"},"spec":{"leftClusterSelector":{"env":"!production"},"rightClusterSelector":null}} {}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := policy.DecodeJSON(data)
		if err != nil || p.Validate() != nil {
			return
		}
		c1, b1, err := CanonicalPolicy(p, policy.OriginMesh)
		if err != nil {
			t.Fatalf("canonicalise a valid policy: %v", err)
		}
		p2, err := policy.DecodeJSON(b1)
		if err != nil {
			t.Fatalf("the broker cannot read back what it would store: %v\n%s", err, b1)
		}
		if err := p2.Validate(); err != nil {
			t.Fatalf("the stored form of a valid policy is invalid: %v\n%s", err, b1)
		}
		_, b2, err := CanonicalPolicy(p2, policy.OriginMesh)
		if err != nil || !bytes.Equal(b1, b2) {
			t.Fatalf("canonical form is not stable:\n%s\n%s", b1, b2)
		}
		if c1.Metadata.Name != p.Metadata.Name {
			t.Fatalf("canonicalising renamed %q to %q", p.Metadata.Name, c1.Metadata.Name)
		}
	})
}
