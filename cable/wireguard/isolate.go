package wireguard

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// IsolatedEnv is set (to "1") in the environment of the re-executed child of RunIsolated.
const IsolatedEnv = "CABLEMESH_WG_ISOLATED"

// parentMntNSEnv carries the parent's mount namespace so the child can refuse to mount over the
// host's UAPI directory if it somehow was not unshared.
const parentMntNSEnv = "CABLEMESH_WG_PARENT_MNTNS"

// forwardedSignals are passed from the waiting parent to the child. SIGINT and SIGTERM stop an
// agent; the others are forwarded too so that a signal meant for the agent (e.g. a status dump)
// does not kill the parent with the default action.
var forwardedSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGUSR1, syscall.SIGUSR2}

// RunIsolated is called first thing in an agent's main. The UAPI socket of a userspace WireGuard
// device lives at /var/run/wireguard/<name>.sock, a path shared by every network namespace, so
// several agents on one host (netns test meshes) with the same interface name would collide.
//
// When the kernel has WireGuard it does nothing (kernel devices are per network namespace) and
// returns parentDone=false. When it has not and the process is not yet isolated, it re-executes
// the current binary (same args, env + CABLEMESH_WG_ISOLATED=1) in a new mount namespace, waits
// for it while forwarding SIGINT/SIGTERM (and SIGHUP/SIGUSR1/SIGUSR2), and returns parentDone=true
// with the child's exit code (128+signal if it was killed): main must then os.Exit(exitCode).
// In the child (env set) it mounts a private tmpfs on /run/wireguard (the target of
// /var/run/wireguard) and returns parentDone=false. On error main should exit non-zero.
// CABLEMESH_WG_ISOLATED=0 opts out (a single agent on a host that wants `wg show` to see its
// userspace device).
func RunIsolated() (parentDone bool, exitCode int, err error) {
	switch os.Getenv(IsolatedEnv) {
	case "1":
		return false, 0, mountPrivateUAPIDir()
	case "0":
		// Opt-out: one agent per host that wants its UAPI socket visible to `wg show`.
		return false, 0, nil
	}
	if KernelHasWireGuard() {
		return false, 0, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return false, 0, fmt.Errorf("isolate: find own executable: %w", err)
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), IsolatedEnv+"=1")
	if ns, err := mntNS(); err == nil {
		cmd.Env = append(cmd.Env, parentMntNSEnv+"="+ns)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Unshareflags: syscall.CLONE_NEWNS, // Go also makes / recursively private in the child
		// If the parent dies without forwarding (SIGKILL), the child must not live on holding the
		// device. Pdeathsig fires when the forking thread exits, hence the locked thread.
		Pdeathsig: syscall.SIGTERM,
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		return false, 0, fmt.Errorf("isolate: start %s in a new mount namespace: %w", exe, err)
	}
	done := make(chan struct{})
	fwd := make(chan struct{})
	go func() {
		// Owned by RunIsolated: ends when the child has been waited for.
		defer close(fwd)
		for {
			select {
			case s := <-sigs:
				_ = cmd.Process.Signal(s)
			case <-done:
				return
			}
		}
	}()
	werr := cmd.Wait()
	close(done)
	<-fwd
	if werr == nil {
		return true, 0, nil
	}
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return true, 128 + int(ws.Signal()), nil
		}
		return true, ee.ExitCode(), nil
	}
	return true, 1, fmt.Errorf("isolate: wait for child: %w", werr)
}

// KernelHasWireGuard reports whether the kernel offers the WireGuard generic netlink family (the
// kernel autoloads the module on this query where it is available).
func KernelHasWireGuard() bool {
	_, err := netlink.GenlFamilyGet("wireguard")
	return err == nil
}

func mntNS() (string, error) { return os.Readlink("/proc/self/ns/mnt") }

// mountPrivateUAPIDir mounts a tmpfs over the directory /var/run/wireguard resolves to, in this
// process's own mount namespace.
func mountPrivateUAPIDir() error {
	if parent := os.Getenv(parentMntNSEnv); parent != "" {
		own, err := mntNS()
		if err != nil {
			return fmt.Errorf("isolate: read own mount namespace: %w", err)
		}
		if own == parent {
			return fmt.Errorf("isolate: %s=1 but the process shares its parent's mount namespace %s; refusing to mount over the host's %s", IsolatedEnv, own, UAPIDir)
		}
	}
	// /var/run is normally a symlink to /run; mount where the path really is.
	parent, err := filepath.EvalSymlinks(filepath.Dir(UAPIDir))
	if err != nil {
		return fmt.Errorf("isolate: resolve %s: %w", filepath.Dir(UAPIDir), err)
	}
	dir := filepath.Join(parent, filepath.Base(UAPIDir))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("isolate: mkdir %s: %w", dir, err)
	}
	if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("isolate: mount private tmpfs on %s: %w", dir, err)
	}
	return nil
}
