package nstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// RemoveCgroup kills the processes of the cgroup2 directory path (cgroup.kill, 5.14+; else one
// by one) and removes it once it is empty, for up to 5s. A cgroup already gone is no error.
func RemoveCgroup(path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		if err := os.WriteFile(filepath.Join(path, "cgroup.kill"), []byte("1"), 0); err != nil {
			killCgroupProcs(path)
		}
		err := os.Remove(path)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("remove cgroup %s: %w", path, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// killCgroupProcs SIGKILLs the processes cgroup.procs lists (never this process).
func killCgroupProcs(path string) {
	data, err := os.ReadFile(filepath.Join(path, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
