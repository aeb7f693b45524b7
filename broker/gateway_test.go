package broker

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/broker/store/etcdtest"
)

// Gateway mode at the broker: overlap admission, mesh addresses, ingresses in imports.

func gatewayToken(t *testing.T, b *testBroker, cluster string, gateway bool, pods ...string) (*apiv1.CreateJoinTokenResponse, error) {
	t.Helper()
	return b.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: cluster, PodCidrs: pods, GatewayMode: gateway})
}

func TestTwoGatewayModeClustersMayShareAPodCIDRButADirectOneMayNot(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	for _, c := range []string{"east", "west"} {
		resp, err := gatewayToken(t, b, c, true, "10.1.0.0/16")
		if err != nil {
			t.Fatalf("gateway-mode cluster %s with 10.1.0.0/16: %v", c, err)
		}
		if !resp.Cluster.GatewayMode {
			t.Fatalf("cluster %s: gateway_mode not stored: %v", c, resp.Cluster)
		}
	}
	_, err := gatewayToken(t, b, "north", false, "10.1.0.0/16")
	wantCode(t, err, codes.FailedPrecondition, `pod CIDR 10.1.0.0/16 of cluster "north" overlaps pod CIDR 10.1.0.0/16 of cluster "east"`,
		`"north" is not`, "--gateway-mode")

	t.Run("the list says which clusters are in gateway mode", func(t *testing.T) {
		got := map[string]bool{}
		for _, c := range b.list().Clusters {
			got[c.Name] = c.GatewayMode
		}
		if fmt.Sprint(got) != "map[east:true west:true]" {
			t.Fatalf("clusters %v; want east and west, both in gateway mode", got)
		}
	})
	t.Run("a token for an existing cluster in the other mode is refused naming the field", func(t *testing.T) {
		_, err := gatewayToken(t, b, "east", false)
		wantCode(t, err, codes.AlreadyExists, `cluster "east" already exists in gateway mode, not direct mode`, "give --gateway-mode")
		if _, err := gatewayToken(t, b, "east", true); err != nil {
			t.Fatalf("a token for east in its own mode: %v", err)
		}
		if _, err := gatewayToken(t, b, "south", false, "10.5.0.0/16"); err != nil {
			t.Fatal(err)
		}
		_, err = gatewayToken(t, b, "south", true)
		wantCode(t, err, codes.AlreadyExists, `cluster "south" already exists in direct mode, not gateway mode`, "leave out --gateway-mode")
	})
	t.Run("no cluster CIDR may overlap the mesh address range", func(t *testing.T) {
		for _, gw := range []bool{false, true} {
			_, err := gatewayToken(t, b, "meshy", gw, "242.0.0.0/24")
			wantCode(t, err, codes.InvalidArgument, `pod CIDR 242.0.0.0/24 of cluster "meshy" overlaps the mesh address range 242.0.0.0/16`, "--mesh-address-range")
		}
		_, err := b.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "meshy", PodCidrs: []string{"10.7.0.0/16"}, ServiceCidrs: []string{"242.0.0.0/8"}})
		wantCode(t, err, codes.InvalidArgument, "service CIDR 242.0.0.0/8", "mesh address range")
	})
}

// register registers a's endpoint at ip, asking for a mesh address of its own choosing (which
// the broker must ignore), and returns the stored endpoint.
func register(t *testing.T, addr string, a *agent, ip string) *apiv1.Endpoint {
	t.Helper()
	e := endpoint(a.cluster, a.node, ip)
	e.MeshAddress = "242.0.0.200" // an agent's wish: never granted
	resp, err := a.client(t, addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: e})
	if err != nil {
		t.Fatalf("register %s/%s: %v", a.cluster, a.node, err)
	}
	return resp.Endpoint
}

func meshOf(t *testing.T, b *testBroker) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, e := range b.list().Endpoints {
		out[e.Cluster+"/"+e.Node] = e.MeshAddress
	}
	return out
}

