package services

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// The importer's own guard: whatever a broker sends, no backend and no headless answer lies
// outside its exporting cluster.
func TestInScopeLeavesOutEndpointsOutsideTheirCluster(t *testing.T) {
	clusters := map[string]*apiv1.Cluster{
		"east": {Name: "east", PodCidrs: []string{"10.1.0.0/16"}},
		"west": {Name: "west", PodCidrs: []string{"10.2.0.0/16"}, ServiceCidrs: []string{"10.102.0.0/16"}},
		"gw":   {Name: "gw", PodCidrs: []string{"10.1.0.0/16"}, GatewayMode: true},
	}
	endpoints := map[string]*apiv1.Endpoint{"gw/n1": {Cluster: "gw", Node: "n1", MeshAddress: "242.0.0.9"}}
	api := web("local",
		cluster("east", 1, "local", []*apiv1.ServicePort{port("http", 80, "TCP")}, ep("10.1.0.10", true), ep("127.0.0.1", true), ep("169.254.169.254", true)),
		cluster("west", 2, "local", []*apiv1.ServicePort{port("http", 80, "TCP")}, ep("10.2.0.10", true), ep("10.102.0.5", true), ep("10.1.0.10", true)),
		cluster("gw", 3, "local", []*apiv1.ServicePort{port("http", 80, "TCP")}, ep("242.0.0.9", true), ep("242.0.0.8", true)),
		cluster("gone", 4, "local", []*apiv1.ServicePort{port("http", 80, "TCP")}, ep("10.9.0.1", true)),
	)
	clean := web("local")
	clean.Name = "clean"
	clean.Clusters[0].Endpoints = clean.Clusters[0].Endpoints[:1]
	in := []*apiv1.ServiceImport{api, clean}
	orig := proto.Clone(api)

	got, problems := InScope(in, clusters, endpoints)
	var kept []string
	for _, c := range got[0].Clusters {
		for _, e := range c.Endpoints {
			kept = append(kept, c.Cluster+":"+e.Ip)
		}
	}
	if want := "east:10.1.0.10 west:10.2.0.10 west:10.102.0.5 gw:242.0.0.9"; strings.Join(kept, " ") != want {
		t.Errorf("kept %v, want %s", kept, want)
	}
	for _, want := range []string{
		"service shop/web: cluster east endpoints[1].ip 127.0.0.1 is not in cluster east's pod CIDRs [10.1.0.0/16] or service CIDRs []; left out",
		"cluster east endpoints[2].ip 169.254.169.254 is not in",
		"cluster west endpoints[2].ip 10.1.0.10 is not in cluster west's pod CIDRs [10.2.0.0/16] or service CIDRs [10.102.0.0/16]",
		"cluster gw endpoints[1].ip 242.0.0.8 is not in cluster gw's pod CIDRs [10.1.0.0/16] or service CIDRs [], nor a mesh address of its gateways [242.0.0.9]",
		"cluster gone endpoints[0].ip 10.9.0.1: cluster gone is not known to this node",
	} {
		if !strings.Contains(strings.Join(problems, "\n"), want) {
			t.Errorf("problems %q lack %q", problems, want)
		}
	}
	if len(problems) != 5 {
		t.Errorf("%d problems, want 5: %q", len(problems), problems)
	}
	if !proto.Equal(api, orig) {
		t.Errorf("InScope changed its input")
	}
	if got[1] != clean {
		t.Errorf("an import in scope was copied")
	}

	// What Compute makes of it: the load balancer's backends are the clusters' own addresses.
	plan := Compute(got[:1], "north", usable("east", "west", "gw", "gone"))
	if len(plan.LB) != 1 || strings.Join(backends(plan.LB[0]), " ") != "10.1.0.10:80 10.2.0.10:80 10.102.0.5:80 242.0.0.9:80" {
		t.Errorf("load balancer %+v", plan.LB)
	}
}

func TestInScopeReturnsImportsInScopeAsTheyAre(t *testing.T) {
	in := []*apiv1.ServiceImport{web("local")}
	clusters := map[string]*apiv1.Cluster{"east": {Name: "east", PodCidrs: []string{"10.1.0.0/16"}}, "west": {Name: "west", PodCidrs: []string{"10.2.0.0/16"}}}
	got, problems := InScope(in, clusters, nil)
	if len(problems) != 0 || len(got) != 1 || got[0] != in[0] {
		t.Fatalf("got %v %q, want the input unchanged and no problem", got, problems)
	}
}
