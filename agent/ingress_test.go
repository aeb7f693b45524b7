package agent

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	"github.com/envoyproxy/go-control-plane/pkg/cache/types"
	client "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/ingress"
	"github.com/cablemesh/cablemesh/agent/ingressport"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/xds"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func ingressPortsAtBroker(b interface {
	Exports(cluster, node string) ([]*apiv1.ServiceExport, int)
}) map[string]uint32 {
	got, _ := b.Exports("east", "east-gw1")
	out := map[string]uint32{}
	for _, e := range got {
		for _, p := range e.GetPorts() {
			out[e.GetName()+"/"+p.GetProtocol()] = p.GetIngressPort()
		}
	}
	return out
}

// TestIngressPortsAndXDS: a gateway gives every exported service port an ingress port, publishes
// it with the export, keeps it across a restart, and serves the ingress over xDS, with a new
// secrets version when the certificate files change.
func TestIngressPortsAndXDS(t *testing.T) {
	b := newBroker(t)
	sock := filepath.Join(t.TempDir(), "xds.sock")
	r, cfg, _, _ := servicesAgent(t, b, &switchPinger{}, func(c *config.Config, _ *Options) {
		c.Ingress.XDS.Listen = sock
		c.Exports = []config.Export{{Name: "web", Namespace: "shop", Ports: []config.ExportPort{{Name: "http", Port: 80, Protocol: "TCP"}, {Name: "dns", Port: 53, Protocol: "UDP"}},
			Endpoints: []config.ExportEndpoint{{IP: "10.1.0.10"}}}}
	})
	want := map[string]uint32{"web/TCP": 15001, "web/UDP": 15000} // key order: 53/UDP before 80/TCP
	eventually(t, "the ingress ports at the broker", func() bool {
		got := ingressPortsAtBroker(b)
		return got["web/TCP"] == want["web/TCP"] && got["web/UDP"] == want["web/UDP"]
	})
	st, _ := getStatus(t, cfg.StatusSocket)
	if st.Ingress == nil || st.Ingress.Mode != "kernel" || len(st.Ingress.Ports) != 2 || st.Ingress.XDS == nil || st.Ingress.XDS.Listen != sock {
		t.Fatalf("ingress status %+v", st.Ingress)
	}

	// The ingress certificate comes from the broker; until then no secret (and no HTTP listener)
	// is served: never the agent's own key.
	eventually(t, "the ingress certificate in status", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Ingress != nil && s.Ingress.XDS != nil && strings.HasPrefix(s.Ingress.XDS.IngressCertificate, "ingress certificate ")
	})
	eventually(t, "the snapshot with the HTTP listener", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Ingress.XDS.Versions["secrets"] != "" && s.Ingress.XDS.Versions["secrets"] != emptySecretsVersion(t)
	})

	// The xDS server serves the TCP listener of the TCP port.
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := client.NewADSClient(ctx, &core.Node{Id: "unit-envoy"}, resourcev3.ListenerType)
	if err := c.InitConnect(cc); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Fetch()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range resp.Resources {
		var l listener.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			t.Fatal(err)
		}
		names = append(names, l.Name)
	}
	if !slices.Contains(names, xds.TCPListenerName(15001)) || !slices.Contains(names, xds.HTTPListener) {
		t.Errorf("listeners %v, want %s and %s", names, xds.TCPListenerName(15001), xds.HTTPListener)
	}
	if err := c.Ack(); err != nil {
		t.Fatal(err)
	}
	checkSecretsAreNotTheAgents(t, cc, cfg.StateDir)

	// A rotated certificate file: new secrets, the other types unchanged.
	before, _ := getStatus(t, cfg.StatusSocket)
	ca := filepath.Join(cfg.StateDir, "ca.crt")
	data, err := os.ReadFile(ca)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ca, append(data, []byte("# rotated\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a new secrets version", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Ingress.XDS.Versions["secrets"] != before.Ingress.XDS.Versions["secrets"]
	})
	after, _ := getStatus(t, cfg.StatusSocket)
	if after.Ingress.XDS.Versions["listeners"] != before.Ingress.XDS.Versions["listeners"] {
		t.Errorf("listeners version changed with the certificate: %v -> %v", before.Ingress.XDS.Versions, after.Ingress.XDS.Versions)
	}
	cancel()

	// A restart keeps the ports, and the file holds them.
	r.stop()
	ports, err := ingressport.Load(cfg.StateDir)
	if err != nil || len(ports) != 2 {
		t.Fatalf("ingress-ports.json: %v %v", ports, err)
	}
	cfg.Exports = append([]config.Export{{Name: "api", Namespace: "aaa", Ports: []config.ExportPort{{Name: "grpc", Port: 9000, Protocol: "TCP"}}}}, cfg.Exports...)
	for i := range cfg.Exports {
		cfg.Exports[i].Endpoints = []config.ExportEndpoint{{IP: "10.1.0.10"}}
	}
	r2 := startAgentWith(t, cfg, fakedriver.New(), func(o *Options) { fakeDatapath(o, nil, nil, nil) })
	waitReady(t, r2)
	eventually(t, "the new export's port at the broker, the old ones unchanged", func() bool {
		got := ingressPortsAtBroker(b)
		return got["web/TCP"] == want["web/TCP"] && got["web/UDP"] == want["web/UDP"] && got["api/TCP"] == 15002
	})
}

