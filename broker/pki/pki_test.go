package pki

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/api/jointoken"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

var loopback = []net.IP{net.IPv4(127, 0, 0, 1).To4()}

func TestMaterialIsCreatedOnceAndReused(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	p1, created, err := LoadOrCreate(dir, loopback, now)
	if err != nil || !created {
		t.Fatalf("first start: created=%v err=%v", created, err)
	}
	p2, created, err := LoadOrCreate(dir, loopback, now)
	if err != nil || created {
		t.Fatalf("second start: created=%v err=%v", created, err)
	}
	if !p1.CACert.Equal(p2.CACert) || !bytes.Equal(p1.TokenKey, p2.TokenKey) || !bytes.Equal(p1.AdminCert, p2.AdminCert) ||
		!bytes.Equal(p1.ServerTLS.Certificate[0], p2.ServerTLS.Certificate[0]) || !bytes.Equal(p1.CAPEM, p2.CAPEM) {
		t.Fatal("a second start changed the CA, token key, admin or serving certificate")
	}
	if len(p1.TokenKey) < 32 {
		t.Fatalf("token key is %d bytes", len(p1.TokenKey))
	}
	for _, f := range []string{CACertFile, CAKeyFile, ServerCertFile, ServerKeyFile, AdminCertFile, AdminKeyFile, TokenKeyFile} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil || st.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v, mode %v; want 0600", f, err, st.Mode().Perm())
		}
	}
	leaf := p1.ServerTLS.Leaf
	if err := leaf.VerifyHostname(apiv1.BrokerServerName); err != nil {
		t.Fatalf("serving certificate: %v", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: p1.CAPool(), DNSName: apiv1.BrokerServerName}); err != nil {
		t.Fatalf("serving certificate does not verify against the CA: %v", err)
	}
	if len(p1.ServerTLS.Certificate) != 2 || !bytes.Equal(p1.ServerTLS.Certificate[1], p1.CACert.Raw) {
		t.Fatal("serving chain is not [leaf, CA]")
	}
	// A new listen IP reissues the serving certificate only.
	p3, _, err := LoadOrCreate(dir, append(loopback, net.ParseIP("192.0.2.7")), now)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(p3.ServerTLS.Certificate[0], p1.ServerTLS.Certificate[0]) || !p3.CACert.Equal(p1.CACert) || !bytes.Equal(p3.AdminCert, p1.AdminCert) {
		t.Fatal("a new listen IP should reissue the serving certificate and keep the rest")
	}
	if err := p3.ServerTLS.Leaf.VerifyHostname("192.0.2.7"); err != nil {
		t.Fatalf("reissued serving certificate lacks the new IP: %v", err)
	}
	admin, _ := pem.Decode(p1.AdminCert)
	ac, _ := x509.ParseCertificate(admin.Bytes)
	if id, err := IdentityOf(ac); err != nil || !id.Admin {
		t.Fatalf("admin certificate identity %+v, %v", id, err)
	}
}

func TestACorruptKeyStopsTheStartInsteadOfReplacingTheCA(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := LoadOrCreate(dir, loopback, time.Now()); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(dir, CAKeyFile), []byte("junk"), 0o600)
	if _, _, err := LoadOrCreate(dir, loopback, time.Now()); err == nil || !strings.Contains(err.Error(), "load mesh CA") {
		t.Fatalf("corrupt CA key: %v, want a load mesh CA error", err)
	}
}

func csr(t *testing.T, key any) []byte {
	t.Helper()
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: "whoever"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der})
}

