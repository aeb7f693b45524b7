package agent

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"github.com/cablemesh/cablemesh/agent/servicedp"
	"github.com/cablemesh/cablemesh/bpf"
)

// fakeLB is the load balancer of the agent's tests: it holds the services it was synced with
// and records the endpoints whose sockets it was asked to destroy.
type fakeLB struct {
	mu        sync.Mutex
	services  []bpf.Service
	syncs     int
	destroyed [][]bpf.Endpoint
	syncErr   error
	closed    bool
	// maxEntries bounds what SyncFit takes (0: no bound).
	maxEntries int
	removed    bool
}

func (f *fakeLB) Sync(s []bpf.Service) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.syncErr != nil {
		return f.syncErr
	}
	f.services = slices.Clone(s)
	f.syncs++
	return nil
}

// SyncFit takes the groups in order while their entries (one per service and one per backend)
// fit in maxEntries (0: no bound), and refuses the others.
func (f *fakeLB) SyncFit(groups [][]bpf.Service) ([]bpf.Refusal, error) {
	f.mu.Lock()
	maxEntries := f.maxEntries
	f.mu.Unlock()
	var taken []bpf.Service
	var refused []bpf.Refusal
	used := 0
	for i, g := range groups {
		need := 0
		for _, s := range g {
			need += 1 + len(s.Backends)
		}
		if maxEntries > 0 && used+need > maxEntries {
			refused = append(refused, bpf.Refusal{Group: i, Reason: fmt.Sprintf("needs %d entries, %d left", need, maxEntries-used)})
			continue
		}
		used += need
		taken = append(taken, g...)
	}
	if err := f.Sync(taken); err != nil {
		return nil, err
	}
	return refused, nil
}

func (f *fakeLB) Capacity() (int, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.maxEntries, f.maxEntries
}

func (f *fakeLB) Services() ([]bpf.Service, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.services), nil
}

func (f *fakeLB) DestroySockets(_ context.Context, gone []bpf.Endpoint) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.destroyed = append(f.destroyed, slices.Clone(gone))
	return len(gone), nil
}

func (f *fakeLB) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	return nil
}

func (f *fakeLB) Remove() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = true
	return nil
}

// backends returns the backends of service key ("vip:port/proto") as "ip:port" strings.
func (f *fakeLB) backends(key string) ([]string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.services {
		if s.String() == key {
			out := []string{}
			for _, b := range s.Backends {
				out = append(out, netip.AddrPortFrom(b.Addr, b.Port).String())
			}
			slices.Sort(out)
			return out, true
		}
	}
	return nil, false
}

func (f *fakeLB) destroyedEndpoints() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, g := range f.destroyed {
		for _, e := range g {
			out = append(out, e.String())
		}
	}
	return out
}

// fakeCounters are the traffic counters of the agent's tests.
type fakeCounters struct {
	mu       sync.Mutex
	attached map[string]bool
	subnets  map[netip.Prefix]uint32
	counts   map[uint32]bpf.ClusterCounters
}

func newFakeCounters() *fakeCounters {
	return &fakeCounters{attached: map[string]bool{}, counts: map[uint32]bpf.ClusterCounters{}}
}

func (f *fakeCounters) Attach(ifname string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attached[ifname] = true
	return nil
}

func (f *fakeCounters) Detach(ifname string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.attached, ifname)
	return nil
}

func (f *fakeCounters) SetSubnets(s map[netip.Prefix]uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.subnets = s
	return nil
}

func (f *fakeCounters) Read() (map[uint32]bpf.ClusterCounters, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[uint32]bpf.ClusterCounters{}
	for k, v := range f.counts {
		out[k] = v
	}
	return out, nil
}

func (f *fakeCounters) Close() error  { return nil }
func (f *fakeCounters) Remove() error { return nil }

// fakeDatapath makes an agent's options use lb and counters (new ones when nil) and a fixed link
// list, never the kernel's.
func fakeDatapath(o *Options, lb *fakeLB, ctr *fakeCounters, links map[string]int) {
	if lb == nil {
		lb = &fakeLB{}
	}
	if ctr == nil {
		ctr = newFakeCounters()
	}
	o.Host.OpenLB = func(context.Context, bpf.Options) (servicedp.LoadBalancer, error) { return lb, nil }
	o.Host.OpenCounters = func(context.Context, bpf.Options) (servicedp.TrafficCounters, error) { return ctr, nil }
	fakeMeshIngress(o, &fakeIngress{}) // never the host's nftables and links
	o.Host.ListLinks = func() (map[string]int, error) {
		if links == nil {
			return nil, errors.New("no links in this test")
		}
		return links, nil
	}
}
