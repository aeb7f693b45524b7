package vxlan

import (
	"net/netip"
	"slices"
	"testing"
)

// TestLoadsThePreviousVersionsConnections reads a connections.json written by the agent of
// commit 98843a3 (the release tests/netns/upgrade_test.go upgrades from), from gateway x of a
// pair x-y on vxlan: the next version's Init must tell the link, FDB entries and routes it kept
// as its own, or it would prune a live cable.
func TestLoadsThePreviousVersionsConnections(t *testing.T) {
	conns, err := connections("testdata/v98843a3").Load()
	if err != nil {
		t.Fatalf("the previous version's connections: %v", err)
	}
	want := conn{Node: "y-gw1", Address: netip.MustParseAddr("172.31.0.11"), VNI: 100, Port: 4789, DstPort: 4789,
		MTU: 1450, Device: "cbl-vx100", Subnets: []netip.Prefix{netip.MustParsePrefix("10.2.0.0/16")}}
	got, ok := conns["y"]
	if len(conns) != 1 || !ok {
		t.Fatalf("connections %v, want y only", conns)
	}
	if !got.equal(want) || !slices.Equal(got.Subnets, want.Subnets) {
		t.Errorf("connection y: %+v, want %+v", got, want)
	}
}