func TestAgentCertificates(t *testing.T) {
	p, _, err := LoadOrCreate(t.TempDir(), loopback, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	certPEM, err := p.SignAgentCSR(csr(t, key), "east", "uid-1", "gw1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := pem.Decode(certPEM)
	cert, _ := x509.ParseCertificate(b.Bytes)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: p.CAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Fatalf("agent certificate does not verify as a client certificate: %v", err)
	}
	id, err := IdentityOf(cert)
	if err != nil || id != (Identity{Cluster: "east", ClusterUID: "uid-1", Node: "gw1", Serial: Serial(cert), NotAfter: cert.NotAfter}) {
		t.Fatalf("identity %+v, %v; want east/gw1 uid-1 (not the CSR's CN)", id, err)
	}
	if d := time.Until(cert.NotAfter); d < Validity-time.Hour || d > Validity+time.Hour {
		t.Fatalf("validity %v, want about %v", d, Validity)
	}

	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	bad := csr(t, key)
	bad[len(bad)/2] ^= 1
	tests := []struct {
		name, want string
		in         []byte
	}{
		{"not PEM", "not a PEM", []byte("hello")},
		{"an Ed25519 key", "not accepted", csr(t, edKey)},
		{"a certificate instead of a CSR", "not a PEM", certPEM},
		{"a corrupted CSR", "csr_pem", bad},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			if _, err := p.SignAgentCSR(tt.in, "east", "uid-1", "gw1", time.Now()); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("got %v, want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestACertificateWithoutACablemeshIdentityIsRefused(t *testing.T) {
	if _, err := IdentityOf(&x509.Certificate{Subject: pkix.Name{CommonName: "x"}}); err == nil {
		t.Fatal("accepted a certificate with no identity")
	}
}

func TestRotateKeepsThePreviousCATrustedAndServingUntilFinished(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	p, _, err := LoadOrCreate(dir, loopback, now)
	if err != nil {
		t.Fatal(err)
	}
	old := p.CACert
	q, err := p.Rotate(dir, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if q.CACert.Equal(old) || !q.Previous.Equal(old) || !q.ServingCA().Equal(old) || q.CAHash() != p.CAHash() || q.IssuerHash() == p.IssuerHash() {
		t.Fatal("after Rotate: want a new issuing CA, the old one previous and serving")
	}
	if blocks := bytes.Count(q.CAPEM, []byte("BEGIN CERTIFICATE")); blocks != 2 {
		t.Fatalf("bundle holds %d CAs, want 2", blocks)
	}
	if _, err := q.Rotate(dir, now, time.Hour); !errors.Is(err, ErrRotationInProgress) {
		t.Fatalf("a second rotation: %v", err)
	}
	// A restart during the overlap loads the same state.
	r, _, err := LoadOrCreate(dir, loopback, now.Add(time.Minute))
	if err != nil || r.Previous == nil || !r.CACert.Equal(q.CACert) || !r.ServerTLS.Leaf.Equal(q.ServerTLS.Leaf) {
		t.Fatalf("reload during the overlap: %v", err)
	}
	if _, err := r.ServerTLS.Leaf.Verify(x509.VerifyOptions{Roots: r.CAPool(), DNSName: apiv1.BrokerServerName}); err != nil {
		t.Fatal(err)
	}
	// Client certificates of both CAs verify; new ones come from the new CA.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	b, err := r.SignAgentCSR(csr(t, key), "east", "u", "gw1", now)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	c, _ := x509.ParseCertificate(blk.Bytes)
	chains, err := c.Verify(x509.VerifyOptions{Roots: r.CAPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	if err != nil || c.CheckSignatureFrom(r.CACert) != nil || r.IssuerOfChains(chains) != r.IssuerHash() {
		t.Fatalf("a certificate issued during the overlap is not of the new CA: %v", err)
	}
	// One of the previous CA, verified during the overlap, names the previous CA; once the
	// rotation finished it names none.
	oldChains := [][]*x509.Certificate{{c, r.Previous}}
	if got, want := r.IssuerOfChains(oldChains), jointoken.CAHash(r.Previous.Raw); got != want {
		t.Fatalf("issuer of a chain to the previous CA during the overlap: %q, want %q", got, want)
	}
	f, err := r.FinishRotation(dir, loopback, now)
	if err != nil || f.Previous != nil || !f.ServingCA().Equal(f.CACert) || f.ServerTLS.Leaf.CheckSignatureFrom(f.CACert) != nil {
		t.Fatalf("finish: %v", err)
	}
	if got := f.IssuerOfChains(oldChains); got != "" {
		t.Fatalf("issuer of a chain to the previous CA after the rotation finished: %q, want none", got)
	}
	if got := f.IssuerOfChains(chains); got != f.IssuerHash() {
		t.Fatalf("issuer of a chain to the new CA after the rotation: %q, want %q", got, f.IssuerHash())
	}
	for _, name := range []string{PreviousCACertFile, PreviousCAKeyFile, RotationFile} {
		if _, err := os.Stat(filepath.Join(dir, name)); !os.IsNotExist(err) {
			t.Fatalf("%s is still there", name)
		}
	}
	// An overlap that ended while the broker was down is over at the next load.
	g, err := f.Rotate(dir, now, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	h, _, err := LoadOrCreate(dir, loopback, now.Add(2*time.Hour))
	if err != nil || h.Previous != nil || !h.CACert.Equal(g.CACert) || !h.ServingCA().Equal(g.CACert) {
		t.Fatalf("load after the overlap: %v", err)
	}
}

func TestIngressCertificateIsAServingCertificateThatNamesNoAgent(t *testing.T) {
	p, _, err := LoadOrCreate(t.TempDir(), loopback, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	_, cert, err := p.IssueIngress(csr(t, key), "east", "east-gw1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !IsIngress(cert) || cert.Subject.Organization[0] != "cablemesh:ingress:east" || cert.Subject.CommonName != "east-gw1" {
		t.Errorf("subject %v: not an ingress certificate of east/east-gw1", cert.Subject)
	}
	roots := x509.NewCertPool()
	roots.AddCert(p.CACert)
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Errorf("not a serving certificate of the mesh CA: %v", err)
	}
	// What the broker's TLS layer checks of a client certificate, and what it reads from one.
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		t.Error("the ingress certificate verifies as a client certificate")
	}
	if id, err := IdentityOf(cert); err == nil {
		t.Errorf("IdentityOf reads %v from an ingress certificate", id)
	}
	_, agent, err := p.IssueAgent(csr(t, key), "east", "uid", "east-gw1", time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if IsIngress(agent) {
		t.Error("an agent certificate is taken for an ingress certificate")
	}
}
