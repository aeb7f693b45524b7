package mcsimport

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// importsBox is the broker's imports a test changes.
type importsBox struct {
	mu   sync.Mutex
	imps []*apiv1.ServiceImport
	ok   bool
}

func (b *importsBox) set(imps ...*apiv1.ServiceImport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.imps, b.ok = imps, true
}

func (b *importsBox) get() ([]*apiv1.ServiceImport, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.imps, b.ok
}

func webImport(vip string, clusters ...string) *apiv1.ServiceImport {
	imp := &apiv1.ServiceImport{Namespace: "shop", Name: "web", Type: "ClusterSetIP", Vips: []string{vip},
		Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}}}
	for i, c := range clusters {
		imp.Clusters = append(imp.Clusters, &apiv1.ImportedCluster{Cluster: c, ClusterId: uint32(i + 1),
			Ports:     []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP", TargetPort: 8080}},
			Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1" + string(rune('0'+i)) + ".0.5", Ready: true}}})
	}
	return imp
}

func newTestWriter(api API, box *importsBox) *Writer {
	return New(Deps{API: api, Identity: "gw-1", Namespace: "cablemesh", Imports: box.get, Log: quiet})
}

func TestReconcileCreatesUpdatesAndDeletesImports(t *testing.T) {
	ctx := context.Background()
	f := newFakeAPI("shop")
	box := &importsBox{}
	w := newTestWriter(f, box)

	box.set(webImport("240.0.0.10", "east", "north"))
	if err := w.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	si := f.imports["shop/web"]
	if si == nil {
		t.Fatalf("no ServiceImport shop/web; have %v", mapsKeys(f.imports))
	}
	if si.Spec.Type != mcsv1a1.ClusterSetIP || !slices.Equal(si.Spec.IPs, []string{"240.0.0.10"}) {
		t.Errorf("spec type %q ips %v, want ClusterSetIP [240.0.0.10]", si.Spec.Type, si.Spec.IPs)
	}
	if len(si.Spec.Ports) != 1 || si.Spec.Ports[0].Port != 80 || si.Spec.Ports[0].Protocol != "TCP" || si.Spec.Ports[0].Name != "http" {
		t.Errorf("ports %+v, want http 80/TCP", si.Spec.Ports)
	}
	if si.Spec.SessionAffinity != "None" {
		t.Errorf("sessionAffinity %q, want None", si.Spec.SessionAffinity)
	}
	if got := clusterNames(si); !slices.Equal(got, []string{"east", "north"}) {
		t.Errorf("status.clusters %v, want [east north]", got)
	}
	es := f.slices["shop/web-east"]
	if es == nil {
		t.Fatalf("no EndpointSlice shop/web-east; have %v", mapsKeys(f.slices))
	}
	wantLabels := map[string]string{ManagedByLabel: "cablemesh.io", ServiceNameLabel: "web", SourceClusterLabel: "east"}
	for k, v := range wantLabels {
		if es.Labels[k] != v {
			t.Errorf("EndpointSlice label %s=%q, want %q", k, es.Labels[k], v)
		}
	}
	if es.AddressType != discoveryv1.AddressTypeIPv4 || len(es.Endpoints) != 1 || es.Endpoints[0].Addresses[0] != "10.10.0.5" {
		t.Errorf("EndpointSlice %s endpoints %+v", es.AddressType, es.Endpoints)
	}
	if len(es.Ports) != 1 || *es.Ports[0].Port != 8080 {
		t.Errorf("EndpointSlice ports %+v, want the target port 8080", es.Ports)
	}
	if f.slices["shop/web-north"] == nil {
		t.Error("no EndpointSlice for the second source cluster")
	}

	// Nothing changed: no write.
	before := f.writes
	if err := w.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if f.writes != before {
		t.Errorf("an unchanged reconcile wrote %d times", f.writes-before)
	}

	// The VIP moves and north stops exporting.
	box.set(webImport("240.0.0.11", "east"))
	if err := w.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.imports["shop/web"].Spec.IPs; !slices.Equal(got, []string{"240.0.0.11"}) {
		t.Errorf("ips after the change %v, want [240.0.0.11]", got)
	}
	if got := clusterNames(f.imports["shop/web"]); !slices.Equal(got, []string{"east"}) {
		t.Errorf("status.clusters after north left %v, want [east]", got)
	}
	if f.slices["shop/web-north"] != nil {
		t.Error("north's EndpointSlice stayed after north stopped exporting")
	}

	// The import goes away.
	box.set()
	if err := w.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if len(f.imports) != 0 || len(f.slices) != 0 {
		t.Errorf("left after the import went: imports %v slices %v", mapsKeys(f.imports), mapsKeys(f.slices))
	}
}

func TestReconcileLeavesObjectsNotOursAlone(t *testing.T) {
	ctx := context.Background()
	f := newFakeAPI("shop")
	// Another controller's ServiceImport of the same name, and an unrelated EndpointSlice.
	f.imports["shop/web"] = &mcsv1a1.ServiceImport{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web", ResourceVersion: "1",
		Labels: map[string]string{ManagedByLabel: "lighthouse-agent.submariner.io"}}, Spec: mcsv1a1.ServiceImportSpec{IPs: []string{"10.96.0.1"}}}
	f.slices["shop/db-x"] = &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "db-x", ResourceVersion: "1",
		Labels: map[string]string{ServiceNameLabel: "db"}}, AddressType: discoveryv1.AddressTypeIPv4}
	box := &importsBox{}
	w := newTestWriter(f, box)
	box.set(webImport("240.0.0.10", "east"))
	if err := w.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.imports["shop/web"]; got.Labels[ManagedByLabel] != "lighthouse-agent.submariner.io" || !slices.Equal(got.Spec.IPs, []string{"10.96.0.1"}) {
		t.Errorf("the foreign ServiceImport was changed: labels %v ips %v", got.Labels, got.Spec.IPs)
	}
	if st := w.Status(); !slices.Contains(st.Foreign, "ServiceImport shop/web") {
		t.Errorf("status foreign %v, want the foreign ServiceImport named", st.Foreign)
	}
	box.set()
	if err := w.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if f.imports["shop/web"] == nil || f.slices["shop/db-x"] == nil {
		t.Error("a reconcile with no imports deleted objects that are not Cablemesh's")
	}
	if f.slices["shop/web-east"] != nil {
		t.Error("our EndpointSlice stayed after the import went")
	}
}

