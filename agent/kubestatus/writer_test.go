package kubestatus

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/clusterpolicy"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/policy"
)

// fakeView is the agent as the writer reads it; tests change its fields between passes.
type fakeView struct {
	status statusapi.Status
	plan   *plan.Plan
}

func (v *fakeView) Status(context.Context) statusapi.Status { return v.status }
func (v *fakeView) Plan() *plan.Plan                        { return v.plan }

// clock is a settable time.
type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                   { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }
func rtt(p50, p95, p99 float64) *statusapi.RTT {
	return &statusapi.RTT{P50Ms: p50, P95Ms: p95, P99Ms: p99}
}

// fixture is a writer for cluster east, node east-gw, over a fake dynamic API.
type fixture struct {
	client *dynamicfake.FakeDynamicClient
	view   *fakeView
	clock  *clock
	leader atomic.Bool
	w      *Writer
}

func newFixture(t *testing.T, objs ...runtime.Object) *fixture {
	t.Helper()
	f := &fixture{
		client: dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{
			ClusterLinkGVR: "ClusterLinkList", clusterpolicy.GVR: "ClusterConnectionPolicyList"}, objs...),
		clock: newClock(),
	}
	f.view = &fakeView{status: statusapi.Status{Cluster: "east", Node: "east-gw", Gateway: true, Services: &statusapi.Services{}},
		plan: testPlan(t, nil, reconcile.PairDecision{Cluster: "west", Connect: true, Driver: "wireguard", Policy: "default", Mode: "gateway"})}
	f.leader.Store(true)
	f.w = New(Deps{API: NewAPI(f.client), Cluster: "east", Node: "east-gw", Leader: f.leader.Load, Now: f.clock.now,
		Log: slog.New(slog.DiscardHandler)})
	f.w.Follow(f.view)
	return f
}

// testPlan is a plan of clusters east and west whose broker holds policies, with decisions.
func testPlan(t *testing.T, policies []policy.ClusterConnectionPolicy, decisions ...reconcile.PairDecision) *plan.Plan {
	t.Helper()
	st := brokerstate.New()
	st.Clusters["east"] = &apiv1.Cluster{Name: "east", Labels: map[string]string{"site": "east"}}
	st.Clusters["west"] = &apiv1.Cluster{Name: "west", Labels: map[string]string{"site": "west"}}
	def := policy.DefaultPolicy("wireguard")
	b, err := json.Marshal(def)
	if err != nil {
		t.Fatal(err)
	}
	st.Policies[def.Metadata.Name] = &apiv1.Policy{Name: def.Metadata.Name, Json: b, IsDefault: true}
	for _, p := range policies {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		st.Policies[p.Metadata.Name] = &apiv1.Policy{Name: p.Metadata.Name, Json: b}
	}
	res, problems := reconcile.Resolver(st)
	if len(problems) > 0 {
		t.Fatalf("resolver: %+v", problems)
	}
	return &plan.Plan{State: st, Resolver: res, Decisions: decisions}
}

func (f *fixture) pass(t *testing.T) {
	t.Helper()
	if err := f.w.Pass(context.Background()); err != nil {
		t.Fatalf("pass: %v", err)
	}
}

// link is the ClusterLink name's status, nil when there is none.
func (f *fixture) link(t *testing.T, name string) *LinkStatus {
	t.Helper()
	u, err := f.client.Resource(ClusterLinkGVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		if strings.Contains(err.Error(), "not found") {
			return nil
		}
		t.Fatal(err)
	}
	ls, err := linkStatusOf(u)
	if err != nil {
		t.Fatal(err)
	}
	return &ls
}

// writes counts the create, update and delete actions on resource so far.
func (f *fixture) writes(resource string) int {
	n := 0
	for _, a := range f.client.Actions() {
		switch a.GetVerb() {
		case "create", "update", "delete":
			if a.GetResource().Resource == resource {
				n++
			}
		}
	}
	return n
}

func connected(cluster string, r *statusapi.RTT) statusapi.Connection {
	return statusapi.Connection{Cluster: cluster, Driver: "wireguard", Policy: "default", State: "connected", RTT: r,
		Health: &statusapi.Health{Probing: true, Healthy: true, Samples: 10}}
}

