package vm

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/vm/guest"
)

// Knobs of TestKernelDatapathsInVM.
const (
	// RequiredEnv=1 (make vm-test, make test) turns a missing qemu or guest kernel into a failure
	// instead of a skip, so that CI cannot pass without the VM stage having run.
	RequiredEnv = "CABLEMESH_VM_REQUIRED"
	// RunEnv overrides GuestRun, the -test.run pattern of the netns tests run in the guest.
	RunEnv = "CABLEMESH_VM_RUN"
	// SkipEnv is passed to the guest's go test as -test.skip (e.g. a subtest with a known bug).
	SkipEnv = "CABLEMESH_VM_SKIP"
	// KeepEnv=1 keeps the run's directory (plan, binaries, console and test logs).
	KeepEnv = "CABLEMESH_KEEP"
)

// GuestRun is the set of netns tests run in the guest: the kernel-datapath tests
// (tests/netns/kernel_datapaths_test.go, kernel_vxlanipsec_test.go's TestKernelVxlanIPsec, the
// combined cable vxlan+ipsec over kernel ESP, and drivers_test.go's TestDriversOnOnePair, whose
// kernel-datapaths case runs here and its other case on the host), which skip on a kernel without
// WireGuard or ESP and so only run here.
const GuestRun = "^TestKernel|^TestDriversOnOnePair$"

// GuestModules are loaded in the guest before the tests run: the datapaths the host kernel lacks
// (wireguard, esp4, the xfrm netlink interface) and those the tests build their meshes from.
// Anything else (xfrm algorithms, nftables expressions) the kernel requests itself through
// modprobe, which finds the modules on the guest's /lib/modules.
var GuestModules = []string{
	"wireguard", "esp4", "xfrm_user", "xfrm_algo", "udp_tunnel", "ip6_udp_tunnel",
	"vxlan", "tun", "veth", "bridge", "nf_tables", "nft_ct",
	"gcm", "ghash_generic", "aesni_intel", "seqiv", "echainiv", "sch_fq_codel",
}

// Budget of the guest, sized for TCG on two host cores.
const (
	guestMemMiB  = 3072
	guestCPUs    = 2
	guestTimeout = 30 * time.Minute // the netns tests inside (go test -timeout); they take about 10
	bootMargin   = 5 * time.Minute  // boot, module loading, power-off
	stallTimeout = 8 * time.Minute  // no output at all for this long: the guest hangs
)

func skipOrFail(t *testing.T, format string, a ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, a...)
	if os.Getenv(RequiredEnv) == "1" {
		t.Fatalf("%s (%s=1: the VM stage must run)", msg, RequiredEnv)
	}
	t.Skip("skipping: " + msg)
}

