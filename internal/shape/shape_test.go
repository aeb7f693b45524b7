package shape

import (
	"bytes"
	"go/format"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// maxFileLines bounds a non-test, non-generated Go file; agentRootLines the agent package's own
// files together, which only wire its components.
const (
	maxFileLines   = 600
	agentRootLines = 600
)

func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", dir, err)
	}
	return dir
}

// goFiles lists the repository's Go files, the separate tests/k8s module and vendored or
// testdata trees aside.
func goFiles(t *testing.T, root string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		if d.IsDir() {
			if rel == filepath.Join("tests", "k8s") || d.Name() == "testdata" || d.Name() == "vendor" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(p, ".go") {
			out = append(out, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func generated(src []byte) bool {
	return bytes.Contains(src, []byte("// Code generated ")) && bytes.Contains(src, []byte("DO NOT EDIT"))
}

func TestNoHandWrittenFileIsOver600Lines(t *testing.T) {
	root := repoRoot(t)
	for _, rel := range goFiles(t, root) {
		if strings.HasSuffix(rel, "_test.go") {
			continue
		}
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		if generated(src) {
			continue
		}
		if n := bytes.Count(src, []byte("\n")); n > maxFileLines {
			t.Errorf("%s has %d lines, more than %d: split it by concern", rel, n, maxFileLines)
		}
	}
}

func TestTheAgentRootIsWiringOnly(t *testing.T) {
	root := repoRoot(t)
	files, err := filepath.Glob(filepath.Join(root, "agent", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		total += bytes.Count(src, []byte("\n"))
	}
	if total == 0 {
		t.Fatal("no Go file in agent/")
	}
	if total > agentRootLines {
		t.Errorf("the agent package's own files hold %d lines, more than %d: what is not wiring belongs in a component (agent/<component>)", total, agentRootLines)
	}
}

func TestEveryGoFileIsGofmted(t *testing.T) {
	root := repoRoot(t)
	for _, rel := range goFiles(t, root) {
		src, err := os.ReadFile(filepath.Join(root, rel))
		if err != nil {
			t.Fatal(err)
		}
		out, err := format.Source(src)
		if err != nil {
			t.Errorf("%s: %v", rel, err)
			continue
		}
		if !bytes.Equal(out, src) {
			t.Errorf("%s is not gofmt'ed: run gofmt -w %s", rel, rel)
		}
	}
}
