package clusterpolicy

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	"github.com/cablemesh/cablemesh/policy"
)

const labelled = `apiVersion: cablemesh.io/v1alpha1
kind: ClusterConnectionPolicy
metadata:
  name: a-to-b
  labels:
    cablemesh.io/origin: cluster
spec:
  leftClusterSelector: {name: a}
  rightClusterSelector: {name: b}
  cableDriver:
    name: vxlan
`

var unlabelled = strings.Replace(labelled, "    cablemesh.io/origin: cluster\n", "    team: net\n", 1)

func TestBuildRefusesWithoutTheLabelAndSyncsWithIt(t *testing.T) {
	items := append(DecodeFile("/p/good.yaml", []byte(labelled)),
		DecodeFile("/p/bad.yaml", []byte(strings.Replace(unlabelled, "a-to-b", "other", 1)))...)
	items = append(items, DecodeFile("/p/broken.yaml", []byte("kind: [\n"))...)
	set := Build("a", items)
	if len(set.Policies) != 1 || set.Policies[0].Metadata.Name != policy.ClusterPolicyName("a-to-b", "a") || set.Policies[0].Origin != "a" {
		t.Fatalf("policies %+v", set.Policies)
	}
	if len(set.Problems) != 2 {
		t.Fatalf("problems %v", set.Problems)
	}
	if p := set.Problems[0]; p.Source != "/p/bad.yaml" || p.Policy != "other" || !strings.Contains(p.Message, policy.MissingOriginLabelMessage) {
		t.Errorf("refusal %+v", p)
	}
	if p := set.Problems[1]; p.Source != "/p/broken.yaml" || p.Message == "" {
		t.Errorf("broken file %+v", p)
	}
}

func TestBuildRefusesANameAppliedTwice(t *testing.T) {
	items := append(DecodeFile("/p/1.yaml", []byte(labelled)), DecodeFile("/p/2.yaml", []byte(labelled))...)
	set := Build("a", items)
	if len(set.Policies) != 0 || len(set.Problems) != 2 || !strings.Contains(set.Problems[0].Message, "applied 2 times (/p/1.yaml, /p/2.yaml)") {
		t.Fatalf("set %+v", set)
	}
}

// sets collects what a source hands out.
type sets chan Set

func (s sets) next(t *testing.T, what string) Set {
	t.Helper()
	select {
	case set := <-s:
		return set
	case <-time.After(10 * time.Second):
		t.Fatalf("no set within 10s: %s", what)
	}
	return Set{}
}

// until returns the first set that ok accepts, skipping the sets of a change the source saw half
// done (a file removed and the next not yet, a file truncated before it is written): the debounce
// only narrows that window, on a loaded machine it does not close it. It fails with the last set
// seen when none is accepted within 10s.
func (s sets) until(t *testing.T, what string, ok func(Set) bool) Set {
	t.Helper()
	deadline := time.After(10 * time.Second)
	var last Set
	for {
		select {
		case set := <-s:
			if ok(set) {
				return set
			}
			last = set
		case <-deadline:
			t.Fatalf("%s: not seen within 10s; last set %+v", what, last)
			return Set{}
		}
	}
}

func run(t *testing.T, src Source) sets {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out := make(sets, 16)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(s Set) { out <- s }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return out
}

func TestDirSourceFollowsTheDirectory(t *testing.T) {
	dir := t.TempDir()
	got := run(t, &DirSource{Dir: dir, Cluster: "a", Debounce: 20 * time.Millisecond})
	if s := got.next(t, "empty dir"); len(s.Policies) != 0 || len(s.Problems) != 0 {
		t.Fatalf("empty dir: %+v", s)
	}
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("p.yaml", labelled)
	got.until(t, "a labelled file", func(s Set) bool {
		return len(s.Policies) == 1 && s.Policies[0].Spec.CableDriver.Name == "vxlan" && len(s.Problems) == 0
	})
	write("q.yaml", strings.Replace(unlabelled, "a-to-b", "q", 1))
	got.until(t, "an unlabelled file", func(s Set) bool {
		return len(s.Policies) == 1 && len(s.Problems) == 1 && strings.Contains(s.Problems[0].Message, "please add `cablemesh.io/origin: cluster` label")
	})
	write("p.yaml", strings.Replace(labelled, "vxlan", "wireguard", 1))
	got.until(t, "an edit", func(s Set) bool {
		return len(s.Policies) == 1 && s.Policies[0].Spec.CableDriver.Name == "wireguard" && len(s.Problems) == 1
	})
	write(".p.yaml.swp", "junk")
	write("notes.txt", "junk")
	for _, f := range []string{"p.yaml", "q.yaml"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	// Hidden and .txt files are not policies: once both files are gone nothing is left.
	got.until(t, "removal", func(s Set) bool { return len(s.Policies) == 0 && len(s.Problems) == 0 })
	select {
	case s := <-got:
		if len(s.Policies) != 0 || len(s.Problems) != 0 {
			t.Fatalf("after removal the junk files made a set: %+v", s)
		}
	case <-time.After(200 * time.Millisecond):
	}
}

func TestDirSourceWaitsForAMissingDirectory(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "later")
	got := run(t, &DirSource{Dir: dir, Cluster: "a", Debounce: 20 * time.Millisecond})
	if s := got.next(t, "missing dir"); len(s.Problems) != 1 || s.Problems[0].Source != dir {
		t.Fatalf("missing dir: %+v", s)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "p.yml"), []byte(labelled), 0o644); err != nil {
		t.Fatal(err)
	}
	// Found at the next look (every dirRetry), then read.
	for deadline := time.Now().Add(10 * time.Second); ; {
		s := got.next(t, "the directory appears")
		if len(s.Policies) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("last set %+v", s)
		}
	}
}

