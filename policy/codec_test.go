package policy

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"
)

func TestDecodeJSONIsStrict(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"an unknown top-level field is named", `{"metadata":{"name":"x"},"colour":"blue"}`, `unknown field "colour"`},
		{"an unknown spec field is named", `{"metadata":{"name":"x"},"spec":{"prio":3}}`, `unknown field "prio"`},
		{"an unknown cableDriver field is named", `{"metadata":{"name":"x"},"spec":{"cableDriver":{"name":"vxlan","opts":{}}}}`, `unknown field "opts"`},
		{"a second object is refused", `{"metadata":{"name":"x"}} {}`, "data after the policy object"},
		{"empty input is refused", " \n", "json is empty"},
		{"a wrong type names the field", `{"metadata":{"name":"x"},"spec":{"priority":"high"}}`, "priority"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeJSON([]byte(tt.in))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("DecodeJSON(%s) = %v, want an error containing %q", tt.in, err, tt.want)
			}
		})
	}
}

func TestEncodeJSONRoundTripsTheSeedPolicies(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("testdata", "seed004", "*.yaml"))
	if len(files) == 0 {
		t.Fatal("no seed policies in testdata/seed004")
	}
	var ps []ClusterConnectionPolicy
	for _, f := range files {
		ps = append(ps, seedPolicy(t, filepath.Base(f)))
	}
	for i := range ps {
		b, err := EncodeJSON(&ps[i])
		if err != nil {
			t.Fatalf("encode %s: %v", ps[i].Metadata.Name, err)
		}
		back, err := DecodeJSON(b)
		if err != nil {
			t.Fatalf("decode what EncodeJSON wrote for %s: %v\n%s", ps[i].Metadata.Name, err, b)
		}
		again, err := EncodeJSON(&back)
		if err != nil || !bytes.Equal(b, again) {
			t.Errorf("%s does not round-trip:\n%s\n%s", ps[i].Metadata.Name, b, again)
		}
	}
}

func FuzzDecodeJSON(f *testing.F) {
	f.Add([]byte(`{"kind":"ClusterConnectionPolicy","metadata":{"name":"x"},"spec":{"cableDriver":{"name":"vxlan","options":{"vni":"7"}}}}`))
	f.Add([]byte(`{"metadata":{"name":"x"},"spec":{"leftClusterSelector":{"env":"!production"}}} {}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := DecodeJSON(data)
		if err != nil {
			return
		}
		b, err := EncodeJSON(&p)
		if err != nil {
			t.Fatalf("encode an accepted policy: %v", err)
		}
		if _, err := DecodeJSON(b); err != nil {
			t.Fatalf("DecodeJSON refuses what EncodeJSON wrote: %v\n%s", err, b)
		}
	})
}
