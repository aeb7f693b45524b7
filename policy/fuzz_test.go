package policy

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// FuzzDecodeYAML: DecodeYAML never panics, and whatever it accepts is valid
// and survives EncodeYAML and a second DecodeYAML unchanged.
func FuzzDecodeYAML(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "seed004", "*.yaml"))
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(head + "spec:\n  clusterSelector:\n    matchExpressions:\n    - {key: env, operator: In, values: [a, b]}\n"))
	f.Add([]byte(head + "spec:\n  leftClusterSelector: {env: !production}\n  rightClusterSelector:\n  topology: client-server\n"))
	f.Add([]byte(head + "spec: &a {}\n---\n" + "kind: ClusterConnectionPolicy\nmetadata: {name: q}\nspec: *a\n"))
	f.Add([]byte(seedSpec + "   priority: 3\n---\n" + seedSpec + "   topology: full-mesh\n"))
	f.Add([]byte(seedSpec + "\tpriority: 3\n"))
	f.Add([]byte(head + "spec:\n  cableDriver: {name: wireguard, options: {mode: gateway}}\n"))
	f.Add([]byte(head + "spec:\n  cableDriver: {name: vxlan, options: {mode: bridge, vni: \"7\"}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ps, err := DecodeYAML(data)
		if err != nil {
			return
		}
		for i := range ps {
			if err := ps[i].Validate(); err != nil {
				t.Fatalf("accepted an invalid policy: %v", err)
			}
			// An accepted mode is one of the two; the driver's options never hold it.
			if d := ps[i].Spec.CableDriver; d != nil {
				if m, ok := d.Options[ModeOption]; ok && m != ModeGateway && m != ModeDirect {
					t.Fatalf("accepted mode %q", m)
				}
				if _, ok := DriverOptions(d.Options)[ModeOption]; ok {
					t.Fatalf("DriverOptions kept the mode")
				}
			}
		}
		out, err := EncodeYAML(ps)
		if err != nil {
			t.Fatalf("encode: %v", err)
		}
		back, err := DecodeYAML(out)
		if err != nil {
			t.Fatalf("decode of our own output: %v\n%s", err, out)
		}
		if len(ps) == 0 && len(back) == 0 {
			return
		}
		if !reflect.DeepEqual(ps, back) {
			t.Fatalf("round trip changed the policies:\n%+v\n%+v\n%s", ps, back, out)
		}
	})
}

// FuzzReindentPriority: the repair never panics, changes nothing but the
// indentation of the priority lines it reports, and its result needs no
// second repair.
func FuzzReindentPriority(f *testing.F) {
	for _, file := range []string{"07-client-server-policy.yaml", "08-client-server-any.yaml"} {
		data, err := os.ReadFile(filepath.Join("testdata", "seed004", file))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(seedSpec + "   priority: 3\n   topology: full-mesh\n"))
	f.Add([]byte(head + "spec:\n  clusterSelector:\n    matchExpressions:\n    - key: env\n      operator: Exists\n   priority: 3\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		out, moved := reindentPriority(data)
		if len(moved) == 0 {
			if !bytes.Equal(out, data) {
				t.Fatalf("nothing reported moved, yet the text changed:\n%s", out)
			}
			return
		}
		before, after := strings.Split(string(data), "\n"), strings.Split(string(out), "\n")
		if len(before) != len(after) {
			t.Fatalf("%d lines became %d", len(before), len(after))
		}
		changed := 0
		for i := range before {
			if before[i] == after[i] {
				continue
			}
			changed++
			if b, a := strings.TrimLeft(before[i], " "), strings.TrimLeft(after[i], " "); b != a || !priorityLine.MatchString(strings.TrimSuffix(a, "\r")) {
				t.Fatalf("line %d %q became %q", i+1, before[i], after[i])
			}
		}
		if changed != len(moved) {
			t.Fatalf("%d lines changed, %d reported: %q", changed, len(moved), moved)
		}
		if again, more := reindentPriority(out); len(more) != 0 || !bytes.Equal(again, out) {
			t.Fatalf("a second repair moved %q", more)
		}
	})
}

// FuzzParseSelector: ParseSelector never panics; what it accepts is valid,
// prints to a string it parses back to the same selector, and matches as
// apimachinery's selector does.
func FuzzParseSelector(f *testing.F) {
	for _, s := range []string{
		"", "location=on-premise,env!=production,tier in (a,b),!legacy,gpu",
		"env=!production", "a==b", "a notin (x, y)", "example.com/zone in (,a)", "k!=",
	} {
		f.Add(s)
	}
	labelSets := []map[string]string{nil, {"env": "production"}, {"env": "", "a": "b", "gpu": "1"}, {"tier": "a", "location": "on-premise"}}
	f.Fuzz(func(t *testing.T, s string) {
		sel, err := ParseSelector(s)
		if err != nil {
			return
		}
		if err := sel.Validate("selector"); err != nil {
			t.Fatalf("accepted an invalid selector: %v", err)
		}
		again, err := ParseSelector(sel.String())
		if err != nil {
			t.Fatalf("ParseSelector(%q) = %q, which does not parse: %v", s, sel.String(), err)
		}
		if !reflect.DeepEqual(again, sel) && !(again.IsEmpty() && sel.IsEmpty()) {
			t.Fatalf("round trip of %q: %#v became %#v", s, sel, again)
		}
		ks, err := metav1.LabelSelectorAsSelector(sel.LabelSelector())
		if err != nil {
			t.Fatalf("apimachinery rejects %q: %v", sel.String(), err)
		}
		for _, labels := range labelSets {
			if got, want := sel.Matches(labels), ks.Matches(mapLabels(labels)); got != want {
				t.Fatalf("%q on %v: we say %v, apimachinery %v", sel.String(), labels, got, want)
			}
		}
	})
}
