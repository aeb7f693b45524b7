package harness

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func tarOf(t *testing.T, entries ...tar.Header) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		body := ""
		if h.Typeflag == tar.TypeReg {
			body = "content of " + h.Name
			h.Size = int64(len(body))
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

func TestUntarWritesTheTree(t *testing.T) {
	dir := t.TempDir()
	err := untar(tarOf(t,
		tar.Header{Name: "cmd/", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "cmd/main.go", Typeflag: tar.TypeReg, Mode: 0o644},
		tar.Header{Name: "scripts/run.sh", Typeflag: tar.TypeReg, Mode: 0o755},
		tar.Header{Name: "link", Typeflag: tar.TypeSymlink, Linkname: "cmd/main.go"},
	), dir)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "link"))
	if err != nil || string(b) != "content of cmd/main.go" {
		t.Errorf("cmd/main.go through the link: %q, %v", b, err)
	}
	if st, err := os.Stat(filepath.Join(dir, "scripts/run.sh")); err != nil || st.Mode()&0o100 == 0 {
		t.Errorf("scripts/run.sh lost its executable bit: %v %v", st, err)
	}
}

func TestUntarRefusesEntriesOutsideTheDirectory(t *testing.T) {
	for _, name := range []string{"../escape", "a/../../escape", "/etc/escape"} {
		parent := t.TempDir()
		dir := filepath.Join(parent, "src")
		err := untar(tarOf(t, tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644}), dir)
		if err == nil || !strings.Contains(err.Error(), "leaves the directory") {
			t.Errorf("%s: err %v, want a refusal", name, err)
		}
		if _, err := os.Stat(filepath.Join(parent, "escape")); err == nil {
			t.Errorf("%s was written outside the directory", name)
		}
	}
}
