package nstest

import (
	"os"
	"path"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// Binary returns the program of the package pkg (module-relative, "./tests/netns/cmd/tcpcheck"):
// from $CABLEMESH_BIN when that directory holds an executable of its name (`make build` and the VM
// stage of tests/vm put the test tools there), else built into dir.
func Binary(t testing.TB, dir, pkg string) string {
	t.Helper()
	tool := path.Base(pkg)
	if bin := os.Getenv("CABLEMESH_BIN"); bin != "" {
		p := filepath.Join(bin, tool)
		if st, err := os.Stat(p); err == nil && st.Mode()&0o111 != 0 {
			return p
		}
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..", "..")
	out := filepath.Join(dir, tool)
	if o, err := RunWithin(10*time.Minute, "go", "-C", root, "build", "-o", out, pkg); err != nil {
		t.Fatalf("build %s: %v\n%s", tool, err, o)
	}
	return out
}
