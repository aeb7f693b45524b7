package brokerclient

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// testCA is a CA that signs leaves for RenewalDue.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, name string) testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return testCA{cert: c, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

func (ca testCA) leaf(t *testing.T, notBefore time.Time, life time.Duration) *x509.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, err := x509.CreateCertificate(rand.Reader, &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "e1"},
		NotBefore: notBefore, NotAfter: notBefore.Add(life), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return c
}

func TestRenewalIsDueTwoThirdsIntoTheLifetimeOrAtOnceInARotation(t *testing.T) {
	old, next := newTestCA(t, "old"), newTestCA(t, "new")
	start := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	leaf := old.leaf(t, start, 300*24*time.Hour)
	twoThirds := start.Add(200 * 24 * time.Hour)
	bundle := func(issuing testCA, cas ...testCA) *apiv1.CABundle {
		b := &apiv1.CABundle{IssuingCa: jointoken.CAHash(issuing.cert.Raw)}
		for _, c := range cas {
			b.Pem = append(b.Pem, c.pem...)
		}
		return b
	}
	tests := []struct {
		name       string
		bundle     *apiv1.CABundle
		want       time.Time
		wantReason string
	}{
		{"no bundle yet: two thirds into the lifetime", nil, twoThirds, "two thirds"},
		{"the issuing CA issued the certificate: two thirds into the lifetime", bundle(old, old), twoThirds, "two thirds"},
		{"a rotation: another CA issues now, renew at once", bundle(next, old, next), time.Time{}, "being rotated"},
		{"no CA of the bundle issued the certificate: renew at once", bundle(next, next), time.Time{}, "no CA of the broker's bundle"},
		{"a bundle without an issuing CA (an older broker): the lifetime", &apiv1.CABundle{Pem: next.pem}, twoThirds, "two thirds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at, reason := RenewalDue(leaf, tt.bundle)
			if !at.Equal(tt.want) || !strings.Contains(reason, tt.wantReason) {
				t.Errorf("RenewalDue = %v, %q; want %v, %q", at, reason, tt.want, tt.wantReason)
			}
		})
	}
}

// joined is a state dir holding an identity from the fake broker's join.
func joined(t *testing.T) (string, *Identity, func() *Identity) {
	t.Helper()
	b := startBroker(t)
	state := filepath.Join(t.TempDir(), "state")
	id, _, err := Join(context.Background(), JoinParams{Broker: b.Addr(), Cluster: "east", Node: "e1", TokenFile: writeToken(t, b.Token("east", time.Hour)), StateDir: state})
	if err != nil {
		t.Fatal(err)
	}
	renew := func() *Identity {
		t.Helper()
		conn, err := DialKeyring(b.Addr(), NewKeyring(id))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		next, bundle, err := Renew(context.Background(), apiv1.NewAgentClient(conn), id, state)
		if err != nil {
			t.Fatalf("Renew: %v", err)
		}
		if len(bundle.GetPem()) == 0 {
			t.Errorf("Renew returned no CA bundle")
		}
		return next
	}
	return state, id, renew
}

