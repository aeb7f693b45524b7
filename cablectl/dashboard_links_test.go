package cablectl

import (
	"encoding/json"
	"io"
	"testing"
	"time"
)

// The dashboard's links[] are links --all's items: the same JSON, key for key and value for value.
func TestTheDashboardServesLinksAllItemsUnchanged(t *testing.T) {
	at := time.Date(2026, 11, 28, 7, 0, 0, 0, time.UTC)
	hs := at.Add(-5 * time.Second)
	p50, p95, p99 := 0.4, 0.6, 0.9
	items := []LinkPair{{Clusters: [2]string{"east", "west"}, Agree: false, Stale: true, Ends: []LinkEnd{
		{Cluster: "east", Node: "gw1", State: "connected", Driver: "wireguard", Policy: "default", LatencyP50Ms: &p50, LatencyP95Ms: &p95,
			LatencyP99Ms: &p99, LastHandshake: &hs, ReportedAt: at, AgentVersion: "v1", Alive: true},
		{Cluster: "west", Node: "gw1", State: "error", Driver: "wireguard", Policy: "default", ReportedAt: at.Add(-time.Minute), Stale: true},
	}}}
	want, err := json.Marshal(items)
	if err != nil {
		t.Fatal(err)
	}
	conv := dashboardLinkItems(items)
	got, err := json.Marshal(conv)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Errorf("dashboard links\n  %s\nwant links --all's items\n  %s", got, want)
	}
	if !conv[0].Ends[1].Stale || conv[0].Ends[0].Stale {
		t.Errorf("the ends' staleness was not kept: %+v", conv[0].Ends)
	}
}

func TestDashboardRefusesBadFlagsAsUsage(t *testing.T) {
	for _, args := range [][]string{
		{"dashboard", "--interval", "10ms"},
		{"dashboard", "--interval", "2h"},
		{"dashboard", "--listen", "no-port"},
		{"dashboard", "extra"},
	} {
		root := NewRoot()
		root.SetArgs(append(args, "--config", "/nonexistent/admin.yaml"))
		root.SetOut(io.Discard)
		root.SetErr(io.Discard)
		err := root.Execute()
		if code := ExitCode(err); code != 2 {
			t.Errorf("cablectl %v: exit %d (%v), want 2 (bad usage) before reading any credential", args, code, err)
		}
	}
}
