package broker

import (
	"sync"
	"time"
)

const (
	// meterBucket and meterBuckets are the resolution and length of the window over which the
	// broker measures how many registrations and heartbeats it completes per second.
	meterBucket  = 100 * time.Millisecond
	meterBuckets = 20
	// minMeasure is how long the broker must have been completing writes before it judges its
	// rate. The store commits in groups, the first of a burst only after its fsync: a rate
	// that counted the wait for that first commit would take the store's start for its pace
	// (at 1,000 agents on a loaded machine, 3 done in the first 2 s, then 379 a second).
	minMeasure = 500 * time.Millisecond
	// registerWaitBudget is the longest a registration is expected to wait for the calls ahead
	// of it before the broker turns it away as busy: half the agent's 10 s deadline, which also
	// covers dialing and the TLS handshake. A call that waits out its deadline costs the agent a
	// whole heartbeat interval, a busy answer only the wait it names; but a registration turned
	// away is one the store could have taken in a group it commits anyway.
	registerWaitBudget = 5 * time.Second
	// registerBusyMinBacklog is how many registrations and heartbeats may always be in flight:
	// the store commits up to 512 in one group, so this many are at most one commit away.
	registerBusyMinBacklog = 256
	// registerBusyMaxHint caps the wait a busy answer asks for.
	registerBusyMaxHint = 8 * time.Second
)

// writeMeter measures the registrations and heartbeats in flight and the rate at which the
// broker completes them, and from both whether a registration would wait too long (busy) and
// when a turned-away agent should come back.
type writeMeter struct {
	mu        sync.Mutex
	now       func() time.Time
	inFlight  int
	busySince time.Time // when inFlight last went from 0 to 1
	firstDone time.Time // the first completion since busySince (before it: none yet)
	// done[i] counts the completions of the bucket with number doneBucket[i] (unix time /
	// meterBucket); a slot holding another bucket number is stale.
	done       [meterBuckets]int
	doneBucket [meterBuckets]int64
	// nextReturn is the latest time a busy answer asked an agent to come back at: the agents
	// turned away are given one return time after the other, at the measured rate, so they come
	// back spread as the broker can take them rather than together.
	nextReturn time.Time
}

func newWriteMeter(now func() time.Time) *writeMeter {
	if now == nil {
		now = time.Now
	}
	return &writeMeter{now: now}
}

// begin counts a registration or heartbeat in flight; end, its completion (whatever its
// outcome: the store's work is done either way).
func (m *writeMeter) begin() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.inFlight == 0 {
		m.busySince = m.now()
	}
	m.inFlight++
}

func (m *writeMeter) end() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.inFlight--
	now := m.now()
	if m.firstDone.Before(m.busySince) {
		m.firstDone = now
	}
	b := now.UnixNano() / int64(meterBucket)
	i := b % meterBuckets
	if m.doneBucket[i] != b {
		m.doneBucket[i], m.done[i] = b, 0
	}
	m.done[i]++
}

// writeLoad is what the meter measured at one moment.
type writeLoad struct {
	inFlight int
	rate     float64       // completions per second; 0 while not measured
	wait     time.Duration // expected wait of a call arriving now (0 while not measured)
}

// loadLocked is the load now: the completions per second since the first of this busy period
// (over the last window at most), and the time the calls in flight take at that rate. The rate
// is not judged until the broker has been completing calls for minMeasure, unless it has
// completed none for registerWaitBudget: a stalled store.
func (m *writeMeter) loadLocked(now time.Time) writeLoad {
	l := writeLoad{inFlight: m.inFlight}
	if m.inFlight == 0 {
		return l
	}
	var span time.Duration
	switch busyFor := now.Sub(m.busySince); {
	case m.firstDone.Before(m.busySince) && busyFor <= registerWaitBudget:
		return l
	case m.firstDone.Before(m.busySince):
		span = busyFor
	case now.Sub(m.firstDone) < minMeasure:
		return l
	default:
		span = now.Sub(m.firstDone)
	}
	span = min(span, meterBucket*meterBuckets)
	cur := now.UnixNano() / int64(meterBucket)
	first := now.Add(-span).UnixNano() / int64(meterBucket)
	n := 0
	for i := range meterBuckets {
		if b := m.doneBucket[i]; b >= first && b <= cur {
			n += m.done[i]
		}
	}
	// Nothing completed in the span: one completion per span is the most the broker can claim.
	l.rate = float64(max(n, 1)) / span.Seconds()
	l.wait = time.Duration(float64(m.inFlight) / l.rate * float64(time.Second))
	return l
}

// admit reports whether a registration arriving now is let in; if not, the wait to ask of it:
// until the calls ahead of it are down to half the budget, plus a place after the agents turned
// away before it, at the measured rate.
func (m *writeMeter) admit() (writeLoad, time.Duration, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now()
	l := m.loadLocked(now)
	if l.inFlight <= registerBusyMinBacklog || l.wait <= registerWaitBudget {
		return l, 0, true
	}
	at := now.Add(l.wait - registerWaitBudget/2)
	if next := m.nextReturn.Add(time.Duration(float64(time.Second) / l.rate)); next.After(at) {
		at = next
	}
	// Beyond the longest hint every agent is told the same; the queue of return times does not
	// run ahead of it.
	at = minTime(at, now.Add(registerBusyMaxHint))
	m.nextReturn = at
	return l, at.Sub(now), false
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// setClock replaces the meter's clock (tests).
func (m *writeMeter) setClock(now func() time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = now
}
