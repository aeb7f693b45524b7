package health

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"
)

// prefix starts every namespace these tests create: "cbth-<pid>-<name>", so that a sweep can
// tell the namespaces of a crashed run (pid gone) from those of a run still going.
const prefix = "cbth-"

func run(args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

func mustRun(t *testing.T, args ...string) {
	t.Helper()
	if err := run(args...); err != nil {
		t.Fatal(err)
	}
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and veth pairs, and probes over a raw ICMP socket (CAP_NET_RAW)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("needs iproute2's ip command")
	}
}

// addNamespace creates cbth-<pid>-<name> and registers its deletion (and the killing of whatever
// still runs in it) with t.Cleanup, so it goes even when the test fails.
func addNamespace(t *testing.T, name string) string {
	t.Helper()
	ns := prefix + strconv.Itoa(os.Getpid()) + "-" + name
	t.Cleanup(func() { deleteNamespace(t, ns) })
	mustRun(t, "ip", "netns", "add", ns)
	return ns
}

func deleteNamespace(t *testing.T, ns string) {
	killNamespacePids(ns)
	if err := run("ip", "netns", "del", ns); err != nil && !strings.Contains(err.Error(), "No such file") {
		t.Errorf("cleanup: %v", err)
	}
}

// killNamespacePids kills what runs in one of our namespaces (processes this test started).
func killNamespacePids(ns string) {
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

// removeStale deletes namespaces of ours whose test process is gone (a killed earlier run).
func removeStale(t *testing.T) {
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || !strings.HasPrefix(f[0], prefix) {
			continue
		}
		pidStr, _, _ := strings.Cut(strings.TrimPrefix(f[0], prefix), "-")
		if pid, err := strconv.Atoi(pidStr); err == nil && pid > 0 && syscall.Kill(pid, 0) == nil {
			continue // its run is still going
		}
		t.Logf("removing stale namespace %s", f[0])
		killNamespacePids(f[0])
		_ = run("ip", "netns", "del", f[0])
	}
}

// inNamespace runs f on a thread switched into ns, so sockets f opens live in ns. The thread is
// switched back before it is released; if that fails it stays locked and dies with the
// goroutine rather than carry the wrong namespace into other goroutines.
func inNamespace(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return // the thread stays locked and is discarded
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return to the original netns: %w (after %v)", err, ferr)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

// waitLinkUp waits until a link's operstate is UP: the kernel activates a link's queue
// asynchronously (linkwatch, up to a second later) and drops what is sent before.
func waitLinkUp(t *testing.T, ns, link string) {
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
