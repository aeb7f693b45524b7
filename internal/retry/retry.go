// Package retry holds the wait between attempts every broker loop of the agent uses (and the
// scale bench's simulated agents, which must behave as the agent does).
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff is exponential between Min and Max, with up to half a step of jitter so that a
// restarted broker is not hit by every agent at once. The zero value of cur starts at Min.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next is the wait before the next attempt.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur = min(b.cur*2, b.Max)
	}
	return min(b.cur+time.Duration(rand.Int64N(int64(b.cur/2)+1)), b.Max)
}

// Reset starts again from Min, after a success.
func (b *Backoff) Reset() { b.cur = 0 }

// Sleep waits d or until ctx ends; it reports whether the wait completed.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
