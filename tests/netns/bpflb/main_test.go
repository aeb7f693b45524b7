package bpflb

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) {
	// The test binary is also the client program: the tests start it again in a namespace and
	// a cgroup of theirs (see client_test.go).
	if os.Getenv(helperEnv) != "" {
		os.Exit(runHelper(os.Args[1:]))
	}
	if os.Geteuid() == 0 {
		if err := mountBPFFS(); err != nil {
			fmt.Fprintln(os.Stderr, "bpflb:", err)
		}
		sweepStale()
	}
	os.Exit(m.Run())
}

// mountBPFFS mounts bpffs at /sys/fs/bpf when it is not: the caller's job by the package's
// contract, and these tests are the caller. It stays mounted afterwards, as on any node.
func mountBPFFS() error {
	var st unix.Statfs_t
	if err := unix.Statfs(bpffsRoot, &st); err == nil && st.Type == unix.BPF_FS_MAGIC {
		return nil
	}
	if out, err := exec.Command("mount", "-t", "bpf", "bpf", bpffsRoot).CombinedOutput(); err != nil {
		return fmt.Errorf("mount bpffs at %s: %v: %s", bpffsRoot, err, strings.TrimSpace(string(out)))
	}
	return nil
}
