package peer

import (
	"strings"
	"testing"
	"time"
)

//go:noinline
func blockUntil(done <-chan struct{}) { <-done }

func TestGoroutinesOfFindsTheGoroutinesOfAPackageUntilTheyEnd(t *testing.T) {
	done := make(chan struct{})
	go blockUntil(done)
	pkgs := []string{"nstest/peer.blockUntil"}
	// The new goroutine may not have been scheduled yet (a loaded machine): wait until it is seen.
	var left []string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if left = goroutinesOf(pkgs, 0); len(left) > 0 {
			break
		}
	}
	if len(left) != 1 || !strings.Contains(left[0], "blockUntil") {
		t.Fatalf("goroutinesOf = %q, want the one blocked goroutine", left)
	}
	var st Status[int]
	st.Closed, st.LeftAfterClose = true, left
	if p := st.CloseProblem(); !strings.Contains(p, "1 goroutines of the driver still run") {
		t.Errorf("CloseProblem = %q", p)
	}
	close(done)
	if left := goroutinesOf(pkgs, 5*time.Second); len(left) != 0 {
		t.Errorf("goroutinesOf after the goroutine ended = %q", left)
	}
	st.LeftAfterClose = nil
	if p := st.CloseProblem(); p != "" {
		t.Errorf("CloseProblem of a clean Close = %q", p)
	}
}
