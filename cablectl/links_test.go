package cablectl

import (
	"bytes"
	"encoding/json"
	"reflect"
	"sort"
	"testing"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// fixtureStatusWithImports is fixtureStatusWithProbes with two imports: west exports both,
// south one; east's own export of api is not a link's.
func fixtureStatusWithImports() *statusapi.Status {
	s := fixtureStatusWithProbes()
	s.Services = &statusapi.Services{ImportsKnown: true, Imports: []statusapi.ServiceImport{
		{Namespace: "shop", Name: "api", Clusters: []statusapi.ImportedCluster{{Cluster: "east", Local: true}, {Cluster: "west"}, {Cluster: "south"}}},
		{Namespace: "shop", Name: "db", Clusters: []statusapi.ImportedCluster{{Cluster: "west"}}},
	}}
	return s
}

func TestLinksTableMatchesGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := printLinks(&buf, "table", linkItems(fixtureStatusWithImports())); err != nil {
		t.Fatal(err)
	}
	golden(t, "links.golden", buf.Bytes())
}

func TestLinkItems(t *testing.T) {
	items := linkItems(fixtureStatusWithImports())
	byName := map[string]linkItem{}
	for _, it := range items {
		byName[it.Cluster] = it
	}
	// west: connected, probes answer, two services, percentiles from the probes.
	if w := byName["west"]; !w.Alive || w.Services != 2 || w.LatencyP50Ms == nil || *w.LatencyP50Ms != 0.41 || *w.LatencyP99Ms != 3.1 {
		t.Errorf("west = %+v", w)
	}
	// south: its device says nothing wrong but its probes fail: not alive.
	if s := byName["south"]; s.Alive || s.Services != 1 {
		t.Errorf("south = %+v, want not alive with one service", s)
	}
	// north: connecting, not probed: not alive, no latency.
	if n := byName["north"]; n.Alive || n.LatencyP50Ms != nil {
		t.Errorf("north = %+v", n)
	}
	if !sort.SliceIsSorted(items, func(i, j int) bool { return items[i].Cluster < items[j].Cluster }) {
		t.Errorf("items not sorted by cluster: %+v", items)
	}
}

func TestLinksCommandJSONHasExactlyTheContractKeys(t *testing.T) {
	sock := serveStatus(t, fixtureStatusWithImports())
	out, err := runCablectl("links", "--socket", sock, "-o", "json")
	if err != nil {
		t.Fatalf("links -o json: %v\n%s", err, out)
	}
	var items []map[string]any
	if err := json.Unmarshal([]byte(out), &items); err != nil {
		t.Fatalf("not a JSON list: %v\n%s", err, out)
	}
	want := []string{"alive", "cluster", "latencyP50Ms", "latencyP95Ms", "latencyP99Ms", "services"}
	for _, it := range items {
		var keys []string
		for k := range it {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if !reflect.DeepEqual(keys, want) {
			t.Errorf("item keys %v, want exactly %v", keys, want)
		}
	}
	if len(items) != 3 || items[2]["cluster"] != "west" || items[2]["alive"] != true || items[2]["services"] != 2.0 || items[2]["latencyP95Ms"] != 1.2 {
		t.Errorf("items = %v", items)
	}
	out, err = runCablectl("links", "--socket", sock, "-o", "yaml")
	if err != nil || !bytes.Contains([]byte(out), []byte("latencyP50Ms: 0.41")) {
		t.Errorf("links -o yaml: %v\n%s", err, out)
	}
}