func TestRenewWritesANewKeyAndCertificateThatLoad(t *testing.T) {
	state, id, renew := joined(t)
	next := renew()
	if next.Leaf.SerialNumber.Cmp(id.Leaf.SerialNumber) == 0 || next.Leaf.Subject.CommonName != "e1" {
		t.Fatalf("renewed certificate %v", next.Leaf.Subject)
	}
	loaded, err := LoadIdentity(state)
	if err != nil {
		t.Fatal(err)
	}
	if loaded.Leaf.SerialNumber.Cmp(next.Leaf.SerialNumber) != 0 {
		t.Errorf("LoadIdentity after Renew has serial %s, want %s", loaded.Leaf.SerialNumber, next.Leaf.SerialNumber)
	}
	if fi, err := os.Stat(filepath.Join(state, KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("agent.key: %v, %v", fi, err)
	}
	for _, f := range []string{KeyFile + pendingSuffix, CertFile + pendingSuffix} {
		if _, err := os.Stat(filepath.Join(state, f)); err == nil {
			t.Errorf("%s left behind", f)
		}
	}
}

// TestAnInterruptedRenewalLeavesAUsableIdentity: a crash at any step of writeIdentity leaves a
// key and a certificate that belong together.
func TestAnInterruptedRenewalLeavesAUsableIdentity(t *testing.T) {
	read := func(t *testing.T, p string) []byte {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	tests := []struct {
		name    string
		crash   func(t *testing.T, state string, keyPEM, certPEM []byte)
		wantNew bool
	}{
		{"the new key written, not its certificate: the old pair", func(t *testing.T, state string, keyPEM, _ []byte) {
			mustWrite(t, filepath.Join(state, KeyFile+pendingSuffix), keyPEM)
		}, false},
		{"both new files written, none renamed: the new pair", func(t *testing.T, state string, keyPEM, certPEM []byte) {
			mustWrite(t, filepath.Join(state, KeyFile+pendingSuffix), keyPEM)
			mustWrite(t, filepath.Join(state, CertFile+pendingSuffix), certPEM)
		}, true},
		{"the key renamed, not the certificate: the new pair", func(t *testing.T, state string, keyPEM, certPEM []byte) {
			mustWrite(t, filepath.Join(state, KeyFile), keyPEM)
			mustWrite(t, filepath.Join(state, CertFile+pendingSuffix), certPEM)
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state, id, renew := joined(t)
			oldKey, oldCert := read(t, filepath.Join(state, KeyFile)), read(t, filepath.Join(state, CertFile))
			next := renew()
			newKey, newCert := read(t, filepath.Join(state, KeyFile)), read(t, filepath.Join(state, CertFile))
			// Back to the old pair, then the crash.
			mustWrite(t, filepath.Join(state, KeyFile), oldKey)
			mustWrite(t, filepath.Join(state, CertFile), oldCert)
			tt.crash(t, state, newKey, newCert)
			loaded, err := LoadIdentity(state)
			if err != nil {
				t.Fatalf("LoadIdentity after the crash: %v", err)
			}
			want := id
			if tt.wantNew {
				want = next
			}
			if loaded.Leaf.SerialNumber.Cmp(want.Leaf.SerialNumber) != 0 {
				t.Errorf("loaded serial %s, want %s", loaded.Leaf.SerialNumber, want.Leaf.SerialNumber)
			}
			for _, f := range []string{KeyFile + pendingSuffix, CertFile + pendingSuffix} {
				if _, err := os.Stat(filepath.Join(state, f)); err == nil {
					t.Errorf("%s left behind", f)
				}
			}
		})
	}
}

func mustWrite(t *testing.T, p string, b []byte) {
	t.Helper()
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestCertificateRefusedIsRevokedOrReplacedOnly(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"revoked", status.Error(codes.Unauthenticated, "the certificate of east/e1 was revoked at 2026-11-21T12:00:00Z (cablectl cluster revoke-node); join again with a new token"), true},
		{"replaced, wrapped", fmt.Errorf("heartbeat: %w", status.Error(codes.Unauthenticated, "the certificate of east/e1 (serial 1f) is no longer good: the node joined again")), true},
		{"a renewal refused", status.Error(codes.Unauthenticated, "the certificate of east/e1 is not good for a renewal (revoked or replaced); join again with a new token"), true},
		{"expired is not for good here: the broker may just be early", status.Error(codes.Unauthenticated, "the certificate of east/e1 expired at ...; renew it"), false},
		{"another code", status.Error(codes.PermissionDenied, "revoked"), false},
		{"not a status", fmt.Errorf("revoked"), false},
	}
	for _, tt := range tests {
		if _, got := CertificateRefused(tt.err); got != tt.want {
			t.Errorf("%s: CertificateRefused = %v, want %v", tt.name, got, tt.want)
		}
	}
}
