package cablectl

import (
	"bytes"
	"strings"
	"testing"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

func TestStatusShowsAnImportTheLoadBalancerRefused(t *testing.T) {
	s := &statusapi.Services{ImportsKnown: true, ImportSelector: "all",
		LoadBalancer: statusapi.LoadBalancer{Running: true, Services: 3, Refused: 1, ServiceMapEntries: 64, BackendMapEntries: 64},
		Imports: []statusapi.ServiceImport{
			{Namespace: "bulk", Name: "s255", Type: "ClusterSetIP", LoadBalancerRefused: "the load balancer's maps are full: it needs 128 service map entries"},
			{Namespace: "shop", Name: "web", Type: "ClusterSetIP"},
		}}
	var b bytes.Buffer
	if err := printServicesSection(&b, s, false); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"1 import refused: the maps (64 service, 64 backend entries) are full",
		"bulk/s255 NOT IN THE LOAD BALANCER: the load balancer's maps are full: it needs 128"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "shop/web NOT IN") {
		t.Errorf("an import the maps hold is shown refused:\n%s", out)
	}
}