func TestHeadlessImportHasNoVIPAndCarriesTheRemoteEndpoints(t *testing.T) {
	f := newFakeAPI("shop")
	box := &importsBox{}
	w := newTestWriter(f, box)
	imp := &apiv1.ServiceImport{Namespace: "shop", Name: "db", Type: "Headless", Vips: []string{"240.0.0.9"},
		Ports: []*apiv1.ServicePort{{Name: "pg", Port: 5432, Protocol: "TCP"}},
		Clusters: []*apiv1.ImportedCluster{{Cluster: "east", Endpoints: []*apiv1.ServiceEndpoint{
			{Ip: "10.10.0.7", Hostname: "db-0", Ready: true}, {Ip: "fd00::7", Hostname: "db-1"}}}}}
	box.set(imp)
	if err := w.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	si := f.imports["shop/db"]
	if si == nil || si.Spec.Type != mcsv1a1.Headless || len(si.Spec.IPs) != 0 {
		t.Fatalf("headless ServiceImport %+v, want type Headless and no ips", si)
	}
	v4, v6 := f.slices["shop/db-east"], f.slices["shop/db-east-ipv6"]
	if v4 == nil || v6 == nil {
		t.Fatalf("want one EndpointSlice per family, have %v", mapsKeys(f.slices))
	}
	if *v4.Endpoints[0].Hostname != "db-0" || !*v4.Endpoints[0].Conditions.Ready {
		t.Errorf("IPv4 endpoint %+v, want hostname db-0, ready", v4.Endpoints[0])
	}
	if v6.AddressType != discoveryv1.AddressTypeIPv6 || *v6.Endpoints[0].Conditions.Ready {
		t.Errorf("IPv6 slice %s endpoint %+v, want IPv6, not ready", v6.AddressType, v6.Endpoints[0])
	}
	if *v4.Ports[0].Port != 5432 {
		t.Errorf("port %d, want the import's 5432 when the cluster lists none", *v4.Ports[0].Port)
	}
}

