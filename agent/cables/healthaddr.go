package cables

import (
	"context"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
)

// healthAddrPoll is how often WatchHealthCheckIP looks at the addresses without a netlink
// event: a backstop for a subscription that failed or lost events, not the usual path.
const healthAddrPoll = 10 * time.Second

// WatchHealthCheckIP calls changed whenever this node's health-check address differs from the
// one its endpoint last published (Endpoint). On Kubernetes the address often appears after the
// agent has registered: the CNI bridge gets its pod CIDR's gateway address only when the node's
// first pod starts. Without a new registration then, the endpoint would publish no
// health_check_ip until the agent restarts, and the remote gateways would never probe this one
// (no latency, no failover by probes). Address changes come from a netlink subscription; a slow
// poll covers a subscription that failed. It returns when ctx ends.
func (c *Cables) WatchHealthCheckIP(ctx context.Context, changed func()) {
	updates := make(chan netlink.AddrUpdate, 64)
	done := make(chan struct{})
	defer close(done)
	err := netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{
		ErrorCallback: func(err error) {
			if ctx.Err() != nil { // the subscription's socket closing at the end
				return
			}
			c.log.Warn("address events lost; the health-check address is polled", "err", err, "every", healthAddrPoll)
		},
	})
	if err != nil {
		c.log.Warn("no address events; the health-check address is polled", "err", err, "every", healthAddrPoll)
		updates = nil
	}
	poll := time.NewTicker(healthAddrPoll)
	defer poll.Stop()
	var notified netip.Addr // the address changed was last called for
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-updates:
			if !ok { // the subscription ended on an error: the poll goes on alone
				updates = nil
				continue
			}
		case <-poll.C:
		}
		now := HealthCheckIP(c.deps.LocalPodCIDRs(), c.deps.InterfaceAddrs())
		if now == c.PublishedHealthCheckIP() || now == notified {
			continue
		}
		c.log.Info("health-check address changed; registering the endpoint again", "healthCheckIP", now.String(), "published", c.PublishedHealthCheckIP().String())
		notified = now
		changed()
	}
}

// PublishedHealthCheckIP is the health_check_ip of the endpoint Endpoint last built (invalid:
// none, or no endpoint built yet).
func (c *Cables) PublishedHealthCheckIP() netip.Addr {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.publishedHealthIP
}
