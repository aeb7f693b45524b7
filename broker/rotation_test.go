package broker

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/pki"
)

// pemCerts counts the certificates in a PEM bundle and returns the hash of the first.
func pemCerts(b []byte) (n int, first string) {
	for {
		var blk *pem.Block
		if blk, b = pem.Decode(b); blk == nil {
			return n, first
		}
		if n == 0 {
			first = jointoken.CAHash(blk.Bytes)
		}
		n++
	}
}

func TestTheMeshCAIsRotatedWithAnOverlap(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	b := startBroker(t, dir, brokerOpts{durable: true, clock: clk})
	oldCA := b.srv.CAHash()
	oldAdmin, _ := os.ReadFile(filepath.Join(dir, AdminConfigFile))
	gw := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	w, err := gw.client(t, b.addr).Watch(ctxT(t), &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if m := recv(t, w); m.Ca == nil || m.Ca.IssuingCa != oldCA {
		t.Fatalf("the first watch message carries CA %v, want the bundle of %s", m.Ca, oldCA)
	}

	resp, err := b.admin.RotateCA(ctxT(t), &apiv1.RotateCARequest{OverlapSeconds: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Cas) != 2 || !resp.Cas[0].Issuing || resp.Cas[0].Hash == oldCA || resp.Cas[1].Hash != oldCA || !resp.Cas[1].Serving || resp.Cas[1].TrustedUntil == nil {
		t.Fatalf("after the rotation: %v; want a new issuing CA and the old one serving until the overlap ends", resp.Cas)
	}
	newCA := resp.Cas[0].Hash

	// The open watch learns the bundle: both CAs, the serving (old) one first.
	m := recv(t, w)
	if n, first := pemCerts(m.GetCa().GetPem()); n != 2 || first != oldCA || m.Ca.IssuingCa != newCA || m.Ca.PreviousTrustedUntil == nil {
		t.Fatalf("watch CA message %v: %d CAs, first %s", m.Ca, n, first)
	}
	// Certificates of the old CA still work; the broker still serves from it; a second rotation
	// waits for this one.
	if _, err := gw.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{}); codeOf(err) != codes.NotFound {
		t.Fatalf("an old-CA agent certificate during the overlap: %v", err)
	}
	_, err = b.admin.RotateCA(ctxT(t), &apiv1.RotateCARequest{})
	wantCode(t, err, codes.FailedPrecondition, "rotation is in progress")

	// New joins pin the serving CA and get a certificate of the new CA, with the bundle.
	tok := b.token("east")
	if c, _ := jointoken.Decode(tok); c.CAHash != oldCA {
		t.Fatalf("a token issued during the overlap pins %s, want the serving CA %s", c.CAHash, oldCA)
	}
	gw2 := mustJoin(t, b.addr, tok, "east", "gw2")
	if n, first := pemCerts(gw2.ca); n != 2 || first != oldCA {
		t.Fatalf("join answer bundle: %d CAs, first %s", n, first)
	}
	if !issuedBy(t, gw2.cert, b.srv.currentPKI().CACert.Raw) {
		t.Fatal("a certificate issued during the overlap is not of the new CA")
	}
	// gw1 renews into the new CA.
	key, csr := keyAndCSR(t)
	r, err := gw.client(t, b.addr).RenewCertificate(ctxT(t), &apiv1.RenewCertificateRequest{CsrPem: csr})
	if err != nil {
		t.Fatal(err)
	}
	gw1 := &agent{key: key, cert: r.CertificatePem, ca: r.CaPem, cluster: "east", node: "gw1"}
	// The rewritten admin.yaml holds a new-CA admin certificate and the bundle.
	if a, _ := os.ReadFile(filepath.Join(dir, AdminConfigFile)); bytes.Equal(a, oldAdmin) {
		t.Fatal("admin.yaml was not rewritten")
	}
	admin2 := apiv1.NewAdminClient(dialAdmin(t, dir, b.addr))

	// The overlap ends (here: now): the old CA is no longer trusted, the broker serves from the
	// new one.
	fin, err := admin2.RotateCA(ctxT(t), &apiv1.RotateCARequest{Finish: true})
	if err != nil || len(fin.Cas) != 1 || fin.Cas[0].Hash != newCA || !fin.Cas[0].Serving {
		t.Fatalf("finish: %v %v", fin, err)
	}
	// (The old certificate, by a client that trusts the new CA: the broker refuses it.)
	oldCert := &agent{key: gw.key, cert: gw.cert, ca: r.CaPem, cluster: "east", node: "gw1"}
	if _, err := oldCert.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{}); err == nil {
		t.Fatal("a certificate of the dropped CA still works")
	} else {
		t.Logf("a certificate of the dropped CA: %v", err)
	}
	for _, a := range []*agent{gw1, gw2} {
		if _, err := a.client(t, b.addr).Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{}); codeOf(err) != codes.NotFound {
			t.Fatalf("a new-CA certificate after the overlap (%s): %v", a.node, err)
		}
	}
	if _, err := admin2.ListClusters(ctxT(t), &apiv1.ListClustersRequest{}); err != nil {
		t.Fatalf("the rewritten admin.yaml after the overlap: %v", err)
	}
	if _, err := join(t, b.addr, tok, "east", "gw3"); codeOf(err) == codes.OK {
		t.Fatal("a token pinning the dropped CA still joins")
	}
	if _, err := os.Stat(filepath.Join(dir, pki.PreviousCACertFile)); !os.IsNotExist(err) {
		t.Fatalf("the previous CA's file is still there: %v", err)
	}

	t.Run("an overlap that ended while the broker was down is over at start", func(t *testing.T) {
		if _, err := admin2.RotateCA(ctxT(t), &apiv1.RotateCARequest{OverlapSeconds: 60}); err != nil {
			t.Fatal(err)
		}
		addr := b.addr
		b.stop()
		clk.Advance(2 * time.Minute)
		b2 := startBroker(t, dir, brokerOpts{durable: true, clock: clk, addr: addr})
		if p := b2.srv.currentPKI(); p.Previous != nil || p.CAHash() == newCA {
			t.Fatalf("after the restart: previous %v, serving %s", p.Previous != nil, p.CAHash())
		}
	})
}

func issuedBy(t *testing.T, certPEM, caDER []byte) bool {
	t.Helper()
	ca, err := parseDER(caDER)
	if err != nil {
		t.Fatal(err)
	}
	return parseCert(t, certPEM).CheckSignatureFrom(ca) == nil
}

func parseDER(der []byte) (*x509.Certificate, error) { return x509.ParseCertificate(der) }
