package brokerstate

import (
	"slices"
	"testing"
)

// TestLoadsThePreviousVersionsFile reads a broker-state.json written by the agent of commit
// 98843a3 (the release tests/netns/upgrade_test.go upgrades from), taken from gateway x of a
// two-cluster mesh on that version (clusters x and y on a vxlan policy, two exports each): the
// next version must start on it, and keep its tunnels, without the broker.
func TestLoadsThePreviousVersionsFile(t *testing.T) {
	s, err := Load("testdata/v98843a3")
	if err != nil {
		t.Fatalf("the previous version's broker state: %v", err)
	}
	if s == nil {
		t.Fatal("the previous version's broker state was not found")
	}
	if s.Revision != 16 {
		t.Errorf("revision %d, want 16", s.Revision)
	}
	if got := s.ClusterNames(); !slices.Equal(got, []string{"x", "y"}) {
		t.Errorf("clusters %v, want [x y]", got)
	}
	if x := s.Clusters["x"]; x == nil || x.GetLabels()["tier"] != "gold" || !slices.Equal(x.GetPodCidrs(), []string{"10.1.0.0/16"}) {
		t.Errorf("cluster x: %v", x)
	}
	for _, key := range []string{"x/x-gw1", "y/y-gw1"} {
		e := s.Endpoints[key]
		if e == nil {
			t.Errorf("endpoint %s missing (have %v)", key, sortedKeys(s.Endpoints))
			continue
		}
		if e.GetCablePorts()["wireguard"] != 51820 || len(e.GetDrivers()) != 3 {
			t.Errorf("endpoint %s: ports %v drivers %v", key, e.GetCablePorts(), e.GetDrivers())
		}
		if e.GetCableAttributes()["wireguard"].GetValues()["publicKey"] == "" {
			t.Errorf("endpoint %s lost its WireGuard public key: %v", key, e.GetCableAttributes())
		}
	}
	p := s.Policies["upgrade-pvx"]
	if p == nil || len(s.Policies) != 2 {
		t.Fatalf("policies %v, want default and upgrade-pvx", sortedKeys(s.Policies))
	}
	if !s.HasImports || len(s.Imports) != 4 {
		t.Errorf("imports: has %v, %d of them, want 4", s.HasImports, len(s.Imports))
	}
}
