package broker

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/labels"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/mcs"
)

// The service-import benchmarks: a mesh of benchClusters clusters that each export the same
// benchServices services (benchEndpoints endpoints each), under the default policy and ten
// policies on cluster labels. Run with
//
//	go test ./broker -run '^$' -bench Imports -benchmem
const (
	benchClusters  = 100
	benchServices  = 50
	benchEndpoints = 10
)

func benchName(i int) string { return fmt.Sprintf("c%03d", i) }

func benchSnapshot(b *testing.B) store.Batch {
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	evs := []*apiv1.Event{defaultPolicyEv(b)}
	for p := range 10 {
		evs = append(evs, policyEv(b, fmt.Sprintf("kind: ClusterConnectionPolicy\nmetadata: {name: p%d}\nspec:\n  leftClusterSelector: {region: r%d}\n  rightClusterSelector: {env: dev}\n  connectionPolicy: no-connect\n  priority: %d\n", p, p, p+1)))
	}
	for c := range benchClusters {
		env := "prod"
		if c%4 == 0 {
			env = "dev"
		}
		evs = append(evs, clusterEv(benchName(c), uint32(c+1), map[string]string{"region": fmt.Sprintf("r%d", c%10), "env": env}))
	}
	for s := range benchServices {
		name := fmt.Sprintf("svc%02d", s)
		for c := range benchClusters {
			evs = append(evs, exportEv(b, benchName(c), name, t0.Add(time.Duration(c)*time.Second), 80, benchEndpoints))
		}
		evs = append(evs, vipEv(name, fmt.Sprintf("241.0.0.%d", s+1)))
	}
	return store.Batch{Snapshot: true, Revision: 1, Events: evs}
}

// BenchmarkImportsSnapshot: everything computed from scratch (broker start, or the tracker
// resuming from a snapshot): 5,000 exports merged into 50 imports, policies compiled.
func BenchmarkImportsSnapshot(b *testing.B) {
	snap := benchSnapshot(b)
	for b.Loop() {
		s := newImportState()
		s.apply(snap)
		mustView(b, s, 1)
	}
}

// BenchmarkImportsExportChange: one export changes (an endpoint goes not ready): the view of
// the new revision, merging that one service again. Once per revision, for every watcher.
func BenchmarkImportsExportChange(b *testing.B) {
	s := newImportState()
	s.apply(benchSnapshot(b))
	mustView(b, s, 1)
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	changes := []store.Batch{
		{Revision: 2, Events: []*apiv1.Event{exportEv(b, "c007", "svc13", t0.Add(7*time.Second), 80, benchEndpoints-1)}},
		{Revision: 3, Events: []*apiv1.Event{exportEv(b, "c007", "svc13", t0.Add(7*time.Second), 80, benchEndpoints)}},
	}
	i := 0
	for b.Loop() {
		s.apply(changes[i%2])
		mustView(b, s, uint64(i+2))
		i++
	}
}

// BenchmarkImportsPolicyChange: a policy changes: the policies compiled again (the merged
// imports are kept).
func BenchmarkImportsPolicyChange(b *testing.B) {
	s := newImportState()
	s.apply(benchSnapshot(b))
	mustView(b, s, 1)
	ev := policyEv(b, "kind: ClusterConnectionPolicy\nmetadata: {name: p3}\nspec:\n  leftClusterSelector: {region: r3}\n  rightClusterSelector: {env: prod}\n  connectionPolicy: no-connect\n  priority: 4\n")
	i := 0
	for b.Loop() {
		s.apply(store.Batch{Revision: uint64(i + 2), Events: []*apiv1.Event{ev}})
		mustView(b, s, uint64(i+2))
		i++
	}
}

// BenchmarkImportsTailorOneClusterCold: one cluster's imports from a view nothing was asked of
// yet: 99 pair decisions, mcs.Visible of the 50 services and their fingerprints.
func BenchmarkImportsTailorOneClusterCold(b *testing.B) {
	s := newImportState()
	s.apply(benchSnapshot(b))
	v := mustView(b, s, 1)
	sel, _ := mcs.ParseImportSelector(mcs.DefaultImportSelector)
	for b.Loop() {
		v.tailored = map[string]*tailoredImports{}
		v.pairs = &pairDecisions{labels: v.pairs.labels, resolver: v.pairs.resolver, connect: map[[2]string]bool{}}
		for _, e := range v.services {
			e.visible = map[string]*visiblePart{}
		}
		v.importsFor("c042", mcs.DefaultImportSelector, sel)
	}
}

