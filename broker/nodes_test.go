package broker

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"testing"

	"google.golang.org/grpc/codes"
	grpcstatus "google.golang.org/grpc/status"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// A join token once worked again and again, and a second join could take the
// node name of the live gateway and overwrite its endpoint. These tests use only what the API
// had before the fix, so that they fail against the old broker.

func TestASecondJoinWithTheSameTokenCannotTakeTheGatewaysName(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	tok := b.token("east", "10.1.0.0/16")
	gw := mustJoin(t, b.addr, tok, "east", "gw1")
	if _, err := gw.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1")}); err != nil {
		t.Fatal(err)
	}

	// Whoever holds the token joins again as gw1 and as another node.
	intruder, err := join(t, b.addr, tok, "east", "gw1")
	wantCode(t, err, codes.AlreadyExists, `node "gw1" of cluster "east" already holds a live certificate`, "cablectl cluster revoke-node east gw1")
	if intruder != nil {
		t.Fatal("the intruder got a certificate")
	}
	_, err = join(t, b.addr, tok, "east", "gw2")
	wantCode(t, err, codes.Unauthenticated, "join token already used")

	// The real gateway is untouched, and keeps working.
	if got := b.list().Endpoints; len(got) != 1 || got[0].PrivateIp != "192.0.2.1" {
		t.Fatalf("endpoints %v, want gw1 at 192.0.2.1 only", got)
	}
	if _, err := gw.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{}); err != nil {
		t.Fatalf("the real gateway's heartbeat: %v", err)
	}
}

func TestAJoinTokenServesAtMostMaxNodesAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	b := startBroker(t, dir, brokerOpts{durable: true})
	resp, err := b.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.1.0.0/16"}, MaxNodes: 2})
	if err != nil || resp.MaxNodes != 2 {
		t.Fatalf("create a token for 2 nodes: %v %v", resp, err)
	}
	mustJoin(t, b.addr, resp.Token, "east", "gw1")
	addr := b.addr
	b.stop()

	b2 := startBroker(t, dir, brokerOpts{durable: true, addr: addr})
	mustJoin(t, b2.addr, resp.Token, "east", "gw2")
	_, err = join(t, b2.addr, resp.Token, "east", "gw3")
	wantCode(t, err, codes.Unauthenticated, "join token already used", `nodes "gw1", "gw2"`, "at most 2")

	for _, tt := range []struct {
		name string
		max  uint32
		code codes.Code
	}{
		{"too many nodes are refused", 10001, codes.InvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := b2.admin.CreateJoinToken(ctxT(t), &apiv1.CreateJoinTokenRequest{Cluster: "east", MaxNodes: tt.max})
			wantCode(t, err, tt.code, "max_nodes")
		})
	}
}

func TestAJoinWhoseAnswerWasLostMayBeRetriedWithTheSameToken(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	tok := b.token("east", "10.1.0.0/16")
	lost := mustJoin(t, b.addr, tok, "east", "gw1") // the agent never saw this answer
	again := mustJoin(t, b.addr, tok, "east", "gw1")
	if _, err := again.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{}); codeOf(err) != codes.NotFound {
		t.Fatalf("the retried join's certificate: %v, want it to work (NotFound: no endpoint yet)", err)
	}
	_, err := lost.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{})
	wantCode(t, err, codes.Unauthenticated, "no longer good")
	// Once used, the certificate is the node's: the same token cannot replace it.
	_, err = join(t, b.addr, tok, "east", "gw1")
	wantCode(t, err, codes.AlreadyExists, "already holds a live certificate")
}

func TestRevokeNode(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	other := mustJoin(t, b.addr, b.token("east"), "east", "gw2")
	ec := east.client(t, b.addr)
	if _, err := ec.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ec.SetExports(ctxT(t), &apiv1.SetExportsRequest{Exports: []*apiv1.ServiceExport{{Namespace: "shop", Name: "web",
		Ports: []*apiv1.ServicePort{{Port: 80}}}}}); err != nil {
		t.Fatal(err)
	}
	w, err := ec.Watch(ctxT(t), &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, w)

	resp, err := b.admin.RevokeNode(ctxT(t), &apiv1.RevokeNodeRequest{Cluster: "east", Node: "gw1"})
	if err != nil || !resp.Node.Revoked || !resp.EndpointRemoved || resp.ExportsRemoved != 1 {
		t.Fatalf("revoke: %v %v", resp, err)
	}
	// The open watch ends, and every call is refused.
	_, err = w.Recv()
	wantCode(t, err, codes.Unauthenticated, "revoked")
	_, err = ec.Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{})
	wantCode(t, err, codes.Unauthenticated, "agent east/gw1", "revoked")
	_, err = ec.RenewCertificate(ctxT(t), &apiv1.RenewCertificateRequest{CsrPem: csrPEM(t)})
	wantCode(t, err, codes.Unauthenticated, "revoked")
	// The cluster stays, and so does its other node.
	l := b.list()
	if len(l.Clusters) != 1 || len(l.Endpoints) != 0 {
		t.Fatalf("after the revocation: %v", l)
	}
	if _, err := other.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{}); codeOf(err) != codes.NotFound {
		t.Fatalf("gw2 after gw1's revocation: %v", err)
	}
	// The name is free for a new join.
	fresh := mustJoin(t, b.addr, b.token("east"), "east", "gw1")
	if _, err := fresh.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.9")}); err != nil {
		t.Fatalf("the new gw1: %v", err)
	}
	_, err = ec.Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{})
	wantCode(t, err, codes.Unauthenticated, "no longer good")

	t.Run("an unknown node is not found", func(t *testing.T) {
		_, err := b.admin.RevokeNode(ctxT(t), &apiv1.RevokeNodeRequest{Cluster: "east", Node: "gw9"})
		wantCode(t, err, codes.NotFound, `node "gw9" of cluster "east" not found`)
		_, err = b.admin.RevokeNode(ctxT(t), &apiv1.RevokeNodeRequest{Cluster: "nope", Node: "gw1"})
		wantCode(t, err, codes.NotFound, `cluster "nope" not found`)
	})
	t.Run("an agent may not revoke", func(t *testing.T) {
		_, err := apiv1.NewAdminClient(fresh.dial(t, b.addr)).RevokeNode(ctxT(t), &apiv1.RevokeNodeRequest{Cluster: "east", Node: "gw2"})
		wantCode(t, err, codes.PermissionDenied)
	})
}

