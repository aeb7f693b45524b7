package broker

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/mcs"
	"github.com/cablemesh/cablemesh/policy"
)

func upsert(kind, key string, r *apiv1.Resource) *apiv1.Event {
	return &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: kind, Key: key, Resource: r}
}

func clusterEv(name string, id uint32, labels map[string]string) *apiv1.Event {
	return upsert(store.KindCluster, name, &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: &apiv1.Cluster{Name: name, Id: id, Labels: labels, PodCidrs: []string{"10.0.0.0/8"}}}})
}

func exportEv(t testing.TB, cluster, name string, created time.Time, port uint32, eps int) *apiv1.Event {
	e := &apiv1.ServiceExport{Cluster: cluster, Node: "gw1", Namespace: "shop", Name: name,
		Ports: []*apiv1.ServicePort{{Name: "http", Port: port}}}
	for i := range eps {
		e.Endpoints = append(e.Endpoints, &apiv1.ServiceEndpoint{Ip: fmt.Sprintf("10.%d.%d.%d", len(cluster), i/250, i%250+1), Ready: true})
	}
	if err := mcs.Normalize("e", e); err != nil {
		t.Fatal(err)
	}
	e.Created = timestamppb.New(created)
	return upsert(store.KindServiceExport, store.ServiceExportKey(cluster, "gw1", "shop", name), &apiv1.Resource{Kind: &apiv1.Resource_ServiceExport{ServiceExport: e}})
}

func vipEv(name, vip string) *apiv1.Event {
	return upsert(store.KindServiceVIP, "shop/"+name, &apiv1.Resource{Kind: &apiv1.Resource_ServiceVip{ServiceVip: &apiv1.ServiceVIP{Namespace: "shop", Name: name, Vips: []string{vip}}}})
}

func defaultPolicyEv(t testing.TB) *apiv1.Event {
	rec, _, err := admission.DefaultPolicy(policy.DefaultDriver)
	if err != nil {
		t.Fatal(err)
	}
	return upsert(store.KindPolicy, rec.Name, &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: rec}})
}

func policyEv(t testing.TB, y string) *apiv1.Event {
	ps, err := policy.DecodeYAML([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(&ps[0])
	if err != nil {
		t.Fatal(err)
	}
	return upsert(store.KindPolicy, ps[0].Metadata.Name, &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: &apiv1.Policy{Name: ps[0].Metadata.Name, Json: b}}})
}

func mustView(t testing.TB, s *importState, rev uint64) *importView {
	t.Helper()
	v, err := s.view(rev)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestImportStateMergesAgainOnlyWhatABatchTouched(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	s := newImportState()
	s.apply(store.Batch{Snapshot: true, Revision: 5, Events: []*apiv1.Event{
		defaultPolicyEv(t), clusterEv("east", 1, nil), clusterEv("west", 2, nil),
		exportEv(t, "east", "web", t0, 80, 1), exportEv(t, "west", "web", t0.Add(time.Second), 80, 1), exportEv(t, "east", "db", t0, 5432, 1),
		vipEv("web", "241.0.0.1"), vipEv("db", "241.0.0.2"),
	}})
	v1 := mustView(t, s, 5)
	if len(v1.imports) != 2 || importText(v1.imports[0]) != "shop/db[east] 241.0.0.2 5432" || importText(v1.imports[1]) != "shop/web[east,west] 241.0.0.1 80" {
		t.Fatalf("imports %v", v1.imports)
	}
	// An endpoint event changes nothing the imports derive from.
	if s.apply(store.Batch{Revision: 6, Events: []*apiv1.Event{upsert(store.KindEndpoint, "east/gw1", &apiv1.Resource{})}}) {
		t.Fatal("an endpoint event was taken for a change of the imports")
	}
	// West's web changes: web is merged again, db is not.
	if !s.apply(store.Batch{Revision: 7, Events: []*apiv1.Event{exportEv(t, "west", "web", t0.Add(time.Second), 8080, 1)}}) {
		t.Fatal("an export change was not taken for a change")
	}
	v2 := mustView(t, s, 7)
	if v2.imports[0] != v1.imports[0] {
		t.Error("db was merged again although only web changed")
	}
	if importText(v2.imports[1]) != "shop/web[east] 241.0.0.1 80" || len(v2.imports[1].Conflicts) != 1 {
		t.Errorf("web after west's change: %s conflicts %v", importText(v2.imports[1]), v2.imports[1].Conflicts)
	}
	if v1.imports[1] == v2.imports[1] || importText(v1.imports[1]) != "shop/web[east,west] 241.0.0.1 80" {
		t.Error("the older view changed: views must be immutable")
	}
	// A removed cluster leaves every import.
	s.apply(store.Batch{Revision: 8, Events: []*apiv1.Event{{Type: apiv1.Event_DELETE, Kind: store.KindCluster, Key: "east",
		Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: &apiv1.Cluster{Name: "east", Id: 1}}}}}})
	if v3 := mustView(t, s, 8); len(v3.imports) != 1 || importText(v3.imports[0]) != "shop/web[west] 241.0.0.1 8080" || len(v3.imports[0].Conflicts) != 0 {
		t.Fatalf("after east went: %v; want west's web alone, its conflict gone with east, and db gone", v3.imports)
	}
}

