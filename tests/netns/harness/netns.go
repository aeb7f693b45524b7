package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// OwnerDir holds one file per live test run, named by its prefix and holding the pid of the test
// process, so that a sweep removes the namespaces of crashed runs and never those of a run that
// is still going (two `go test` processes may run at once).
const OwnerDir = "/run/cablemesh-netns-tests"

// SweepPrefix starts every test run's namespace prefix ("cbt" + short hex id + "-").
const SweepPrefix = "cbt"

// KeptMarker is the file a run kept with CABLEMESH_KEEP=1 leaves in its temp dir, so that later
// sweeps leave that dir alone.
const KeptMarker = "KEPT"

var runPrefixRE = regexp.MustCompile(`^(cbt[0-9a-f]{4}-)`)

// NewPrefix returns a fresh per-run namespace prefix such as "cbt7a3f-".
func NewPrefix() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return SweepPrefix + hex.EncodeToString(b) + "-"
}

// ListNamespaces returns the names of the host's named network namespaces.
func ListNamespaces(ctx context.Context) ([]string, error) {
	out, err := MustRun(ctx, "ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names, nil
}

// AddNamespace creates a network namespace with its loopback up.
func AddNamespace(ctx context.Context, name string) error {
	if _, err := MustRun(ctx, "ip", "netns", "add", name); err != nil {
		return err
	}
	_, err := MustRun(ctx, "ip", "-n", name, "link", "set", "lo", "up")
	return err
}

// DeleteNamespace kills every process inside namespace name and deletes it. A namespace that is
// already gone is no error.
func DeleteNamespace(ctx context.Context, name string) error {
	KillNamespacePids(ctx, name)
	r := Run(ctx, "ip", "netns", "del", name)
	if r.Err != nil && !strings.Contains(r.Stderr, "No such file") {
		return fmt.Errorf("%s", r)
	}
	return nil
}

// KillNamespacePids SIGKILLs every process whose network namespace is name.
func KillNamespacePids(ctx context.Context, name string) {
	for i := 0; i < 3; i++ {
		out := Run(ctx, "ip", "netns", "pids", name).Stdout
		pids := strings.Fields(out)
		if len(pids) == 0 {
			return
		}
		for _, s := range pids {
			if pid, err := strconv.Atoi(s); err == nil && pid != os.Getpid() {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ClaimPrefix records that this process owns prefix (see OwnerDir).
func ClaimPrefix(prefix string) error {
	if err := os.MkdirAll(OwnerDir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(OwnerDir, prefix), []byte(strconv.Itoa(os.Getpid())), 0o644)
}

// ReleasePrefix forgets the claim of ClaimPrefix.
func ReleasePrefix(prefix string) { _ = os.Remove(filepath.Join(OwnerDir, prefix)) }

func prefixOwnerAlive(prefix string) bool {
	b, err := os.ReadFile(filepath.Join(OwnerDir, prefix))
	if err != nil {
		return false
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || pid <= 0 {
		return false
	}
	return syscall.Kill(pid, 0) == nil
}

// SweepNamespaces deletes the namespaces whose names start with prefix and kills what runs in them.
func SweepNamespaces(ctx context.Context, prefix string) ([]string, error) {
	names, err := ListNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, n := range names {
		if !strings.HasPrefix(n, prefix) {
			continue
		}
		if err := DeleteNamespace(ctx, n); err != nil {
			return removed, err
		}
		removed = append(removed, n)
	}
	return removed, nil
}

// SweepStale removes what crashed earlier test runs left behind: namespaces named "cbtXXXX-..."
// whose owning test process is gone, their temp dirs and their owner files.
func SweepStale(ctx context.Context) ([]string, error) {
	names, err := ListNamespaces(ctx)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, n := range names {
		m := runPrefixRE.FindStringSubmatch(n)
		if m == nil || prefixOwnerAlive(m[1]) {
			continue
		}
		if err := DeleteNamespace(ctx, n); err != nil {
			return removed, err
		}
		removed = append(removed, n)
	}
	// Temp dirs of crashed runs (os.MkdirTemp("", prefix)), unless kept on purpose (KeptMarker).
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), SweepPrefix+"*"))
	for _, d := range dirs {
		m := runPrefixRE.FindStringSubmatch(filepath.Base(d))
		if m == nil || prefixOwnerAlive(m[1]) {
			continue
		}
		if _, err := os.Stat(filepath.Join(d, KeptMarker)); err == nil {
			continue
		}
		if st, err := os.Stat(d); err == nil && st.IsDir() {
			if !sweepStaleDatapath(d) {
				continue // something is still mounted below it: never remove through a mount
			}
			_ = os.RemoveAll(d)
			removed = append(removed, d)
		}
	}
	entries, _ := os.ReadDir(OwnerDir)
	for _, e := range entries {
		if runPrefixRE.MatchString(e.Name()) && !prefixOwnerAlive(e.Name()) {
			ReleasePrefix(e.Name())
		}
	}
	return removed, nil
}