func TestImportsOfAMissingNamespaceAreSkipped(t *testing.T) {
	f := newFakeAPI("shop")
	box := &importsBox{}
	w := newTestWriter(f, box)
	other := webImport("240.0.0.12", "east")
	other.Namespace = "billing"
	box.set(webImport("240.0.0.10", "east"), other)
	if err := w.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.imports["billing/web"] != nil || f.slices["billing/web-east"] != nil {
		t.Error("an object was written in a namespace that does not exist")
	}
	if f.imports["shop/web"] == nil {
		t.Error("the import of the existing namespace was not written")
	}
	if got := w.Status().SkippedNamespaces; !slices.Equal(got, []string{"billing"}) {
		t.Errorf("status skipped namespaces %v, want [billing]", got)
	}
	// A missing namespace is no error; a missing CRD (NotFound of the resource) is one.
	if namespaceMissing(apierrors.NewNotFound(grSI, "web")) {
		t.Error("a NotFound of the ServiceImport resource was taken for a missing namespace")
	}
	// The namespace appears: the import is written.
	f.namespaces["billing"] = true
	if err := w.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.imports["billing/web"] == nil || len(w.Status().SkippedNamespaces) != 0 {
		t.Errorf("after billing was created: import %v, skipped %v", f.imports["billing/web"] != nil, w.Status().SkippedNamespaces)
	}
}

func TestNoImportsFromTheBrokerYetChangesNothing(t *testing.T) {
	f := newFakeAPI("shop")
	box := &importsBox{}
	w := newTestWriter(f, box)
	box.set(webImport("240.0.0.10", "east"))
	if err := w.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	box.mu.Lock()
	box.imps, box.ok = nil, false // as after a restart before the broker's first message
	box.mu.Unlock()
	if err := w.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.imports["shop/web"] == nil {
		t.Error("the writer deleted the imports before the broker sent any")
	}
}

// attributed records which writer made each object write.
type attributed struct {
	*fakeAPI
	name   string
	counts *sync.Map
}

func (a attributed) note() {
	v, _ := a.counts.LoadOrStore(a.name, new(int))
	a.fakeAPI.mu.Lock()
	*v.(*int)++
	a.fakeAPI.mu.Unlock()
}

func (a attributed) CreateServiceImport(ctx context.Context, si *mcsv1a1.ServiceImport) (*mcsv1a1.ServiceImport, error) {
	a.note()
	return a.fakeAPI.CreateServiceImport(ctx, si)
}

func (a attributed) CreateEndpointSlice(ctx context.Context, es *discoveryv1.EndpointSlice) error {
	a.note()
	return a.fakeAPI.CreateEndpointSlice(ctx, es)
}

func (a attributed) UpdateServiceImportStatus(ctx context.Context, si *mcsv1a1.ServiceImport) error {
	a.note()
	return a.fakeAPI.UpdateServiceImportStatus(ctx, si)
}

func TestOnlyTheLeaseHolderWrites(t *testing.T) {
	f := newFakeAPI("shop")
	box := &importsBox{}
	box.set(webImport("240.0.0.10", "east"))
	counts := &sync.Map{}
	first := New(Deps{API: attributed{f, "gw-1", counts}, Identity: "gw-1", Namespace: "cablemesh", Imports: box.get, Log: quiet})
	second := New(Deps{API: attributed{f, "gw-2", counts}, Identity: "gw-2", Namespace: "cablemesh", Imports: box.get, Log: quiet})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { first.Run(ctx) })
	waitFor(t, func() bool { return f.holder() == "gw-1" })
	wg.Go(func() { second.Run(ctx) })
	second.Trigger()
	waitFor(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.imports["shop/web"] != nil && f.slices["shop/web-east"] != nil
	})
	// The imports change and only the second gateway hears of it: it must not write them.
	box.set(webImport("240.0.0.11", "east"))
	second.Trigger()
	time.Sleep(200 * time.Millisecond)
	f.mu.Lock()
	ips := f.imports["shop/web"].Spec.IPs
	f.mu.Unlock()
	if !slices.Equal(ips, []string{"240.0.0.10"}) {
		t.Errorf("ips %v after only the gateway without the lease was triggered, want the old [240.0.0.10]", ips)
	}
	if v, ok := counts.Load("gw-2"); ok && *v.(*int) > 0 {
		t.Errorf("the gateway without the lease wrote %d objects", *v.(*int))
	}
	if v, ok := counts.Load("gw-1"); !ok || *v.(*int) == 0 {
		t.Error("the lease holder wrote nothing")
	}
	first.Trigger()
	waitFor(t, func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Equal(f.imports["shop/web"].Spec.IPs, []string{"240.0.0.11"})
	})
	if first.Status().Leader == second.Status().Leader {
		t.Errorf("leaders: gw-1 %v gw-2 %v, want exactly one", first.Status().Leader, second.Status().Leader)
	}
}

