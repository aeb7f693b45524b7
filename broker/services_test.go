package broker

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/internal/syncbuf"
	"github.com/cablemesh/cablemesh/mcs"
)

// svcMesh is a broker with clusters (labelled site=<name>) and one joined agent, gw1, in each.
type svcMesh struct {
	*testBroker
	agents  map[string]*agent
	clients map[string]apiv1.AgentClient
	octet   map[string]int // cluster → n of its pod CIDR 10.n.0.0/16
}

func newSvcMesh(t *testing.T, dir string, o brokerOpts, clusters ...string) *svcMesh {
	t.Helper()
	m := &svcMesh{testBroker: startBroker(t, dir, o), agents: map[string]*agent{}, clients: map[string]apiv1.AgentClient{}, octet: map[string]int{}}
	for i, c := range clusters {
		m.octet[c] = i + 1
		m.labelledCluster(c, fmt.Sprintf("10.%d.0.0/16", i+1), map[string]string{"site": c})
		m.join(c, "gw1")
	}
	return m
}

func (m *svcMesh) join(cluster, node string) {
	m.t.Helper()
	a := mustJoin(m.t, m.addr, m.token(cluster), cluster, node)
	m.agents[cluster+"/"+node] = a
	if node == "gw1" {
		m.agents[cluster] = a
		m.clients[cluster] = a.client(m.t, m.addr)
	}
}

func (m *svcMesh) set(cluster string, exports ...*apiv1.ServiceExport) *apiv1.SetExportsResponse {
	m.t.Helper()
	return setExports(m.t, m.clients[cluster], m.local(cluster, exports...)...)
}

// local is exports with svc's endpoints moved into cluster's pod CIDR, where the broker admits
// them.
func (m *svcMesh) local(cluster string, exports ...*apiv1.ServiceExport) []*apiv1.ServiceExport {
	return inPodCIDR(m.octet[cluster], exports...)
}

// inPodCIDR is copies of exports whose endpoints 10.9.x.y (svc's) are 10.n.x.y.
func inPodCIDR(n int, exports ...*apiv1.ServiceExport) []*apiv1.ServiceExport {
	out := make([]*apiv1.ServiceExport, len(exports))
	for i, e := range exports {
		e = proto.Clone(e).(*apiv1.ServiceExport)
		for _, ep := range e.Endpoints {
			if rest, ok := strings.CutPrefix(ep.Ip, "10.9."); ok {
				ep.Ip = fmt.Sprintf("10.%d.%s", n, rest)
			}
		}
		out[i] = e
	}
	return out
}

func setExports(t *testing.T, c apiv1.AgentClient, exports ...*apiv1.ServiceExport) *apiv1.SetExportsResponse {
	t.Helper()
	resp, err := c.SetExports(ctxT(t), &apiv1.SetExportsRequest{Exports: exports})
	if err != nil {
		t.Fatalf("set exports: %v", err)
	}
	return resp
}

func (m *svcMesh) services() *apiv1.ListServicesResponse {
	m.t.Helper()
	resp, err := m.admin.ListServices(ctxT(m.t), &apiv1.ListServicesRequest{})
	if err != nil {
		m.t.Fatalf("list services: %v", err)
	}
	return resp
}

func (m *svcMesh) watch(cluster string, req *apiv1.WatchRequest) apiv1.Agent_WatchClient {
	m.t.Helper()
	w, err := m.clients[cluster].Watch(ctxT(m.t), req)
	if err != nil {
		m.t.Fatal(err)
	}
	return w
}

// wantImports is a watch with the default import selector.
func wantImports(since uint64) *apiv1.WatchRequest {
	return &apiv1.WatchRequest{SinceRevision: since, WantImports: true, ImportSelector: mcs.DefaultImportSelector}
}

