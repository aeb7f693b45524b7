package harness

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Binaries of another version of Cablemesh, built from the module's own git history, so that a
// test runs a mesh of the previous version and upgrades it to the working tree one process at a
// time. Each process picks its binary: Cluster.AgentBin for an agent, Replica.Bin for a broker
// replica ("" is the mesh's own build, Mesh.Bin).

// VersionCacheEnv names a directory for the builds of earlier versions; default
// $XDG_CACHE_HOME/cablemesh/upgrade when XDG_CACHE_HOME is set, else /var/cache/cablemesh/upgrade.
// A build is kept per commit, so CI pays for it once.
const VersionCacheEnv = "CABLEMESH_VERSION_CACHE"

// versionBinaries are the programs a version build holds (tcpcheck is the test's own, not a
// version's).
var versionBinaries = []string{"cable-broker", "cable-agent", "cablectl"}

// versionCacheDir is where builds of earlier versions are kept.
func versionCacheDir() string {
	if d := os.Getenv(VersionCacheEnv); d != "" {
		return d
	}
	if x := os.Getenv("XDG_CACHE_HOME"); x != "" {
		return filepath.Join(x, "cablemesh", "upgrade")
	}
	return "/var/cache/cablemesh/upgrade"
}

// RequireCommit skips the test when the module is not a git checkout holding commit (a source
// tarball, or a shallow clone that does not reach back to it), saying how to get it; any other
// failure to read the history fails the test.
func RequireCommit(t testing.TB, commit string) {
	t.Helper()
	ctx := context.Background()
	root, err := ModuleRoot(ctx)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if r := Run(ctx, "git", "-C", root, "rev-parse", "--git-dir"); r.Err != nil {
		t.Skipf("skipping: %s is not a git checkout, so the previous version %s cannot be built (%s)", root, commit, strings.TrimSpace(r.Stderr))
	}
	if r := Run(ctx, "git", "-C", root, "cat-file", "-e", commit+"^{commit}"); r.Err != nil {
		shallow := strings.TrimSpace(Run(ctx, "git", "-C", root, "rev-parse", "--is-shallow-repository").Stdout)
		if shallow == "true" {
			t.Skipf("skipping: the shallow clone at %s does not reach the previous version %s (git fetch --unshallow)", root, commit)
		}
		t.Fatalf("the previous version %s is not in the git history of %s: %s", commit, root, r)
	}
}

// BuildVersion returns cable-broker, cable-agent and cablectl as built from commit of the
// module's git history (tcpcheck from the working tree's build), building them on first use
// into the version cache. The source comes out of `git archive`, so the checkout's work tree
// and worktree list are never touched.
func BuildVersion(ctx context.Context, commit string) (Binaries, error) {
	cur, err := Build(ctx)
	if err != nil {
		return Binaries{}, err
	}
	root, err := ModuleRoot(ctx)
	if err != nil {
		return Binaries{}, err
	}
	full, err := MustRun(ctx, "git", "-C", root, "rev-parse", "--verify", commit+"^{commit}")
	if err != nil {
		return Binaries{}, fmt.Errorf("resolve commit %s: %w", commit, err)
	}
	full = strings.TrimSpace(full)
	dir := filepath.Join(versionCacheDir(), full)
	if !haveVersion(dir) {
		if err := buildVersionInto(ctx, root, full, dir); err != nil {
			return Binaries{}, err
		}
	}
	return Binaries{Broker: filepath.Join(dir, "cable-broker"), Agent: filepath.Join(dir, "cable-agent"),
		Cablectl: filepath.Join(dir, "cablectl"), TCPCheck: cur.TCPCheck}, nil
}

// haveVersion reports whether dir holds every binary of a version build.
func haveVersion(dir string) bool {
	for _, b := range versionBinaries {
		st, err := os.Stat(filepath.Join(dir, b))
		if err != nil || st.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// buildVersionInto builds commit's binaries in a temp dir beside dir and renames it into place,
// so a build cut short never leaves a half-filled cache entry (and two builds racing both end
// with a complete one).
func buildVersionInto(ctx context.Context, root, commit, dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return fmt.Errorf("version cache: %w", err)
	}
	sweepVersionBuilds(filepath.Dir(dir))
	work, err := os.MkdirTemp(filepath.Dir(dir), "build-"+commit[:12]+"-")
	if err != nil {
		return fmt.Errorf("version cache: %w", err)
	}
	defer os.RemoveAll(work)
	src := filepath.Join(work, "src")
	if err := extractCommit(ctx, root, commit, src); err != nil {
		return err
	}
	out := filepath.Join(work, "bin")
	// Not -trimpath: its objects would miss the build cache the working tree's builds filled, and
	// a cold build of every dependency takes over ten minutes on a loaded two-core machine.
	args := []string{"-C", src, "build",
		"-ldflags", "-X github.com/cablemesh/cablemesh/internal/version.Version=" + commit[:12], "-o", out + "/"}
	for _, b := range versionBinaries {
		args = append(args, "./cmd/"+b)
	}
	// A cold build takes minutes on two cores. The build of another commit must not pick up a
	// go.work of the machine's, nor fetch another toolchain.
	bctx, cancel := context.WithTimeout(ctx, 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(bctx, "go", args...)
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOTOOLCHAIN=local")
	// A test killed by its timeout takes the build with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	b, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("build the binaries of %s: %w\n%s", commit[:12], err, b)
	}
	if err := os.Rename(out, dir); err != nil {
		if haveVersion(dir) {
			return nil // another build finished first
		}
		return fmt.Errorf("version cache: %w", err)
	}
	return nil
}

// staleVersionBuild is the age past which a build directory of the cache is a leftover of a
// build that was killed (a build takes minutes).
const staleVersionBuild = time.Hour

// sweepVersionBuilds removes the build directories of the cache that builds killed before
// their cleanup left behind.
func sweepVersionBuilds(cache string) {
	entries, _ := os.ReadDir(cache)
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), "build-") {
			continue
		}
		if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > staleVersionBuild {
			_ = os.RemoveAll(filepath.Join(cache, e.Name()))
		}
	}
}

// extractCommit writes the tree of commit into dir, read from `git archive`'s tar stream.
func extractCommit(ctx context.Context, root, commit, dir string) error {
	cmd := exec.CommandContext(ctx, "git", "-C", root, "archive", "--format=tar", commit)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return fmt.Errorf("git archive %s: %w", commit, err)
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("git archive %s: %w", commit, err)
	}
	exErr := untar(stdout, dir)
	_, _ = io.Copy(io.Discard, stdout)
	if err := cmd.Wait(); err != nil {
		return fmt.Errorf("git archive %s: %w: %s", commit, err, stderr.String())
	}
	if exErr != nil {
		return fmt.Errorf("extract %s: %w", commit, exErr)
	}
	return nil
}

// untar writes the regular files, directories and symlinks of a tar stream below dir; a name
// that would leave dir is refused.
func untar(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(h.Name)
		if name == "." || filepath.IsAbs(name) || name == ".." || strings.HasPrefix(name, "../") {
			if name == "." {
				continue
			}
			return fmt.Errorf("entry %q leaves the directory", h.Name)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := writeFile(p, tr, os.FileMode(h.Mode)&0o755|0o644); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, p); err != nil {
				return err
			}
		}
		// git archive writes a pax global header (the commit id) and nothing else.
	}
}

func writeFile(p string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
