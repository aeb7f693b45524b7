package nstest

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"

	"golang.org/x/sys/unix"
)

// Within runs fn on an OS thread of its own inside the named network namespace ns (under
// /run/netns): every socket fn creates belongs to ns and stays usable from any goroutine
// afterwards. The thread is never unlocked, so it ends with its goroutine and no other goroutine
// ever runs in ns (the switch cannot leak to the scheduler's other threads).
func Within(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}