// svc is an export of shop/<name> as an agent sends it: one named port per port given (name
// "p<port>"), one ready endpoint.
func svc(name string, ports ...uint32) *apiv1.ServiceExport {
	e := &apiv1.ServiceExport{Namespace: "shop", Name: name, Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.9.0.1", Ready: true}}}
	for _, p := range ports {
		e.Ports = append(e.Ports, &apiv1.ServicePort{Name: fmt.Sprintf("p%d", p), Port: p})
	}
	return e
}

// importsText shows an import set as "ns/name[cluster,...] vips ports" per import, "; "
// between them; "-" when the message carries none (nil) and "" for an empty set.
func importsText(imps *apiv1.ServiceImports) string {
	if imps == nil {
		return "-"
	}
	var parts []string
	for _, imp := range imps.Imports {
		parts = append(parts, importText(imp))
	}
	return strings.Join(parts, "; ")
}

func importText(imp *apiv1.ServiceImport) string {
	var cs, ports []string
	for _, c := range imp.Clusters {
		cs = append(cs, c.Cluster)
	}
	for _, p := range imp.Ports {
		ports = append(ports, fmt.Sprint(p.Port))
	}
	return fmt.Sprintf("%s[%s] %s %s", mcs.Key(imp.Namespace, imp.Name), strings.Join(cs, ","), strings.Join(imp.Vips, ","), strings.Join(ports, ","))
}

func listText(resp *apiv1.ListServicesResponse) string {
	var parts []string
	for _, imp := range resp.Imports {
		s := importText(imp)
		for _, c := range imp.Conflicts {
			s += fmt.Sprintf(" conflict(%s %s)", c.Cluster, c.Field)
		}
		parts = append(parts, s)
	}
	return strings.Join(parts, "; ")
}

func TestAnAgentExportsOnlyForItsOwnClusterAndNode(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west")
	before := m.services().Revision

	other := svc("web", 80)
	other.Cluster = "west"
	_, err := m.clients["east"].SetExports(ctxT(t), &apiv1.SetExportsRequest{Exports: []*apiv1.ServiceExport{svc("db", 5432), other}})
	wantCode(t, err, codes.PermissionDenied, "exports[1]", "agent east/gw1 may export only as its own cluster and node east/gw1, not as west/gw1")

	otherNode := svc("web", 80)
	otherNode.Node = "gw2"
	_, err = m.clients["east"].SetExports(ctxT(t), &apiv1.SetExportsRequest{Exports: []*apiv1.ServiceExport{otherNode}})
	wantCode(t, err, codes.PermissionDenied, "not as east/gw2")

	bad := svc("Web_1", 80)
	_, err = m.clients["east"].SetExports(ctxT(t), &apiv1.SetExportsRequest{Exports: []*apiv1.ServiceExport{bad}})
	wantCode(t, err, codes.InvalidArgument, `exports[0].name: name "Web_1" is not a DNS label`)

	if got := m.services(); len(got.Exports) != 0 || len(got.Imports) != 0 || got.Revision != before {
		t.Fatalf("refused requests stored %d exports, revision %d -> %d", len(got.Exports), before, got.Revision)
	}
	// The cluster and node come from the certificate: an export that leaves them out is the caller's.
	resp := m.set("east", svc("web", 80))
	if len(resp.Exports) != 1 || resp.Exports[0].Cluster != "east" || resp.Exports[0].Node != "gw1" || resp.Exports[0].Labels[mcs.LabelExported] != "true" {
		t.Fatalf("stored %v: want east/gw1's, defaulted", resp.Exports)
	}
	// The admin credential is not an agent's.
	_, err = apiv1.NewAgentClient(dialAdmin(t, m.dir, m.addr)).SetExports(ctxT(t), &apiv1.SetExportsRequest{})
	wantCode(t, err, codes.PermissionDenied, "is for agents")
}

func TestExportsMergeAndTheirConflictsShowInListServices(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west", "north")
	m.set("east", svc("web", 80))
	m.clock.Advance(time.Second)
	// Same port name, another number: west's export loses to east's, which is older.
	west := svc("web", 8080)
	west.Ports[0].Name = "p80"
	resp := m.set("west", west)
	if len(resp.Conflicts) != 1 || resp.Conflicts[0].Cluster != "west" || resp.Conflicts[0].Field != "ports" ||
		resp.Conflicts[0].Message != `shop/web: port "p80" is 8080/TCP, but 80/TCP in an older export` {
		t.Fatalf("west's conflicts %v", resp.Conflicts)
	}
	m.clock.Advance(time.Second)
	// A compatible export adds its ports to the union; a headless one conflicts on type.
	if resp := m.set("north", svc("web", 80, 443)); len(resp.Conflicts) != 0 {
		t.Fatalf("north's compatible export conflicts: %v", resp.Conflicts)
	}
	if resp := m.set("east", svc("web", 80)); len(resp.Conflicts) != 0 {
		t.Fatalf("east, the oldest, has conflicts: %v", resp.Conflicts)
	}

	got := m.services()
	if want := "shop/web[east,north] 241.0.0.1 80,443 conflict(west ports)"; listText(got) != want {
		t.Fatalf("ListServices: %s\nwant %s", listText(got), want)
	}
	var exporters []string
	for _, e := range got.Exports {
		exporters = append(exporters, store.ServiceExportKey(e.Cluster, e.Node, e.Namespace, e.Name))
	}
	if want := []string{"east/gw1/shop/web", "north/gw1/shop/web", "west/gw1/shop/web"}; !slices.Equal(exporters, want) {
		t.Fatalf("exports %v, want %v", exporters, want)
	}
	if got.Revision == 0 {
		t.Fatal("no revision")
	}
}

func TestAServiceVIPIsStableAcrossResendsSecondNodesAndRestarts(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	m := newSvcMesh(t, dir, brokerOpts{durable: true, clock: clk}, "east")
	first := m.set("east", svc("web", 80))
	created := first.Exports[0].Created.AsTime()
	if v := m.services().Imports[0].Vips; !slices.Equal(v, []string{"241.0.0.1"}) {
		t.Fatalf("VIPs %v, want the first of the default range", v)
	}
	// The same exports again: nothing is written.
	clk.Advance(time.Minute)
	again := m.set("east", svc("web", 80))
	if again.Revision != first.Revision || again.Exports[0].Revision != first.Exports[0].Revision || !again.Exports[0].Created.AsTime().Equal(created) {
		t.Fatalf("re-sent exports: revision %d -> %d, export revision %d -> %d", first.Revision, again.Revision, first.Exports[0].Revision, again.Exports[0].Revision)
	}
	// A second node of the cluster exporting the same service shares the VIP.
	m.join("east", "gw2")
	setExports(t, m.agents["east/gw2"].client(t, m.addr), m.local("east", svc("web", 80))...)
	if got := listText(m.services()); got != "shop/web[east] 241.0.0.1 80" {
		t.Fatalf("after a second node: %s", got)
	}
	// A changed export keeps its first export time.
	clk.Advance(time.Minute)
	changed := m.set("east", svc("web", 80, 81))
	if changed.Revision == first.Revision || !changed.Exports[0].Created.AsTime().Equal(created) {
		t.Fatalf("changed export: revision %d, created %v; want a new revision and created %v", changed.Revision, changed.Exports[0].Created.AsTime(), created)
	}

	// A restart keeps it, and an agent that reconnects and sends the same exports changes nothing.
	rev := m.services().Revision
	addr := m.addr
	m.stop()
	b2 := startBroker(t, dir, brokerOpts{addr: addr, durable: true, clock: clk})
	m2 := &svcMesh{testBroker: b2, clients: map[string]apiv1.AgentClient{"east": m.agents["east"].client(t, b2.addr)}, octet: m.octet}
	if got := listText(m2.services()); got != "shop/web[east] 241.0.0.1 80,81" {
		t.Fatalf("after a restart: %s", got)
	}
	if resp := m2.set("east", svc("web", 80, 81)); resp.Revision != rev {
		t.Fatalf("re-sent after a restart: revision %d, want %d unchanged", resp.Revision, rev)
	}
}

func TestAVIPIsReleasedWithTheLastExportAndTheLowestFreeIsNext(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west")
	m.set("east", svc("db", 5432), svc("web", 80)) // key order: shop/db, then shop/web
	m.set("west", svc("web", 80))
	if got := listText(m.services()); got != "shop/db[east] 241.0.0.1 5432; shop/web[east,west] 241.0.0.2 80" {
		t.Fatalf("before: %s", got)
	}
	m.set("east", svc("db", 5432))
	if got := listText(m.services()); got != "shop/db[east] 241.0.0.1 5432; shop/web[west] 241.0.0.2 80" {
		t.Fatalf("east withdrew web, which west still exports: %s", got)
	}
	m.set("west")
	if got := listText(m.services()); got != "shop/db[east] 241.0.0.1 5432" {
		t.Fatalf("the last export of web is gone: %s", got)
	}
	m.set("east", svc("db", 5432), svc("api", 8080))
	if got := listText(m.services()); got != "shop/api[east] 241.0.0.2 8080; shop/db[east] 241.0.0.1 5432" {
		t.Fatalf("a new service takes the lowest free VIP, the one web had: %s", got)
	}
}

func TestAFullVIPRangeRefusesTheExportAndStoresNothing(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{vipRanges: []netip.Prefix{netip.MustParsePrefix("241.0.0.0/30")}}, "east")
	m.set("east", svc("a", 80), svc("b", 80))
	before := m.services()
	_, err := m.clients["east"].SetExports(ctxT(t), &apiv1.SetExportsRequest{Exports: []*apiv1.ServiceExport{svc("a", 80), svc("b", 80), svc("c", 80)}})
	wantCode(t, err, codes.ResourceExhausted, "cannot allocate a VIP for service shop/c", "241.0.0.0/30 is exhausted")
	if after := m.services(); after.Revision != before.Revision || len(after.Exports) != 2 {
		t.Fatalf("a refused export changed the store: revision %d -> %d, %d exports", before.Revision, after.Revision, len(after.Exports))
	}
}

