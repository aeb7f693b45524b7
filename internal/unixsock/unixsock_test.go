package unixsock

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestListenReplacesOnlyADeadProcesssSocket(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "sub", "agent.sock")

	lis, err := Listen(path, 0o640)
	if err != nil {
		t.Fatalf("Listen on a new path (its directory missing): %v", err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o640 {
		t.Errorf("socket file %v, %v: want mode 0640", fi, err)
	}
	// A live process's socket is refused.
	if _, err := Listen(path, 0o640); !errors.Is(err, ErrServed) {
		t.Errorf("Listen on a served socket: %v, want ErrServed", err)
	}
	// Left behind by a process that died: replaced.
	lis.(*net.UnixListener).SetUnlinkOnClose(false)
	lis.Close()
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("the dead listener's socket file should still be there: %v", err)
	}
	again, err := Listen(path, 0o600)
	if err != nil {
		t.Fatalf("Listen over a stale socket: %v", err)
	}
	again.Close()

	file := filepath.Join(dir, "not-a-socket")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(file, 0o600); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Errorf("Listen on a regular file: %v, want refused", err)
	}
	if b, _ := os.ReadFile(file); string(b) != "x" {
		t.Errorf("the regular file was touched: %q", b)
	}
}
