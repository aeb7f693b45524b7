package servicedp

import (
	"strings"
	"testing"
)

func TestCgroupPathIsCheckedToBeCgroup2(t *testing.T) {
	dir := t.TempDir()
	if _, err := CgroupPath(dir); err == nil || !strings.Contains(err.Error(), "cgroupPath "+dir+" is not a cgroup2 directory") {
		t.Errorf("a tmpfs dir as cgroupPath: %v", err)
	}
	if _, err := CgroupPath(dir + "/missing"); err == nil || !strings.Contains(err.Error(), "cgroupPath "+dir+"/missing") {
		t.Errorf("a missing cgroupPath: %v", err)
	}
	if p, err := CgroupPath(""); err == nil && p != "/sys/fs/cgroup" && p != "/sys/fs/cgroup/unified" {
		t.Errorf("detected cgroup2 root %q", p)
	}
}

func TestABPFPinDirOffBPFFSIsRefusedNamingIt(t *testing.T) {
	dir := t.TempDir()
	mounted, _, err := EnsureBPFFS(dir + "/pins")
	if mounted || err == nil || !strings.Contains(err.Error(), "bpfPinDir "+dir+"/pins is not on a bpf filesystem") {
		t.Errorf("EnsureBPFFS(%s/pins) = %v, %v", dir, mounted, err)
	}
}
