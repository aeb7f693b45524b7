package cablectl

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	grpcstatus "google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
)

// joinAgent joins node of cluster with token, as the agent does (pinning the token's CA).
func joinAgent(t *testing.T, cfgPath, token, cluster, node string) error {
	t.Helper()
	cfg, err := adminconfig.Load(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := jointoken.Decode(token)
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: node}}, key)
	tc := &tls.Config{InsecureSkipVerify: true, VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
		for _, r := range raw[1:] {
			if jointoken.CAHash(r) == claims.CAHash {
				return nil
			}
		}
		return fmt.Errorf("no CA %s", claims.CAHash)
	}}
	conn, err := grpc.NewClient("passthrough:///"+cfg.Broker, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = apiv1.NewAgentClient(conn).Join(t.Context(), &apiv1.JoinRequest{Token: token, Cluster: cluster, Node: node,
		CsrPem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})})
	return err
}

func TestJoinTokensNodesAndRevocation(t *testing.T) {
	cfg := startClusterTestBroker(t)
	one, err := runClusterCmd(t, "--config", cfg, "cluster", "join-token", "east", "--pod-cidr", "10.1.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	two, err := runClusterCmd(t, "--config", cfg, "cluster", "join-token", "east", "--max-nodes", "2")
	if err != nil {
		t.Fatal(err)
	}
	one, two = strings.TrimSpace(one), strings.TrimSpace(two)
	if err := joinAgent(t, cfg, one, "east", "gw1"); err != nil {
		t.Fatal(err)
	}
	if err := joinAgent(t, cfg, one, "east", "gw2"); err == nil || !strings.Contains(err.Error(), "join token already used") {
		t.Fatalf("a second node with a one-time token: %v", err)
	}
	for _, n := range []string{"gw2", "gw3"} {
		if err := joinAgent(t, cfg, two, "east", n); err != nil {
			t.Fatalf("a token of 2 nodes, %s: %v", n, err)
		}
	}

	out, err := runClusterCmd(t, "--config", cfg, "cluster", "nodes", "east")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "CLUSTER") || !strings.Contains(lines[0], "CERT-NOT-AFTER") || !strings.Contains(lines[1], "gw1") || !strings.Contains(lines[1], "live") {
		t.Fatalf("cluster nodes:\n%s", out)
	}
	year := fmt.Sprint(time.Now().AddDate(1, 0, 0).UTC().Year())
	if !strings.Contains(lines[1], year+"-") {
		t.Fatalf("cluster nodes does not show the certificate's expiry (%s):\n%s", year, out)
	}

	if out, err := runClusterCmd(t, "--config", cfg, "cluster", "revoke-node", "east", "gw1"); err != nil || !strings.Contains(out, "node east/gw1 revoked") {
		t.Fatalf("revoke-node: %q %v", out, err)
	}
	out, err = runClusterCmd(t, "--config", cfg, "cluster", "nodes", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var nodes struct{ Nodes []nodeCertView }
	if err := json.Unmarshal([]byte(out), &nodes); err != nil || len(nodes.Nodes) != 3 || nodes.Nodes[0].Status != "revoked" || nodes.Nodes[1].Status != "live" {
		t.Fatalf("nodes -o json after the revocation: %v\n%s", err, out)
	}
	if _, err := runClusterCmd(t, "--config", cfg, "cluster", "revoke-node", "east", "nope"); err == nil || isClusterUsageErr(err) || !strings.Contains(err.Error(), `node "nope" of cluster "east" not found`) {
		t.Fatalf("revoking an unknown node: %v", err)
	}
	if _, err := runClusterCmd(t, "--config", cfg, "cluster", "revoke-node", "east"); !isClusterUsageErr(err) {
		t.Fatalf("revoke-node without a node: %v", err)
	}
	if _, err := runClusterCmd(t, "--config", cfg, "cluster", "join-token", "west", "--pod-cidr", "127.0.0.0/8"); !isClusterUsageErr(err) || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("a loopback pod CIDR: %v", err)
	}
}