func object(name string, labels map[string]string, driver string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cablemesh.io/v1alpha1",
		"kind":       "ClusterConnectionPolicy",
		"metadata":   map[string]any{"name": name, "uid": "u-" + name, "resourceVersion": "1"},
		"spec": map[string]any{
			"clusterSelector": map[string]any{},
			"cableDriver":     map[string]any{"name": driver},
		},
		"status": map[string]any{"pairsDecided": int64(1)},
	}}
	u.SetLabels(labels)
	return u
}

func TestKubeSourceFollowsTheObjects(t *testing.T) {
	scheme := runtime.NewScheme()
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(scheme,
		map[schema.GroupVersionResource]string{GVR: "ClusterConnectionPolicyList"})
	got := run(t, &KubeSource{Client: client, Cluster: "a", Debounce: 20 * time.Millisecond})
	if s := got.next(t, "no objects"); len(s.Policies) != 0 {
		t.Fatalf("initial %+v", s)
	}
	res := client.Resource(GVR)
	ctx := context.Background()
	origin := map[string]string{policy.LabelOrigin: policy.OriginClusterLabel}
	if _, err := res.Create(ctx, object("to-b", origin, "vxlan"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := got.next(t, "add")
	if len(s.Policies) != 1 || s.Policies[0].Metadata.Name != policy.ClusterPolicyName("to-b", "a") || s.Policies[0].Spec.CableDriver.Name != "vxlan" {
		t.Fatalf("after add: %+v", s)
	}
	if _, err := res.Update(ctx, object("to-b", origin, "wireguard"), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if s = got.next(t, "update"); len(s.Policies) != 1 || s.Policies[0].Spec.CableDriver.Name != "wireguard" {
		t.Fatalf("after update: %+v", s)
	}
	if _, err := res.Create(ctx, object("nolabel", nil, "vxlan"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s = got.next(t, "an unlabelled object")
	if len(s.Problems) != 1 || s.Problems[0].Source != "kubernetes ClusterConnectionPolicy nolabel" || !strings.Contains(s.Problems[0].Message, policy.MissingOriginLabelMessage) {
		t.Fatalf("after the unlabelled object: %+v", s)
	}
	for _, n := range []string{"to-b", "nolabel"} {
		if err := res.Delete(ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for {
		s = got.next(t, "delete")
		if len(s.Policies) == 0 && len(s.Problems) == 0 {
			break
		}
	}
}

// FuzzDecodeFile: any file content gives Items without panicking, and Build turns them into a
// Set whose policies the broker accepts for the cluster.
func FuzzDecodeFile(f *testing.F) {
	f.Add([]byte(labelled))
	f.Add([]byte(unlabelled))
	f.Add([]byte(labelled + "---\n" + labelled))
	f.Add([]byte("{}"))
	f.Fuzz(func(t *testing.T, data []byte) {
		set := Build("a", DecodeFile("f.yaml", data))
		for _, p := range set.Policies {
			if err := policy.CheckSyncedClusterPolicy(p, "a"); err != nil {
				t.Fatalf("synced %q the broker would refuse: %v", p.Metadata.Name, err)
			}
		}
	})
}

// FuzzObjectItem: any spec of an object decodes or is refused, never panics.
func FuzzObjectItem(f *testing.F) {
	f.Add("x", `{"clusterSelector":{},"cableDriver":{"name":"vxlan"}}`)
	f.Add("", `[]`)
	f.Fuzz(func(t *testing.T, name, spec string) {
		u := object(name, map[string]string{policy.LabelOrigin: policy.OriginClusterLabel}, "vxlan")
		var v any
		if err := jsonUnmarshal([]byte(spec), &v); err != nil {
			return
		}
		u.Object["spec"] = v
		it := ObjectItem(u)
		if it.Err == nil && it.Policy.Metadata.Name != name {
			t.Fatalf("name %q decoded as %q", name, it.Policy.Metadata.Name)
		}
	})
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// A cluster cannot make its own policy final (only the mesh's admin can): the file is refused,
// the problem names spec.final, and nothing is synced.
func TestBuildRefusesAFinalClusterPolicy(t *testing.T) {
	final := strings.Replace(labelled, "  cableDriver:\n", "  final: true\n  cableDriver:\n", 1)
	set := Build("a", DecodeFile("/p/final.yaml", []byte(final)))
	if len(set.Policies) != 0 || len(set.Problems) != 1 {
		t.Fatalf("set %+v, want the policy refused", set)
	}
	if p := set.Problems[0]; p.Source != "/p/final.yaml" || p.Policy != "a-to-b" || !strings.Contains(p.Message, "spec.final") || !strings.Contains(p.Message, "mesh policies only") {
		t.Errorf("refusal %+v", p)
	}
}