func TestAVIPOutsideAChangedRangeIsKeptAndANewFamilyIsAdded(t *testing.T) {
	dir := t.TempDir()
	m := newSvcMesh(t, dir, brokerOpts{durable: true}, "east")
	m.set("east", svc("web", 80))
	addr := m.addr
	m.stop()

	logs := &syncbuf.Buffer{}
	ranges := []netip.Prefix{netip.MustParsePrefix("242.0.0.0/16"), netip.MustParsePrefix("fd00:241::/112")}
	// The VIP range moves onto the default mesh address range, which moves out of its way.
	b2 := startBroker(t, dir, brokerOpts{addr: addr, durable: true, vipRanges: ranges, logTo: logs, meshRange: netip.MustParsePrefix("243.0.0.0/16")})
	m2 := &svcMesh{testBroker: b2, clients: map[string]apiv1.AgentClient{"east": m.agents["east"].client(t, b2.addr)}, octet: m.octet}
	if got := listText(m2.services()); got != "shop/web[east] 241.0.0.1,fd00:241::1 80" {
		t.Fatalf("after the range changed: %s; want the old IPv4 VIP kept and an IPv6 one added", got)
	}
	if !strings.Contains(logs.String(), "service VIP lies outside --service-vip-range") || !strings.Contains(logs.String(), "vip=241.0.0.1") {
		t.Fatalf("no warning about the VIP outside the range; log:\n%s", logs)
	}
	m2.set("east", svc("web", 80), svc("api", 80))
	if got := listText(m2.services()); got != "shop/api[east] 242.0.0.1,fd00:241::2 80; shop/web[east] 241.0.0.1,fd00:241::1 80" {
		t.Fatalf("a new service after the range changed: %s", got)
	}
}

