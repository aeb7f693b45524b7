package broker

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// An export whose endpoint lies outside the exporting cluster's pod and service CIDRs would send
// importers' callers somewhere that cluster does not own: their own loopback, a metadata service,
// another cluster's pod, another service's VIP. The broker refuses the whole set, naming the
// field, the value and the CIDRs, and writes nothing of it.
func TestAnExportedEndpointOutsideItsClusterIsRefusedAndNothingIsWritten(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west")
	m.set("west", svc("api", 8080)) // 10.2.0.1, VIP 241.0.0.1
	m.set("east", svc("db", 5432))  // 10.1.0.1
	brokerIP, _, _ := strings.Cut(m.addr, ":")
	for _, ip := range []string{"127.0.0.1", "::1", "169.254.169.254", brokerIP, "10.2.0.1", "241.0.0.1", "::ffff:127.0.0.1"} {
		t.Run(ip, func(t *testing.T) {
			before := m.services()
			bad := svc("lo", 8080)
			bad.Endpoints = []*apiv1.ServiceEndpoint{{Ip: "10.1.0.7", Ready: true}, {Ip: ip, Ready: true}}
			_, err := m.clients["east"].SetExports(ctxT(t), &apiv1.SetExportsRequest{Exports: append(m.local("east", svc("db", 5432), svc("web", 80)), bad)})
			wantCode(t, err, codes.InvalidArgument, fmt.Sprintf("exports[2].endpoints[1].ip %s is not in cluster east's pod CIDRs [10.1.0.0/16] or service CIDRs []", ip))
			after := m.services()
			if after.Revision != before.Revision || !proto.Equal(after, before) {
				t.Fatalf("a refused set changed the store: revision %d -> %d\n%s", before.Revision, after.Revision, listText(after))
			}
		})
	}
}

// An export stored before the broker checked endpoints (or before its cluster's CIDRs changed)
// is not served with endpoints outside its cluster: they are left out of the imports, and the
// import says why (a conflict on "endpoints"). When the cluster's CIDRs change, its exports are
// merged again.
func TestAStoredEndpointOutsideItsClusterIsNotServed(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west")
	m.set("west", svc("api", 8080)) // 10.2.0.1
	old := &apiv1.ServiceExport{Cluster: "east", Node: "gw1", Namespace: "shop", Name: "api", Type: "ClusterSetIP",
		Ports:     []*apiv1.ServicePort{{Name: "p8080", Port: 8080, Protocol: "TCP"}},
		Labels:    map[string]string{"cablemesh.io/exported": "true"},
		Affinity:  "local",
		Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.5", Ready: true}, {Ip: "127.0.0.1", Ready: true}},
		Created:   timestamppb.New(m.clock.Now())}
	if _, err := m.srv.store.Update(ctxT(t), func(tx store.Tx) error { return tx.PutServiceExport(old) }); err != nil {
		t.Fatal(err)
	}
	endpointsOf := func(imp *apiv1.ServiceImport) string {
		var out []string
		for _, c := range imp.GetClusters() {
			for _, ep := range c.GetEndpoints() {
				out = append(out, c.GetCluster()+":"+ep.GetIp())
			}
		}
		for _, c := range imp.GetConflicts() {
			out = append(out, fmt.Sprintf("conflict(%s %s: %s)", c.GetCluster(), c.GetField(), c.GetMessage()))
		}
		return strings.Join(out, " ")
	}
	w := m.watch("west", wantImports(0))
	msg := recv(t, w)
	want := "east:10.1.0.5 west:10.2.0.1 conflict(east endpoints: node gw1: left out: endpoints[1].ip 127.0.0.1 is not in cluster east's pod CIDRs [10.1.0.0/16] or service CIDRs [])"
	if got := endpointsOf(msg.GetImports().GetImports()[0]); got != want {
		t.Fatalf("west imports\n%s\nwant\n%s", got, want)
	}
	if got := endpointsOf(m.services().Imports[0]); got != want {
		t.Fatalf("ListServices\n%s\nwant\n%s", got, want)
	}

	// east's pod CIDRs change: 10.1.0.5 is no longer its own.
	if _, err := m.srv.store.Update(ctxT(t), func(tx store.Tx) error {
		c, err := tx.Cluster("east")
		if err != nil {
			return err
		}
		c.PodCidrs = []string{"10.3.0.0/16"}
		return tx.PutCluster(c)
	}); err != nil {
		t.Fatal(err)
	}
	for {
		msg = recv(t, w)
		if msg.GetImports() != nil {
			break
		}
	}
	got := endpointsOf(msg.GetImports().GetImports()[0])
	if strings.Contains(got, "east:") || !strings.Contains(got, "endpoints[0].ip 10.1.0.5 is not in cluster east's pod CIDRs [10.3.0.0/16]") {
		t.Fatalf("after east's CIDRs changed: %s; want no east endpoint and both named", got)
	}
}

// In gateway mode a cluster's services are reached at its gateways: its gateways' mesh addresses
// are in its scope, another cluster's are not.
func TestAGatewayModeClusterMayExportItsGatewaysMeshAddress(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	tokens := map[string]string{}
	for _, c := range []string{"east", "west"} {
		resp, err := b.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: c, PodCidrs: []string{"10.1.0.0/16"}, GatewayMode: true})
		if err != nil {
			t.Fatal(err)
		}
		tokens[c] = resp.Token
	}
	east := mustJoin(t, b.addr, tokens["east"], "east", "gw1")
	west := mustJoin(t, b.addr, tokens["west"], "west", "gw1")
	eastMesh := register(t, b.addr, east, "192.0.2.1").MeshAddress
	westMesh := register(t, b.addr, west, "192.0.2.2").MeshAddress
	c := east.client(t, b.addr)
	mesh := svc("mesh", 80)
	mesh.Endpoints = []*apiv1.ServiceEndpoint{{Ip: "10.1.0.5", Ready: true}, {Ip: eastMesh, Ready: true}}
	setExports(t, c, mesh)
	mesh.Endpoints[1].Ip = westMesh
	_, err := c.SetExports(ctxT(t), &apiv1.SetExportsRequest{Exports: []*apiv1.ServiceExport{mesh}})
	wantCode(t, err, codes.InvalidArgument, fmt.Sprintf("exports[0].endpoints[1].ip %s is not in cluster east's pod CIDRs [10.1.0.0/16] or service CIDRs [], nor a mesh address of its gateways [%s]", westMesh, eastMesh))
}
