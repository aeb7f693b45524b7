package agent

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"
)

// backoff is exponential with jitter between min and max.
type backoff struct {
	min, max, cur time.Duration
}

func (a *Agent) newBackoff() *backoff {
	return &backoff{min: a.opts.MinBackoff, max: a.opts.MaxBackoff}
}

func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.min
	} else {
		b.cur = min(b.cur*2, b.max)
	}
	// Jitter of up to half the step, so a restarted broker is not hit by every agent at once.
	return min(b.cur+time.Duration(rand.Int64N(int64(b.cur/2)+1)), b.max)
}

func (b *backoff) reset() { b.cur = 0 }

// repeatFilter tells a failure that repeats the previous one, so a broker that stays down is
// logged once at warn level and then at debug level, not every few seconds.
type repeatFilter struct{ last string }

func (f *repeatFilter) repeated(err error) bool {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	r := msg == f.last
	f.last = msg
	return r
}

func (f *repeatFilter) reset() { f.last = "" }

// sleep waits d or until ctx ends; it reports whether the wait completed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// warnLevel is the level of a failure that may repeat: warn the first time, debug after.
func warnLevel(repeated bool) slog.Level {
	if repeated {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}