func TestMeshAddressesAreUniqueStableAndReleased(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, dir, brokerOpts{durable: true, meshRange: netip.MustParsePrefix("242.0.0.0/29")})
	if _, err := gatewayToken(t, b, "east", true, "10.1.0.0/16"); err != nil {
		t.Fatal(err)
	}
	if _, err := gatewayToken(t, b, "west", false, "10.2.0.0/16"); err != nil {
		t.Fatal(err)
	}
	eastTok := func() string {
		t.Helper()
		resp, err := gatewayToken(t, b, "east", true)
		if err != nil {
			t.Fatal(err)
		}
		return resp.Token
	}
	east1 := mustJoin(t, b.addr, eastTok(), "east", "gw1")
	east2 := mustJoin(t, b.addr, eastTok(), "east", "gw2")
	west1 := mustJoin(t, b.addr, b.token("west"), "west", "gw1")

	// Watch from the start: the endpoint events carry the mesh addresses.
	w, err := west1.client(t, b.addr).Watch(ctxT(t), &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, a := range []*agent{east1, east2, west1} {
		e := register(t, b.addr, a, "192.0.2."+fmt.Sprint(len(got)+1))
		got[a.cluster+"/"+a.node] = e.MeshAddress
	}
	want := map[string]string{"east/gw1": "242.0.0.1", "east/gw2": "242.0.0.2", "west/gw1": "242.0.0.3"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("mesh addresses in the responses %v; want %v (the lowest free, whatever the agent asked)", got, want)
	}
	if l := meshOf(t, b); fmt.Sprint(l) != fmt.Sprint(want) {
		t.Fatalf("mesh addresses in the list %v; want %v", l, want)
	}
	seen := map[string]string{}
	for len(seen) < 3 {
		m, err := w.Recv()
		if err != nil {
			t.Fatalf("watch: %v", err)
		}
		for _, ev := range m.Events {
			if e := ev.GetResource().GetEndpoint(); e != nil && e.MeshAddress != "" {
				seen[e.Cluster+"/"+e.Node] = e.MeshAddress
			}
		}
	}
	if fmt.Sprint(seen) != fmt.Sprint(want) {
		t.Fatalf("mesh addresses in the watch %v; want %v", seen, want)
	}

	t.Run("registering again keeps the address", func(t *testing.T) {
		if e := register(t, b.addr, east2, "192.0.2.2"); e.MeshAddress != "242.0.0.2" {
			t.Fatalf("east/gw2 again: %s", e.MeshAddress)
		}
		if e := register(t, b.addr, east2, "192.0.2.9"); e.MeshAddress != "242.0.0.2" {
			t.Fatalf("east/gw2 at a new IP: %s", e.MeshAddress)
		}
	})
	t.Run("an endpoint whose lease expired gets its address back", func(t *testing.T) {
		b.clock.Advance(10 * DefaultLease)
		b.reap()
		if l := b.list().Endpoints; len(l) != 0 {
			t.Fatalf("endpoints after the reap: %v", l)
		}
		// Registered in the opposite order: each still gets its own.
		for _, a := range []*agent{west1, east2, east1} {
			if e := register(t, b.addr, a, "192.0.2.1"); e.MeshAddress != want[a.cluster+"/"+a.node] {
				t.Fatalf("%s/%s after expiry: %s, want %s", a.cluster, a.node, e.MeshAddress, want[a.cluster+"/"+a.node])
			}
		}
	})
	addr := b.addr
	b.stop()
	b = startBroker(t, dir, brokerOpts{durable: true, addr: addr, meshRange: netip.MustParsePrefix("242.0.0.0/29")})
	t.Run("a broker restart keeps every address", func(t *testing.T) {
		if l := meshOf(t, b); fmt.Sprint(l) != fmt.Sprint(want) {
			t.Fatalf("after restart %v; want %v", l, want)
		}
		if e := register(t, b.addr, east1, "192.0.2.1"); e.MeshAddress != "242.0.0.1" {
			t.Fatalf("east/gw1 after restart: %s", e.MeshAddress)
		}
	})
	t.Run("a revoked node's address is released", func(t *testing.T) {
		if _, err := b.admin.RevokeNode(ctxT(t), &apiv1.RevokeNodeRequest{Cluster: "east", Node: "gw2"}); err != nil {
			t.Fatal(err)
		}
		gw3 := mustJoin(t, b.addr, eastTok(), "east", "gw3")
		if e := register(t, b.addr, gw3, "192.0.2.3"); e.MeshAddress != "242.0.0.2" {
			t.Fatalf("east/gw3 after gw2 was revoked: %s, want gw2's 242.0.0.2", e.MeshAddress)
		}
		// The revoked name joins again (a new record) and gets a free address, not gw3's.
		again := mustJoin(t, b.addr, eastTok(), "east", "gw2")
		if e := register(t, b.addr, again, "192.0.2.2"); e.MeshAddress != "242.0.0.4" {
			t.Fatalf("east/gw2 joined again: %s, want 242.0.0.4", e.MeshAddress)
		}
	})
	t.Run("the range exhausted is refused naming it", func(t *testing.T) {
		// 242.0.0.0/29: .1 to .6; .1-.4 are taken.
		for i, n := range []string{"gw5", "gw6"} {
			a := mustJoin(t, b.addr, eastTok(), "east", n)
			if e := register(t, b.addr, a, "192.0.2.5"); e.MeshAddress != fmt.Sprintf("242.0.0.%d", 5+i) {
				t.Fatalf("%s: %s", n, e.MeshAddress)
			}
		}
		a := mustJoin(t, b.addr, eastTok(), "east", "gw7")
		_, err := a.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw7", "192.0.2.7")})
		wantCode(t, err, codes.ResourceExhausted, "cannot allocate a mesh address for node east/gw7", "mesh address range 242.0.0.0/29 is exhausted", "--mesh-address-range")
	})
	t.Run("a removed cluster's addresses are released", func(t *testing.T) {
		if _, err := b.admin.RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "east"}); err != nil {
			t.Fatal(err)
		}
		resp, err := gatewayToken(t, b, "north", true, "10.3.0.0/16")
		if err != nil {
			t.Fatal(err)
		}
		n := mustJoin(t, b.addr, resp.Token, "north", "gw1")
		if e := register(t, b.addr, n, "192.0.2.8"); e.MeshAddress != "242.0.0.1" {
			t.Fatalf("north/gw1 after east was removed: %s, want east/gw1's 242.0.0.1", e.MeshAddress)
		}
	})
}