func TestImportViewTailorsPerClusterAndSelectorOnce(t *testing.T) {
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	s := newImportState()
	s.apply(store.Batch{Snapshot: true, Revision: 3, Events: []*apiv1.Event{
		defaultPolicyEv(t), clusterEv("east", 1, map[string]string{"site": "east"}), clusterEv("west", 2, map[string]string{"site": "west"}),
		clusterEv("north", 3, map[string]string{"site": "north"}),
		policyEv(t, "kind: ClusterConnectionPolicy\nmetadata: {name: apart}\nspec:\n  leftClusterSelector: {site: east}\n  rightClusterSelector: {site: north}\n  connectionPolicy: no-connect\n  priority: 5\n"),
		exportEv(t, "west", "web", t0, 80, 1), exportEv(t, "north", "web", t0, 80, 1), vipEv("web", "241.0.0.1"),
	}})
	v := mustView(t, s, 3)
	sel, _ := mcs.ParseImportSelector(mcs.DefaultImportSelector)
	a, b := v.importsFor("east", mcs.DefaultImportSelector, sel), v.importsFor("east", mcs.DefaultImportSelector, sel)
	if a != b {
		t.Fatal("the same cluster and selector were tailored twice")
	}
	if got := importsText(a.imports); got != "shop/web[west] 241.0.0.1 80" {
		t.Fatalf("east imports %s; want west's part only (north is not connected)", got)
	}
	n := v.importsFor("north", mcs.DefaultImportSelector, sel)
	if importsText(n.imports) != "shop/web[north,west] 241.0.0.1 80" || n.fingerprint == a.fingerprint {
		t.Fatalf("north imports %s (fingerprint equal to east's: %v)", importsText(n.imports), n.fingerprint == a.fingerprint)
	}
	none, _ := mcs.ParseImportSelector("")
	if e := v.importsFor("east", "", none); e.imports == nil || len(e.imports.Imports) != 0 || e.fingerprint == a.fingerprint {
		t.Fatalf("an empty selector: %v", e.imports)
	}
	// A view whose policies cannot be compiled connects no one: each cluster sees only itself.
	bad := &importView{imports: v.imports, services: v.services, pairs: &pairDecisions{labels: v.pairs.labels, connect: map[[2]string]bool{}}, labelSets: v.labelSets, tailored: map[string]*tailoredImports{}}
	if got := importsText(bad.importsFor("north", mcs.DefaultImportSelector, sel).imports); got != "shop/web[north] 241.0.0.1 80" {
		t.Fatalf("without a resolver north sees %s", got)
	}
}

func TestImportTrackerHandsOutTheViewAtOrBeforeARevision(t *testing.T) {
	tr := newImportTracker(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	ctx := t.Context()
	got := make(chan *importView, 1)
	go func() {
		v, err := tr.at(ctx, 12)
		if err != nil {
			t.Error(err)
		}
		got <- v
	}()
	v10 := &importView{rev: 10}
	tr.publish(10, v10)
	tr.publish(11, nil)
	select {
	case v := <-got:
		t.Fatalf("got view %d before revision 12 was applied", v.rev)
	case <-time.After(20 * time.Millisecond):
	}
	v13 := &importView{rev: 13}
	tr.publish(13, v13)
	if v := <-got; v != v10 {
		t.Fatalf("at 12: view %d, want 10 (the newest at or before 12)", v.rev)
	}
	if v, _ := tr.at(ctx, 13); v != v13 {
		t.Fatalf("at 13: view %d", v.rev)
	}
	// Older views than it keeps: the oldest kept, which is newer.
	for r := uint64(14); r < 14+maxImportViews; r++ {
		tr.publish(r, &importView{rev: r})
	}
	if v, _ := tr.at(ctx, 12); v.rev != 14 {
		t.Fatalf("at 12 after pruning: view %d, want 14, the oldest kept", v.rev)
	}
	tr.stop(context.Canceled)
	if _, err := tr.at(ctx, 99); err == nil {
		t.Fatal("a stopped tracker handed out a view")
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	tr2 := newImportTracker(slog.New(slog.NewTextHandler(io.Discard, nil)), nil)
	if _, err := tr2.at(cctx, 1); err == nil {
		t.Fatal("at waited past its context")
	}
}

func TestImportStateTakesTheServiceOfAnExportFromItsKey(t *testing.T) {
	for key, want := range map[string]string{"east/gw1/shop/web": "shop/web", "east/node.with-dots/shop/web": "shop/web", "web": "", "shop/web": ""} {
		got, ok := serviceOfExportKey(key)
		if got != want || ok != (want != "") {
			t.Errorf("serviceOfExportKey(%q) = %q, %v; want %q", key, got, ok, want)
		}
	}
	// A DELETE that comes without its last value still removes the export.
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	s := newImportState()
	s.apply(store.Batch{Snapshot: true, Revision: 1, Events: []*apiv1.Event{defaultPolicyEv(t), clusterEv("east", 1, nil), exportEv(t, "east", "web", t0, 80, 1)}})
	if v := mustView(t, s, 1); len(v.imports) != 1 {
		t.Fatalf("imports %v", v.imports)
	}
	s.apply(store.Batch{Revision: 2, Events: []*apiv1.Event{{Type: apiv1.Event_DELETE, Kind: store.KindServiceExport, Key: "east/gw1/shop/web"}}})
	if v := mustView(t, s, 2); len(v.imports) != 0 {
		t.Fatalf("after a bare DELETE of the only export: %v", v.imports)
	}
}
