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
// afterwards. The thread goes back to its original namespace before it is unlocked; when it
// cannot, it stays locked and ends with its goroutine, so no other goroutine ever runs in ns.
//
// The thread must survive whenever it can: a child process started with Pdeathsig (the
// harness's agents and brokers) is killed when the thread that forked it exits, and the thread
// this goroutine locks may be one that earlier forked such a child.
func Within(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := os.Open(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer orig.Close()
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			runtime.UnlockOSThread()
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		err = fn()
		if unix.Setns(int(orig.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}