// BenchmarkImportsTailorOneClusterWarm: one cluster's imports from a new view whose services'
// parts and pair decisions earlier views computed (the usual case: one service changed).
func BenchmarkImportsTailorOneClusterWarm(b *testing.B) {
	s := newImportState()
	s.apply(benchSnapshot(b))
	v := mustView(b, s, 1)
	sel, _ := mcs.ParseImportSelector(mcs.DefaultImportSelector)
	for b.Loop() {
		v.tailored = map[string]*tailoredImports{}
		v.importsFor("c042", mcs.DefaultImportSelector, sel)
	}
}

// BenchmarkImportsPolicyChangeAllClusters: a policy changes with a watcher in every cluster:
// the policies compiled, every pair decided again, each cluster's imports and fingerprint.
func BenchmarkImportsPolicyChangeAllClusters(b *testing.B) {
	s := newImportState()
	s.apply(benchSnapshot(b))
	mustView(b, s, 1)
	evs := []*apiv1.Event{
		policyEv(b, "kind: ClusterConnectionPolicy\nmetadata: {name: p3}\nspec:\n  leftClusterSelector: {region: r3}\n  rightClusterSelector: {env: prod}\n  connectionPolicy: no-connect\n  priority: 4\n"),
		policyEv(b, "kind: ClusterConnectionPolicy\nmetadata: {name: p3}\nspec:\n  leftClusterSelector: {region: r3}\n  rightClusterSelector: {env: dev}\n  connectionPolicy: no-connect\n  priority: 4\n"),
	}
	sel, _ := mcs.ParseImportSelector(mcs.DefaultImportSelector)
	i := 0
	for b.Loop() {
		s.apply(store.Batch{Revision: uint64(i + 2), Events: []*apiv1.Event{evs[i%2]}})
		v := mustView(b, s, uint64(i+2))
		for c := range benchClusters {
			v.importsFor(benchName(c), mcs.DefaultImportSelector, sel)
		}
		i++
	}
}

// BenchmarkImportsRevisionAllClusters: the whole cost of one export change with a watcher in
// every cluster: the new view, and each of the 100 clusters' imports and fingerprint.
func BenchmarkImportsRevisionAllClusters(b *testing.B) {
	s := newImportState()
	s.apply(benchSnapshot(b))
	mustView(b, s, 1)
	t0 := time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)
	changes := []store.Batch{
		{Revision: 2, Events: []*apiv1.Event{exportEv(b, "c007", "svc13", t0.Add(7*time.Second), 80, benchEndpoints-1)}},
		{Revision: 3, Events: []*apiv1.Event{exportEv(b, "c007", "svc13", t0.Add(7*time.Second), 80, benchEndpoints)}},
	}
	sel, _ := mcs.ParseImportSelector(mcs.DefaultImportSelector)
	i := 0
	for b.Loop() {
		s.apply(changes[i%2])
		v := mustView(b, s, uint64(i+2))
		for c := range benchClusters {
			v.importsFor(benchName(c), mcs.DefaultImportSelector, sel)
		}
		i++
	}
}

// BenchmarkImportsNaivePerWatcher is the anchor: what one watcher would pay per batch if it
// merged every export itself (mcs.Merge over the 5,000 exports) before tailoring, instead of
// sharing the tracker's view.
func BenchmarkImportsNaivePerWatcher(b *testing.B) {
	s := newImportState()
	s.apply(benchSnapshot(b))
	v := mustView(b, s, 1)
	var exports []*apiv1.ServiceExport
	for _, byKey := range s.exports {
		for _, e := range byKey {
			exports = append(exports, e)
		}
	}
	ids := map[string]uint32{}
	for n, c := range s.clusters {
		ids[n] = c.GetId()
	}
	sel, _ := mcs.ParseImportSelector(mcs.DefaultImportSelector)
	for b.Loop() {
		imps := mcs.Merge(exports, ids, s.vips)
		t := tailorImports(imps, "c042", func(c string) bool { return v.pairs.connects("c042", c) }, sel)
		fingerprint(t)
	}
}

// tailorImports is what a watcher would do alone: mcs.Visible of each import.
func tailorImports(imports []*apiv1.ServiceImport, self string, connected func(string) bool, sel labels.Selector) *apiv1.ServiceImports {
	out := &apiv1.ServiceImports{}
	for _, imp := range imports {
		if vis := mcs.Visible(imp, self, connected, sel); vis != nil {
			out.Imports = append(out.Imports, vis)
		}
	}
	return out
}
