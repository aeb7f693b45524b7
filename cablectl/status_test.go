package cablectl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

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

// fixtureStatusWithProbes is fixtureStatus with health probes: west answers, north publishes no
// health-check address, south's device is fine but its probes fail.
func fixtureStatusWithProbes() *statusapi.Status {
	s := fixtureStatus()
	north, west, south := &s.Connections[0], &s.Connections[1], &s.Connections[2]
	west.MTU = 1420
	west.RTT = &statusapi.RTT{LastMs: 0.4, MinMs: 0.045, AvgMs: 0.52, MaxMs: 3.1, P50Ms: 0.41, P95Ms: 1.2, P99Ms: 3.1}
	west.Health = &statusapi.Health{Probing: true, Healthy: true, Source: "10.1.0.1", Target: "10.2.0.1", ProbesSent: 120, ProbesFailed: 2,
		FailureThreshold: 3, PeriodMs: 3000, Samples: 118, LastProbe: ago(time.Second), LastSuccess: ago(time.Second), LastError: "timeout after 2s"}
	north.Health = &statusapi.Health{Probing: false, Healthy: true, Reason: "remote endpoint north/north-gw1 publishes no health_check_ip"}
	south.Node, south.MTU = "south-gw1", 1420
	south.Message = "health probe: 4 consecutive failures (last: timeout after 2s)"
	south.RTT = &statusapi.RTT{LastMs: 12.25, MinMs: 11, AvgMs: 12, MaxMs: 14.5, P50Ms: 12, P95Ms: 14.5, P99Ms: 14.5}
	south.Health = &statusapi.Health{Probing: true, Healthy: false, Source: "10.1.0.1", Target: "10.4.0.1", ProbesSent: 30, ProbesFailed: 4,
		ConsecutiveFailures: 4, FailureThreshold: 3, PeriodMs: 3000, Samples: 26, LastProbe: ago(2 * time.Second), LastSuccess: ago(14 * time.Second),
		LastError: "timeout after 2s"}
	south.LastHandshake, south.RxBytes, south.TxBytes = ago(40*time.Second), 4096, 8192
	north.Policy, west.Policy, south.Policy = "default", "default", "default"
	return s
}

// fixtureStatusWithPolicies is a gateway whose policies put west on vxlan, leave south on
// wireguard, keep north unconnected, and whose ipsec driver did not start (a pair needing it
// errors).
func fixtureStatusWithPolicies() *statusapi.Status {
	s := fixtureStatus()
	s.Connections = []statusapi.Connection{
		{Cluster: "south", ClusterID: 4, Node: "south-gw1", Driver: "wireguard", Policy: "default", AppliedRevision: 40, State: "connected",
			Endpoint: "10.0.0.14:51820", RxBytes: 2048, TxBytes: 1024, LastHandshake: ago(20 * time.Second)},
		{Cluster: "west", ClusterID: 2, Node: "west-gw1", Driver: "vxlan", Policy: "east-west-vxlan", AppliedRevision: 42, State: "connected",
			Endpoint: "10.0.0.12:4789", RxBytes: 1258291, TxBytes: 3482},
		{Cluster: "zeta", ClusterID: 6, Driver: "ipsec", Policy: "secure-zeta", State: "error",
			Message: "driver ipsec unavailable on this node: charon: no such file"},
	}
	s.Decisions = []statusapi.Decision{
		{Cluster: "north", Connect: false, Policy: "isolate-north"},
		{Cluster: "south", Connect: true, Driver: "wireguard", Policy: "default", Default: true},
		{Cluster: "west", Connect: true, Driver: "vxlan", Policy: "east-west-vxlan"},
		{Cluster: "zeta", Connect: true, Driver: "ipsec", Policy: "secure-zeta"},
	}
	s.Drivers = []statusapi.DriverStatus{{Name: "wireguard", Running: true, Port: 51820}, {Name: "vxlan", Running: true, Port: 4789},
		{Name: "ipsec", Error: "charon: no such file"}}
	return s
}

// fixtureStatusWithProblems is a gateway whose wireguard driver refused to connect west (a bad
// option value), which routes north without a subnet that overlaps its underlay, whose driver
// for zeta is not configured, whose certificate renews in 200 days and whose join token file
// others can read.
func fixtureStatusWithProblems() *statusapi.Status {
	s := fixtureStatus()
	notAfter, renewAt := statusNow.Add(300*24*time.Hour), statusNow.Add(200*24*time.Hour)
	s.Broker.CertificateNotAfter, s.Broker.CertificateRenewAt = &notAfter, &renewAt
	underlay := "subnet 172.31.0.128/25 is not routed over the cable: it overlaps this node's underlay network 172.31.0.0/24 (the link of its advertise address), which this node must keep reaching over its underlay"
	s.Connections = []statusapi.Connection{
		{Cluster: "north", ClusterID: 3, Node: "north-gw1", Driver: "wireguard", Policy: "default", State: "connected", Endpoint: "10.0.0.13:51820",
			RxBytes: 4096, TxBytes: 2048, LastHandshake: ago(5 * time.Second), Subnets: []string{"10.3.0.0/16"}, Message: underlay},
		{Cluster: "west", ClusterID: 2, Node: "west-gw1", Driver: "wireguard", Policy: "west-jumbo", State: "error", Endpoint: "10.0.0.12:51820",
			Message: `wireguard could not connect the pair: wireguard option "mtu": 100000 is out of range (1280..65535)`},
		{Cluster: "zeta", ClusterID: 6, Driver: "ipsec", Policy: "secure-zeta", State: "error", Message: "driver ipsec is not configured on this node (cableDrivers)"},
	}
	s.Problems = []statusapi.Problem{
		{Message: "join token file /etc/cablemesh/join-token is readable by others (mode 0644): whoever reads it can join a node to this cluster while the token is valid; chmod 600 it, and delete it once the node has joined"},
		{Cluster: "north", Message: underlay},
		{Cluster: "zeta", Message: "driver ipsec is not configured on this node (cableDrivers)"},
	}
	return s
}

