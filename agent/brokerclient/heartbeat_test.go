package brokerclient

import (
	"testing"
	"time"
)

func TestHeartbeatDelay(t *testing.T) {
	// n returns a fixed share of its bound: the table picks the two ends and the middle.
	lowest := func(int64) int64 { return 0 }
	highest := func(k int64) int64 { return k - 1 }
	middle := func(k int64) int64 { return k / 2 }
	tests := []struct {
		name     string
		interval time.Duration
		n        func(int64) int64
		want     time.Duration
	}{
		{"no jitter drawn waits the whole interval", 10 * time.Second, lowest, 10 * time.Second},
		{"the most jitter shortens the wait by a fifth", 10 * time.Second, highest, 8 * time.Second},
		{"half the jitter shortens it by a tenth", 10 * time.Second, middle, 9 * time.Second},
		{"a tiny interval gets no jitter", 4 * time.Nanosecond, highest, 4 * time.Nanosecond},
		{"a zero interval stays zero", 0, highest, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := heartbeatDelay(tt.interval, tt.n); got != tt.want {
				t.Errorf("heartbeatDelay(%s) = %s, want %s", tt.interval, got, tt.want)
			}
		})
	}
}

// The real random source stays within the bounds the table checks at their ends.
func TestJitterStaysWithinItsBounds(t *testing.T) {
	const interval = 10 * time.Second
	for range 1000 {
		if d := HeartbeatDelay(interval); d < interval*4/5 || d > interval {
			t.Fatalf("HeartbeatDelay(%s) = %s, outside [8s, 10s]", interval, d)
		}
		if d := AfterRegistrationDelay(interval); d < interval/2 || d > interval {
			t.Fatalf("AfterRegistrationDelay(%s) = %s, outside [5s, 10s]", interval, d)
		}
	}
}

// The first heartbeat after a registration waits between half the interval and all of it: a
// fleet that registered in one second heartbeats over five, not two.
func TestAfterRegistrationDelay(t *testing.T) {
	lowest := func(int64) int64 { return 0 }
	highest := func(k int64) int64 { return k - 1 }
	for _, tt := range []struct {
		name     string
		interval time.Duration
		n        func(int64) int64
		want     time.Duration
	}{
		{"no jitter drawn waits the interval", 10 * time.Second, lowest, 10 * time.Second},
		{"the most jitter waits half of it", 10 * time.Second, highest, 5 * time.Second},
		{"a tiny interval waits it whole", time.Nanosecond, highest, time.Nanosecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := afterRegistrationDelay(tt.interval, tt.n); got != tt.want {
				t.Errorf("afterRegistrationDelay(%s) = %s, want %s", tt.interval, got, tt.want)
			}
		})
	}
}