// emptySecretsVersion is the secrets version of a snapshot without certificates.
func emptySecretsVersion(t *testing.T) string {
	t.Helper()
	var bd xds.Builder
	snap, err := bd.Build(xds.State{Cluster: "east", MeshDomain: "cablemesh.local"})
	if err != nil {
		t.Fatal(err)
	}
	return snap.Resources[types.Secret].Version
}

// checkSecretsAreNotTheAgents fetches the SDS secrets over cc and checks that the certificate
// served is an ingress certificate whose key is not agent.key's.
func checkSecretsAreNotTheAgents(t *testing.T, cc *grpc.ClientConn, stateDir string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := client.NewADSClient(ctx, &core.Node{Id: "unit-sds"}, resourcev3.SecretType)
	if err := c.InitConnect(cc); err != nil {
		t.Fatal(err)
	}
	resp, err := c.Fetch()
	if err != nil {
		t.Fatal(err)
	}
	agentKey, err := os.ReadFile(filepath.Join(stateDir, "agent.key"))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, a := range resp.Resources {
		var sec tlsv3.Secret
		if err := a.UnmarshalTo(&sec); err != nil {
			t.Fatal(err)
		}
		tc := sec.GetTlsCertificate()
		if tc == nil {
			continue
		}
		found = true
		if bytes.Equal(tc.GetPrivateKey().GetInlineBytes(), agentKey) {
			t.Errorf("secret %s serves agent.key", sec.Name)
		}
		blk, _ := pem.Decode(tc.GetCertificateChain().GetInlineBytes())
		leaf, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(leaf.ExtKeyUsage, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}) || !strings.HasPrefix(leaf.Subject.Organization[0], "cablemesh:ingress:") {
			t.Errorf("secret %s: certificate %v with usages %v, want an ingress serving certificate", sec.Name, leaf.Subject, leaf.ExtKeyUsage)
		}
	}
	if !found {
		t.Error("no TLS certificate secret served")
	}
}

// TestAReloadToLoopbackTCPXDSIsRefused: a live reload that moves ingress.xds.listen to loopback
// TCP is refused whole, naming the field; the unix socket keeps serving.
func TestAReloadToLoopbackTCPXDSIsRefused(t *testing.T) {
	registerReloadDrivers()
	b := multiBroker(t)
	base := testConfig(t, b, true)
	sock := filepath.Join(t.TempDir(), "xds.sock")
	listen := fmt.Sprintf("ingress: {mode: envoy, xds: {listen: %q}}\n", sock)
	r, cfg, path, _ := startReloadAgent(t, reloadConfigText(b, base, bothDrivers, listen), nil)
	waitReady(t, r)
	eventually(t, "the xDS server in status", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Ingress != nil && s.Ingress.XDS != nil && s.Ingress.XDS.Listen == sock
	})
	tries := 0
	eventually(t, "status names the refused field", func() bool {
		// Written again (a new comment, a new hash) until seen: the first write may come before
		// the agent's file watch is armed.
		tries++
		writeRenamed(t, path, reloadConfigText(b, base, bothDrivers, fmt.Sprintf("# try %d\ningress: {mode: envoy, xds: {listen: \"127.0.0.1:18000\"}}\n", tries)))
		time.Sleep(300 * time.Millisecond)
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Config != nil && len(s.Config.Refused) == 1 && s.Config.Refused[0].Field == "ingress.xds.listen" &&
			strings.Contains(s.Config.Refused[0].Message, `"127.0.0.1:18000" is a TCP address`)
	})
	s, _ := getStatus(t, cfg.StatusSocket)
	if s.Ingress.XDS.Listen != sock {
		t.Errorf("xDS listen in status %q after the refused reload, want %q", s.Ingress.XDS.Listen, sock)
	}
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c := client.NewADSClient(ctx, &core.Node{Id: "after-reload"}, resourcev3.ListenerType)
	if err := c.InitConnect(cc); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Fetch(); err != nil {
		t.Errorf("the unix socket stopped serving after the refused reload: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", "127.0.0.1:18000", time.Second); err == nil {
		conn.Close()
		t.Error("something listens on 127.0.0.1:18000 after the refused reload")
	}
}

// TestAnOldBrokerGetsNoAgentKeyServed: a broker without Agent.IssueIngressCertificate leaves
// the ingress without a certificate: no secret is served (never agent.key), and status says why.
func TestAnOldBrokerGetsNoAgentKeyServed(t *testing.T) {
	b := newBroker(t)
	b.ActAsOldBroker()
	sock := filepath.Join(t.TempDir(), "xds.sock")
	_, cfg, _, _ := servicesAgent(t, b, &switchPinger{}, func(c *config.Config, _ *Options) {
		c.Ingress.XDS.Listen = sock
	})
	eventually(t, "status says the broker issues no ingress certificate", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Ingress != nil && strings.Contains(s.Ingress.Error, "does not issue ingress certificates") &&
			s.Ingress.XDS != nil && strings.Contains(s.Ingress.XDS.IngressCertificate, "upgrade the broker")
	})
	s, _ := getStatus(t, cfg.StatusSocket)
	if s.Ingress.XDS.Versions["secrets"] != emptySecretsVersion(t) {
		t.Errorf("secrets version %q, want that of no secrets", s.Ingress.XDS.Versions["secrets"])
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, ingress.IngressKeyFile)); err == nil {
		t.Error("an ingress key was written without a certificate")
	}
}
