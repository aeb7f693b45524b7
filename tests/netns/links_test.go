package netns

import (
	"encoding/json"
	"fmt"
	"reflect"
	"sort"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestLinksJSON runs `cablectl links -o json` on east's gateway in a mesh of three clusters in
// which west exports one service: every item has exactly the contract's keys; west and north are
// alive with probe latencies, and west counts its one service.
func TestLinksJSON(t *testing.T) {
	harness.RequireRoot(t)
	m := harness.New(t)
	cs := m.AddClusters("east=10.1.0.0/16", "west=10.2.0.0/16", "north=10.3.0.0/16")
	east, west := cs[0], cs[1]
	m.WaitConnected(2*time.Minute, cs...)
	if r := harness.Run(m.Ctx, m.Bin.Cablectl, "service", "export", "web", "-n", "shop", "--port", "http:8080/TCP",
		"--endpoint", west.PodIP.String(), "--socket", west.StatusSocket); r.Err != nil {
		t.Fatalf("export web from west: %s", r)
	}

	want := []string{"alive", "cluster", "latencyP50Ms", "latencyP95Ms", "latencyP99Ms", "services"}
	var items []map[string]any
	var last harness.Result
	err := harness.WaitFor(60*time.Second, 500*time.Millisecond, func() (bool, string) {
		last = harness.NSRun(m.Ctx, east.GwNS, m.Bin.Cablectl, "links", "--socket", east.StatusSocket, "-o", "json")
		if last.Err != nil {
			return false, last.String()
		}
		items = nil
		if err := json.Unmarshal([]byte(last.Stdout), &items); err != nil {
			return false, fmt.Sprintf("not a JSON list: %v: %q", err, last.Stdout)
		}
		by := map[string]map[string]any{}
		for _, it := range items {
			by[fmt.Sprint(it["cluster"])] = it
		}
		w, n := by["west"], by["north"]
		if len(items) != 2 || w == nil || n == nil {
			return false, fmt.Sprintf("items %v, want west and north", items)
		}
		if w["alive"] != true || n["alive"] != true || w["services"] != 1.0 || n["services"] != 0.0 {
			return false, fmt.Sprintf("west %v north %v, want both alive, west with 1 service", w, n)
		}
		if w["latencyP50Ms"] == nil || n["latencyP99Ms"] == nil {
			return false, "no probe latency yet"
		}
		return true, ""
	})
	if err != nil {
		t.Fatalf("links -o json on east: %v\nlast: %s", err, last)
	}
	for _, it := range items {
		var keys []string
		for k := range it {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		if !reflect.DeepEqual(keys, want) {
			t.Errorf("item %v has keys %v, want exactly %v", it, keys, want)
		}
		p50, _ := it["latencyP50Ms"].(float64)
		p99, _ := it["latencyP99Ms"].(float64)
		if p50 <= 0 || p99 < p50 {
			t.Errorf("%v: p50 %v p99 %v, want 0 < p50 <= p99", it["cluster"], p50, p99)
		}
	}
	table := harness.NSRun(m.Ctx, east.GwNS, m.Bin.Cablectl, "links", "--socket", east.StatusSocket)
	m.Logf("links -o json on east: %s\nlinks:\n%s", last.Stdout, table.Stdout)
}
