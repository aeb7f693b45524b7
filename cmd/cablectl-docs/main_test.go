package main

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// committedDir is the reference as committed, from this package's directory.
const committedDir = "../../docs/cablectl"

// TestCommittedReferenceIsGenerated fails when docs/cablectl/ is not what cablectl's command tree
// generates (a command, flag or help text changed without make docs), or holds a page of a
// command that no longer exists.
func TestCommittedReferenceIsGenerated(t *testing.T) {
	for _, k := range envDefaults {
		t.Setenv(k, "") // restored after the test; render unsets them
	}
	want, err := render()
	if err != nil {
		t.Fatal(err)
	}
	got, err := readMarkdown(committedDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range sortedNames(want) {
		b, ok := got[name]
		switch {
		case !ok:
			t.Errorf("docs/cablectl/%s is missing: run make docs and commit", name)
		case !bytes.Equal(b, want[name]):
			t.Errorf("docs/cablectl/%s is not what cablectl's commands generate: run make docs and commit", name)
		}
	}
	for _, name := range sortedNames(got) {
		if _, ok := want[name]; !ok {
			t.Errorf("docs/cablectl/%s is the page of no cablectl command: run make docs and commit", name)
		}
	}
}

// TestReferenceCoversEveryCommand: the generated reference has a page per command of the tree,
// each naming the command and its flags, and no date line (so it is stable between runs).
func TestReferenceCoversEveryCommand(t *testing.T) {
	for _, k := range envDefaults {
		t.Setenv(k, "/from/the/environment")
	}
	files, err := render()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]string{
		"cablectl.md":                       {"## cablectl\n", "--config string", `(default "/var/lib/cablemesh/broker/admin.yaml")`},
		"cablectl_cluster_join-token.md":    {"## cablectl cluster join-token\n", "cablectl cluster join-token"},
		"cablectl_status.md":                {"## cablectl status\n", "--output"},
		"cablectl_connection-policy_add.md": {"## cablectl connection-policy add\n"},
		"cablectl_install_kubernetes.md":    {"## cablectl install kubernetes\n"},
	} {
		b, ok := files[name]
		if !ok {
			t.Errorf("no page %s (have %s)", name, strings.Join(sortedNames(files), ", "))
			continue
		}
		for _, s := range want {
			if !strings.Contains(string(b), s) {
				t.Errorf("%s does not contain %q:\n%s", name, s, b)
			}
		}
	}
	for name, b := range files {
		if strings.Contains(string(b), "Auto generated") || strings.Contains(string(b), "/from/the/environment") {
			t.Errorf("%s depends on when or where it was generated:\n%s", name, b)
		}
	}
}

// TestWriteReferenceRemovesStalePages: make docs leaves exactly the generated pages, removing
// the page of a command that is gone, and leaves other files alone.
func TestWriteReferenceRemovesStalePages(t *testing.T) {
	for _, k := range envDefaults {
		t.Setenv(k, "")
	}
	dir := t.TempDir()
	for name, body := range map[string]string{"cablectl_gone.md": "old", "cablectl.md": "stale", "notes.txt": "kept"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := writeReference(dir); err != nil {
		t.Fatal(err)
	}
	want, err := render()
	if err != nil {
		t.Fatal(err)
	}
	got, err := readMarkdown(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sortedNames(got), sortedNames(want)) {
		t.Errorf("pages after writeReference: %v, want %v", sortedNames(got), sortedNames(want))
	}
	if !bytes.Equal(got["cablectl.md"], want["cablectl.md"]) {
		t.Errorf("cablectl.md was not rewritten:\n%s", got["cablectl.md"])
	}
	if b, err := os.ReadFile(filepath.Join(dir, "notes.txt")); err != nil || string(b) != "kept" {
		t.Errorf("notes.txt: %q, %v; want it left alone", b, err)
	}
}

func sortedNames(files map[string][]byte) []string {
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
