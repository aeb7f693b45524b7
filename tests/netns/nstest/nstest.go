// Package nstest owns the life cycle of the test network namespaces: every netns test creates,
// lists, deletes and sweeps its namespaces here (tests/netns/harness builds its meshes on it), so
// there is one way to kill what runs in a namespace, one way to delete one, and one test of
// whether the run that owned a leftover is still going. It also holds what the netns tests of
// single packages (the cable drivers, the health prober) share: running commands, per-process
// namespaces that are removed even when a test fails (and swept when a killed run could not
// remove them), veth pairs, pings and cgroups.
//
// Two naming schemes share the host, told apart by their shape so that a sweep never takes the
// other's namespaces:
//   - a package's Prefix: <prefix><pid>-<name>, for instance cbtv4242-a, unique per test
//     process, so two runs at once (a developer's and `go test ./tests/netns/...`) never delete
//     each other's namespaces, while a later run can tell the leftovers of a killed run by their
//     dead pid;
//   - a harness mesh's run prefix: cbt<4 hex digits>-<name>, whose owner pid is in a file
//     (tests/netns/harness.OwnerDir). Prefix.Add refuses a prefix that could take that shape.
package nstest

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// CommandTimeout bounds every command Run starts.
const CommandTimeout = 30 * time.Second

// Run runs args with CommandTimeout and returns its combined output; the error names the
// command and carries the output.
func Run(args ...string) (string, error) { return RunWithin(CommandTimeout, args...) }

// RunWithin is Run with another time limit, for commands that are meant to take long.
func RunWithin(limit time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// MustRun is Run that fails the test on an error.
func MustRun(t testing.TB, args ...string) string {
	t.Helper()
	out, err := Run(args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// RequireRoot skips the test unless it runs as root and finds the tools on PATH; why says what
// the test needs root for.
func RequireRoot(t testing.TB, why string, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: " + why)
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s on PATH", tool)
		}
	}
}

// Prefix starts the namespace names of one test package, e.g. "cbtv". It must not be another
// package's prefix followed by digits, nor "cbt" and a hex digit (a harness run prefix, see the
// package comment): Add checks the latter.
type Prefix string

// harnessRunPrefix is the shape of the harness's run prefixes, which a Prefix must not take.
var harnessRunPrefix = regexp.MustCompile(`^cbt[0-9a-f]`)

// Name is the name of this process's namespace called name.
func (p Prefix) Name(name string) string {
	return string(p) + strconv.Itoa(os.Getpid()) + "-" + name
}

// swept records the prefixes this process has swept: once is enough, later leftovers can only
// come from runs that started after this one.
var swept sync.Map

// Add creates this process's namespace name (first sweeping the leftovers of dead runs with
// the same prefix) and registers its deletion with t.Cleanup, so that it goes even when the
// test fails. Its loopback stays down.
func (p Prefix) Add(t testing.TB, name string) string {
	t.Helper()
	if harnessRunPrefix.MatchString(string(p)) {
		t.Fatalf("namespace prefix %q has the shape of a harness run prefix (cbt and a hex digit): the harness's sweep would delete its namespaces", p)
	}
	if _, done := swept.LoadOrStore(p, true); !done {
		p.Sweep(t)
	}
	ns := p.Name(name)
	t.Cleanup(func() {
		if err := Delete(ns); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	if err := Create(ns); err != nil {
		t.Fatal(err)
	}
	return ns
}

// Sweep deletes the namespaces with this prefix whose test process is gone (a killed run
// cannot clean up), and kills what still runs in them. Those of live runs, this one included,
// stay.
func (p Prefix) Sweep(t testing.TB) {
	t.Helper()
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(string(p)) + `([0-9]+)-.`)
	removed, err := SweepDead(func(ns string) (int, bool) {
		m := re.FindStringSubmatch(ns)
		if m == nil {
			return 0, false
		}
		pid, err := strconv.Atoi(m[1])
		return pid, err == nil
	})
	for _, ns := range removed {
		t.Logf("removed stale namespace %s", ns)
	}
	if err != nil {
		t.Logf("remove stale namespaces: %v", err)
	}
}

// Create creates network namespace ns; its loopback stays down.
func Create(ns string) error {
	_, err := Run("ip", "netns", "add", ns)
	return err
}

// List returns the names of the host's named network namespaces.
func List() ([]string, error) {
	out, err := Run("ip", "netns", "list")
	if err != nil {
		return nil, err
	}
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0]) // "name (id: 3)"
		}
	}
	return names, nil
}

// DeleteMatching deletes every namespace whose name match accepts (see Delete), and returns
// those it deleted; it stops at the first it cannot delete.
func DeleteMatching(match func(ns string) bool) ([]string, error) {
	names, err := List()
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, ns := range names {
		if !match(ns) {
			continue
		}
		if err := Delete(ns); err != nil {
			return removed, err
		}
		removed = append(removed, ns)
	}
	return removed, nil
}