func TestOnlyTheLeaderWrites(t *testing.T) {
	f := newFixture(t)
	f.view.status.Connections = []statusapi.Connection{connected("west", rtt(0.5, 0.9, 1.2))}
	f.leader.Store(false)
	f.pass(t)
	if n := len(f.client.Actions()); n != 0 {
		t.Fatalf("a node that does not lead made %d API calls: %v", n, f.client.Actions())
	}
	f.leader.Store(true)
	f.pass(t)
	ls := f.link(t, "west")
	want := LinkStatus{Connect: true, Policy: "default", Mode: "gateway", Driver: "wireguard", State: "connected", Alive: true,
		LatencyP50: "0.50ms", LatencyP95: "0.90ms", LatencyP99: "1.20ms", Gateway: "east-gw"}
	if ls == nil || *ls != want {
		t.Fatalf("ClusterLink west: %+v, want %+v", ls, want)
	}
	// Losing the lease stops the writes, whatever changes.
	f.leader.Store(false)
	f.view.status.Connections[0].State = "error"
	f.clock.advance(time.Minute)
	before := len(f.client.Actions())
	f.pass(t)
	if n := len(f.client.Actions()) - before; n != 0 {
		t.Fatalf("after losing the lease: %d API calls", n)
	}
}

func TestClusterLinksFollowTheRemoteClusters(t *testing.T) {
	f := newFixture(t)
	f.view.status.Connections = []statusapi.Connection{connected("west", rtt(0.5, 0.9, 1.2))}
	f.view.status.Services.Imports = []statusapi.ServiceImport{
		{Namespace: "demo", Name: "web", Clusters: []statusapi.ImportedCluster{{Cluster: "west"}}},
		{Namespace: "demo", Name: "db", Clusters: []statusapi.ImportedCluster{{Cluster: "west"}, {Cluster: "east", Local: true}}},
	}
	f.pass(t)
	if ls := f.link(t, "west"); ls == nil || ls.Services != 2 {
		t.Fatalf("ClusterLink west: %+v, want 2 services", ls)
	}

	// A new cluster the policies keep apart: its ClusterLink says so.
	f.view.plan = testPlan(t, nil, reconcile.PairDecision{Cluster: "west", Connect: true, Driver: "wireguard", Policy: "default", Mode: "gateway"},
		reconcile.PairDecision{Cluster: "north", Connect: false, Policy: "apart"})
	f.clock.advance(DefaultMinInterval)
	f.pass(t)
	if ls := f.link(t, "north"); ls == nil || ls.State != StateNotConnected || ls.Connect || ls.Policy != "apart" {
		t.Fatalf("ClusterLink north: %+v", ls)
	}

	// The link goes down: updated once the interval allows.
	f.view.status.Connections[0].State = "error"
	f.view.status.Connections[0].Message = "handshake timed out"
	f.clock.advance(DefaultMinInterval)
	f.pass(t)
	if ls := f.link(t, "west"); ls == nil || ls.State != "error" || ls.Alive || ls.Message != "handshake timed out" {
		t.Fatalf("ClusterLink west after the link went down: %+v", ls)
	}

	// west leaves the mesh: its ClusterLink goes; one not ours stays.
	foreign := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "cablemesh.io/v1alpha1", "kind": ClusterLinkKind,
		"metadata": map[string]any{"name": "hand-made"}}}
	if _, err := f.client.Resource(ClusterLinkGVR).Create(context.Background(), foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.view.plan = testPlan(t, nil, reconcile.PairDecision{Cluster: "north", Connect: false, Policy: "apart"})
	f.view.status.Connections = nil
	f.clock.advance(DefaultResync) // lists again
	f.pass(t)
	if ls := f.link(t, "west"); ls != nil {
		t.Fatalf("ClusterLink west still there: %+v", ls)
	}
	if _, err := f.client.Resource(ClusterLinkGVR).Get(context.Background(), "hand-made", metav1.GetOptions{}); err != nil {
		t.Fatalf("a ClusterLink not labelled as ours was touched: %v", err)
	}
}

