//go:build linux

package bpf

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestOpenRefusesAPinDirThatIsNotOnBPFFS(t *testing.T) {
	for _, tt := range []struct{ name, dir, want string }{
		{"an empty PinDir", "", `PinDir "": want an absolute path`},
		{"a relative PinDir", "cablemesh", `PinDir "cablemesh": want an absolute path`},
		{"a PinDir on another filesystem", filepath.Join(t.TempDir(), "pins"), "is not on a bpf filesystem (mount one first"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Open(context.Background(), Options{PinDir: tt.dir, CgroupPath: "/sys/fs/cgroup"})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Open: %v, want it to say %q", err, tt.want)
			}
			if _, err := OpenCounters(context.Background(), Options{PinDir: tt.dir}); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("OpenCounters: %v, want it to say %q", err, tt.want)
			}
		})
	}
}

func TestOpenRefusesAnUnknownDestroyMethod(t *testing.T) {
	_, err := Open(context.Background(), Options{PinDir: "/sys/fs/bpf/x", CgroupPath: "/sys/fs/cgroup", DestroyMethod: "magic"})
	if err == nil || !strings.Contains(err.Error(), `DestroyMethod "magic": want "iterator", "sock_diag" or empty`) {
		t.Errorf("Open: %v", err)
	}
}

func TestOpenRefusesACgroupPathThatIsNotCgroup2(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a directory on bpffs")
	}
	var st unix.Statfs_t
	if err := unix.Statfs("/sys/fs/bpf", &st); err != nil || st.Type != unix.BPF_FS_MAGIC {
		t.Skip("needs bpffs mounted at /sys/fs/bpf")
	}
	pin := filepath.Join("/sys/fs/bpf", "cmbpf-unit-"+filepath.Base(t.TempDir()))
	t.Cleanup(func() { _ = Purge(pin) })
	_, err := Open(context.Background(), Options{PinDir: pin, CgroupPath: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "not a cgroup2 directory") {
		t.Errorf("Open with a CgroupPath off cgroup2: %v", err)
	}
}

func TestPurgeRefusesADirectoryOffBPFFS(t *testing.T) {
	dir := t.TempDir()
	if err := Purge(dir); err == nil || !strings.Contains(err.Error(), "not on a bpf filesystem") {
		t.Errorf("Purge(%s): %v, want a refusal", dir, err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Errorf("Purge removed %s: %v", dir, err)
	}
	if err := Purge(filepath.Join(dir, "missing")); err != nil {
		t.Errorf("Purge of a missing directory: %v", err)
	}
}
