package cables

import (
	"sync/atomic"
	"time"
)

// repairTicker is the reconcile loop's clock for the health repair check. It runs at the probe
// period in force, so a reload that changes healthCheck.period (or turns probing on or off)
// takes effect at the loop's next wake-up, not at the next restart.
type repairTicker struct {
	t      *time.Ticker
	period time.Duration
	// armed, when set, receives the period the ticker runs at (ns; 0: stopped), for the
	// reload's tests: what the loop really does.
	armed *atomic.Int64
}

// follow sets the ticker to period (0: no checks) and returns its channel (nil: never ticks).
func (r *repairTicker) follow(period time.Duration) <-chan time.Time {
	switch {
	case period <= 0:
		r.stop()
		return nil
	case r.t == nil:
		r.t = time.NewTicker(period)
	case period != r.period:
		r.t.Reset(period)
	}
	r.period = period
	r.record()
	return r.t.C
}

func (r *repairTicker) record() {
	if r.armed != nil {
		r.armed.Store(int64(r.period))
	}
}

func (r *repairTicker) stop() {
	if r.t != nil {
		r.t.Stop()
		r.t = nil
	}
	r.period = 0
	r.record()
}

// repairPeriod is the interval of the repair check: the probe period in force, 0 when nothing
// is probed.
func (c *Cables) repairPeriod() time.Duration {
	if m := c.Health(); m != nil {
		return m.Settings().Period
	}
	return 0
}
