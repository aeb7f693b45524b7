package cables

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestRepairTickerFollowsThePeriodInForce(t *testing.T) {
	var armed atomic.Int64
	r := repairTicker{armed: &armed}
	defer r.stop()
	if c := r.follow(0); c != nil || armed.Load() != 0 {
		t.Fatalf("no probes: channel %v, armed %v; want none", c, time.Duration(armed.Load()))
	}
	c := r.follow(time.Hour)
	if c == nil || time.Duration(armed.Load()) != time.Hour {
		t.Fatalf("armed %v, want 1h", time.Duration(armed.Load()))
	}
	// A shorter period takes effect at once: the ticker ticks within it, not after the hour.
	if c2 := r.follow(10 * time.Millisecond); c2 != c || time.Duration(armed.Load()) != 10*time.Millisecond {
		t.Fatalf("armed %v, want 10ms on the same ticker", time.Duration(armed.Load()))
	}
	select {
	case <-c:
	case <-time.After(5 * time.Second):
		t.Fatal("no tick within 5s of a 10ms period")
	}
	if c := r.follow(0); c != nil || armed.Load() != 0 {
		t.Fatalf("probes turned off: channel %v, armed %v; want none", c, time.Duration(armed.Load()))
	}
}