func TestRemovingAClusterDropsItsExportsAndFreesItsVIPs(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west")
	m.set("east", svc("web", 80))
	m.set("west", svc("web", 80), svc("db", 5432))
	w := m.watch("east", wantImports(0))
	if got := importsText(recv(t, w).Imports); got != "shop/db[west] 241.0.0.2 5432; shop/web[east,west] 241.0.0.1 80" {
		t.Fatalf("east's first imports: %s", got)
	}
	if _, err := m.admin.RemoveCluster(ctxT(t), &apiv1.RemoveClusterRequest{Name: "west"}); err != nil {
		t.Fatal(err)
	}
	msg := recv(t, w)
	if importsText(msg.Imports) != "shop/web[east] 241.0.0.1 80" || !strings.Contains(keys(msg.Events), "DELETE:cluster:west") ||
		strings.Contains(keys(msg.Events), "service") {
		t.Fatalf("after west's removal east got %s with imports %s", keys(msg.Events), importsText(msg.Imports))
	}
	if got := listText(m.services()); got != "shop/web[east] 241.0.0.1 80" {
		t.Fatalf("after west's removal: %s", got)
	}
	m.set("east", svc("web", 80), svc("api", 80))
	if got := listText(m.services()); got != "shop/api[east] 241.0.0.2 80; shop/web[east] 241.0.0.1 80" {
		t.Fatalf("db's VIP was not freed: %s", got)
	}
}

