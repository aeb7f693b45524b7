//go:build linux

// Command guestinit is PID 1 of the VM that tests/vm boots, in the manner of virtme: it runs
// from a tiny initramfs, loads the boot modules the initramfs carries (virtio, 9p, overlay),
// mounts the host's / read-only over 9p under a tmpfs overlay and makes that the root, mounts
// the pseudo file systems, bind-mounts the guest kernel's modules on /lib/modules, loads the
// modules of the plan with modprobe, runs the plan's commands one after the other with their
// output and outcome in the share, and powers the VM off. It is built statically by the host
// side (CGO_ENABLED=0) and never runs outside the VM: started as any other PID than 1 it exits.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/tests/vm/guest"
)

func main() {
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "guestinit: this is the VM's init (PID 1), started by tests/vm; not a program to run by hand")
		os.Exit(2)
	}
	// The kernel starts init with no PATH; the commands it runs itself (ip, modprobe) need one.
	_ = os.Setenv("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	err := run()
	if err != nil {
		logf("FATAL: %v", err)
		if _, serr := os.Stat(guest.ShareMount); serr == nil {
			_ = os.WriteFile(filepath.Join(guest.ShareMount, guest.OutDir, "fatal"), []byte(err.Error()+"\n"), 0o644)
		}
	}
	unix.Sync()
	logf("powering off")
	_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	// Not reached; should power-off fail, PID 1 exiting panics the kernel, and with panic=-1 and
	// -no-reboot qemu exits.
	os.Exit(1)
}

// logf writes one line to the console (PID 1's stdout), prefixed with the guest's uptime.
func logf(format string, a ...any) {
	fmt.Printf("[guestinit %8.3f] %s\n", uptime().Seconds(), fmt.Sprintf(format, a...))
}

func uptime() time.Duration {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return time.Duration(ts.Nano())
}

func run() error {
	var rep guest.Report
	rep.InitStarted = uptime()
	if err := earlyMounts(); err != nil {
		return err
	}
	if err := loadBootModules(); err != nil {
		return err
	}
	if err := mountRoot(); err != nil {
		return err
	}
	rep.RootMounted = uptime()
	logf("root: host / over 9p (read-only) under a tmpfs overlay")
	var plan guest.Plan
	if err := guest.ReadJSON(filepath.Join(guest.ShareMount, guest.PlanFile), &plan); err != nil {
		return err
	}
	var dirs []string
	for _, c := range plan.Commands {
		dirs = append(dirs, c.Dir)
	}
	if err := lateMounts(dirs); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Join(guest.ShareMount, guest.OutDir), 0o755); err != nil {
		return err
	}
	setupHost()
	if err := bindModules(plan.KernelTree); err != nil {
		return err
	}
	rep.ModuleErrors = loadModules(plan.Modules)
	rep.ModulesLoaded = uptime()
	fillReport(&rep)
	if err := guest.WriteJSON(filepath.Join(guest.ShareMount, guest.GuestFile), rep); err != nil {
		return err
	}
	logf("kernel %s, %d CPUs, %d MiB; modules: %s", rep.KernelRelease, rep.CPUs, rep.MemTotalKiB/1024, strings.Join(rep.LoadedModules, " "))

	reaper := startReaper()
	for _, c := range plan.Commands {
		o := runCommand(reaper, c)
		logf("command %s: exit %d after %s%s", c.Name, o.ExitCode, o.Took.Round(time.Millisecond), map[bool]string{true: " (timed out)", false: ""}[o.TimedOut])
		if err := guest.WriteJSON(guest.OutcomePath(guest.ShareMount, c.Name), o); err != nil {
			return err
		}
	}
	return guest.WriteJSON(filepath.Join(guest.ShareMount, guest.DoneFile), map[string]any{"uptime": uptime()})
}

func mount(src, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mkdir %s: %w", target, err)
	}
	if err := unix.Mount(src, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s (%s, %q) on %s: %w", src, fstype, data, target, err)
	}
	return nil
}

