// Package syncloop is the agent's way of keeping the broker's copy of something this node owns
// (its exports, its cluster-scoped policies) equal to the local one: send the whole set whenever
// it changes (Trigger), retry with backoff until the broker has it, wait for the next change when
// the broker refused it for good, and optionally send it again on a timer (a broker that lost
// its state gets it back). The send itself, and what its outcome means for the status, stay with
// the caller.
package syncloop

import (
	"context"
	"log/slog"
	"time"

	"github.com/cablemesh/cablemesh/internal/retry"
)

// Loop is one such sync. Its zero value is ready: Trigger may be called before Run (a change
// made before the broker connection is sent once it is up) and while it runs.
type Loop struct {
	trigger Trigger
	// last is the previous failure's text, to log a run of identical failures once; only Run's
	// goroutine touches it.
	last string
}

// Options shape a run of a Loop. Every field is optional.
type Options struct {
	// Backoff is the wait between failed attempts (reset after a success); nil: 1s to 1m.
	Backoff *retry.Backoff
	// Log receives the failures: the first of a run of identical ones at warn level, the
	// repeats at debug level, so a broker that stays down is not logged every few seconds.
	Log *slog.Logger
	// Resync, when positive, sends again at that interval even without a change.
	Resync time.Duration
	// Refused says the broker refused the set so that sending the same set again cannot
	// succeed (bad input, permission): the loop waits for the next trigger or resync.
	Refused func(error) bool
	// Stop says the loop must end for good: asked before every attempt with a nil error and
	// after every failed one with its error (the agent's certificate was refused).
	Stop func(error) bool
}

// Trigger asks for a send. It never blocks.
func (l *Loop) Trigger() { l.trigger.Fire() }

// Run calls send on every trigger (and resync) until ctx ends or opts.Stop says so; what names
// what is sent in the logs (a noun phrase: "this node's exports"). One Run at a time.
func (l *Loop) Run(ctx context.Context, what string, send func(context.Context) error, opts Options) {
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	if opts.Backoff == nil {
		opts.Backoff = &retry.Backoff{Min: time.Second, Max: time.Minute}
	}
	var resync <-chan time.Time
	if opts.Resync > 0 {
		t := time.NewTicker(opts.Resync)
		defer t.Stop()
		resync = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-l.trigger.C():
		case <-resync:
		}
		if !l.untilSent(ctx, what, send, opts) {
			return
		}
	}
}

// untilSent sends until a send succeeds or is refused for good; false means Run must end.
func (l *Loop) untilSent(ctx context.Context, what string, send func(context.Context) error, opts Options) bool {
	stop := func(err error) bool { return opts.Stop != nil && opts.Stop(err) }
	for {
		if stop(nil) {
			return false
		}
		err := send(ctx)
		if ctx.Err() != nil {
			return false
		}
		if err == nil {
			opts.Backoff.Reset()
			l.last = ""
			return true
		}
		if stop(err) {
			return false
		}
		level := slog.LevelWarn
		if err.Error() == l.last {
			level = slog.LevelDebug
		}
		l.last = err.Error()
		if opts.Refused != nil && opts.Refused(err) {
			opts.Log.Log(ctx, level, "broker refused "+what, "err", err)
			return true
		}
		d := opts.Backoff.Next()
		opts.Log.Log(ctx, level, "could not send "+what+" to the broker; retrying", "err", err, "retryIn", d.Round(time.Millisecond).String())
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return false
		case <-t.C:
		case <-l.trigger.C(): // a newer set, or a reconnect: send at once
			t.Stop()
		}
	}
}

// RunSource runs a source of the set (a directory watch, a Kubernetes informer) until ctx ends,
// starting it again with backoff whenever it returns early: a source that fails must not leave
// the set frozen until the agent restarts.
func RunSource(ctx context.Context, log *slog.Logger, what string, bo *retry.Backoff, run func(context.Context) error) {
	if log == nil {
		log = slog.Default()
	}
	for {
		err := run(ctx)
		if ctx.Err() != nil {
			return
		}
		d := bo.Next()
		log.Error(what+" stopped; restarting", "err", err, "retryIn", d.Round(time.Millisecond).String())
		if !retry.Sleep(ctx, d) {
			return
		}
	}
}