func TestEndpointLeaseExpiryKeepsTheExports(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east")
	if _, err := m.clients["east"].RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1"), LeaseSeconds: 1}); err != nil {
		t.Fatal(err)
	}
	m.set("east", svc("web", 80))
	m.clock.Advance(time.Minute)
	m.reap()
	if got := m.list(); len(got.Endpoints) != 0 {
		t.Fatal("the endpoint was not reaped")
	}
	if got := listText(m.services()); got != "shop/web[east] 241.0.0.1 80" {
		t.Fatalf("after the lease expired: %s", got)
	}
}

func TestAWatchSeesTheImportsOfItsOwnAndConnectedClustersAdmittedByItsSelector(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west", "north")
	m.apply(`
kind: ClusterConnectionPolicy
metadata: {name: east-north-apart}
spec:
  leftClusterSelector: {site: east}
  rightClusterSelector: {site: north}
  connectionPolicy: no-connect
  priority: 5
`)
	m.set("east", svc("web", 80))
	prod := svc("web", 80)
	prod.Labels = map[string]string{"env": "prod"}
	m.set("west", prod, svc("db", 5432))
	m.set("north", svc("web", 80), svc("cache", 6379))
	hidden := svc("db", 5432)
	hidden.Labels = map[string]string{mcs.LabelExported: "false"}
	m.join("west", "gw2")
	setExports(t, m.agents["west/gw2"].client(t, m.addr), m.local("west", hidden)...)

	tests := []struct {
		name, cluster, selector, want string
	}{
		{"the default selector: own and connected clusters, not north", "east", mcs.DefaultImportSelector,
			"shop/db[west] 241.0.0.2 5432; shop/web[east,west] 241.0.0.1 80"},
		{"north sees only itself and west", "north", mcs.DefaultImportSelector,
			"shop/cache[north] 241.0.0.3 6379; shop/db[west] 241.0.0.2 5432; shop/web[north,west] 241.0.0.1 80"},
		{"a selector on the exports' labels", "east", "env=prod", "shop/web[west] 241.0.0.1 80"},
		{"a selector that admits what is not exported=true", "east", mcs.LabelExported + "=false", ""},
		{"an empty selector imports nothing", "east", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := m.watch(tt.cluster, &apiv1.WatchRequest{WantImports: true, ImportSelector: tt.selector})
			msg := recv(t, w)
			if msg.Imports == nil || importsText(msg.Imports) != tt.want {
				t.Fatalf("imports %s, want %s", importsText(msg.Imports), tt.want)
			}
			for _, ev := range msg.Events {
				if ev.Kind == store.KindServiceExport || ev.Kind == store.KindServiceVIP {
					t.Fatalf("the snapshot carries %s:%s", ev.Kind, ev.Key)
				}
			}
		})
	}
	// west/gw2's export, labelled exported=false, is its cluster's second node's: the cluster's
	// oldest node export (gw1's) gives the labels, so west's db is still imported by default.
	// An export whose only node says exported=false is hidden:
	m.set("west", prod)
	msg := recv(t, m.watch("east", wantImports(0)))
	if got := importsText(msg.Imports); got != "shop/web[east,west] 241.0.0.1 80" {
		t.Fatalf("with west's db exported=false only: %s", got)
	}
}

