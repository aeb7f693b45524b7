package broker

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
)

// A cluster's nodes together cannot export past the cluster's quota: the export that would is
// refused naming the count, the limit and the flag, and changes nothing; another cluster is
// not affected.
func TestSetExportsIsRefusedOverTheClustersQuota(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{exportQuota: admission.ExportQuota{Services: 3}}, "east", "west")
	m.join("east", "gw2")
	svcAt := func(name, ip string) *apiv1.ServiceExport {
		return &apiv1.ServiceExport{Namespace: "shop", Name: name, Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
			Endpoints: []*apiv1.ServiceEndpoint{{Ip: ip, Ready: true}}}
	}
	svc := func(name string) *apiv1.ServiceExport { return svcAt(name, "10.1.0.10") }     // east's pod CIDR
	westSvc := func(name string) *apiv1.ServiceExport { return svcAt(name, "10.2.0.10") } // west's
	m.set("east", svc("a"), svc("b"))
	gw2 := m.agents["east/gw2"].client(t, m.addr)
	_, err := gw2.SetExports(ctxT(t), &apiv1.SetExportsRequest{Exports: []*apiv1.ServiceExport{svc("c"), svc("d")}})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "cluster east would export 4 services, at most 3 per cluster (the broker's --max-services-per-cluster)") {
		t.Fatalf("gw2 exporting a 4th service of east: %v", err)
	}
	if n := len(m.services().GetImports()); n != 2 {
		t.Errorf("%d services after the refusal, want east's 2", n)
	}
	setExports(t, gw2, svc("a"), svc("c")) // a is exported by gw1 too: 3 services
	m.set("west", westSvc("w1"), westSvc("w2"), westSvc("w3"))
	var names []string
	for _, imp := range m.services().GetImports() {
		names = append(names, imp.GetName())
	}
	if fmt.Sprint(names) != "[a b c w1 w2 w3]" {
		t.Errorf("services %v", names)
	}
}
