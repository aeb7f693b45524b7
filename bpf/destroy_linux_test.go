//go:build linux

package bpf

import (
	"net/netip"
	"testing"
)

func TestLargeSetsOfGoneEndpointsAreSplitIntoTargetMapSizedParts(t *testing.T) {
	all := map[Endpoint]bool{}
	for i := range 9 {
		all[Endpoint{Addr: netip.AddrFrom4([4]byte{10, 0, 0, byte(i + 1)}), Port: 80, Proto: TCP}] = true
	}
	parts := chunks(all, 4)
	if len(parts) != 3 {
		t.Fatalf("9 endpoints in parts of 4: %d parts", len(parts))
	}
	seen := map[Endpoint]bool{}
	for _, p := range parts {
		if len(p) > 4 {
			t.Errorf("a part of %d endpoints, want at most 4", len(p))
		}
		for e := range p {
			if seen[e] {
				t.Errorf("%s is in two parts", e)
			}
			seen[e] = true
		}
	}
	if len(seen) != len(all) {
		t.Errorf("parts hold %d endpoints, want %d", len(seen), len(all))
	}
}