func TestAFlappingLinkIsWrittenAtMostOncePerInterval(t *testing.T) {
	f := newFixture(t)
	f.view.status.Connections = []statusapi.Connection{connected("west", nil)}
	f.pass(t)
	created := f.writes("clusterlinks")
	if created != 1 {
		t.Fatalf("%d writes for the first pass, want 1 (the create)", created)
	}
	// The link flaps every 100 ms for 20 s, a pass each time.
	states := []string{"error", "connected"}
	const flaps = 200
	for i := range flaps {
		f.view.status.Connections[0].State = states[i%2]
		f.clock.advance(100 * time.Millisecond)
		f.pass(t)
	}
	updates := f.writes("clusterlinks") - created
	maxUpdates := int(20*time.Second/DefaultMinInterval) + 1
	if updates > maxUpdates || updates < 2 {
		t.Fatalf("%d updates for %d flaps in 20 s, want at most %d (one per %v) and some", updates, flaps, maxUpdates, DefaultMinInterval)
	}
	t.Logf("%d flaps in 20 s: %d writes", flaps, updates)
	// Once it settles, the last state is written when the interval ends.
	f.view.status.Connections[0].State = "error"
	f.clock.advance(DefaultMinInterval)
	f.pass(t)
	if ls := f.link(t, "west"); ls == nil || ls.State != "error" {
		t.Fatalf("the settled state was not written: %+v", ls)
	}
}

func TestALatencyChangeAloneWaitsForTheLatencyInterval(t *testing.T) {
	f := newFixture(t)
	f.view.status.Connections = []statusapi.Connection{connected("west", rtt(0.5, 0.9, 1.2))}
	f.pass(t)
	f.view.status.Connections[0].RTT = rtt(0.7, 1.1, 1.9)
	f.clock.advance(DefaultMinInterval)
	f.pass(t)
	if ls := f.link(t, "west"); ls.LatencyP50 != "0.50ms" {
		t.Fatalf("latency written after %v: %+v", DefaultMinInterval, ls)
	}
	f.clock.advance(DefaultLatencyInterval - DefaultMinInterval)
	f.pass(t)
	if ls := f.link(t, "west"); ls.LatencyP50 != "0.70ms" || ls.LatencyP99 != "1.90ms" {
		t.Fatalf("latency not written after %v: %+v", DefaultLatencyInterval, ls)
	}
}

func TestAPassWritesAtMostMaxWritesPerPass(t *testing.T) {
	f := newFixture(t)
	var ds []reconcile.PairDecision
	for i := range MaxWritesPerPass + 5 {
		ds = append(ds, reconcile.PairDecision{Cluster: "c" + string(rune('a'+i)), Connect: false, Policy: "apart"})
	}
	f.view.plan = testPlan(t, nil, ds...)
	f.pass(t)
	if n := f.writes("clusterlinks"); n != MaxWritesPerPass {
		t.Fatalf("first pass: %d writes, want %d", n, MaxWritesPerPass)
	}
	f.pass(t)
	if n := f.writes("clusterlinks"); n != MaxWritesPerPass+5 {
		t.Fatalf("second pass: %d writes in all, want %d", n, MaxWritesPerPass+5)
	}
}

// ccp is a ClusterConnectionPolicy object applied in a cluster, of generation gen.
func ccp(name string, gen int64, driver string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "cablemesh.io/v1alpha1",
		"kind":       "ClusterConnectionPolicy",
		"metadata":   map[string]any{"name": name, "generation": gen},
		"spec": map[string]any{
			"clusterSelector": map[string]any{},
			"priority":        int64(10),
			"cableDriver":     map[string]any{"name": driver},
		},
	}}
	u.SetLabels(map[string]string{policy.LabelOrigin: policy.OriginClusterLabel})
	return u
}

// synced is obj as the broker holds it for cluster.
func synced(t *testing.T, obj *unstructured.Unstructured, cluster string) policy.ClusterConnectionPolicy {
	t.Helper()
	it := clusterpolicy.ObjectItem(obj)
	if it.Err != nil {
		t.Fatal(it.Err)
	}
	p, err := policy.ClusterScoped(it.Policy, cluster)
	if err != nil {
		t.Fatal(err)
	}
	p.Origin = cluster
	return p
}

func (f *fixture) policyStatus(t *testing.T, name string) map[string]any {
	t.Helper()
	u, err := f.client.Resource(clusterpolicy.GVR).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st, _ := u.Object["status"].(map[string]any)
	return st
}

