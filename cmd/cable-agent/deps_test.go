package main

import (
	"os/exec"
	"strings"
	"testing"
)

// maxKubePackages bounds the k8s.io packages the agent links. The agent needs Nodes, Services,
// EndpointSlices, ServiceExports, ClusterConnectionPolicies, and its ServiceImports writer's
// Leases (coordination/v1, one package more: 101) (about 100 packages with
// client-go's rest, dynamic and tools/cache); client-go's clientset and informer factories
// register every API group of Kubernetes and bring 400 more, which a cold build compiles.
const maxKubePackages = 110

// heavyKubePackages are the client-go packages that pull in every API group.
var heavyKubePackages = []string{
	"k8s.io/client-go/kubernetes",
	"k8s.io/client-go/informers",
	"k8s.io/client-go/dynamic/dynamicinformer",
}

func TestTheAgentLinksOnlyTheKubernetesPackagesItUses(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool in PATH:", err)
	}
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Fatalf("go list -deps: %v", err)
	}
	var kube []string
	deps := map[string]bool{}
	for _, p := range strings.Fields(string(out)) {
		deps[p] = true
		if strings.Contains(p, "k8s.io") {
			kube = append(kube, p)
		}
	}
	for _, p := range heavyKubePackages {
		if deps[p] {
			t.Errorf("cable-agent links %s (and every API group with it)", p)
		}
	}
	if len(kube) > maxKubePackages {
		t.Errorf("cable-agent links %d k8s.io packages, want at most %d", len(kube), maxKubePackages)
	}
}
