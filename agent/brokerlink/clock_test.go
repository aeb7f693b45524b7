package brokerlink

import (
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

func TestClockSkew(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name           string
		sent, received time.Time
		broker         time.Time
		skew, unc      time.Duration
	}{
		{"a broker stamping the midpoint has no skew", t0, t0.Add(20 * time.Millisecond), t0.Add(10 * time.Millisecond), 0, 10 * time.Millisecond},
		{"a broker 3s ahead shows +3s", t0, t0.Add(2 * time.Millisecond), t0.Add(3*time.Second + time.Millisecond), 3 * time.Second, time.Millisecond},
		{"a broker 5s behind shows -5s", t0, t0, t0.Add(-5 * time.Second), -5 * time.Second, 0},
		{"a clock stepped back during the call counts no round trip", t0, t0.Add(-time.Second), t0, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			skew, unc := clockSkew(tc.sent, tc.received, tc.broker)
			if skew != tc.skew || unc != tc.unc {
				t.Errorf("clockSkew = %v ±%v, want %v ±%v", skew, unc, tc.skew, tc.unc)
			}
		})
	}
}

func TestBrokerClockFillsTheStatus(t *testing.T) {
	var c brokerClock
	var b statusapi.Broker
	c.fill(&b)
	if b.ClockSkewMs != nil || b.Version != "" {
		t.Fatalf("before any reply: skew %v version %q, want none", b.ClockSkewMs, b.Version)
	}
	t0 := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	// An older broker sends no time: the version is kept, the skew stays unknown.
	c.observe(t0, t0, nil, "v1")
	c.fill(&b)
	if b.ClockSkewMs != nil || b.Version != "v1" {
		t.Fatalf("reply without time: skew %v version %q, want no skew and v1", b.ClockSkewMs, b.Version)
	}
	c.observe(t0, t0.Add(4*time.Millisecond), timestamppb.New(t0.Add(1502*time.Millisecond)), "v2")
	b = statusapi.Broker{}
	c.fill(&b)
	if b.ClockSkewMs == nil || *b.ClockSkewMs != 1500 || *b.ClockSkewUncertaintyMs != 2 || b.Version != "v2" || !b.ClockMeasuredAt.Equal(t0.Add(4*time.Millisecond)) {
		t.Fatalf("after a reply: skew %v ±%v at %v version %q, want 1500 ±2 at t0+4ms, v2", b.ClockSkewMs, b.ClockSkewUncertaintyMs, b.ClockMeasuredAt, b.Version)
	}
}