func TestAChangedMeshRangeRenumbersAtStart(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, dir, brokerOpts{durable: true})
	b.token("east", "10.1.0.0/16")
	a := mustJoin(t, b.addr, b.token("east"), "east", "gw1")
	if e := register(t, b.addr, a, "192.0.2.1"); e.MeshAddress != "242.0.0.1" {
		t.Fatalf("first address %s", e.MeshAddress)
	}
	addr := b.addr
	b.stop()
	b = startBroker(t, dir, brokerOpts{durable: true, addr: addr, meshRange: netip.MustParsePrefix("10.250.0.0/24")})
	if l := meshOf(t, b); l["east/gw1"] != "10.250.0.1" {
		t.Fatalf("after the range changed: %v; want 10.250.0.1", l)
	}
	if e := register(t, b.addr, a, "192.0.2.1"); e.MeshAddress != "10.250.0.1" {
		t.Fatalf("registering after the change: %s", e.MeshAddress)
	}
}

func TestImportsCarryTheExportingGatewaysIngresses(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west")
	register(t, m.addr, m.agents["east"], "192.0.2.1") // east/gw1: 242.0.0.1
	w := m.watch("west", wantImports(0))
	first, err := w.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if importsText(first.Imports) != "" {
		t.Fatalf("first imports %s", importsText(first.Imports))
	}
	web := svc("web", 80, 443)
	web.Ports[0].IngressPort = 30080 // 443 has none: not served by the ingress
	m.set("east", web)
	ingressText := func(imps *apiv1.ServiceImports) string {
		var out []string
		for _, imp := range imps.GetImports() {
			for _, c := range imp.Clusters {
				for _, g := range c.Ingresses {
					for _, p := range g.Ports {
						out = append(out, fmt.Sprintf("%s %s/%s %s %d->%d", imp.Name, c.Cluster, g.Node, g.MeshAddress, p.Port, p.IngressPort))
					}
				}
			}
		}
		return strings.Join(out, "; ")
	}
	next := func(want string) {
		t.Helper()
		for {
			msg, err := w.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if msg.Imports == nil {
				continue
			}
			if got := ingressText(msg.Imports); got != want {
				t.Fatalf("ingresses %q; want %q", got, want)
			}
			return
		}
	}
	next("web east/gw1 242.0.0.1 80->30080")

	// A second node of east exports it too, but has no endpoint yet: no ingress until it registers.
	m.join("east", "gw2")
	gw2 := m.agents["east/gw2"].client(t, m.addr)
	web2 := svc("web", 80, 443)
	web2.Endpoints[0].Ip = "10.9.0.2" // so that the import changes, and is sent
	web2.Ports[0].IngressPort, web2.Ports[1].IngressPort = 30081, 30443
	setExports(t, gw2, m.local("east", web2)...)
	next("web east/gw1 242.0.0.1 80->30080")
	register(t, m.addr, m.agents["east/gw2"], "192.0.2.2")
	next("web east/gw1 242.0.0.1 80->30080; web east/gw2 242.0.0.2 80->30081; web east/gw2 242.0.0.2 443->30443")

	t.Run("the service list shows them too", func(t *testing.T) {
		if got := ingressText(&apiv1.ServiceImports{Imports: m.services().Imports}); got != "web east/gw1 242.0.0.1 80->30080; web east/gw2 242.0.0.2 80->30081; web east/gw2 242.0.0.2 443->30443" {
			t.Fatalf("list: %s", got)
		}
	})

	// Its lease expires: its ingress goes.
	m.clock.Advance(10 * DefaultLease)
	if _, err := m.clients["east"].Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{}); err != nil {
		t.Fatal(err)
	}
	m.reap()
	next("web east/gw1 242.0.0.1 80->30080")
}

