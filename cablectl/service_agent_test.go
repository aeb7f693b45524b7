package cablectl

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/cablemesh/cablemesh/agent/statusapi"
)

func fixtureServices() *statusapi.Services {
	return &statusapi.Services{
		ImportSelector: "cablemesh.io/exported=true", ImportsKnown: true,
		DNS:          statusapi.DNSStatus{Enabled: true, Listen: "10.1.0.1:53"},
		LoadBalancer: statusapi.LoadBalancer{Running: true, CgroupPath: "/sys/fs/cgroup", PinDir: "/sys/fs/bpf/cablemesh", Services: 2, SocketsDestroyed: 3},
		Imports: []statusapi.ServiceImport{
			{Namespace: "shop", Name: "db", Type: "Headless", Affinity: "local", Ports: []statusapi.ServicePort{{Name: "pg", Port: 5432, Protocol: "TCP"}},
				Clusters: []statusapi.ImportedCluster{{Cluster: "west", ClusterID: 2, Usable: true, ReadyEndpoints: 1,
					Endpoints: []statusapi.ServiceEndpoint{{IP: "10.2.0.20", Hostname: "db-0", Ready: true}}, Backends: []string{}}}},
			{Namespace: "shop", Name: "web", Type: "ClusterSetIP", VIPs: []string{"241.0.0.1"}, Affinity: "local",
				Ports: []statusapi.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}, {Name: "echo", Port: 7, Protocol: "UDP"}},
				Clusters: []statusapi.ImportedCluster{
					{Cluster: "east", ClusterID: 1, Local: true, Usable: true, Reason: "local cluster", ReadyEndpoints: 1,
						Endpoints: []statusapi.ServiceEndpoint{{IP: "10.1.0.10", Ready: true}, {IP: "10.1.0.11"}}, Backends: []string{"10.1.0.10:7/udp", "10.1.0.10:80/tcp"}},
					{Cluster: "west", ClusterID: 2, Usable: false, Reason: "connection down: health probes failed 3 times in a row (last: timeout after 300ms)", ReadyEndpoints: 1,
						Endpoints: []statusapi.ServiceEndpoint{{IP: "10.2.0.10", Ready: true}}, Backends: []string{}},
				},
				Conflicts: []statusapi.ServiceConflict{{Cluster: "north", Field: "type", Message: "exported as Headless, but the oldest export (cluster east) is ClusterSetIP"}}},
		},
		Exports: []statusapi.NodeExport{
			{Export: statusapi.Export{Name: "web", Namespace: "shop", Type: "ClusterSetIP", Ports: []statusapi.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
				Endpoints: []statusapi.ServiceEndpoint{{IP: "10.1.0.10", Ready: true}}}, Source: "config"},
			{Export: statusapi.Export{Name: "web", Namespace: "shop", Type: "ClusterSetIP", Ports: []statusapi.ServicePort{{Port: 8080, Protocol: "TCP"}}}, Source: "runtime", Shadowed: "config"},
		},
		Sync: statusapi.ExportSync{InSync: true, Revision: 42},
	}
}

func TestStatusServicesSectionMatchesGolden(t *testing.T) {
	tests := []struct {
		name, golden, format string
		services             func() *statusapi.Services
	}{
		{"imports per cluster with what the maps hold, the exports and their sync", "status_services.golden", "table", fixtureServices},
		{"the wide table lists the backends in the maps", "status_services_wide.golden", "wide", fixtureServices},
		{"a gateway-mode cluster's row says which ingress it is reached through", "status_services_gateway.golden", "table", func() *statusapi.Services {
			s := fixtureServices()
			c := &s.Imports[0].Clusters[len(s.Imports[0].Clusters)-1]
			c.GatewayMode = true
			c.Reason = "connected (not probed); gateway mode: through the ingress of gateway b1 at 242.0.0.2:15000/tcp"
			return s
		}},
		{"an agent that has no imports yet says DNS answers SERVFAIL", "status_services_unknown.golden", "table", func() *statusapi.Services {
			return &statusapi.Services{ImportSelector: "", LoadBalancer: statusapi.LoadBalancer{Error: "cgroupPath: no cgroup2 hierarchy at /sys/fs/cgroup or /sys/fs/cgroup/unified"},
				Exports: []statusapi.NodeExport{{Export: statusapi.Export{Name: "web", Namespace: "shop", Type: "ClusterSetIP"}, Source: "runtime"}},
				Sync:    statusapi.ExportSync{Error: "connection refused"}}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := fixtureStatus()
			s.Connections = s.Connections[1:2]
			s.Connections[0].Traffic = &statusapi.Traffic{RxPackets: 10, RxBytes: 1500, TxPackets: 12, TxBytes: 2048}
			s.Services = tt.services()
			var buf bytes.Buffer
			if err := printStatus(&buf, tt.format, s, statusNow); err != nil {
				t.Fatal(err)
			}
			golden(t, tt.golden, buf.Bytes())
		})
	}
}

func TestServiceExportFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string // in the usage error; "" means valid
	}{
		{"a port without a name, protocol or number is refused naming the flag and value", []string{"--port", "http:x/TCP"}, `--port "http:x/TCP": "x" is not a port number`},
		{"a port out of range is refused", []string{"--port", "http:70000/TCP"}, `--port "http:70000/TCP"`},
		{"an unknown protocol is refused", []string{"--port", "http:80/ICMP"}, `protocol "ICMP" is not TCP, UDP or SCTP`},
		{"an empty port name is refused", []string{"--port", ":80/TCP"}, `empty port name`},
		{"an endpoint that is no IP is refused", []string{"--port", "http:80/TCP", "--endpoint", "web-0"}, `--endpoint "web-0": "web-0" is not a unicast IP address`},
		{"an endpoint key that is unknown is refused", []string{"--port", "http:80/TCP", "--endpoint", "10.1.0.1,weight=3"}, `unknown key "weight"`},
		{"an endpoint readiness that is no bool is refused", []string{"--port", "http:80/TCP", "--endpoint", "10.1.0.1,ready=maybe"}, `ready="maybe" is not true or false`},
		{"a bad type is refused", []string{"--port", "http:80/TCP", "--type", "NodePort"}, `--type "NodePort"`},
		{"a bad affinity is refused", []string{"--port", "http:80/TCP", "--affinity", "near"}, `--affinity "near"`},
		{"bad labels are refused", []string{"--port", "http:80/TCP", "--labels", "a b=c"}, `--labels "a b=c"`},
		{"a ClusterSetIP service without ports is refused by the export rules", nil, "export.ports: a ClusterSetIP service needs at least one port"},
		{"two unnamed ports are refused by the export rules", []string{"--port", "80", "--port", "81"}, "export.ports[0].name: is required"},
		{"a bad namespace is refused", []string{"--port", "80", "-n", "Shop_1"}, "--namespace"},
		{"a headless service needs no port", []string{"--type", "Headless", "--endpoint", "10.1.0.1,hostname=db-0"}, ""},
	}
	missing := filepath.Join(t.TempDir(), "no.sock")
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"service", "export", "web", "--socket", missing}, tt.args...)
			_, err := runCablectl(args...)
			var ue usageError
			if tt.want == "" {
				if err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "cannot reach agent") {
					t.Errorf("valid flags: %v, want only the unreachable agent", err)
				}
				return
			}
			if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want a usage error containing %q", err, tt.want)
			}
		})
	}
}

// fakeAgent serves the export API on a unix socket and records what it was sent.
type fakeAgent struct {
	mu       sync.Mutex
	exported map[string]statusapi.Export
}

func (f *fakeAgent) serve(t *testing.T) string {
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
	mux.HandleFunc("PUT "+statusapi.ExportsPath+"{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		var x statusapi.Export
		_ = json.NewDecoder(r.Body).Decode(&x)
		f.mu.Lock()
		f.exported[x.Namespace+"/"+x.Name] = x
		f.mu.Unlock()
		if x.Type == "" {
			x.Type = "ClusterSetIP"
		}
		_ = json.NewEncoder(w).Encode(statusapi.ExportResult{Export: x, Source: "runtime"})
	})
	mux.HandleFunc("DELETE "+statusapi.ExportsPath+"{ns}/{name}", func(w http.ResponseWriter, r *http.Request) {
		k := r.PathValue("ns") + "/" + r.PathValue("name")
		f.mu.Lock()
		_, ok := f.exported[k]
		delete(f.exported, k)
		f.mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusConflict)
			_ = json.NewEncoder(w).Encode(statusapi.Error{Error: "export refused: " + k + " is defined in the agent config file (exports[0]); remove it there"})
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET "+statusapi.ServicesPath, func(w http.ResponseWriter, _ *http.Request) { _ = json.NewEncoder(w).Encode(fixtureServices()) })
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(func() { _ = srv.Shutdown(context.Background()) })
	return sock
}

func TestServiceExportAndUnexportTalkToTheAgent(t *testing.T) {
	f := &fakeAgent{exported: map[string]statusapi.Export{}}
	sock := f.serve(t)
	out, err := runCablectl("service", "export", "web", "--namespace", "shop", "--port", "http:80/tcp", "--port", "echo:7/UDP",
		"--endpoint", "10.1.0.10", "--endpoint", "10.1.0.11,hostname=web-1,ready=false", "--labels", "tier=front", "--affinity", "none", "--socket", sock)
	if err != nil {
		t.Fatalf("export: %v\n%s", err, out)
	}
	golden(t, "service_export.golden", []byte(out))
	x := f.exported["shop/web"]
	if len(x.Ports) != 2 || x.Ports[0].Protocol != "TCP" || x.Ports[1].Port != 7 || len(x.Endpoints) != 2 || x.Endpoints[1].Ready ||
		x.Endpoints[1].Hostname != "web-1" || x.Labels["tier"] != "front" || x.Affinity != "none" {
		t.Errorf("sent %+v", x)
	}
	if out, err := runCablectl("service", "unexport", "web", "-n", "shop", "--socket", sock); err != nil || out != "service shop/web unexported\n" {
		t.Errorf("unexport: %v %q", err, out)
	}
	_, err = runCablectl("service", "unexport", "web", "-n", "shop", "--socket", sock)
	var ue usageError
	if err == nil || errors.As(err, &ue) || !strings.Contains(err.Error(), "defined in the agent config file") {
		t.Errorf("a refused unexport: %v, want the agent's reason with exit 1", err)
	}
	lb, err := agentBackends(context.Background(), sock, "shop", "web")
	if err != nil || len(lb.Held) != 1 || !lb.Held[backendKey{ClusterID: 1, IP: mustAddr("10.1.0.10")}] {
		t.Errorf("agent backends %+v %v", lb, err)
	}
}

func mustAddr(s string) netip.Addr { return netip.MustParseAddr(s) }
