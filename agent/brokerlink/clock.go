package brokerlink

import (
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// brokerClock is what the last register or heartbeat reply said of the broker: its clock (for
// this node's clock skew, which `cablectl diagnose` checks) and its build (`cablectl version`).
// The zero value knows nothing yet.
type brokerClock struct {
	mu          sync.Mutex
	known       bool
	skew        time.Duration // broker clock minus this node's clock
	uncertainty time.Duration // half the round trip: the skew is exact to within it
	measuredAt  time.Time
	version     string
}

// clockSkew estimates the broker's clock minus ours from one exchange: the broker stamped
// broker somewhere between our sent and received, so it is compared with their midpoint, and the
// estimate is good to half the round trip (NTP's offset, with one sample).
func clockSkew(sent, received, broker time.Time) (skew, uncertainty time.Duration) {
	rtt := received.Sub(sent)
	if rtt < 0 {
		rtt = 0
	}
	mid := sent.Add(rtt / 2)
	return broker.Sub(mid), rtt / 2
}

// observe records a reply received at received to a request sent at sent. A reply without a
// broker time (an older broker) leaves the skew unknown but records the version.
func (c *brokerClock) observe(sent, received time.Time, broker *timestamppb.Timestamp, version string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if version != "" {
		c.version = version
	}
	if broker == nil || !broker.IsValid() {
		return
	}
	// Monotonic readings for the round trip; the wall clock for the comparison.
	c.skew, c.uncertainty = clockSkew(sent, received, broker.AsTime())
	c.measuredAt = received.UTC().Round(0)
	c.known = true
}

// fill writes what is known into the status's broker section.
func (c *brokerClock) fill(b *statusapi.Broker) {
	c.mu.Lock()
	defer c.mu.Unlock()
	b.Version = c.version
	if !c.known {
		return
	}
	skew := float64(c.skew) / float64(time.Millisecond)
	unc := float64(c.uncertainty) / float64(time.Millisecond)
	at := c.measuredAt
	b.ClockSkewMs, b.ClockSkewUncertaintyMs, b.ClockMeasuredAt = &skew, &unc, &at
}
