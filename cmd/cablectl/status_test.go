package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

// The -update flag regenerates golden files. It is registered only if no other test file of
// this package registered it already.
func init() {
	if flag.Lookup("update") == nil {
		flag.Bool("update", false, "rewrite golden files under testdata/")
	}
}

func updateGolden() bool {
	f := flag.Lookup("update")
	return f != nil && f.Value.String() == "true"
}

var statusNow = time.Date(2026, 11, 21, 12, 0, 0, 0, time.UTC)

func ago(d time.Duration) *time.Time {
	t := statusNow.Add(-d)
	return &t
}

func fixtureStatus() *statusapi.Status {
	return &statusapi.Status{
		Cluster: "east", ClusterID: 1, Node: "east-gw1", Gateway: true,
		Broker: statusapi.Broker{Address: "10.0.0.1:7443", Connected: true, Revision: 42, LastContact: ago(3 * time.Second)},
		Connections: []statusapi.Connection{
			{Cluster: "north", ClusterID: 3, Node: "north-gw1", Driver: "wireguard", State: "connecting", Endpoint: "10.0.0.13:51820",
				RxBytes: 0, TxBytes: 148, LastHandshake: nil},
			{Cluster: "west", ClusterID: 2, Node: "west-gw1", Driver: "wireguard", State: "connected", Endpoint: "10.0.0.12:51820",
				RTT: &statusapi.RTT{LastMs: 0.4, MinMs: 0.2, AvgMs: 0.5, MaxMs: 1.1}, RxBytes: 1258291, TxBytes: 3482, LastHandshake: ago(12 * time.Second)},
			{Cluster: "south", ClusterID: 4, Driver: "wireguard", State: "error", Endpoint: "10.0.0.14:51820",
				Message: "connection is wanted but missing on the device"},
		},
	}
}

func TestStatusTableMatchesGolden(t *testing.T) {
	tests := []struct {
		name   string
		golden string
		status func() *statusapi.Status
	}{
		{"a gateway with three remote clusters", "status_table.golden", fixtureStatus},
		{"an agent on cached state with the broker down", "status_table_cached.golden", func() *statusapi.Status {
			s := fixtureStatus()
			s.Connections = s.Connections[1:2]
			s.Broker = statusapi.Broker{Address: "10.0.0.1:7443", Revision: 40, LastContact: ago(5 * time.Minute), Cached: true,
				Error: "connection refused"}
			return s
		}},
		{"an agent that never reached its broker and has no connections", "status_table_empty.golden", func() *statusapi.Status {
			return &statusapi.Status{Cluster: "east", Node: "n2", Broker: statusapi.Broker{Address: "10.0.0.1:7443"}, Connections: []statusapi.Connection{}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := printStatus(&buf, "table", tt.status(), statusNow); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tt.golden)
			if updateGolden() {
				if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run go test -run TestStatusTable -update to create it)", err)
			}
			if got := buf.String(); got != string(want) {
				t.Errorf("table differs from %s:\n--- got\n%s--- want\n%s", path, got, want)
			}
		})
	}
}

func TestStatusFormatting(t *testing.T) {
	tests := []struct {
		name, got, want string
	}{
		{"small byte counts are exact", statusBytes(512), "512 B"},
		{"kibibytes have one decimal", statusBytes(1536), "1.5 KiB"},
		{"mebibytes have one decimal", statusBytes(1258291), "1.2 MiB"},
		{"gibibytes have one decimal", statusBytes(3 << 30), "3.0 GiB"},
		{"no handshake reads never", statusAgo(nil, statusNow), "never"},
		{"a recent handshake reads in seconds", statusAgo(ago(12*time.Second), statusNow), "12s ago"},
		{"an older contact reads in minutes", statusAgo(ago(5*time.Minute), statusNow), "5m ago"},
		{"no probe data reads as a dash", statusRTT(nil), "-"},
		{"probe data reads the last RTT", statusRTT(&statusapi.RTT{LastMs: 1.25}), "1.2ms"},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, tt.got, tt.want)
		}
	}
}

// serveStatus serves doc on a unix socket like an agent would.
func serveStatus(t *testing.T, doc *statusapi.Status) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "cbta-ctl")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "agent.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+statusapi.Path, func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(doc) })
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return sock
}

func runCablectl(args ...string) (string, error) {
	root := newRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs(args)
	err := root.Execute()
	return out.String(), err
}

func TestStatusCommandReadsTheAgent(t *testing.T) {
	sock := serveStatus(t, fixtureStatus())

	out, err := runCablectl("status", "--socket", sock, "-o", "json")
	if err != nil {
		t.Fatalf("status -o json: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	if m["cluster"] != "east" || m["node"] != "east-gw1" || m["broker"].(map[string]any)["connected"] != true ||
		m["broker"].(map[string]any)["revision"] != 42.0 {
		t.Errorf("json = %v", m)
	}
	c := m["connections"].([]any)[1].(map[string]any)
	for _, k := range []string{"cluster", "clusterID", "driver", "state", "endpoint", "rxBytes", "txBytes", "lastHandshake"} {
		if _, ok := c[k]; !ok {
			t.Errorf("connection lacks %q: %v", k, c)
		}
	}

	out, err = runCablectl("status", "--socket", sock)
	if err != nil || !strings.HasPrefix(out, "CLUSTER") || !strings.Contains(out, "Broker: 10.0.0.1:7443 connected, revision 42") {
		t.Errorf("status table: %v\n%s", err, out)
	}
	out, err = runCablectl("status", "--socket", sock, "-o", "yaml")
	if err != nil || !strings.Contains(out, "cluster: east") || !strings.Contains(out, "rxBytes: 1258291") {
		t.Errorf("status -o yaml: %v\n%s", err, out)
	}
}

func TestStatusCommandFailures(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no.sock")
	_, err := runCablectl("status", "--socket", missing)
	if err == nil || !strings.Contains(err.Error(), "cannot reach agent at "+missing+": ") {
		t.Errorf("unreachable agent: %v", err)
	}
	var ue usageError
	if errors.As(err, &ue) || isCobraUsageError(err) {
		t.Errorf("an unreachable agent counts as bad usage (exit 2), want exit 1: %v", err)
	}
	_, err = runCablectl("status", "--socket", missing, "-o", "xml")
	if !errors.As(err, &ue) {
		t.Errorf("-o xml = %v, want a usage error", err)
	}
}
