package cablectl

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"sigs.k8s.io/yaml"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
)

// joinTestAgent creates cluster (with pods) if it is new and joins node to it the way an agent
// does, and returns an Agent client with the certificate it got.
func joinTestAgent(t *testing.T, cfgPath, cluster, node, pods string) apiv1.AgentClient {
	t.Helper()
	cfg, err := adminconfig.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := dialTestBroker(t, cfgPath).CreateJoinToken(context.Background(), &apiv1.CreateJoinTokenRequest{Cluster: cluster, PodCidrs: []string{pods}})
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: node}}, key)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM([]byte(cfg.CA))
	dial := func(certs ...tls.Certificate) *grpc.ClientConn {
		conn, err := grpc.NewClient("passthrough:///"+cfg.Broker, grpc.WithTransportCredentials(credentials.NewTLS(
			&tls.Config{RootCAs: pool, ServerName: apiv1.BrokerServerName, Certificates: certs})))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	resp, err := apiv1.NewAgentClient(dial()).Join(context.Background(), &apiv1.JoinRequest{Token: tok.Token, Cluster: cluster, Node: node,
		CsrPem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr})})
	if err != nil {
		t.Fatalf("join %s/%s: %v", cluster, node, err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	cert, err := tls.X509KeyPair(resp.CertificatePem, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	if err != nil {
		t.Fatal(err)
	}
	return apiv1.NewAgentClient(dial(cert))
}

func port(name string, n uint32) *apiv1.ServicePort { return &apiv1.ServicePort{Name: name, Port: n} }

// startServiceTestBroker runs a broker where east, west and north export shop/web (west's
// export conflicts on a port) and west exports shop/db headless, and returns its admin.yaml.
func startServiceTestBroker(t *testing.T) string {
	t.Helper()
	cfg := startClusterTestBroker(t)
	agents := map[string]apiv1.AgentClient{}
	for i, c := range []string{"east", "west", "north"} {
		agents[c] = joinTestAgent(t, cfg, c, "gw1", "10."+string(rune('1'+i))+".0.0/16")
	}
	set := func(cluster string, exports ...*apiv1.ServiceExport) {
		t.Helper()
		if _, err := agents[cluster].SetExports(context.Background(), &apiv1.SetExportsRequest{Exports: exports}); err != nil {
			t.Fatalf("set exports of %s: %v", cluster, err)
		}
	}
	set("east", &apiv1.ServiceExport{Namespace: "shop", Name: "web", Ports: []*apiv1.ServicePort{port("http", 80), port("https", 443)},
		Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.6", Hostname: "web-1"}, {Ip: "10.1.0.5", Hostname: "web-0", Ready: true}}})
	set("west",
		&apiv1.ServiceExport{Namespace: "shop", Name: "web", Ports: []*apiv1.ServicePort{port("http", 8080)}, Affinity: "none",
			Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.2.0.7", Ready: true}}},
		&apiv1.ServiceExport{Namespace: "shop", Name: "db", Type: "Headless",
			Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.2.0.9", Hostname: "db-0", Ready: true}}})
	set("north", &apiv1.ServiceExport{Namespace: "shop", Name: "web", Ports: []*apiv1.ServicePort{port("http", 80)},
		Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.3.0.5", Ready: true}}})
	return cfg
}

func TestServiceCommandsAgainstARealBroker(t *testing.T) {
	cfg := startServiceTestBroker(t)

	out, err := runClusterCmd(t, "--config", cfg, "service", "list")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "service-list.golden", []byte(out))

	out, err = runClusterCmd(t, "--config", cfg, "service", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var items []map[string]any
	if err := json.Unmarshal([]byte(out), &items); err != nil {
		t.Fatalf("list -o json is not a JSON list: %v\n%s", err, out)
	}
	if len(items) != 2 {
		t.Fatalf("%d items, want db and web", len(items))
	}
	for _, k := range []string{"name", "namespace", "type", "vip", "vips", "ports", "clusters", "conflicts"} {
		if _, ok := items[1][k]; !ok {
			t.Errorf("item lacks %q: %v", k, items[1])
		}
	}
	var web serviceListItem
	b, _ := json.Marshal(items[1])
	if err := json.Unmarshal(b, &web); err != nil {
		t.Fatal(err)
	}
	if web.Name != "web" || web.Namespace != "shop" || web.Type != "ClusterSetIP" || web.VIP != "241.0.0.1" ||
		len(web.Ports) != 2 || web.Ports[0] != (servicePortView{Name: "http", Port: 80, Protocol: "TCP"}) ||
		strings.Join(web.Clusters, ",") != "east,north" ||
		len(web.Conflicts) != 1 || web.Conflicts[0].Cluster != "west" || web.Conflicts[0].Field != "ports" || !strings.Contains(web.Conflicts[0].Message, `port "http" is 8080/TCP`) {
		t.Fatalf("web: %+v", web)
	}
	if db := items[0]; db["vip"] != "" || db["type"] != "Headless" || len(db["ports"].([]any)) != 0 || len(db["conflicts"].([]any)) != 0 {
		t.Fatalf("db: %v; want a headless service with vip \"\" and empty lists", db)
	}
	out, err = runClusterCmd(t, "--config", cfg, "service", "list", "-o", "yaml")
	if err != nil {
		t.Fatal(err)
	}
	var fromYAML []serviceListItem
	if err := yaml.Unmarshal([]byte(out), &fromYAML); err != nil || len(fromYAML) != 2 || fromYAML[1].VIP != "241.0.0.1" {
		t.Fatalf("list -o yaml: %v %+v\n%s", err, fromYAML, out)
	}

	out, err = runClusterCmd(t, "--config", cfg, "service", "describe", "web", "-n", "shop")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "service-describe.golden", []byte(out))
	out, err = runClusterCmd(t, "--config", cfg, "service", "describe", "db", "--namespace", "shop", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var db serviceDescribeView
	if err := json.Unmarshal([]byte(out), &db); err != nil {
		t.Fatalf("describe -o json: %v\n%s", err, out)
	}
	if db.Type != "Headless" || len(db.VIPs) != 0 || len(db.Clusters) != 1 || db.Clusters[0].Name != "west" || db.Clusters[0].ID != 2 ||
		len(db.Clusters[0].Endpoints) != 1 || db.Clusters[0].Endpoints[0].Hostname != "db-0" || !db.Clusters[0].Endpoints[0].Ready ||
		db.Clusters[0].Endpoints[0].InLocalMaps != nil {
		t.Fatalf("describe db: %+v", db)
	}
	if out, err := runClusterCmd(t, "--config", cfg, "service", "describe", "web", "-n", "shop", "-o", "yaml"); err != nil || !strings.Contains(out, "imported: false") {
		t.Fatalf("describe -o yaml: %v\n%s", err, out)
	}

	_, err = runClusterCmd(t, "--config", cfg, "service", "describe", "web")
	if err == nil || isClusterUsageErr(err) || err.Error() != "service default/web not found: no cluster exports it (see cablectl service list)" {
		t.Fatalf("describe in the wrong namespace: %v; want a failure (exit 1) saying it is not found", err)
	}
}

func TestServiceCommandsRefuseBadUsageBeforeDialling(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "missing.yaml")
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"an unknown output format", []string{"service", "list", "-o", "wide"}, `--output "wide"`},
		{"list with an argument", []string{"service", "list", "web"}, "takes no arguments"},
		{"describe without a name", []string{"service", "describe"}, "needs NAME"},
		{"a name that is no DNS label", []string{"service", "describe", "Web_1"}, `service name "Web_1" is not a DNS label`},
		{"a namespace that is no DNS label", []string{"service", "describe", "web", "-n", "Shop"}, `--namespace: namespace "Shop" is not a DNS label`},
		{"describe with an unknown output format", []string{"service", "describe", "web", "-o", "xml"}, `--output "xml"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := runClusterCmd(t, append([]string{"--config", cfg}, tt.args...)...)
			if !isClusterUsageErr(err) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want a usage error containing %q", err, tt.want)
			}
		})
	}
	if _, err := runClusterCmd(t, "--config", cfg, "service", "list"); err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("a missing admin config: %v, want a failure naming the file", err)
	}
}

// TestServiceDescribeWithLocalMapsGolden: the seam for the agent-side part of describe: an
// import with what a local agent's eBPF maps hold of its backends.
func TestServiceDescribeWithLocalMapsGolden(t *testing.T) {
	imp := &apiv1.ServiceImport{Namespace: "shop", Name: "web", Type: "ClusterSetIP", Vips: []string{"241.0.0.1", "fd00:241::1"},
		Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
		Clusters: []*apiv1.ImportedCluster{
			{Cluster: "east", ClusterId: 1, Affinity: "local", Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
				Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.5", Ready: true}, {Ip: "10.1.0.6", Ready: false}}},
			{Cluster: "west", ClusterId: 2, Affinity: "local", Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP", IngressPort: 30080}},
				Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.2.0.5", Ready: true}}},
		},
	}
	exports := []*apiv1.ServiceExport{
		{Cluster: "east", Node: "gw2", Namespace: "shop", Name: "web"}, {Cluster: "east", Node: "gw1", Namespace: "shop", Name: "web"},
		{Cluster: "west", Node: "gw1", Namespace: "shop", Name: "web"}, {Cluster: "west", Node: "gw1", Namespace: "shop", Name: "other"},
	}
	local := &localBackends{Source: "agent east/gw1", Held: map[backendKey]bool{
		{ClusterID: 1, IP: netip.MustParseAddr("10.1.0.5")}: true,
		{ClusterID: 2, IP: netip.MustParseAddr("10.2.0.5")}: true,
	}}
	v := describeService(imp, exports, map[string]uint32{"east": 1, "west": 2}, 42, local)
	var buf bytes.Buffer
	if err := printServiceDescribe(&buf, "table", v); err != nil {
		t.Fatal(err)
	}
	golden(t, "service-describe-datapath.golden", buf.Bytes())
	if e := v.Clusters[0].Endpoints[1]; e.InLocalMaps == nil || *e.InLocalMaps {
		t.Fatalf("east's not-ready endpoint: %+v, want inLocalMaps false", e)
	}
	if strings.Join(v.Clusters[0].Nodes, ",") != "gw1,gw2" || strings.Join(v.Clusters[1].Nodes, ",") != "gw1" {
		t.Fatalf("nodes %v %v", v.Clusters[0].Nodes, v.Clusters[1].Nodes)
	}
}