// fakeClock is a clock a test moves.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestLeaseIsTakenOverAfterItExpires(t *testing.T) {
	f := newFakeAPI("cablemesh")
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := &election{api: f, namespace: "cablemesh", identity: "gw-1", now: clk.now}
	b := &election{api: f, namespace: "cablemesh", identity: "gw-2", now: clk.now}

	mustLead(t, a, true)
	mustLead(t, b, false)
	clk.add(RenewInterval)
	mustLead(t, a, true) // renewed at +5s: valid to +20s
	clk.add(12 * time.Second)
	mustLead(t, b, false) // +17s: gw-1's renewal still holds
	if f.holder() != "gw-1" {
		t.Fatalf("holder %q, want gw-1", f.holder())
	}
	// gw-1 stops renewing (it died); at +20s its lease has expired.
	clk.add(3 * time.Second)
	if a.leading() {
		t.Error("gw-1 still believes it leads after its lease expired unrenewed")
	}
	mustLead(t, b, true)
	if f.holder() != "gw-2" {
		t.Fatalf("holder %q after takeover, want gw-2", f.holder())
	}
	l := f.leases["cablemesh/"+LeaseName]
	if l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions != 1 || *l.Spec.LeaseDurationSeconds != 15 {
		t.Errorf("lease transitions %v duration %v, want 1 and 15", l.Spec.LeaseTransitions, *l.Spec.LeaseDurationSeconds)
	}
	// gw-1 comes back: gw-2 holds a live lease.
	mustLead(t, a, false)
}

func TestLeaseConflictEndsTheHold(t *testing.T) {
	ctx := context.Background()
	f := newFakeAPI("cablemesh")
	clk := &fakeClock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	a := &election{api: f, namespace: "cablemesh", identity: "gw-1", now: clk.now}
	mustLead(t, a, true)
	// Someone else wrote the lease between our get and update: simulate by a racing update.
	racer := conflictingLease{fakeAPI: f}
	a.api = racer
	clk.add(RenewInterval)
	got, err := a.tryAcquireOrRenew(ctx)
	if err != nil || got {
		t.Errorf("after a conflicting write: leading %v err %v, want false, nil", got, err)
	}
	if a.leading() {
		t.Error("still leading after losing the race for the lease")
	}
}

// conflictingLease bumps the lease's resource version before every update, as a racing writer.
type conflictingLease struct{ *fakeAPI }

func (c conflictingLease) UpdateLease(ctx context.Context, l *coordinationv1.Lease) (*coordinationv1.Lease, error) {
	c.fakeAPI.mu.Lock()
	c.fakeAPI.leases[key(l.Namespace, l.Name)].ResourceVersion = c.fakeAPI.nextRV()
	c.fakeAPI.mu.Unlock()
	return c.fakeAPI.UpdateLease(ctx, l)
}

func mustLead(t *testing.T, e *election, want bool) {
	t.Helper()
	got, err := e.tryAcquireOrRenew(context.Background())
	if err != nil {
		t.Fatalf("%s: %v", e.identity, err)
	}
	if got != want {
		t.Fatalf("%s leads %v, want %v", e.identity, got, want)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func clusterNames(si *mcsv1a1.ServiceImport) []string {
	var out []string
	for _, c := range si.Status.Clusters {
		out = append(out, c.Cluster)
	}
	return out
}

func mapsKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// stateOf is a StateReader over st.
type stateOf struct{ st *brokerstate.State }

func (s stateOf) Read(f func(*brokerstate.State, *apiv1.Cluster)) { f(s.st, nil) }

func TestFollowReadsTheBrokerStateAndANilWriterIsInert(t *testing.T) {
	var none *Writer
	none.Follow(stateOf{brokerstate.New()})
	none.Trigger()
	none.Run(context.Background()) // returns at once

	f := newFakeAPI("shop")
	w := New(Deps{API: f, Identity: "gw-1", Namespace: "cablemesh", Log: quiet})
	st := brokerstate.New()
	w.Follow(stateOf{st})
	if err := w.Reconcile(context.Background()); err != nil || len(f.imports) != 0 {
		t.Fatalf("before the broker sent imports: err %v, imports %v", err, mapsKeys(f.imports))
	}
	st.Imports, st.HasImports = []*apiv1.ServiceImport{webImport("240.0.0.10", "east")}, true
	if err := w.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	if f.imports["shop/web"] == nil {
		t.Errorf("the broker state's import was not written; have %v", mapsKeys(f.imports))
	}
}