// TestKernelDatapathsInVM boots the stock Debian kernel under qemu with this machine's userspace
// and runs GuestRun of tests/netns inside it, with the same binaries; a failure inside fails it.
func TestKernelDatapathsInVM(t *testing.T) {
	if os.Geteuid() != 0 {
		skipOrFail(t, "the VM test needs root (qemu reads the host's / for the guest, the guest's tests need root inside)")
	}
	if _, err := exec.LookPath(QEMU); err != nil {
		skipOrFail(t, "%v", errNoQEMU)
	}
	kdir := os.Getenv(KernelDirEnv)
	if kdir == "" {
		kdir = KernelDirDefault
	}
	kernel, err := FindKernel(kdir)
	if err != nil {
		skipOrFail(t, "%v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	root, err := ModuleRoot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if removed := SweepStale(); len(removed) > 0 {
		t.Logf("removed the directories of crashed VM runs: %v", removed)
	}
	share, err := NewShare()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Everything the guest printed is in the test's log already (Progress).
		if os.Getenv(KeepEnv) == "1" {
			_ = os.WriteFile(filepath.Join(share, keptMarker), nil, 0o644)
			t.Logf("kept %s (plan, console.log, out/; %s=1)", share, KeepEnv)
			return
		}
		_ = os.RemoveAll(share)
	})
	for _, d := range []string{guest.OutDir, "bin"} {
		if err := os.MkdirAll(filepath.Join(share, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	t0 := time.Now()
	initPath := filepath.Join(share, "guestinit")
	if err := BuildInit(ctx, root, initPath); err != nil {
		t.Fatal(err)
	}
	initramfs := filepath.Join(share, "initramfs.cpio")
	if err := WriteInitramfs(initramfs, initPath, kernel); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(share, "bin")
	if err := BuildGuestBinaries(ctx, root, bin, os.Getenv("CABLEMESH_BIN")); err != nil {
		t.Fatal(err)
	}
	buildTook := time.Since(t0)

	plan, err := guestPlan(ctx, root, kernel)
	if err != nil {
		t.Fatal(err)
	}
	if err := guest.WriteJSON(filepath.Join(share, guest.PlanFile), plan); err != nil {
		t.Fatal(err)
	}

	accel, why := ChooseAccel(ctx, kernel)
	m := Machine{
		Kernel: kernel, Initramfs: initramfs, Share: share, Accel: accel,
		MemMiB: guestMemMiB, CPUs: guestCPUs,
		Deadline: guestTimeout + bootMargin, StallTimeout: stallTimeout,
	}
	// Boot, as the host sees it: from qemu's start to the guest's first command.
	var qemuStart time.Time
	var bootWall time.Duration
	m.Progress = func(source, line string) {
		if bootWall == 0 && source == "console" && strings.Contains(line, "[guestinit") && strings.Contains(line, "] command ") {
			bootWall = time.Since(qemuStart)
		}
		t.Logf("vm %s| %s", source, line)
	}
	t.Logf("guest kernel %s (%s); accelerator %s (%s); build took %s", kernel.Release, kernel.Image, accel, why, buildTook.Round(time.Second))
	t.Logf("%s %s", QEMU, strings.Join(quoteArgs(m.Args()), " "))
	qemuStart = time.Now()
	wall, runErr := m.Run(ctx)

	var rep guest.Report
	repErr := guest.ReadJSON(filepath.Join(share, guest.GuestFile), &rep)
	if repErr == nil {
		t.Logf("guest: kernel %s (%s), %d CPUs, %d MiB; init started %.2fs, root mounted %.2fs, modules loaded %.2fs after the kernel started (guest clock)",
			rep.KernelRelease, rep.KernelVersion, rep.CPUs, rep.MemTotalKiB/1024, rep.InitStarted.Seconds(), rep.RootMounted.Seconds(), rep.ModulesLoaded.Seconds())
		t.Logf("guest modules: %s", strings.Join(rep.LoadedModules, " "))
		for mod, msg := range rep.ModuleErrors {
			t.Errorf("guest: modprobe %s failed: %s", mod, msg)
		}
	}
	if runErr != nil {
		t.Errorf("VM: %v\nlast console lines:\n%s", runErr, Tail(filepath.Join(share, ConsoleLog), 40))
	}
	if b, err := os.ReadFile(filepath.Join(share, guest.OutDir, "fatal")); err == nil {
		t.Errorf("guest init failed: %s", b)
	}
	if repErr != nil {
		t.Errorf("no report from the guest (%v): it did not get as far as loading the modules\nlast console lines:\n%s", repErr, Tail(filepath.Join(share, ConsoleLog), 40))
	}
	for _, c := range plan.Commands {
		var o guest.Outcome
		if err := guest.ReadJSON(guest.OutcomePath(share, c.Name), &o); err != nil {
			t.Errorf("%s: no outcome from the guest: %v", c.Name, err)
			continue
		}
		log, _ := os.ReadFile(guest.LogPath(share, c.Name))
		sum := summarize(string(log))
		t.Logf("%s in the guest: exit %d after %s; %s", c.Name, o.ExitCode, o.Took.Round(time.Second), sum)
		switch {
		case o.TimedOut:
			t.Errorf("%s timed out in the guest after %s", c.Name, c.Timeout)
		case o.ExitCode != 0:
			t.Errorf("%s failed in the guest: exit %d %s; failed: %s (their output is above, prefixed \"vm %s|\")",
				c.Name, o.ExitCode, o.Error, strings.Join(sum.failed, ", "), c.Name)
		}
		if sum.ran == 0 {
			t.Errorf("%s ran no test in the guest: %s", c.Name, strings.Join(c.Argv, " "))
		}
		// In the guest nothing may skip for want of a kernel feature: that is what it is for.
		for _, s := range sum.skipped {
			t.Errorf("%s skipped in the guest: %s", s, sum.skipReasons[s])
		}
	}
	if _, err := os.Stat(filepath.Join(share, guest.DoneFile)); err != nil && runErr == nil {
		t.Errorf("the guest powered off without finishing its plan")
	}
	t.Logf("VM stage: %s wall (build %s, qemu %s of which boot to the first command %s, %s)",
		time.Since(t0).Round(time.Second), buildTook.Round(time.Second), wall.Round(time.Second), bootWall.Round(100*time.Millisecond), accel)
}

// guestPlan is what the guest runs: the netns tests of GuestRun (or $CABLEMESH_VM_RUN) with the
// binaries of the share, in the module's tests/netns directory.
func guestPlan(ctx context.Context, root string, k Kernel) (guest.Plan, error) {
	goroot, err := GoEnv(ctx, root, "GOROOT")
	if err != nil {
		return guest.Plan{}, err
	}
	gocache, err := GoEnv(ctx, root, "GOCACHE")
	if err != nil {
		return guest.Plan{}, err
	}
	gomodcache, err := GoEnv(ctx, root, "GOMODCACHE")
	if err != nil {
		return guest.Plan{}, err
	}
	run := os.Getenv(RunEnv)
	if run == "" {
		run = GuestRun
	}
	bin := filepath.Join(guest.ShareMount, "bin")
	argv := []string{filepath.Join(bin, TestBinary), "-test.v", "-test.count=1",
		"-test.timeout=" + guestTimeout.String(), "-test.run", run}
	if skip := os.Getenv(SkipEnv); skip != "" {
		argv = append(argv, "-test.skip", skip)
	}
	env := []string{
		"PATH=" + filepath.Join(goroot, "bin") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"HOME=/root",
		// The harness runs `go env GOMOD` and builds tcpcheck: the host's caches, read through
		// the overlay, keep that quick; nothing may reach for the network.
		"GOCACHE=" + gocache, "GOMODCACHE=" + gomodcache, "GOTOOLCHAIN=local", "GOPROXY=off",
		"CABLEMESH_BIN=" + bin,
		"CABLEMESH_VM=1",
	}
	if v := os.Getenv(KeepEnv); v != "" {
		env = append(env, KeepEnv+"="+v)
	}
	return guest.Plan{
		KernelTree: k.Tree,
		Modules:    GuestModules,
		Commands: []guest.Command{{
			Name:    "netns",
			Dir:     filepath.Join(root, "tests", "netns"),
			Argv:    argv,
			Env:     env,
			Timeout: guestTimeout + time.Minute,
		}},
	}, nil
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " ,=\"'") && strings.ContainsAny(a, " \"'") {
			out[i] = fmt.Sprintf("%q", a)
		} else {
			out[i] = a
		}
	}
	return out
}

