package ingressport

import "testing"

// TestLoadsThePreviousVersionsFile reads an ingress-ports.json written by the agent of commit
// 98843a3 (the release tests/netns/upgrade_test.go upgrades from): the next version must keep
// every service on its port.
func TestLoadsThePreviousVersionsFile(t *testing.T) {
	ports, err := Load("testdata/v98843a3")
	if err != nil {
		t.Fatalf("the previous version's ingress ports: %v", err)
	}
	want := map[string]uint16{"shop/db-x/5432/TCP": 15000, "shop/web-x/80/TCP": 15001}
	if len(ports) != len(want) {
		t.Errorf("%d ports %v, want %v", len(ports), ports, want)
	}
	for s, port := range want {
		k, err := ParseKey(s)
		if err != nil {
			t.Fatalf("ParseKey(%q): %v", s, err)
		}
		if ports[k] != port {
			t.Errorf("%s: port %d, want %d", s, ports[k], port)
		}
	}
}
