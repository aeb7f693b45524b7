package bpflb

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/bpf"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

const (
	// Namespaces are cbtl<pid>-<name> (see nstest, which sweeps those of dead runs).
	nsPrefix = nstest.Prefix("cbtl")
	// Cgroups and pin directories are <ownPrefix><pid>-<n>, swept by TestMain when <pid> is gone.
	ownPrefix = "cmbpflb-"
	bpffsRoot = "/sys/fs/bpf"

	clientDev, backendDev = "cbtl-c", "cbtl-b"
)

// The addresses of the test topology: only inside the namespaces the tests create.
var (
	clientIP4   = netip.MustParseAddr("10.231.0.1")
	backendA4   = netip.MustParseAddr("10.231.0.2")
	backendB4   = netip.MustParseAddr("10.231.0.3")
	clientIP6   = netip.MustParseAddr("fd00:231::1")
	backendA6   = netip.MustParseAddr("fd00:231::2")
	backendB6   = netip.MustParseAddr("fd00:231::3")
	vip4        = netip.MustParseAddr("241.231.0.1")
	vip6        = netip.MustParseAddr("fd00:241::1")
	backendPort = uint16(8080)
)

// env is one test's world: a client and a backend namespace joined by a veth, a cgroup the
// hooks attach to, a pin directory, and the load balancer.
type env struct {
	t                   *testing.T
	clientNS, backendNS string
	cgroup              string // absolute path
	pinDir              string
	opts                bpf.Options
	lb                  *bpf.LB
}

var envSeq atomic.Int32

// cgroupRoot is where cgroup2 is mounted: /sys/fs/cgroup/unified on a hybrid layout (as on
// these test machines), /sys/fs/cgroup on a unified one; "" when neither.
var cgroupRoot = func() string {
	for _, p := range []string{"/sys/fs/cgroup/unified", "/sys/fs/cgroup"} {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC {
			return p
		}
	}
	return ""
}()

func requireRoot(t *testing.T) {
	t.Helper()
	nstest.RequireRoot(t, "loads eBPF programs, attaches them to a cgroup, creates network namespaces and veth pairs", "ip", "ping")
	if cgroupRoot == "" {
		t.Skip("needs cgroup2 mounted at /sys/fs/cgroup/unified or /sys/fs/cgroup")
	}
}

// newEnv builds the topology and opens the load balancer with method for socket destroy.
func newEnv(t *testing.T, method bpf.DestroyMethod) *env {
	t.Helper()
	requireRoot(t)
	n := strconv.Itoa(int(envSeq.Add(1)))
	e := &env{t: t}
	e.clientNS = nsPrefix.Add(t, "c"+n)
	e.backendNS = nsPrefix.Add(t, "b"+n)
	nstest.Veth(t, e.clientNS, clientDev, clientIP4.String()+"/24", e.backendNS, backendDev, backendA4.String()+"/24")
	nstest.MustRun(t, "ip", "-n", e.backendNS, "addr", "add", backendB4.String()+"/24", "dev", backendDev)
	// nodad: usable at once, instead of after duplicate address detection.
	nstest.MustRun(t, "ip", "-n", e.clientNS, "addr", "add", clientIP6.String()+"/64", "dev", clientDev, "nodad")
	for _, a := range []netip.Addr{backendA6, backendB6} {
		nstest.MustRun(t, "ip", "-n", e.backendNS, "addr", "add", a.String()+"/64", "dev", backendDev, "nodad")
	}
	for _, ns := range []string{e.clientNS, e.backendNS} {
		nstest.MustRun(t, "ip", "-n", ns, "link", "set", "lo", "up")
	}
	nstest.WaitLinkUp(t, e.clientNS, clientDev)
	nstest.WaitLinkUp(t, e.backendNS, backendDev)

	name := ownPrefix + strconv.Itoa(os.Getpid()) + "-" + n
	e.cgroup = newCgroup(t, name)
	e.pinDir = filepath.Join(bpffsRoot, name)
	t.Cleanup(func() {
		if err := bpf.Purge(e.pinDir); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	e.opts = bpf.Options{PinDir: e.pinDir, CgroupPath: e.cgroup, DestroyMethod: method,
		Log: slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	e.lb = e.open()
	return e
}

// open opens the load balancer and closes it at cleanup (pins stay for Purge to remove).
func (e *env) open() *bpf.LB {
	e.t.Helper()
	lb, err := bpf.Open(context.Background(), e.opts)
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { lb.Close() })
	return lb
}

func (e *env) sync(services ...bpf.Service) {
	e.t.Helper()
	if err := e.lb.Sync(services); err != nil {
		e.t.Fatal(err)
	}
}

// testWriter sends the loader's logs to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// newCgroup creates a cgroup2 child, and at cleanup kills what runs in it and removes it.
func newCgroup(t *testing.T, name string) string {
	t.Helper()
	path := filepath.Join(cgroupRoot, name)
	if err := os.Mkdir(path, 0o755); err != nil {
		t.Fatalf("create cgroup: %v", err)
	}
	t.Cleanup(func() {
		if err := nstest.RemoveCgroup(path); err != nil {
			t.Errorf("cleanup: %v", err)
		}
	})
	return path
}

// sweepStale removes the cgroups and pin directories of earlier runs whose process is gone
// (a killed run cannot clean up).
func sweepStale() {
	re := regexp.MustCompile(`^` + regexp.QuoteMeta(ownPrefix) + `([0-9]+)-`)
	stale := func(dir string) []string {
		entries, _ := os.ReadDir(dir)
		var out []string
		for _, e := range entries {
			m := re.FindStringSubmatch(e.Name())
			if m == nil {
				continue
			}
			if pid, err := strconv.Atoi(m[1]); err == nil && nstest.Alive(pid) && pid != os.Getpid() {
				continue // its run is still going
			}
			out = append(out, filepath.Join(dir, e.Name()))
		}
		return out
	}
	for _, p := range stale(bpffsRoot) {
		if err := bpf.Purge(p); err != nil {
			fmt.Fprintln(os.Stderr, "bpflb: sweep:", err)
		}
	}
	if cgroupRoot == "" {
		return
	}
	for _, p := range stale(cgroupRoot) {
		if err := nstest.RemoveCgroup(p); err != nil {
			fmt.Fprintln(os.Stderr, "bpflb: sweep:", err)
		}
	}
}

// inNamespace runs f on a thread that entered the named namespace, so that what f creates
// (listening sockets, tcx attachments) belongs there. The thread returns to the test's
// namespace after; if it cannot, it stays locked and dies with the goroutine.
func inNamespace(name string, f func() error) error {
	ns, err := netns.GetFromName(name)
	if err != nil {
		return fmt.Errorf("open netns %s: %w", name, err)
	}
	defer ns.Close()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns %s: %w", name, err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return from netns %s: %w (after %v)", name, err, ferr)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}

func service(vip netip.Addr, proto bpf.Proto, backends ...netip.Addr) bpf.Service {
	s := bpf.Service{VIP: vip, Port: 80, Proto: proto, Backends: []bpf.Backend{}}
	for i, a := range backends {
		s.Backends = append(s.Backends, bpf.Backend{Addr: a, Port: backendPort, ClusterID: uint32(i + 1)})
	}
	return s
}

func ap(a netip.Addr, port uint16) string { return netip.AddrPortFrom(a, port).String() }