// Two replicas on one etcd hand out mesh addresses concurrently: never one address twice.
func TestMeshAddressesAreUniqueAcrossReplicas(t *testing.T) {
	etcd := etcdtest.Start(t, 1)
	root := "/cablemesh-mesh-test/"
	dirA, dirB := t.TempDir(), t.TempDir()
	a, err := startReplica(t, etcd, root, dirA)
	if err != nil {
		t.Fatal(err)
	}
	copyFile(t, filepath.Join(dirA, SecretKeyFile), filepath.Join(dirB, SecretKeyFile))
	b, err := startReplica(t, etcd, root, dirB)
	if err != nil {
		t.Fatal(err)
	}
	const each = 8
	tok, err := a.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.1.0.0/16"}, GatewayMode: true, MaxNodes: 2 * each})
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu   sync.Mutex
		got  = map[string]string{} // address → node
		wg   sync.WaitGroup
		reps = []*replica{a, b}
	)
	for i := range 2 * each {
		wg.Go(func() {
			r := reps[i%2]
			node := fmt.Sprintf("gw%02d", i)
			ag, err := join(t, r.addr, tok.Token, "east", node)
			if err != nil {
				t.Errorf("join %s through %s: %v", node, r.addr, err)
				return
			}
			resp, err := ag.client(t, r.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", node, fmt.Sprintf("192.0.2.%d", i+1))})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("register %s through %s: %v", node, r.addr, err)
				return
			}
			if other, dup := got[resp.Endpoint.MeshAddress]; dup {
				t.Errorf("mesh address %s handed to %s and %s", resp.Endpoint.MeshAddress, other, node)
			}
			got[resp.Endpoint.MeshAddress] = node
		})
	}
	wg.Wait()
	if len(got) != 2*each {
		t.Fatalf("%d distinct addresses, want %d: %v", len(got), 2*each, got)
	}
	for _, r := range reps {
		l, err := r.admin.ListClusters(ctxT(t), &apiv1.ListClustersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range l.Endpoints {
			if got[e.MeshAddress] != e.Node {
				t.Fatalf("%s lists %s at %s, acknowledged to %q", r.addr, e.Node, e.MeshAddress, got[e.MeshAddress])
			}
			if !netip.MustParsePrefix("242.0.0.0/16").Contains(netip.MustParseAddr(e.MeshAddress)) {
				t.Fatalf("%s: %s outside the default range", e.Node, e.MeshAddress)
			}
		}
	}
}