// SweepDead deletes the namespaces of test runs that are gone: owner returns the pid of the
// process that owns a namespace (ok false: not a test namespace of this scheme, left alone).
func SweepDead(owner func(ns string) (pid int, ok bool)) ([]string, error) {
	return DeleteMatching(func(ns string) bool {
		pid, ok := owner(ns)
		return ok && !Alive(pid)
	})
}

// Alive says whether process pid runs. A killed process is a zombie until its parent (often
// init, for a killed `go test` binary) reaps it, and signal 0 still reaches a zombie.
func Alive(pid int) bool {
	if pid <= 0 || syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return true // no /proc: trust the signal
	}
	// The state follows the command name, which is in parentheses and may hold anything.
	_, rest, _ := strings.Cut(string(stat[strings.LastIndexByte(string(stat), ')')+1:]), " ")
	return !strings.HasPrefix(rest, "Z")
}

// Delete kills what runs in namespace ns and deletes it; a namespace already gone is no error.
func Delete(ns string) error {
	KillPids(ns)
	if out, err := Run("ip", "netns", "del", ns); err != nil && !strings.Contains(out, "No such file") {
		return err
	}
	return nil
}

// KillPids SIGKILLs what runs in namespace ns (never this process), a few times over, since
// a process may fork while it dies.
func KillPids(ns string) {
	for range 3 {
		out, _ := exec.Command("ip", "netns", "pids", ns).Output()
		pids := strings.Fields(string(out))
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

// Veth joins namespaces nsA and nsB by a veth pair devA-devB, gives each end its address
// (CIDR notation; none for "") and sets both up.
func Veth(t testing.TB, nsA, devA, cidrA, nsB, devB, cidrB string) {
	t.Helper()
	MustRun(t, "ip", "-n", nsA, "link", "add", devA, "type", "veth", "peer", "name", devB, "netns", nsB)
	for _, end := range [][3]string{{nsA, devA, cidrA}, {nsB, devB, cidrB}} {
		if end[2] != "" {
			MustRun(t, "ip", "-n", end[0], "addr", "add", end[2], "dev", end[1])
		}
	}
	MustRun(t, "ip", "-n", nsA, "link", "set", devA, "up")
	MustRun(t, "ip", "-n", nsB, "link", "set", devB, "up")
}

// Node is one side of Pair: its underlay address on the veth and its "pod" address, one
// address inside its cluster's pod CIDR, on its loopback.
type Node struct{ Underlay, Pod string }

// Pair makes the two-node mesh of the driver tests: namespaces <p><pid>-a and -b joined by the
// veth pair <p>-va/<p>-vb, each end with its underlay address in a /24, loopback up with the
// node's pod address as a /32.
func (p Prefix) Pair(t testing.TB, a, b Node) (nsA, nsB string) {
	t.Helper()
	nsA, nsB = p.Add(t, "a"), p.Add(t, "b")
	Veth(t, nsA, string(p)+"-va", a.Underlay+"/24", nsB, string(p)+"-vb", b.Underlay+"/24")
	for _, n := range []struct{ ns, pod string }{{nsA, a.Pod}, {nsB, b.Pod}} {
		MustRun(t, "ip", "-n", n.ns, "link", "set", "lo", "up")
		MustRun(t, "ip", "-n", n.ns, "addr", "add", n.pod+"/32", "dev", "lo")
	}
	return nsA, nsB
}

// WaitLinkUp waits until a link's operstate is UP: the kernel activates a link's queue
// asynchronously (linkwatch, up to a second later) and drops what is sent before.
func WaitLinkUp(t testing.TB, ns, link string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		out, err := exec.Command("ip", "-n", ns, "-o", "link", "show", "dev", link).Output()
		if err == nil && strings.Contains(string(out), "state UP") {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("link %s in %s did not come up", link, ns)
}

// PingOK pings dst from namespace ns until three pings in a row answer, for up to about 15s
// (a tunnel may still be coming up), and fails the test otherwise.
func PingOK(t testing.TB, ns, dst string) {
	t.Helper()
	var err error
	for i := 0; i < 10; i++ {
		if _, err = Run("ip", "netns", "exec", ns, "ping", "-c", "3", "-i", "0.2", "-W", "1", dst); err == nil {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("ping %s from %s: %v", dst, ns, err)
}

// PingFails checks that two pings from ns to dst go unanswered.
func PingFails(t testing.TB, ns, dst string) {
	t.Helper()
	if _, err := Run("ip", "netns", "exec", ns, "ping", "-c", "2", "-i", "0.2", "-W", "1", dst); err == nil {
		t.Errorf("ping %s from %s worked, want no path", dst, ns)
	}
}
