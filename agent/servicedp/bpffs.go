package servicedp

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/cablemesh/cablemesh/agent/config"
)

// The services datapath needs a bpf filesystem for its pins and the cgroup2 hierarchy for its
// hooks. bpffs is mounted by cmd/cable-agent before the agent re-executes itself into a private
// mount namespace (cable.PrepareProcess): a bpffs mounted inside that namespace would be a new
// instance that vanishes, with every pin, when the agent exits.

// onFS reports whether path (or, when it does not exist yet, its nearest existing parent) lies
// on a filesystem of type magic.
func onFS(path string, magic int64) (bool, error) {
	p := filepath.Clean(path)
	for {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return int64(st.Type) == magic, nil
		}
		if !errors.Is(err, unix.ENOENT) || p == "/" {
			return false, fmt.Errorf("statfs %s: %w", p, err)
		}
		p = filepath.Dir(p)
	}
}

// EnsureBPFFS makes sure pinDir lies on a bpf filesystem: when it does not and it lies below
// /sys/fs/bpf, it mounts bpffs at /sys/fs/bpf, in this process's mount namespace. It reports
// whether it mounted, and warns (in warning) when that namespace is not the host's: pins in it
// then do not outlive the agent. Call it before the process changes mount namespace.
func EnsureBPFFS(pinDir string) (mounted bool, warning string, err error) {
	ok, err := onFS(pinDir, unix.BPF_FS_MAGIC)
	if err != nil {
		return false, "", fmt.Errorf("bpfPinDir %s: %w", pinDir, err)
	}
	if ok {
		return false, "", nil
	}
	clean := filepath.Clean(pinDir)
	if !strings.HasPrefix(clean+"/", config.BPFFSMount+"/") {
		return false, "", fmt.Errorf("bpfPinDir %s is not on a bpf filesystem; mount one (mount -t bpf bpf DIR) and put bpfPinDir below it, or use the default %s", pinDir, config.DefaultBPFPinDir)
	}
	if err := os.MkdirAll(config.BPFFSMount, 0o755); err != nil {
		return false, "", fmt.Errorf("bpfPinDir %s: create %s: %w", pinDir, config.BPFFSMount, err)
	}
	if err := unix.Mount("bpf", config.BPFFSMount, "bpf", 0, "mode=0700"); err != nil {
		return false, "", fmt.Errorf("bpfPinDir %s: bpffs is not mounted at %s and mounting it failed (mount -t bpf bpf %s): %w", pinDir, config.BPFFSMount, config.BPFFSMount, err)
	}
	own, err1 := os.Readlink("/proc/self/ns/mnt")
	host, err2 := os.Readlink("/proc/1/ns/mnt")
	if err1 == nil && err2 == nil && own != host {
		warning = fmt.Sprintf("mounted bpffs at %s in the agent's own mount namespace (%s, not the host's %s): the pins in %s are lost when the agent exits; mount bpffs at %s on the host (or give the agent the host's) so that an agent restart keeps the service maps", config.BPFFSMount, own, host, pinDir, config.BPFFSMount)
	}
	return true, warning, nil
}

// CgroupPath returns the cgroup2 directory of the config (cgroupPath), or the cgroup2 root
// detected among config.CgroupRoots when it is unset; it checks the directory is on cgroup2.
func CgroupPath(configured string) (string, error) {
	if configured != "" {
		ok, err := onFS(configured, unix.CGROUP2_SUPER_MAGIC)
		if err != nil {
			return "", fmt.Errorf("cgroupPath %s: %w", configured, err)
		}
		if _, serr := os.Stat(configured); serr != nil {
			return "", fmt.Errorf("cgroupPath %s: %w", configured, serr)
		}
		if !ok {
			return "", fmt.Errorf("cgroupPath %s is not a cgroup2 directory", configured)
		}
		return configured, nil
	}
	for _, p := range config.CgroupRoots {
		var st unix.Statfs_t
		if unix.Statfs(p, &st) == nil && int64(st.Type) == unix.CGROUP2_SUPER_MAGIC {
			return p, nil
		}
	}
	return "", fmt.Errorf("cgroupPath: no cgroup2 hierarchy at %s; mount it (mount -t cgroup2 none /sys/fs/cgroup) or set cgroupPath", strings.Join(config.CgroupRoots, " or "))
}