// earlyMounts are what the initramfs stage needs: /dev, /proc, /sys.
func earlyMounts() error {
	for _, m := range []struct{ src, target, fstype string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		if err := mount(m.src, m.target, m.fstype, unix.MS_NOSUID, ""); err != nil {
			return err
		}
	}
	return nil
}

// loadBootModules loads the initramfs's modules in the order the host resolved from modules.dep.
func loadBootModules() error {
	b, err := os.ReadFile(guest.ModuleOrder)
	if err != nil {
		return err
	}
	for _, name := range strings.Fields(string(b)) {
		if err := insmod(filepath.Join(guest.InitramfsModules, name)); err != nil {
			return err
		}
	}
	return nil
}

func insmod(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.FinitModule(int(f.Fd()), "", 0); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("load module %s: %w", path, err)
	}
	return nil
}

// mountRoot mounts the host's / (9p, read-only) as the lower layer of an overlay on a tmpfs,
// mounts the share in it, moves /dev, /proc and /sys over and switches root (as switch_root does:
// the initramfs cannot be pivoted away).
func mountRoot() error {
	const lower, rw, newRoot = "/lower", "/rw", "/newroot"
	opts9p := "trans=virtio,version=9p2000.L,msize=512000,cache=loose,access=client"
	var err error
	// The virtio device is probed when virtio_pci loads; give it a moment all the same.
	for i := 0; i < 50; i++ {
		if err = mount(guest.RootTag, lower, "9p", unix.MS_RDONLY, opts9p); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err != nil {
		return err
	}
	if err := mount("tmpfs", rw, "tmpfs", 0, "mode=0755"); err != nil {
		return err
	}
	for _, d := range []string{rw + "/upper", rw + "/work"} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := mount("overlay", newRoot, "overlay", 0, fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lower, rw, rw)); err != nil {
		return err
	}
	// The share: read-write, no caching, so that what the guest writes is on the host at once.
	if err := mount(guest.ShareTag, newRoot+guest.ShareMount, "9p", 0, "trans=virtio,version=9p2000.L,msize=512000,cache=none,access=client"); err != nil {
		return err
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := unix.Mount(d, newRoot+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s into the new root: %w", d, err)
		}
	}
	if err := os.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the new root on /: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	return os.Chdir("/")
}

// lateMounts give the new root what a booted system has: fresh /run and /tmp (not the host's
// files), devpts, shm, bpffs, cgroup2 (unified, at /sys/fs/cgroup), debugfs. The commands'
// working directories stay visible even when they are under a directory that gets a fresh
// tmpfs: a clone under /tmp (as CI's may be) would otherwise vanish and every command fail with
// "fork/exec ...: no such file or directory" (the chdir's error).
func lateMounts(commandDirs []string) error {
	kept, err := holdDirs(commandDirs, "/tmp", "/var/tmp")
	if err != nil {
		return err
	}
	for _, m := range []struct {
		src, target, fstype string
		flags               uintptr
		data                string
	}{
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755"},
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"tmpfs", "/var/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=0620,ptmxmode=0666"},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777"},
		{"bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", 0, ""},
		{"debugfs", "/sys/kernel/debug", "debugfs", 0, ""},
	} {
		if err := mount(m.src, m.target, m.fstype, m.flags, m.data); err != nil {
			return err
		}
	}
	if err := restoreDirs(kept); err != nil {
		return err
	}
	// ip netns keeps its namespaces under /run/netns, as on the host.
	return os.MkdirAll("/run/netns", 0o755)
}

// heldDir is a host directory held open across the tmpfs mount that hides it.
type heldDir struct {
	path string
	fd   int
}

