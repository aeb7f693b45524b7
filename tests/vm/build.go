package vm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// buildTimeout bounds each go build the harness runs (cold builds take minutes on two cores).
const buildTimeout = 20 * time.Minute

// goCmd runs the go tool in the module root with extra environment and returns its output.
func goCmd(ctx context.Context, root string, env []string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, buildTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out.String())
	}
	return out.String(), nil
}

// GoEnv returns `go env NAME`.
func GoEnv(ctx context.Context, root, name string) (string, error) {
	out, err := goCmd(ctx, root, nil, "env", name)
	return strings.TrimSpace(out), err
}

// ModuleRoot is the directory of the cablemesh module (where go.mod is).
func ModuleRoot(ctx context.Context) (string, error) {
	gomod, err := GoEnv(ctx, ".", "GOMOD")
	if err != nil {
		return "", err
	}
	if gomod == "" || gomod == os.DevNull {
		return "", fmt.Errorf("not inside the cablemesh module (go env GOMOD = %q)", gomod)
	}
	return filepath.Dir(gomod), nil
}

// BuildInit builds the guest's init, statically, to path.
func BuildInit(ctx context.Context, root, path string) error {
	_, err := goCmd(ctx, root, []string{"CGO_ENABLED=0"}, "build", "-trimpath", "-o", path, "./tests/vm/guestinit")
	return err
}

// Programs the guest runs, built into the run's bin directory.
var (
	// MeshBinaries are the programs the netns harness runs (from $CABLEMESH_BIN when it has them).
	MeshBinaries = []string{"cable-broker", "cable-agent", "cablectl"}
	// TestBinary is the compiled tests/netns package.
	TestBinary = "netns.test"
)

// BuildGuestBinaries puts into bin the netns test binary, tcpcheck, and the mesh binaries: copied
// from from (e.g. $CABLEMESH_BIN, `make build`'s bin/) when it holds them, else built.
func BuildGuestBinaries(ctx context.Context, root, bin, from string) error {
	if err := os.MkdirAll(bin, 0o755); err != nil {
		return err
	}
	if _, err := goCmd(ctx, root, nil, "test", "-c", "-o", filepath.Join(bin, TestBinary), "./tests/netns"); err != nil {
		return err
	}
	pkgs := []string{"./tests/netns/cmd/tcpcheck"}
	for _, b := range MeshBinaries {
		src := filepath.Join(from, b)
		if st, err := os.Stat(src); from != "" && err == nil && st.Mode()&0o111 != 0 {
			if err := copyFile(src, filepath.Join(bin, b)); err != nil {
				return err
			}
			continue
		}
		pkgs = append(pkgs, "./cmd/"+b)
	}
	_, err := goCmd(ctx, root, nil, append([]string{"build", "-o", bin + "/"}, pkgs...)...)
	return err
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// A run's directory: os.TempDir()/cablemesh-vm-*, with the pid of the test process that owns it
// in ownerFile; keptMarker marks one kept on purpose (CABLEMESH_KEEP=1).
const (
	sharePattern = "cablemesh-vm-*"
	ownerFile    = "owner"
	keptMarker   = "KEPT"
)

// NewShare makes a run's directory, owned by this process.
func NewShare() (string, error) {
	dir, err := os.MkdirTemp("", strings.TrimSuffix(sharePattern, "*"))
	if err != nil {
		return "", err
	}
	return dir, os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// SweepStale removes the directories of runs whose test process is gone (killed before its
// cleanup ran), unless kept on purpose, and returns them.
func SweepStale() []string {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), sharePattern))
	var removed []string
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, keptMarker)); err == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			// No owner yet: just made by a run that is about to write it, or made by hand.
			if st, serr := os.Stat(d); serr != nil || time.Since(st.ModTime()) < time.Minute {
				continue
			}
		} else {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 && syscall.Kill(pid, 0) == nil {
				continue // its test is still running
			}
		}
		if os.RemoveAll(d) == nil {
			removed = append(removed, d)
		}
	}
	return removed
}
