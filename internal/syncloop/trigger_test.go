package syncloop

import (
	"testing"
	"time"
)

func TestTriggerCoalesces(t *testing.T) {
	var tr Trigger
	for range 5 {
		tr.Fire()
	}
	select {
	case <-tr.C():
	case <-time.After(time.Second):
		t.Fatal("no wake-up after Fire")
	}
	select {
	case <-tr.C():
		t.Fatal("five Fire calls made more than one wake-up")
	default:
	}
}

func TestTriggerDrainForgetsPending(t *testing.T) {
	var tr Trigger
	tr.Fire()
	tr.Drain()
	select {
	case <-tr.C():
		t.Fatal("a drained Fire still woke the waiter")
	default:
	}
}