// holdDirs opens, for every dir under one of the hidden roots, the top directory below that
// root (/tmp/ci for /tmp/ci/tests/netns: the tests also read files of the rest of the tree).
func holdDirs(dirs []string, hidden ...string) ([]heldDir, error) {
	var held []heldDir
	seen := map[string]bool{}
	for _, d := range dirs {
		for _, root := range hidden {
			rel, err := filepath.Rel(root, filepath.Clean(d))
			if err != nil || rel == "." || strings.HasPrefix(rel, "..") {
				continue
			}
			top := filepath.Join(root, strings.Split(rel, string(filepath.Separator))[0])
			if seen[top] {
				continue
			}
			seen[top] = true
			fd, err := unix.Open(top, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
			if err != nil {
				return nil, fmt.Errorf("hold %s across the fresh %s: %w", top, root, err)
			}
			held = append(held, heldDir{path: top, fd: fd})
		}
	}
	return held, nil
}

// restoreDirs bind-mounts the held directories back at their paths, on the fresh tmpfs.
func restoreDirs(held []heldDir) error {
	for _, h := range held {
		if err := os.MkdirAll(h.path, 0o755); err != nil {
			return fmt.Errorf("mkdir %s: %w", h.path, err)
		}
		src := fmt.Sprintf("/proc/self/fd/%d", h.fd)
		if err := unix.Mount(src, h.path, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind the host's %s back over the fresh tmpfs: %w", h.path, err)
		}
		_ = unix.Close(h.fd)
	}
	return nil
}

// setupHost names the guest and brings loopback up.
func setupHost() {
	_ = unix.Sethostname([]byte("cablemesh-vm"))
	if out, err := exec.Command("ip", "link", "set", "lo", "up").CombinedOutput(); err != nil {
		logf("ip link set lo up: %v: %s", err, out)
	}
}

// bindModules makes tree's lib/modules the guest's /lib/modules, so that modprobe and the
// kernel's own module requests (an xfrm algorithm, an nftables expression) find the modules.
func bindModules(tree string) error {
	src := filepath.Join(tree, "lib", "modules")
	if err := mount(src, "/lib/modules", "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("modules of the guest kernel: %w", err)
	}
	return nil
}

// loadModules modprobes the modules (one modprobe for all: each run reads the module index over
// 9p, which is slow under TCG) and, should that fail, each one alone to say which failed.
func loadModules(mods []string) map[string]string {
	if len(mods) == 0 {
		return nil
	}
	if out, err := exec.Command("modprobe", append([]string{"-a"}, mods...)...).CombinedOutput(); err == nil {
		return nil
	} else {
		logf("modprobe -a %s: %v: %s", strings.Join(mods, " "), err, strings.TrimSpace(string(out)))
	}
	failed := map[string]string{}
	for _, m := range mods {
		out, err := exec.Command("modprobe", m).CombinedOutput()
		if err != nil {
			failed[m] = strings.TrimSpace(fmt.Sprintf("%v: %s", err, out))
			logf("modprobe %s: %s", m, failed[m])
		}
	}
	return failed
}

func fillReport(rep *guest.Report) {
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		rep.KernelRelease = unix.ByteSliceToString(u.Release[:])
		rep.KernelVersion = unix.ByteSliceToString(u.Version[:])
	}
	if f, err := os.Open("/proc/modules"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if fs := strings.Fields(sc.Text()); len(fs) > 0 {
				rep.LoadedModules = append(rep.LoadedModules, fs[0])
			}
		}
		f.Close()
		sort.Strings(rep.LoadedModules)
	}
	var cpus unix.CPUSet
	if unix.SchedGetaffinity(0, &cpus) == nil {
		rep.CPUs = cpus.Count()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
				rep.MemTotalKiB, _ = strconv.Atoi(f[1])
			}
		}
	}
}

// reaper waits for every child of PID 1: the commands it started and every orphan that
// reparents to it (processes the tests leave behind, daemons whose parent died). The exits of
// the commands go to the channel registered for their pid.
type reaper struct {
	register chan registration
}