func TestCertListAdminRenewAndCARotation(t *testing.T) {
	cfg := startClusterTestBroker(t)
	out, err := runClusterCmd(t, "--config", cfg, "cert", "list")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "admin") || !strings.Contains(out, "issuing,serving") || !strings.Contains(out, "NOT-AFTER") {
		t.Fatalf("cert list:\n%s", out)
	}

	renewed := filepath.Join(t.TempDir(), "admin.yaml")
	out, err = runClusterCmd(t, "--config", cfg, "admin", "renew", "--out", renewed)
	if err != nil || !strings.Contains(out, "admin certificate valid until") {
		t.Fatalf("admin renew: %q %v", out, err)
	}
	if st, err := os.Stat(renewed); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("renewed admin.yaml: %v", err)
	}
	if _, err := runClusterCmd(t, "--config", renewed, "cluster", "list"); err != nil {
		t.Fatalf("the renewed admin.yaml: %v", err)
	}

	out, err = runClusterCmd(t, "--config", cfg, "ca", "rotate", "--overlap", "2h")
	if err != nil || strings.Count(out, "CA sha256:") != 2 || !strings.Contains(out, "previous, trusted until") {
		t.Fatalf("ca rotate: %q %v", out, err)
	}
	// The broker rewrote its own admin.yaml; the renewed one (old CA) works during the overlap.
	for _, c := range []string{cfg, renewed} {
		if _, err := runClusterCmd(t, "--config", c, "cluster", "list"); err != nil {
			t.Fatalf("%s during the overlap: %v", c, err)
		}
	}
	if out, err := runClusterCmd(t, "--config", cfg, "cert", "list", "-o", "json"); err != nil || !strings.Contains(out, `"trustedUntil"`) {
		t.Fatalf("cert list during the overlap: %q %v", out, err)
	}
	if _, err := runClusterCmd(t, "--config", cfg, "ca", "rotate"); err == nil || !strings.Contains(err.Error(), "rotation is in progress") {
		t.Fatalf("a second rotation: %v", err)
	}
	if out, err := runClusterCmd(t, "--config", cfg, "ca", "rotate", "--finish"); err != nil || strings.Count(out, "CA sha256:") != 1 {
		t.Fatalf("ca rotate --finish: %q %v", out, err)
	}
	if _, err := runClusterCmd(t, "--config", cfg, "cluster", "list"); err != nil {
		t.Fatalf("the broker's admin.yaml after the rotation: %v", err)
	}
	if _, err := runClusterCmd(t, "--config", renewed, "cluster", "list"); err == nil {
		t.Fatal("an admin.yaml of the dropped CA still works")
	}
}

func TestApplySaysWhichFieldIsTooLarge(t *testing.T) {
	cfg := startClusterTestBroker(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	big := write("big.yaml", "kind: ClusterConnectionPolicy\nmetadata: {name: big}\nspec: {cableDriver: {name: ipsec, options: {ike_proposals: "+strings.Repeat("a", 5000)+"}}}\n")
	_, err := runClusterCmd(t, "--config", cfg, "apply", "-f", big)
	if err == nil || !strings.Contains(err.Error(), `policy "big": spec.cableDriver.options.ike_proposals: the value is 5000 bytes, at most 1024`) || strings.Contains(err.Error(), "rpc error") {
		t.Fatalf("apply of a too large option: %v", err)
	}
	var many strings.Builder
	for i := range 300 {
		fmt.Fprintf(&many, "---\nkind: ClusterConnectionPolicy\nmetadata: {name: p%d}\nspec: {}\n", i)
	}
	_, err = runClusterCmd(t, "--config", cfg, "apply", "-f", write("many.yaml", many.String()))
	if err == nil || !strings.Contains(err.Error(), "300 policies at once, at most 256") {
		t.Fatalf("apply of too many policies: %v", err)
	}
	gre := write("gre.yaml", "kind: ClusterConnectionPolicy\nmetadata: {name: tunnel}\nspec: {cableDriver: {name: gre}}\n")
	_, err = runClusterCmd(t, "--config", cfg, "apply", "-f", gre)
	if err == nil || !strings.Contains(err.Error(), `policy "tunnel": spec.cableDriver.name: "gre" is not a cable driver`) {
		t.Fatalf("apply of driver gre: %v", err)
	}
	vni := write("vni.yaml", "kind: ClusterConnectionPolicy\nmetadata: {name: v}\nspec: {cableDriver: {name: vxlan, options: {vni: \"0\"}}}\n")
	_, err = runClusterCmd(t, "--config", cfg, "apply", "-f", vni)
	if err == nil || !strings.Contains(err.Error(), `policy "v": spec.cableDriver.options: vxlan option vni="0"`) {
		t.Fatalf("apply of vni 0: %v", err)
	}
}

func TestATransportSizeRefusalIsSaidPlainly(t *testing.T) {
	err := rpcError("apply", grpcstatus.Error(codes.ResourceExhausted, "grpc: received message larger than max (5242880 vs. 4194304)"))
	if !strings.Contains(err.Error(), "apply: the request is larger than the broker accepts in one call (received message larger than max (5242880 vs. 4194304)): send less at once") {
		t.Fatalf("got %v", err)
	}
}
