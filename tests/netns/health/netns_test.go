package health

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// prefix starts every namespace these tests create: "cbth-<pid>-<name>", so that a sweep can
// tell the namespaces of a crashed run (pid gone) from those of a run still going.
const prefix = nstest.Prefix("cbth-")

func requireRoot(t *testing.T) {
	t.Helper()
	nstest.RequireRoot(t, "creates network namespaces and veth pairs, and probes over a raw ICMP socket (CAP_NET_RAW)", "ip")
}

// inNamespace runs f on a thread switched into ns, so sockets f opens live in ns. The thread is
// switched back before it is released; if that fails it stays locked and dies with the
// goroutine rather than carry the wrong namespace into other goroutines.
func inNamespace(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- fmt.Errorf("get current netns: %w", err)
			return // the thread stays locked and is discarded
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter netns: %w", err)
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- fmt.Errorf("return to the original netns: %w (after %v)", err, ferr)
			return
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