type registration struct {
	pid  int
	exit chan syscall.WaitStatus
}

func startReaper() *reaper {
	r := &reaper{register: make(chan registration)}
	exits := make(chan struct {
		pid int
		ws  syscall.WaitStatus
	}, 64)
	go func() {
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, 0, nil)
			if err != nil {
				if errors.Is(err, syscall.ECHILD) {
					time.Sleep(50 * time.Millisecond)
				}
				continue
			}
			exits <- struct {
				pid int
				ws  syscall.WaitStatus
			}{pid, ws}
		}
	}()
	go func() {
		waiting := map[int]chan syscall.WaitStatus{}
		early := map[int]syscall.WaitStatus{}
		for {
			select {
			case reg := <-r.register:
				if ws, ok := early[reg.pid]; ok {
					delete(early, reg.pid)
					reg.exit <- ws
					continue
				}
				waiting[reg.pid] = reg.exit
			case e := <-exits:
				if ch, ok := waiting[e.pid]; ok {
					delete(waiting, e.pid)
					ch <- e.ws
					continue
				}
				// An orphan, or a command that exited before it was registered: kept (pids are
				// not reused that fast) and dropped once the map grows.
				early[e.pid] = e.ws
				if len(early) > 4096 {
					early = map[int]syscall.WaitStatus{}
				}
			}
		}
	}()
	return r
}

// runCommand runs c in its own process group with its output in the share, killing the group
// when c's timeout passes (SIGQUIT first, for Go's goroutine dump, then SIGKILL).
func runCommand(r *reaper, c guest.Command) guest.Outcome {
	o := guest.Outcome{Name: c.Name, ExitCode: -1}
	start := time.Now()
	logf("command %s: %s (in %s, timeout %s)", c.Name, strings.Join(c.Argv, " "), c.Dir, c.Timeout)
	logFile, err := os.Create(guest.LogPath(guest.ShareMount, c.Name))
	if err != nil {
		o.Error = err.Error()
		return o
	}
	defer logFile.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		o.Error = err.Error()
		return o
	}
	defer devnull.Close()
	argv0, err := lookPath(c.Argv[0], c.Env)
	if err != nil {
		o.Error = err.Error()
		fmt.Fprintln(logFile, err)
		return o
	}
	exit := make(chan syscall.WaitStatus, 1)
	p, err := os.StartProcess(argv0, c.Argv, &os.ProcAttr{
		Dir:   c.Dir,
		Env:   c.Env,
		Files: []*os.File{devnull, logFile, logFile},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	if err != nil {
		o.Error = err.Error()
		fmt.Fprintln(logFile, err)
		return o
	}
	r.register <- registration{pid: p.Pid, exit: exit}
	timeout := time.NewTimer(c.Timeout)
	defer timeout.Stop()
	var ws syscall.WaitStatus
	select {
	case ws = <-exit:
	case <-timeout.C:
		o.TimedOut = true
		fmt.Fprintf(logFile, "\nguestinit: %s timed out after %s: SIGQUIT, then SIGKILL after 15s\n", c.Name, c.Timeout)
		_ = syscall.Kill(-p.Pid, syscall.SIGQUIT)
		select {
		case ws = <-exit:
		case <-time.After(15 * time.Second):
			_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
			ws = <-exit
		}
	}
	// Whatever the command left in its process group goes with it.
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
	o.Took = time.Since(start)
	if ws.Exited() {
		o.ExitCode = ws.ExitStatus()
	} else if ws.Signaled() {
		o.Error = "killed by " + ws.Signal().String()
	}
	_ = logFile.Sync()
	return o
}

// lookPath finds argv0 in the PATH of env (not the init's own).
func lookPath(argv0 string, env []string) (string, error) {
	if strings.Contains(argv0, "/") {
		return argv0, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		p := filepath.Join(dir, argv0)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in PATH %s", argv0, path)
}
