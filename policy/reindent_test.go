package policy

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestSeed004ExamplesDecodeWithTheirWarnings(t *testing.T) {
	moved := func(line int) []string {
		return []string{fmt.Sprintf(`line %d: moved "priority: 3" from column 4 to column 3, the indentation of its siblings (the YAML was mis-indented)`, line)}
	}
	tests := []struct {
		file     string
		priority int
		warnings []string
	}{
		{"01-default-connect.yaml", 0, nil},
		{"02-default-no-connect.yaml", 0, nil},
		{"03-on-prem.yaml", 3, nil},
		{"04-on-prem-to-cloud.yaml", 3, nil},
		{"05-cloud-a-default.yaml", 3, nil},
		{"06-on-prem-to-cloud-no-connect.yaml", 3, nil},
		{"07-client-server-policy.yaml", 3, moved(14)},
		{"08-client-server-any.yaml", 3, moved(13)},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			data, err := os.ReadFile(filepath.Join("testdata", "seed004", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			ps, warnings, err := DecodeYAMLWithWarnings(data)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(warnings, tt.warnings) {
				t.Errorf("warnings %q, want %q", warnings, tt.warnings)
			}
			if len(ps) != 1 || ps[0].EffectivePriority() != tt.priority {
				t.Errorf("got %+v, want one policy of priority %d", ps, tt.priority)
			}
		})
	}
}

// seedSpec is the head of the client-server example of Submariner's connectivity proposal, up to its
// cableDriver block.
const seedSpec = head + "spec:\n" +
	"  leftClusterSelector:\n    database-role: server\n" +
	"  rightClusterSelector:\n    database-role: client\n" +
	"  topology: client-server\n" +
	"  cableDriver:\n      name:  \"vxlan\"\n"

