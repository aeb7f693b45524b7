package agent

import (
	"github.com/cablemesh/cablemesh/internal/retry"
)

// newBackoff is the wait between attempts of one broker loop, between the options' bounds.
func (a *Agent) newBackoff() *retry.Backoff {
	return &retry.Backoff{Min: a.opts.MinBackoff, Max: a.opts.MaxBackoff}
}
