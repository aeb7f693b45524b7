package config

import (
	"testing"

	"github.com/cablemesh/cablemesh/bpf"
)

// The config checks loadBalancer's sizes against the bounds the loader enforces.
func TestLoadBalancerBoundsAreTheLoaders(t *testing.T) {
	if minLBMapEntries != bpf.MinMapEntries || maxLBMapEntries != bpf.MaxMapEntries {
		t.Fatalf("config bounds %d..%d, loader %d..%d", minLBMapEntries, maxLBMapEntries, bpf.MinMapEntries, bpf.MaxMapEntries)
	}
}