func TestReindentPriorityRepairsOnlyTheSeedsDefect(t *testing.T) {
	tests := []struct {
		name     string
		in       string
		warnings []string // the lines moved; none means refused
		wantErr  string   // the error when refused
	}{
		{
			name:     "a priority one column deeper than spec's entries after a nested block is moved to them",
			in:       seedSpec + "   priority: 3\n",
			warnings: []string{`line 12: moved "priority: 3"`},
		},
		{
			name:     "a comment after the priority is kept",
			in:       seedSpec + "   priority: 3 # servers first\n",
			warnings: []string{`line 12: moved "priority: 3 # servers first"`},
		},
		{
			name:     "a priority several columns deeper, after a selector, is moved too",
			in:       head + "spec:\n  clusterSelector:\n      env: production\n     priority: -2\n",
			warnings: []string{`line 7: moved "priority: -2" from column 6 to column 3`},
		},
		{
			name:     "a priority one column deeper after a plain entry is moved",
			in:       head + "spec:\n  topology: full-mesh\n   priority: 3\n",
			warnings: []string{`line 6: moved "priority: 3"`},
		},
		{
			name: "a priority after a list of expressions is moved",
			in: head + "spec:\n  clusterSelector:\n    matchExpressions:\n    - key: env\n      operator: In\n      values:\n      - a\n" +
				"   priority: 3\n",
			warnings: []string{`line 11: moved "priority: 3"`},
		},
		{
			name:     "a priority after a block scalar is moved and the scalar left alone",
			in:       head + "spec:\n  cableDriver:\n    name: ipsec\n    options:\n      psk: |\n        a: b\n          c: d\n   priority: 3\n",
			warnings: []string{`line 11: moved "priority: 3"`},
		},
		{
			name:     "the defect in every document of a file is moved, each with its warning",
			in:       seedSpec + "   priority: 3\n---\n" + strings.Replace(seedSpec, "name: p", "name: q", 1) + "   priority: 4\n",
			warnings: []string{`line 12: moved "priority: 3"`, `line 25: moved "priority: 4"`},
		},
		{
			name:     "a file with CRLF line ends is repaired and keeps them",
			in:       strings.ReplaceAll(seedSpec+"   priority: 3\n", "\n", "\r\n"),
			warnings: []string{`line 12: moved "priority: 3" from column 4 to column 3`},
		},
		{
			name:    "a mis-indented topology is refused with the parser's error",
			in:      head + "spec:\n  cableDriver:\n      name: vxlan\n   topology: full-mesh\n",
			wantErr: "document 1: yaml: line 4: did not find expected key",
		},
		{
			name:    "a mis-indented topology next to a mis-indented priority is refused and nothing is moved",
			in:      seedSpec + "   priority: 3\n   topology: full-mesh\n",
			wantErr: "yaml: line 4:",
		},
		{
			name:    "a tab before the priority is refused with the parser's error",
			in:      seedSpec + "\tpriority: 3\n",
			wantErr: "yaml: line 12: found character that cannot start any token",
		},
		{
			name:    "a tab after spaces before the priority is refused",
			in:      seedSpec + "  \tpriority: 3\n",
			wantErr: "yaml: line",
		},
		{
			name:    "a mis-indented priority outside spec is refused",
			in:      "kind: ClusterConnectionPolicy\nmetadata:\n  labels:\n      team: net\n   priority: 3\n  name: p\nspec: {}\n",
			wantErr: "yaml: line 2: did not find expected key",
		},
		{
			name:    "a priority shallower than spec's entries is refused",
			in:      head + "spec:\n    topology: full-mesh\n  priority: 3\n",
			wantErr: "yaml: line",
		},
		{
			name:    "a mis-indented priority inside a nested block is refused",
			in:      head + "spec:\n  cableDriver:\n    options:\n        vni: \"1\"\n      priority: 3\n",
			wantErr: "yaml: line",
		},
		{
			name:    "a priority mis-indented after a spec that is a list is refused",
			in:      head + "spec:\n - 0\n  priority: 0\n",
			wantErr: "yaml: line",
		},
		{
			name:    "a mis-indented priority that is not an integer is refused",
			in:      seedSpec + "   priority: high\n",
			wantErr: "yaml: line",
		},
		{
			name:    "a mis-indented priority in a file with another syntax error is refused with that file's error",
			in:      seedSpec + "   priority: 3\n---\n" + head + "spec: [unclosed\n",
			wantErr: "document 1: yaml: line 4: did not find expected key",
		},
		{
			name:    "a priority YAML reads as a cableDriver field is not moved, and strict decoding refuses it",
			in:      seedSpec + "      priority: 3\n",
			wantErr: "line 12: spec.cableDriver.priority: unknown field",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ps, warnings, err := DecodeYAMLWithWarnings([]byte(tt.in))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q (decoded %+v)", err, tt.wantErr, ps)
				}
				if len(warnings) != 0 {
					t.Errorf("refused, yet warned %q", warnings)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(warnings) != len(tt.warnings) {
				t.Fatalf("warnings %q, want %d like %q", warnings, len(tt.warnings), tt.warnings)
			}
			for i, w := range tt.warnings {
				if !strings.HasPrefix(warnings[i], w) {
					t.Errorf("warning %q, want it to start with %q", warnings[i], w)
				}
			}
			for _, p := range ps {
				if p.Spec.Priority == nil {
					t.Errorf("%s: the moved priority is not spec.priority: %+v", p.Metadata.Name, p.Spec)
				}
			}
		})
	}
}

func TestReindentPriorityLeavesValidYAMLAlone(t *testing.T) {
	for _, in := range []string{
		"spec:\n  b: |\n    text: with colon\n      priority: 3\n  c:\n  - d: 1\n    e: 2\n",
		"spec:\n  cableDriver: &cd\n    name: vxlan\n  priority: 3\n",
		"metadata:\n  name: p\nspec:\n  priority: 3\n---\nspec:\n    priority: 3\n",
	} {
		if out, moved := reindentPriority([]byte(in)); len(moved) != 0 || string(out) != in {
			t.Errorf("moved %q:\n%s", moved, out)
		}
	}
}