func TestAPolicyChangeMovesAnotherClustersPartOutOfTheImportsAndBack(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west")
	m.set("east", svc("web", 80))
	m.set("west", svc("web", 80))
	w := m.watch("east", wantImports(0))
	if got := importsText(recv(t, w).Imports); got != "shop/web[east,west] 241.0.0.1 80" {
		t.Fatalf("first: %s", got)
	}
	m.apply(`
kind: ClusterConnectionPolicy
metadata: {name: apart}
spec:
  leftClusterSelector: {site: east}
  rightClusterSelector: {site: west}
  connectionPolicy: no-connect
  priority: 5
`)
	msg := recv(t, w)
	if !strings.HasPrefix(keys(msg.Events), "UPSERT:policy:apart") || importsText(msg.Imports) != "shop/web[east] 241.0.0.1 80" {
		t.Fatalf("after no-connect: %s, imports %s", keys(msg.Events), importsText(msg.Imports))
	}
	if _, err := m.admin.DeletePolicies(ctxT(t), &apiv1.DeletePoliciesRequest{Names: []string{"apart"}}); err != nil {
		t.Fatal(err)
	}
	msg = recv(t, w)
	if !strings.HasPrefix(keys(msg.Events), "DELETE:policy:apart") || importsText(msg.Imports) != "shop/web[east,west] 241.0.0.1 80" {
		t.Fatalf("after the policy went: %s, imports %s", keys(msg.Events), importsText(msg.Imports))
	}
	// A relabelled cluster is re-resolved too: west leaves the default policy's reach via a
	// policy on a label it gets later.
	m.apply(`
kind: ClusterConnectionPolicy
metadata: {name: quarantine}
spec:
  leftClusterSelector: {quarantine: "yes"}
  rightClusterSelector: {}
  connectionPolicy: no-connect
  priority: 5
`)
	if msg := recv(t, w); msg.Imports != nil {
		t.Fatalf("a policy that covers no pair yet re-sent unchanged imports: %s", importsText(msg.Imports))
	}
	if _, err := m.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "west", Set: map[string]string{"quarantine": "yes"}}); err != nil {
		t.Fatal(err)
	}
	if msg := recv(t, w); importsText(msg.Imports) != "shop/web[east] 241.0.0.1 80" {
		t.Fatalf("after west was labelled into a no-connect policy: %s", importsText(msg.Imports))
	}
}

func TestImportsAreSentOnlyWhenTheyChange(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east", "west", "north")
	m.apply(`
kind: ClusterConnectionPolicy
metadata: {name: east-north-apart}
spec:
  leftClusterSelector: {site: east}
  rightClusterSelector: {site: north}
  connectionPolicy: no-connect
  priority: 5
`)
	m.set("west", svc("web", 80))
	w := m.watch("east", wantImports(0))
	if got := importsText(recv(t, w).Imports); got != "shop/web[west] 241.0.0.1 80" {
		t.Fatalf("first: %s", got)
	}
	// An endpoint is no service change: its event comes without imports.
	if _, err := m.clients["west"].RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("west", "gw1", "192.0.2.2")}); err != nil {
		t.Fatal(err)
	}
	if msg := recv(t, w); !strings.HasPrefix(keys(msg.Events), "UPSERT:endpoint:west/gw1") || msg.Imports != nil {
		t.Fatalf("endpoint change: %s with imports %s; want the endpoint only", keys(msg.Events), importsText(msg.Imports))
	}
	// A cluster label change that moves no pair re-sends nothing either.
	if _, err := m.admin.LabelCluster(ctxT(t), &apiv1.LabelClusterRequest{Name: "west", Set: map[string]string{"tier": "1"}}); err != nil {
		t.Fatal(err)
	}
	if msg := recv(t, w); !strings.HasPrefix(keys(msg.Events), "UPSERT:cluster:west") || msg.Imports != nil {
		t.Fatalf("label change: %s with imports %s", keys(msg.Events), importsText(msg.Imports))
	}
	// North's exports are not east's to see: no message at all, and re-sent exports write nothing.
	m.set("north", svc("cache", 6379))
	m.set("west", svc("web", 80))
	// The next message is the next change east sees: west's endpoint going not ready.
	notReady := svc("web", 80)
	notReady.Endpoints[0].Ready = false
	rev := m.set("west", notReady).Revision
	msg := recv(t, w)
	if msg.Revision != rev || len(msg.Events) != 0 || msg.Imports == nil || msg.Imports.Imports[0].Clusters[0].Endpoints[0].Ready {
		t.Fatalf("got %s at %d with imports %v; want only the imports with west's endpoint not ready, at %d", keys(msg.Events), msg.Revision, msg.Imports, rev)
	}
}