// summary is what go test -v printed about its top-level tests.
type summary struct {
	ran                     int
	passed, failed, skipped []string
	skipReasons             map[string]string
	took                    map[string]string
}

var resultRE = regexp.MustCompile(`^--- (PASS|FAIL|SKIP): (\S+) \(([\d.]+s)\)`)

func summarize(log string) summary {
	s := summary{skipReasons: map[string]string{}, took: map[string]string{}}
	lines := strings.Split(log, "\n")
	for i, l := range lines {
		m := resultRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s.ran++
		s.took[m[2]] = m[3]
		switch m[1] {
		case "PASS":
			s.passed = append(s.passed, m[2])
		case "FAIL":
			s.failed = append(s.failed, m[2])
		case "SKIP":
			s.skipped = append(s.skipped, m[2])
			if i+1 < len(lines) {
				s.skipReasons[m[2]] = strings.TrimSpace(lines[i+1])
			}
		}
	}
	return s
}

func (s summary) String() string {
	var parts []string
	names := make([]string, 0, len(s.took))
	for n := range s.took {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		parts = append(parts, n+" "+s.took[n])
	}
	return fmt.Sprintf("%d passed, %d failed, %d skipped (%s)", len(s.passed), len(s.failed), len(s.skipped), strings.Join(parts, ", "))
}