func TestPolicyStatusIsTheBrokersCopysResolution(t *testing.T) {
	obj := ccp("to-west", 3, "vxlan")
	f := newFixture(t, obj.DeepCopy())
	held := synced(t, obj, "east")

	// The broker does not hold it yet: no status.
	f.pass(t)
	if st := f.policyStatus(t, "to-west"); st != nil {
		t.Fatalf("status written before the broker held the policy: %v", st)
	}

	f.view.plan = testPlan(t, []policy.ClusterConnectionPolicy{held})
	f.pass(t)
	st := f.policyStatus(t, "to-west")
	var got PolicyStatus
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(st, &got); err != nil {
		t.Fatal(err)
	}
	want := PolicyStatus{ObservedGeneration: 3, SyncedAs: held.Metadata.Name, PairsDecided: 1, PairsConnected: 1,
		Decided: []DecidedPair{{ClusterA: "east", ClusterB: "west", Connect: true, Driver: "vxlan"}}}
	if !sameJSON(got, want) {
		t.Fatalf("status %+v, want %+v", got, want)
	}

	// A new generation the broker has not got: the status stays that of generation 3. (The
	// fake's update replaces the status too, which the API server's does not: carry it over.)
	next := ccp("to-west", 4, "wireguard")
	next.Object["status"] = st
	if _, err := f.client.Resource(clusterpolicy.GVR).Update(context.Background(), next, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	f.clock.advance(DefaultResync)
	f.pass(t)
	if st := f.policyStatus(t, "to-west"); st == nil || st["observedGeneration"] != int64(3) {
		t.Fatalf("status after generation 4, before the broker has it: %v", st)
	}
}

func TestPolicyStatusNamesTheConflictsLost(t *testing.T) {
	obj := ccp("to-west", 1, "vxlan")
	f := newFixture(t, obj.DeepCopy())
	held := synced(t, obj, "east")
	// Another policy of east for the same pair at the same priority, another driver, a name
	// that sorts first: it wins.
	rival := synced(t, ccp("aaa-rival", 1, "wireguard"), "east")
	f.view.plan = testPlan(t, []policy.ClusterConnectionPolicy{held, rival})
	f.pass(t)
	var got PolicyStatus
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(f.policyStatus(t, "to-west"), &got); err != nil {
		t.Fatal(err)
	}
	if got.ConflictsLost != 1 || len(got.Conflicts) != 1 || got.Conflicts[0].Winner != rival.Metadata.Name || got.PairsDecided != 0 {
		t.Fatalf("status %+v: want one conflict lost to aaa-rival", got)
	}
}

func TestARefusedPolicyGetsItsError(t *testing.T) {
	obj := ccp("no-label", 2, "vxlan")
	obj.SetLabels(nil)
	f := newFixture(t, obj)
	f.pass(t)
	st := f.policyStatus(t, "no-label")
	if msg, _ := st["error"].(string); !strings.Contains(msg, policy.MissingOriginLabelMessage) || st["observedGeneration"] != int64(2) {
		t.Fatalf("status %v: want the missing label's error at generation 2", st)
	}
	// Written once: it does not change.
	f.clock.advance(DefaultResync)
	f.pass(t)
	if n := f.writes("clusterconnectionpolicies"); n != 1 {
		t.Fatalf("%d status writes, want 1", n)
	}
}

// A write the API server refuses is retried on a later pass.
func TestAFailedWriteIsRetried(t *testing.T) {
	f := newFixture(t)
	f.view.status.Connections = []statusapi.Connection{connected("west", nil)}
	fail := true
	f.client.PrependReactor("create", "clusterlinks", func(k8stesting.Action) (bool, runtime.Object, error) {
		if fail {
			fail = false
			return true, nil, context.DeadlineExceeded
		}
		return false, nil, nil
	})
	if err := f.w.Pass(context.Background()); err == nil {
		t.Fatal("the failed create was not reported")
	}
	f.clock.advance(DefaultMinInterval)
	f.pass(t)
	if ls := f.link(t, "west"); ls == nil || ls.State != "connected" {
		t.Fatalf("ClusterLink west after the retry: %+v", ls)
	}
}