func TestAnEndpointIsBoundToTheCertificateThatRegisteredIt(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	gw := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	r, err := gw.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1")})
	if err != nil {
		t.Fatal(err)
	}
	if r.Endpoint.CertificateSerial == "" {
		t.Fatal("the endpoint is not bound to a certificate")
	}
	// The binding cannot be forged by the request.
	e := endpoint("east", "gw1", "192.0.2.1")
	e.CertificateSerial = "ff"
	r2, err := gw.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: e})
	if err != nil || r2.Endpoint.CertificateSerial != r.Endpoint.CertificateSerial {
		t.Fatalf("re-register with a made-up serial: %v %v", r2, err)
	}
	// A certificate the node no longer holds (revoked, joined again) is refused by the
	// authorization; the binding itself is admission.CheckBinding's (its table test).
}

func TestRenewCertificate(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	gw := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	if _, err := gw.client(t, b.addr).RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1")}); err != nil {
		t.Fatal(err)
	}
	renew := func(a *agent) *agent {
		t.Helper()
		key, csr := keyAndCSR(t)
		resp, err := a.client(t, b.addr).RenewCertificate(ctxT(t), &apiv1.RenewCertificateRequest{CsrPem: csr})
		if err != nil {
			t.Fatalf("renew: %v", err)
		}
		if resp.NotAfter == nil || resp.Ca == nil || !sameBytes(resp.CaPem, b.srv.currentPKI().CAPEM) {
			t.Fatalf("renew answer lacks expiry or CA: %v", resp)
		}
		return &agent{key: key, cert: resp.CertificatePem, ca: resp.CaPem, cluster: a.cluster, node: a.node}
	}
	gw2 := renew(gw)
	leaf := parseCert(t, gw2.cert)
	if leaf.URIs[0].String() != "cablemesh://cluster/east/node/gw1" || leaf.SerialNumber.Cmp(parseCert(t, gw.cert).SerialNumber) == 0 {
		t.Fatalf("renewed certificate names %v", leaf.URIs)
	}
	// Both the renewed certificate and the one renewed with work (the agent switches when it
	// reconnects); the endpoint's binding follows.
	for _, a := range []*agent{gw, gw2} {
		if _, err := a.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{}); err != nil {
			t.Fatalf("heartbeat after the renewal: %v", err)
		}
	}
	gw3 := renew(gw2)
	if _, err := gw3.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{}); err != nil {
		t.Fatalf("heartbeat with the twice-renewed certificate: %v", err)
	}
	_, err := gw.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{})
	wantCode(t, err, codes.Unauthenticated, "no longer good")
	// A renewal is not a join: it cannot name another node, and a bad CSR is refused.
	_, err = gw3.client(t, b.addr).RenewCertificate(ctxT(t), &apiv1.RenewCertificateRequest{CsrPem: []byte("nope")})
	wantCode(t, err, codes.InvalidArgument, "csr_pem")
	_, err = apiv1.NewAgentClient(dialAdmin(t, b.dir, b.addr)).RenewCertificate(ctxT(t), &apiv1.RenewCertificateRequest{CsrPem: csrPEM(t)})
	wantCode(t, err, codes.PermissionDenied)
}

func TestRenewAdminCertificate(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	key, csr := keyAndCSR(t)
	resp, err := b.admin.RenewAdminCertificate(ctxT(t), &apiv1.RenewCertificateRequest{CsrPem: csr})
	if err != nil {
		t.Fatal(err)
	}
	a := &agent{key: key, cert: resp.CertificatePem, ca: resp.CaPem}
	if _, err := apiv1.NewAdminClient(a.dial(t, b.addr)).ListClusters(ctxT(t), &apiv1.ListClustersRequest{}); err != nil {
		t.Fatalf("the renewed admin certificate: %v", err)
	}
	l, err := apiv1.NewAdminClient(a.dial(t, b.addr)).ListCertificates(ctxT(t), &apiv1.ListCertificatesRequest{})
	if err != nil || l.Admin == nil || l.Admin.Serial != parseCert(t, resp.CertificatePem).SerialNumber.Text(16) || len(l.Cas) != 1 {
		t.Fatalf("list certificates: %v %v", l, err)
	}
}

func codeOf(err error) codes.Code { return grpcstatus.Code(err) }

func keyAndCSR(t *testing.T) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "whatever"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func csrPEM(t *testing.T) []byte {
	_, csr := keyAndCSR(t)
	return csr
}

func parseCert(t *testing.T, b []byte) *x509.Certificate {
	t.Helper()
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatal("no PEM certificate")
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
