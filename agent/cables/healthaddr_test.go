package cables

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/internal/scratchns"
)

// The CNI bridge gets its pod CIDR's address after the agent registered: the watcher must see it
// by its netlink event (well before the poll) and ask for one registration; an address outside
// the pod CIDRs must not.
func TestAHealthCheckAddressThatAppearsLaterRegistersTheEndpointAgain(t *testing.T) {
	scratchns.Enter(t)
	ns, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	bridge := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "cni0"}}
	if err := h.LinkAdd(bridge); err != nil {
		t.Fatal(err)
	}
	addrs := func() []netip.Addr {
		list, err := h.AddrList(nil, netlink.FAMILY_ALL)
		if err != nil {
			t.Error(err)
		}
		var out []netip.Addr
		for _, a := range list {
			if ip, ok := netip.AddrFromSlice(a.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
		return out
	}
	pods := []netip.Prefix{netip.MustParsePrefix("10.9.0.0/24")}
	c := New(config.Static{}, Deps{Log: slog.Default(), LocalPodCIDRs: func() []netip.Prefix { return pods }, InterfaceAddrs: addrs})
	if ep := c.Endpoint(EndpointInputs{Cluster: "east", Node: "gw", PodCIDRs: pods, Addrs: addrs()}); ep.HealthCheckIp != "" {
		t.Fatalf("health_check_ip %q before the bridge has an address", ep.HealthCheckIp)
	}

	ctx, cancel := context.WithTimeout(context.Background(), healthAddrPoll-time.Second)
	defer cancel()
	var mu sync.Mutex
	var calls []time.Duration
	var added time.Time
	go func() {
		add := func(cidr string) {
			ip, n, _ := net.ParseCIDR(cidr)
			n.IP = ip
			if err := h.AddrAdd(bridge, &netlink.Addr{IPNet: n}); err != nil {
				t.Error(err)
			}
		}
		time.Sleep(100 * time.Millisecond)
		add("192.168.77.1/24") // not in the pod CIDRs: no new registration
		time.Sleep(300 * time.Millisecond)
		mu.Lock()
		added = time.Now()
		mu.Unlock()
		add("10.9.0.1/24")
		time.Sleep(time.Second) // a second call would come within this
		cancel()
	}()
	// The watcher runs on the test's goroutine, whose thread is in the scratch namespace: its
	// subscription is there.
	c.WatchHealthCheckIP(ctx, func() {
		mu.Lock()
		calls = append(calls, time.Since(added))
		mu.Unlock()
		c.Endpoint(EndpointInputs{Cluster: "east", Node: "gw", PodCIDRs: pods, Addrs: addrs()})
	})
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 {
		t.Fatalf("changed called %d times (%v), want once, for the pod CIDR's address", len(calls), calls)
	}
	if calls[0] > 2*time.Second {
		t.Errorf("changed %v after the address was added: not by its netlink event (the poll is every %v)", calls[0], healthAddrPoll)
	}
	if got := c.PublishedHealthCheckIP(); got != netip.MustParseAddr("10.9.0.1") {
		t.Errorf("published health-check address %v, want 10.9.0.1", got)
	}
	t.Logf("registered again %v after the bridge got its pod CIDR address", calls[0])
}
