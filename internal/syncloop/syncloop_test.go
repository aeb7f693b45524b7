package syncloop

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/internal/retry"
)

// run starts l.Run with send and opts under a context the test cancels, and returns a function
// that waits for Run to return.
func run(t *testing.T, l *Loop, send func(context.Context) error, opts Options) (cancel func(), done <-chan struct{}) {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	ch := make(chan struct{})
	if opts.Backoff == nil {
		opts.Backoff = &retry.Backoff{Min: time.Millisecond, Max: 5 * time.Millisecond}
	}
	go func() {
		defer close(ch)
		l.Run(ctx, "the test set", send, opts)
	}()
	t.Cleanup(func() {
		stop()
		<-ch
	})
	return stop, ch
}

// waitFor polls cond for up to 5 s (generous: the machine is shared).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestATriggerBeforeRunIsSentOnceRunStarts(t *testing.T) {
	var l Loop
	l.Trigger()
	l.Trigger() // folds into the first
	var sends atomic.Int32
	run(t, &l, func(context.Context) error { sends.Add(1); return nil }, Options{})
	waitFor(t, "the first send", func() bool { return sends.Load() >= 1 })
	time.Sleep(50 * time.Millisecond)
	if n := sends.Load(); n != 1 {
		t.Errorf("%d sends for two triggers before Run, want 1", n)
	}
}

func TestAFailedSendIsRetriedUntilItSucceeds(t *testing.T) {
	var l Loop
	var sends atomic.Int32
	run(t, &l, func(context.Context) error {
		if sends.Add(1) < 4 {
			return errors.New("broker unavailable")
		}
		return nil
	}, Options{})
	l.Trigger()
	waitFor(t, "the fourth send", func() bool { return sends.Load() >= 4 })
	time.Sleep(50 * time.Millisecond)
	if n := sends.Load(); n != 4 {
		t.Errorf("%d sends, want 4: three failures and the success, then nothing until a trigger", n)
	}
}

func TestARefusedSetWaitsForTheNextTrigger(t *testing.T) {
	var l Loop
	var sends atomic.Int32
	refused := errors.New("bad input")
	run(t, &l, func(context.Context) error { sends.Add(1); return refused }, Options{
		Refused: func(err error) bool { return errors.Is(err, refused) },
	})
	l.Trigger()
	waitFor(t, "the first send", func() bool { return sends.Load() >= 1 })
	time.Sleep(50 * time.Millisecond)
	if n := sends.Load(); n != 1 {
		t.Fatalf("%d sends of a refused set, want 1", n)
	}
	l.Trigger()
	waitFor(t, "the send after the next trigger", func() bool { return sends.Load() >= 2 })
}

func TestStopEndsTheLoop(t *testing.T) {
	var l Loop
	var mu sync.Mutex
	stopped := false
	var sends atomic.Int32
	_, done := run(t, &l, func(context.Context) error { sends.Add(1); return errors.New("certificate refused") }, Options{
		Stop: func(err error) bool {
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				stopped = true
			}
			return stopped
		},
	})
	l.Trigger()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after Stop said so")
	}
	if n := sends.Load(); n != 1 {
		t.Errorf("%d sends, want 1", n)
	}
}

func TestResyncSendsWithoutATrigger(t *testing.T) {
	var l Loop
	var sends atomic.Int32
	run(t, &l, func(context.Context) error { sends.Add(1); return nil }, Options{Resync: 10 * time.Millisecond})
	waitFor(t, "two resyncs", func() bool { return sends.Load() >= 2 })
}

func TestRunSourceRestartsASourceThatFails(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var runs atomic.Int32
	done := make(chan struct{})
	go func() {
		defer close(done)
		RunSource(ctx, nil, "test source", &retry.Backoff{Min: time.Millisecond, Max: time.Millisecond}, func(context.Context) error {
			if runs.Add(1) == 3 {
				cancel()
			}
			return errors.New("watch closed")
		})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("RunSource did not return when its context ended")
	}
	if n := runs.Load(); n != 3 {
		t.Errorf("%d runs, want 3", n)
	}
}
