package agent

import (
	"log/slog"

	"github.com/cablemesh/cablemesh/internal/retry"
)

// newBackoff is the wait between attempts of one broker loop, between the options' bounds.
func (a *Agent) newBackoff() *retry.Backoff {
	return &retry.Backoff{Min: a.opts.MinBackoff, Max: a.opts.MaxBackoff}
}

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

// warnLevel is the level of a failure that may repeat: warn the first time, debug after.
func warnLevel(repeated bool) slog.Level {
	if repeated {
		return slog.LevelDebug
	}
	return slog.LevelWarn
}