// The import state re-merges a service when the mesh address of a node exporting it appears,
// changes or goes, and only then.
func TestImportStateFollowsTheExportingNodesMeshAddresses(t *testing.T) {
	s := newImportState()
	web := exportEv(t, "east", "web", time.Unix(1e9, 0), 80, 1)
	web.Resource.GetServiceExport().Ports[0].IngressPort = 30080
	s.apply(store.Batch{Snapshot: true, Revision: 1, Events: []*apiv1.Event{clusterEv("east", 1, nil), defaultPolicyEv(t), web}})
	ingresses := func(rev uint64) string {
		t.Helper()
		v, err := s.view(rev)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, imp := range v.imports {
			for _, c := range imp.Clusters {
				for _, g := range c.Ingresses {
					out = append(out, fmt.Sprintf("%s/%s@%s:%d", c.Cluster, g.Node, g.MeshAddress, g.Ports[0].IngressPort))
				}
			}
		}
		return strings.Join(out, ",")
	}
	if got := ingresses(1); got != "" {
		t.Fatalf("no endpoint yet: %q", got)
	}
	steps := []struct {
		name    string
		ev      *apiv1.Event
		changed bool
		want    string
	}{
		{"the exporting node registers with a mesh address", endpointEv("east", "gw1", "242.0.0.1"), true, "east/gw1@242.0.0.1:30080"},
		{"the same address again changes nothing", endpointEv("east", "gw1", "242.0.0.1"), false, "east/gw1@242.0.0.1:30080"},
		{"a node that exports nothing changes nothing", endpointEv("east", "gw2", "242.0.0.2"), false, "east/gw1@242.0.0.1:30080"},
		{"a new address is shown", endpointEv("east", "gw1", "242.0.0.9"), true, "east/gw1@242.0.0.9:30080"},
		{"the endpoint withdrawn takes its ingress", &apiv1.Event{Type: apiv1.Event_DELETE, Kind: store.KindEndpoint, Key: "east/gw1"}, true, ""},
		{"it registers again", endpointEv("east", "gw1", "242.0.0.1"), true, "east/gw1@242.0.0.1:30080"},
		{"its export withdrawn takes the import", &apiv1.Event{Type: apiv1.Event_DELETE, Kind: store.KindServiceExport, Key: store.ServiceExportKey("east", "gw1", "shop", "web")}, true, ""},
		{"then its address changes nothing", endpointEv("east", "gw1", "242.0.0.5"), false, ""},
	}
	for i, st := range steps {
		rev := uint64(i + 2)
		if got := s.apply(store.Batch{Revision: rev, Events: []*apiv1.Event{st.ev}}); got != st.changed {
			t.Fatalf("%s: apply says changed %v, want %v", st.name, got, st.changed)
		}
		if got := ingresses(rev); got != st.want {
			t.Fatalf("%s: ingresses %q, want %q", st.name, got, st.want)
		}
	}
}

// endpointEv is an endpoint UPSERT of cluster/node with mesh address mesh.
func endpointEv(cluster, node, mesh string) *apiv1.Event {
	return upsert(store.KindEndpoint, store.EndpointKey(cluster, node), &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: &apiv1.Endpoint{
		Cluster: cluster, Node: node, PrivateIp: "172.31.0.9", MeshAddress: mesh}}})
}
