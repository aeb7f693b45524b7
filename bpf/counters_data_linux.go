//go:build linux

package bpf

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
)

// The counters' data: the remote subnets the agent sets, and the counts the programs add up.

func subnetKey(p netip.Prefix) countersSubnetKey {
	var k countersSubnetKey
	bits := p.Bits()
	if p.Addr().Is4() {
		bits += 96
	}
	k.Prefixlen = uint32(bits)
	k.Addr = addrBytes(p.Addr())
	return k
}

// SetSubnets makes the subnet map hold exactly subnets (remote subnet -> cluster ID, 1..255),
// writing only what changed.
func (c *Counters) SetSubnets(subnets map[netip.Prefix]uint32) (err error) {
	want := map[countersSubnetKey]uint32{}
	for p, id := range subnets {
		if !p.IsValid() || p.Addr().Zone() != "" {
			return fmt.Errorf("set subnets: subnet %q is not a valid prefix", p)
		}
		if id == 0 || id > maxClusterID {
			return fmt.Errorf("set subnets: subnet %s: cluster ID %d is not in 1..%d", p, id, maxClusterID)
		}
		if p.Addr().Is4In6() {
			if p.Bits() < 96 {
				return fmt.Errorf("set subnets: subnet %s: an IPv4-mapped prefix needs at least 96 bits", p)
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		p = p.Masked()
		want[subnetKey(p)] = id
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("set subnets: closed")
	}
	m := c.maps.CmCtrSubnet
	have := map[countersSubnetKey]uint32{}
	var (
		k  countersSubnetKey
		id uint32
	)
	it := m.Iterate()
	for it.Next(&k, &id) {
		have[k] = id
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("set subnets: read map %s: %w", mapName(m), err)
	}
	changed := false
	// However it ends, a change made must reach the programs' lookup caches.
	defer func() {
		if changed {
			if gerr := c.bumpGeneration(); gerr != nil && err == nil {
				err = fmt.Errorf("set subnets: %w", gerr)
			}
		}
	}()
	for k, id := range want {
		if old, ok := have[k]; ok && old == id {
			continue
		}
		changed = true
		if err := m.Put(k, id); err != nil {
			return fmt.Errorf("set subnets: map %s: put %s: %w", mapName(m), subnetString(k), err)
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			changed = true
			if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("set subnets: map %s: delete %s: %w", mapName(m), subnetString(k), err)
			}
		}
	}
	return nil
}

// bumpGeneration moves the subnet map's generation on, which empties every CPU's lookup cache in
// the counter programs (c/counters.c). It skips 0, which no cache entry is ever valid at.
func (c *Counters) bumpGeneration() error {
	var gen uint32
	if err := c.maps.CmCtrGen.Lookup(uint32(0), &gen); err != nil {
		return fmt.Errorf("read map %s: %w", mapName(c.maps.CmCtrGen), err)
	}
	if gen++; gen == 0 {
		gen = 1
	}
	if err := c.maps.CmCtrGen.Put(uint32(0), gen); err != nil {
		return fmt.Errorf("write map %s: %w", mapName(c.maps.CmCtrGen), err)
	}
	return nil
}

func subnetString(k countersSubnetKey) string {
	a := addrFromBytes(k.Addr)
	bits := int(k.Prefixlen)
	if a.Is4() {
		bits -= 96
	}
	return netip.PrefixFrom(a, bits).String()
}

// Read returns the counters of every cluster that has any, summed over the CPUs.
func (c *Counters) Read() (map[uint32]ClusterCounters, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errors.New("read counters: closed")
	}
	out := map[uint32]ClusterCounters{}
	var perCPU []countersClusterStats
	for id := uint32(1); id <= maxClusterID; id++ {
		if err := c.maps.CmCtrStats.Lookup(id, &perCPU); err != nil {
			return nil, fmt.Errorf("read counters: map %s: cluster %d: %w", mapName(c.maps.CmCtrStats), id, err)
		}
		var sum ClusterCounters
		for _, s := range perCPU {
			sum.RxPackets += s.RxPackets
			sum.RxBytes += s.RxBytes
			sum.TxPackets += s.TxPackets
			sum.TxBytes += s.TxBytes
		}
		if sum != (ClusterCounters{}) {
			out[id] = sum
		}
	}
	return out, nil
}