func TestAWatchWithoutWantImportsSeesNoServices(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east")
	m.set("east", svc("web", 80))
	w := m.watch("east", &apiv1.WatchRequest{ImportSelector: "ignored=(without want_imports"})
	snap := recv(t, w)
	if snap.Imports != nil || strings.Contains(keys(snap.Events), "service") {
		t.Fatalf("snapshot %s with imports %s", keys(snap.Events), importsText(snap.Imports))
	}
	m.set("east", svc("web", 80, 81))
	m.token("west", "10.2.0.0/16")
	if msg := recv(t, w); keys(msg.Events) != fmt.Sprintf("UPSERT:cluster:west@%d", msg.Revision) || msg.Imports != nil {
		t.Fatalf("got %s with imports %s; want the next non-service change only", keys(msg.Events), importsText(msg.Imports))
	}
}

func TestABadImportSelectorEndsTheWatch(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east")
	w := m.watch("east", &apiv1.WatchRequest{WantImports: true, ImportSelector: "env in (prod"})
	_, err := w.Recv()
	wantCode(t, err, codes.InvalidArgument, "import_selector", `"env in (prod"`)
}

func TestAResumedWatchGetsTheImportsOnItsFirstMessage(t *testing.T) {
	m := newSvcMesh(t, t.TempDir(), brokerOpts{}, "east")
	rev := m.set("east", svc("web", 80)).Revision
	m.token("west", "10.2.0.0/16")
	msg := recv(t, m.watch("east", wantImports(rev)))
	if msg.Snapshot || keys(msg.Events) != fmt.Sprintf("UPSERT:cluster:west@%d", rev+1) || importsText(msg.Imports) != "shop/web[east] 241.0.0.1 80" {
		t.Fatalf("resume: snapshot=%v %s imports %s", msg.Snapshot, keys(msg.Events), importsText(msg.Imports))
	}
	// Resuming at the current revision: no events, still the imports.
	msg = recv(t, m.watch("east", wantImports(msg.Revision)))
	if len(msg.Events) != 0 || importsText(msg.Imports) != "shop/web[east] 241.0.0.1 80" {
		t.Fatalf("resume at the current revision: %s imports %s", keys(msg.Events), importsText(msg.Imports))
	}
}

func TestStoreKeysAgreeWithMCS(t *testing.T) {
	if store.ServiceExportKey("a", "b", "c", "d") != mcs.ExportKey("a", "b", "c", "d") || store.ServiceVIPKey("c", "d") != mcs.Key("c", "d") {
		t.Fatal("store and mcs key services differently")
	}
}

// updateCounter is a store that counts its Updates.
type updateCounter struct {
	store.Store
	n atomic.Int64
}

func (u *updateCounter) Update(ctx context.Context, fn func(store.Tx) error) (store.Commit, error) {
	u.n.Add(1)
	return u.Store.Update(ctx, fn)
}

// Exports the broker has already (every agent sends its exports on every new stream) are
// answered from a read, with what a write would have answered: no write is queued for them.
func TestExportsTheBrokerHasAreAnsweredWithoutAWrite(t *testing.T) {
	var counter *updateCounter
	b := startBroker(t, t.TempDir(), brokerOpts{wrapStore: func(s store.Store) store.Store {
		counter = &updateCounter{Store: s}
		return counter
	}})
	ag := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	c := ag.client(t, b.addr)
	for _, exports := range [][]*apiv1.ServiceExport{nil, inPodCIDR(1, svc("db", 5432))} {
		first := setExports(t, c, exports...)
		before := counter.n.Load()
		again := setExports(t, c, exports...)
		if n := counter.n.Load() - before; n != 0 {
			t.Errorf("%d exports sent again: %d store writes, want none", len(exports), n)
		}
		if !proto.Equal(first, again) {
			t.Errorf("%d exports sent again: answered %v, want %v as the first time", len(exports), again, first)
		}
	}
	// A change is written.
	before := counter.n.Load()
	resp := setExports(t, c, inPodCIDR(1, svc("db", 5432), svc("web", 80))...)
	if n := counter.n.Load() - before; n != 1 || len(resp.Exports) != 2 {
		t.Errorf("a changed set: %d store writes and %d exports answered, want 1 and 2", n, len(resp.Exports))
	}
}
