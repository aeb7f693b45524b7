package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/cablemesh/cablemesh/tests/netns/nstest"
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

// AddNamespace creates a network namespace with its loopback up.
func AddNamespace(ctx context.Context, name string) error {
	if err := nstest.Create(name); err != nil {
		return err
	}
	_, err := MustRun(ctx, "ip", "-n", name, "link", "set", "lo", "up")
	return err
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

// prefixOwner is the pid of the test process that claimed prefix, 0 when none did.
func prefixOwner(prefix string) int {
	b, err := os.ReadFile(filepath.Join(OwnerDir, prefix))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return pid
}

func prefixOwnerAlive(prefix string) bool { return nstest.Alive(prefixOwner(prefix)) }

// SweepNamespaces deletes the namespaces whose names start with prefix and kills what runs in them.
func SweepNamespaces(prefix string) ([]string, error) {
	return nstest.DeleteMatching(func(ns string) bool { return strings.HasPrefix(ns, prefix) })
}

// SweepStale removes what crashed earlier test runs left behind: namespaces named "cbtXXXX-..."
// whose owning test process is gone, their temp dirs and their owner files.
func SweepStale(ctx context.Context) ([]string, error) {
	removed, err := nstest.SweepDead(func(ns string) (int, bool) {
		m := runPrefixRE.FindStringSubmatch(ns)
		if m == nil {
			return 0, false
		}
		return prefixOwner(m[1]), true
	})
	if err == nil {
		err = ctx.Err() // the dirs' sweep below unmounts and removes: not once the caller gave up
	}
	if err != nil {
		return removed, err
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
