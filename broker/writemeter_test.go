package broker

import (
	"testing"
	"time"
)

// fakeMeter is a writeMeter on a clock the test moves.
type fakeMeter struct {
	*writeMeter
	now time.Time
}

func newFakeMeter() *fakeMeter {
	f := &fakeMeter{now: time.Unix(1_700_000_000, 0)}
	f.writeMeter = newWriteMeter(func() time.Time { return f.now })
	return f
}

// run puts n calls in flight, then for d completes them at rate per second (in steps of a
// bucket), putting as many new ones in flight: the backlog stays n, the rate is rate.
func (f *fakeMeter) run(n int, rate float64, d time.Duration) {
	for range n {
		f.begin()
	}
	per := rate * meterBucket.Seconds()
	carry := 0.0
	for t := time.Duration(0); t < d; t += meterBucket {
		f.now = f.now.Add(meterBucket)
		carry += per
		for ; carry >= 1; carry-- {
			f.end()
			f.begin()
		}
	}
}

// A store that keeps up is never turned away from, however many calls are in flight; a
// saturated one is, once the calls ahead would wait longer than the budget.
func TestWriteMeterBusyOnlyWhenTheWaitIsTooLong(t *testing.T) {
	for _, tt := range []struct {
		name     string
		inFlight int
		rate     float64
		d        time.Duration // how long the store has been at it
		busy     bool
	}{
		{"a lone call", 1, 0, time.Second, false},
		{"a storm the store keeps up with", 4000, 1000, 2 * time.Second, false}, // 4 s of work
		{"a small backlog on a stalled store", registerBusyMinBacklog, 0, time.Minute, false},
		{"a backlog of 8 s", 4000, 500, 2 * time.Second, true},
		{"a stalled store", 1000, 0, registerWaitBudget + meterBucket, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFakeMeter()
			f.run(tt.inFlight, tt.rate, tt.d)
			l, hint, ok := f.admit()
			if ok == tt.busy {
				t.Fatalf("admit with %d in flight at %.0f/s: admitted %v (measured %d in flight, %.0f/s, wait %s), want %v",
					tt.inFlight, tt.rate, ok, l.inFlight, l.rate, l.wait, !tt.busy)
			}
			if tt.busy && (hint <= 0 || hint > registerBusyMaxHint) {
				t.Fatalf("busy with a hint of %s: want within (0, %s]", hint, registerBusyMaxHint)
			}
			if tt.rate > 0 && (l.rate < tt.rate*0.9 || l.rate > tt.rate*1.1) {
				t.Fatalf("measured %.0f/s, ran at %.0f/s", l.rate, tt.rate)
			}
		})
	}
}

// A burst is let in until the broker has been completing calls long enough to measure its rate
// (the store's first group commits only after its fsync), or has completed none for as long as a
// registration may wait.
func TestWriteMeterLetsABurstInUntilItsRateIsMeasured(t *testing.T) {
	f := newFakeMeter()
	f.run(5000, 0, registerWaitBudget-meterBucket)
	if _, _, ok := f.admit(); !ok {
		t.Fatalf("turned away %s into a burst with nothing done yet", registerWaitBudget-meterBucket)
	}
	f.end() // the first completion: the rate is measured from it, after minMeasure
	f.now = f.now.Add(minMeasure - meterBucket)
	if l, _, ok := f.admit(); !ok {
		t.Fatalf("turned away %s after the first completion (measured %.0f/s)", minMeasure-meterBucket, l.rate)
	}
	f.now = f.now.Add(meterBucket)
	if l, _, ok := f.admit(); ok {
		t.Fatalf("5,000 in flight and 1 done in %s: let in (measured %.0f/s, wait %s)", minMeasure, l.rate, l.wait)
	}

	stalled := newFakeMeter()
	stalled.run(5000, 0, registerWaitBudget+meterBucket)
	if _, _, ok := stalled.admit(); ok {
		t.Fatalf("5,000 in flight and nothing done for %s: let in", registerWaitBudget+meterBucket)
	}
}

// The agents turned away are told to come back one after the other at the measured rate, from
// when the backlog ahead is down to half the budget, never later than the longest hint.
func TestWriteMeterSpreadsTheReturns(t *testing.T) {
	f := newFakeMeter()
	f.run(4000, 500, 2*time.Second) // a wait of 8 s
	l, first, ok := f.admit()
	if ok {
		t.Fatalf("let in with a wait of %s", l.wait)
	}
	if want := l.wait - registerWaitBudget/2; first < want-time.Millisecond || first > want+time.Millisecond {
		t.Fatalf("first hint %s, want %s (the wait of %s less half the budget)", first, want, l.wait)
	}
	prev := first
	for i := 1; i < 100; i++ {
		_, hint, ok := f.admit()
		if ok {
			t.Fatalf("turned-away call %d let in", i)
		}
		want := time.Duration(float64(time.Second) / l.rate)
		if step := hint - prev; step < want-time.Microsecond || step > want+time.Microsecond {
			t.Fatalf("call %d: hint %s, %s after the one before; want %s apart (%.0f/s)", i, hint, step, want, l.rate)
		}
		prev = hint
	}
	for range 5000 {
		f.admit()
	}
	if _, hint, _ := f.admit(); hint != registerBusyMaxHint {
		t.Fatalf("after 5,000 turned away the hint is %s, want the longest, %s", hint, registerBusyMaxHint)
	}
	// Once the return times handed out have passed, a busy answer starts again from the wait
	// measured now.
	f.now = f.now.Add(time.Minute)
	f.run(0, 500, 2*time.Second)
	l, hint, _ := f.admit()
	if want := l.wait - registerWaitBudget/2; hint < want-time.Millisecond || hint > want+time.Millisecond {
		t.Fatalf("a minute later the hint is %s, want %s (the wait of %s less half the budget)", hint, want, l.wait)
	}
}
