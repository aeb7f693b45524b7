// Package scratchns puts a unit test that needs the kernel (links, routes, nftables) in a new,
// unnamed network namespace of its own, so it never touches the host's and leaves nothing named
// behind even when it fails: the namespace is gone once its last handle closes.
package scratchns

import (
	"os"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// Enter locks the test's goroutine to its thread and moves that thread into a new network
// namespace until the test ends (its cleanup, which runs on the same goroutine, moves it back).
// Without root the test is skipped, saying so.
func Enter(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace")
	}
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		t.Fatalf("get netns: %v", err)
	}
	ns, err := netns.New()
	if err != nil {
		orig.Close()
		runtime.UnlockOSThread()
		t.Fatalf("new netns: %v", err)
	}
	t.Cleanup(func() {
		if err := netns.Set(orig); err != nil {
			// The thread must not go back to the pool in the wrong namespace: it stays locked and
			// dies with the goroutine.
			t.Errorf("restore netns: %v", err)
			return
		}
		ns.Close()
		orig.Close()
		runtime.UnlockOSThread()
	})
}

// Run is Enter, then f.
func Run(t *testing.T, f func()) {
	t.Helper()
	Enter(t)
	f()
}