func TestStatusTableMatchesGolden(t *testing.T) {
	tests := []struct {
		name   string
		golden string
		status func() *statusapi.Status
		format string
	}{
		{"a gateway with three remote clusters", "status_table.golden", fixtureStatus, ""},
		{"an agent on cached state with the broker down", "status_table_cached.golden", func() *statusapi.Status {
			s := fixtureStatus()
			s.Connections = s.Connections[1:2]
			s.Broker = statusapi.Broker{Address: "10.0.0.1:7443", Revision: 40, LastContact: ago(5 * time.Minute), Cached: true,
				Error: "connection refused"}
			return s
		}, ""},
		{"an agent that never reached its broker and has no connections", "status_table_empty.golden", func() *statusapi.Status {
			return &statusapi.Status{Cluster: "east", Node: "n2", Broker: statusapi.Broker{Address: "10.0.0.1:7443"}, Connections: []statusapi.Connection{}}
		}, ""},
		{"a gateway whose probes to one cluster fail", "status_table_probes.golden", fixtureStatusWithProbes, ""},
		{"the wide table with RTT statistics and probe health", "status_wide.golden", fixtureStatusWithProbes, "wide"},
		{"a gateway whose policies pick a driver per pair and leave one pair unconnected", "status_table_policies.golden", fixtureStatusWithPolicies, ""},
		{"the wide table names the deciding policy and the driver that did not start", "status_wide_policies.golden", fixtureStatusWithPolicies, "wide"},
		{"a gateway whose driver refused a pair, with a subnet not routed, a certificate to renew and a readable token", "status_table_problems.golden", fixtureStatusWithProblems, ""},
		{"a gateway in gateway mode with one gateway-mode pair and its ingress data plane", "status_table_gateway.golden", func() *statusapi.Status {
			s := fixtureStatus()
			s.MeshAddress = "242.0.0.1"
			s.Connections[0].Mode = "gateway"
			s.Connections[0].Subnets = []string{"242.0.0.2/32"}
			s.Connections[1].Mode = "direct"
			s.Ingress = &statusapi.Ingress{Mode: "kernel", Ports: []statusapi.IngressPort{}, Dataplane: &statusapi.IngressDataplane{
				Kind: "nftables", MeshLink: "cbl-mesh0", Programmed: true, RemoteMeshAddresses: 1, Ports: 2, Backends: 2, Rules: 9}}
			return s
		}, ""},
		{"an agent whose certificate the broker revoked", "status_table_revoked.golden", func() *statusapi.Status {
			s := fixtureStatus()
			s.Connections = s.Connections[1:2]
			notAfter := statusNow.Add(300 * 24 * time.Hour)
			s.Broker = statusapi.Broker{Address: "10.0.0.1:7443", Revision: 42, LastContact: ago(2 * time.Minute), CertificateNotAfter: &notAfter,
				CertificateRefused: true, Error: "certificate revoked: join again (the certificate of east/east-gw1 was revoked at 2026-11-21T11:58:00Z (cablectl cluster revoke-node); join again with a new token)"}
			s.Problems = []statusapi.Problem{{Message: "the broker refused this node's certificate for good: ...; the agent no longer calls the broker and keeps its tunnels on its last state. Join again: a new token in joinTokenFile, remove agent.crt from /var/lib/cablemesh, restart the agent"}}
			return s
		}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			format := tt.format
			if format == "" {
				format = "table"
			}
			if err := printStatus(&buf, format, tt.status(), statusNow); err != nil {
				t.Fatal(err)
			}
			golden(t, tt.golden, buf.Bytes())
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
		{"an RTT under a tenth of a millisecond reads in microseconds", statusRTT(&statusapi.RTT{LastMs: 0.0452}), "45µs"},
		{"a zero RTT reads as zero milliseconds", statusMs(0), "0.0ms"},
		{"no health block reads as a dash", statusHealth(nil), "-"},
		{"an unprobed connection says so", statusHealth(&statusapi.Health{Reason: "x"}), "not probed"},
		{"a prober that has not sent yet is pending", statusHealth(&statusapi.Health{Probing: true, Healthy: true}), "pending"},
		{"answering probes read ok", statusHealth(&statusapi.Health{Probing: true, Healthy: true, ProbesSent: 3}), "ok"},
		{"failures below the threshold are counted", statusHealth(&statusapi.Health{Probing: true, Healthy: true, ProbesSent: 3, ConsecutiveFailures: 2, FailureThreshold: 3}), "2/3 failed"},
		{"failures at the threshold read down", statusHealth(&statusapi.Health{Probing: true, ProbesSent: 3, ConsecutiveFailures: 3, FailureThreshold: 3}), "down"},
		{"probe counters read sent/failed", statusProbes(&statusapi.Health{Probing: true, ProbesSent: 120, ProbesFailed: 2}), "120/2"},
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
	root := NewRoot()
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

func TestStatusCommandShowsProbeDetails(t *testing.T) {
	sock := serveStatus(t, fixtureStatusWithProbes())

	out, err := runCablectl("status", "--socket", sock, "-o", "wide")
	if err != nil || !strings.Contains(out, "P50/P95/P99") || !strings.Contains(out, "0.4ms/1.2ms/3.1ms") || !strings.Contains(out, "not probed: ") {
		t.Errorf("status -o wide: %v\n%s", err, out)
	}
	out, err = runCablectl("status", "--socket", sock, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal([]byte(out), &m); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	west := m["connections"].([]any)[1].(map[string]any)
	rtt, _ := west["rtt"].(map[string]any)
	for k, want := range map[string]float64{"lastMs": 0.4, "minMs": 0.045, "avgMs": 0.52, "maxMs": 3.1, "p50Ms": 0.41, "p95Ms": 1.2, "p99Ms": 3.1} {
		if rtt[k] != want {
			t.Errorf("rtt.%s = %v, want %v", k, rtt[k], want)
		}
	}
	h, _ := west["health"].(map[string]any)
	if h["healthy"] != true || h["probing"] != true || h["probesSent"] != 120.0 || h["target"] != "10.2.0.1" {
		t.Errorf("health = %v", h)
	}
}

func TestStatusTableShowsTheConfigInForceAndARefusedFile(t *testing.T) {
	s := &statusapi.Status{Cluster: "east", Node: "n1", Broker: statusapi.Broker{Address: "10.0.0.1:7443"}, Connections: []statusapi.Connection{},
		Config: &statusapi.ConfigStatus{Path: "/etc/cablemesh/agent.yaml", Revision: 3, Hash: "sha256:0123456789abcdef0123", LoadedAt: statusNow.Add(-12 * time.Second)}}
	var buf bytes.Buffer
	if err := printStatus(&buf, "table", s, statusNow); err != nil {
		t.Fatal(err)
	}
	if want := "Config: revision 3, sha256:0123456789ab, loaded 12s ago\n"; !strings.Contains(buf.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, buf.String())
	}
	s.Config.Refused = []statusapi.ConfigRefusal{{Field: "cluster", Message: "cluster cannot change"}}
	buf.Reset()
	if err := printStatus(&buf, "table", s, statusNow); err != nil {
		t.Fatal(err)
	}
	if want := "Config: revision 3, sha256:0123456789ab, loaded 12s ago, newer file refused: cluster\n"; !strings.Contains(buf.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, buf.String())
	}
}

func TestStatusMeshLineSaysWhenTheMeshAddressIsNotInUse(t *testing.T) {
	tests := []struct {
		name string
		st   statusapi.Status
		want string
	}{
		{"a node without a mesh address or data plane has no line", statusapi.Status{}, ""},
		{"a gateway of a mesh of direct pairs holds an address it does not use",
			statusapi.Status{MeshAddress: "242.0.0.3", Ingress: &statusapi.Ingress{Mode: "kernel", Dataplane: &statusapi.IngressDataplane{Kind: "nftables", Programmed: true}}},
			"Mesh address: 242.0.0.3 (not in use: no gateway-mode pair)"},
		{"a gateway in gateway mode shows what its table does",
			statusapi.Status{MeshAddress: "242.0.0.1", Ingress: &statusapi.Ingress{Mode: "kernel", Dataplane: &statusapi.IngressDataplane{Kind: "nftables", MeshLink: "cbl-mesh0", Programmed: true, Ports: 2, Backends: 2, RemoteMeshAddresses: 1}}},
			"Mesh address: 242.0.0.1, ingress kernel (nftables): 2 ports (0 without backends), 2 backends, SNAT for 1 remote gateways"},
		{"a mesh link that cannot be made is an error, not an unused address",
			statusapi.Status{MeshAddress: "242.0.0.1", Ingress: &statusapi.Ingress{Mode: "kernel", Dataplane: &statusapi.IngressDataplane{Kind: "nftables", Error: "operation not permitted"}}},
			"Mesh address: 242.0.0.1, ingress kernel (nftables): not programmed, error: operation not permitted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := statusMeshLine(&tt.st); got != tt.want {
				t.Errorf("got  %q\nwant %q", got, tt.want)
			}
		})
	}
}
