package brokerclient

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// pendingSuffix marks the new key and certificate of a renewal before they replace the current
// ones (see writeIdentity).
const pendingSuffix = ".new"

// Keyring holds the agent's current identity. A connection dialled with DialKeyring presents its
// certificate and verifies the broker against its CAs at every handshake, so a renewed
// certificate or a new CA bundle is used by the next handshake, without a restart.
type Keyring struct {
	id atomic.Pointer[Identity]
	mu sync.Mutex // serialises Update
}

// NewKeyring returns a keyring holding id.
func NewKeyring(id *Identity) *Keyring {
	k := &Keyring{}
	k.id.Store(id)
	return k
}

// Identity is the current identity.
func (k *Keyring) Identity() *Identity { return k.id.Load() }

// Set replaces the identity for the handshakes to come.
func (k *Keyring) Set(id *Identity) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.id.Store(id)
}

// Update replaces the identity with f's result, f seeing the current one; no other Set or
// Update runs between. An error leaves the identity as it was.
func (k *Keyring) Update(f func(*Identity) (*Identity, error)) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	next, err := f(k.id.Load())
	if err != nil {
		return err
	}
	k.id.Store(next)
	return nil
}

// TLSConfig is the mTLS client configuration of DialKeyring: the certificate and the CAs are
// read from the keyring at each handshake. The broker's chain is verified in VerifyConnection
// (against the current CAs, for apiv1.BrokerServerName), as the static configuration does.
func (k *Keyring) TLSConfig() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		ServerName: apiv1.BrokerServerName,
		// The chain is verified by VerifyConnection against the keyring's CAs of the moment: a
		// tls.Config's RootCAs cannot change after the connection's credentials are built.
		InsecureSkipVerify: true,
		VerifyConnection:   k.verifyBroker,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c := k.Identity().Cert
			return &c, nil
		},
	}
}

func (k *Keyring) verifyBroker(cs tls.ConnectionState) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("broker presented no certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range cs.PeerCertificates[1:] {
		inter.AddCert(c)
	}
	_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: k.Identity().CAs, Intermediates: inter, DNSName: apiv1.BrokerServerName})
	if err != nil {
		return fmt.Errorf("broker certificate is not valid under the mesh CAs this agent trusts (%s): %w", CAFile, err)
	}
	return nil
}

// DialKeyring opens the mTLS connection to the broker with the keyring's identity (see Dial).
func DialKeyring(broker string, k *Keyring, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return dial(broker, k.TLSConfig(), opts)
}

// WithCAs is id trusting the CAs of bundlePEM instead of its own.
func (id *Identity) WithCAs(bundlePEM []byte) (*Identity, error) {
	cas, err := ParseCAs(bundlePEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range cas {
		pool.AddCert(c)
	}
	return &Identity{Cert: id.Cert, Leaf: id.Leaf, CAs: pool, CAPEM: bytes.Clone(bundlePEM)}, nil
}

// ParseCAs parses a CA bundle: one or more PEM CA certificates, nothing else.
func ParseCAs(bundlePEM []byte) ([]*x509.Certificate, error) {
	var out []*x509.Certificate
	rest := bundlePEM
	for {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("CA bundle: a %q PEM block", blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("CA bundle: %w", err)
		}
		if !c.IsCA {
			return nil, fmt.Errorf("CA bundle: %q is not a CA certificate", c.Subject.CommonName)
		}
		out = append(out, c)
	}
	if len(out) == 0 || len(bytes.TrimSpace(rest)) > 0 {
		return nil, errors.New("CA bundle holds no PEM CA certificate, or trailing data")
	}
	return out, nil
}

// SaveCAs writes the CA bundle to stateDir/ca.crt atomically (the next start, and the next
// handshake through a Keyring set with it, trust exactly these CAs).
func SaveCAs(stateDir string, bundlePEM []byte) error {
	if _, err := ParseCAs(bundlePEM); err != nil {
		return err
	}
	return brokerstate.WriteFileAtomic(filepath.Join(stateDir, CAFile), bundlePEM, 0o644)
}

// RenewalDue says when the certificate leaf should be renewed: two thirds into its lifetime; or
// at once (the zero time) when the broker's CA bundle names an issuing CA other than the one
// that issued leaf, a CA rotation: the certificate must be replaced before its CA stops being
// trusted. reason says which, for the log. A nil bundle (none received yet) leaves the lifetime.
func RenewalDue(leaf *x509.Certificate, bundle *apiv1.CABundle) (at time.Time, reason string) {
	if bundle != nil && bundle.GetIssuingCa() != "" {
		cas, _ := ParseCAs(bundle.GetPem())
		issuer := ""
		for _, ca := range cas {
			if leaf.CheckSignatureFrom(ca) == nil {
				issuer = jointoken.CAHash(ca.Raw)
				break
			}
		}
		switch {
		case issuer == "":
			return time.Time{}, "no CA of the broker's bundle issued this certificate"
		case issuer != bundle.GetIssuingCa():
			r := "the mesh CA is being rotated: this certificate is of CA " + issuer + ", new certificates come from " + bundle.GetIssuingCa()
			if t := bundle.GetPreviousTrustedUntil(); t != nil {
				r += ", and its CA is trusted until " + t.AsTime().UTC().Format(time.RFC3339)
			}
			return time.Time{}, r
		}
	}
	life := leaf.NotAfter.Sub(leaf.NotBefore)
	return leaf.NotBefore.Add(life / 3 * 2), "two thirds of the certificate's lifetime have passed"
}

// Renew replaces the identity cur with a new key and a certificate for it from the broker
// (Agent.RenewCertificate over client, which is authenticated by cur's certificate). The answer
// is checked (a client certificate of the same cluster and node, for the new key, under the CAs
// of the answer's bundle) before anything is written; then ca.crt, agent.key (0600) and agent.crt
// are replaced so that a crash at any point leaves a complete identity (writeIdentity). It
// returns the new identity, trusting the answer's bundle, and the bundle.
func Renew(ctx context.Context, client apiv1.AgentClient, cur *Identity, stateDir string) (*Identity, *apiv1.CABundle, error) {
	kr, err := NewKeyRequest(cur.Leaf.Subject, "agent")
	if err != nil {
		return nil, nil, err
	}
	resp, err := client.RenewCertificate(ctx, &apiv1.RenewCertificateRequest{CsrPem: kr.CSRPEM})
	if err != nil {
		return nil, nil, fmt.Errorf("renew certificate: %w", err)
	}
	bundle := resp.GetCa()
	if bundle == nil {
		bundle = &apiv1.CABundle{Pem: resp.GetCaPem()}
	}
	keyPEM := kr.KeyPEM
	id, err := identityFromPEM(resp.GetCertificatePem(), keyPEM, bundle.GetPem())
	if err != nil {
		return nil, nil, fmt.Errorf("renewal answer: %w", err)
	}
	if _, err := id.Leaf.Verify(x509.VerifyOptions{Roots: id.CAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return nil, nil, fmt.Errorf("renewal answer: not a client certificate of the mesh CAs: %w", err)
	}
	if !sameIdentity(cur.Leaf, id.Leaf) {
		return nil, nil, fmt.Errorf("renewal answer: the certificate names %q, not %q as the current one does", id.Leaf.Subject, cur.Leaf.Subject)
	}
	if err := SaveCAs(stateDir, bundle.GetPem()); err != nil {
		return nil, nil, err
	}
	if err := writeIdentity(stateDir, keyPEM, resp.GetCertificatePem()); err != nil {
		return nil, nil, err
	}
	return id, bundle, nil
}

// sameIdentity says a and b name the same node: subject and URIs.
func sameIdentity(a, b *x509.Certificate) bool {
	uris := func(c *x509.Certificate) []string {
		var out []string
		for _, u := range c.URIs {
			out = append(out, u.String())
		}
		slices.Sort(out)
		return out
	}
	return a.Subject.String() == b.Subject.String() && slices.Equal(uris(a), uris(b))
}

// writeIdentity replaces agent.key and agent.crt. Both go first to agent.key.new and
// agent.crt.new (each written atomically, the certificate last), then are renamed over the
// current ones, the key first. A crash leaves either the old pair (perhaps with the new files
// beside it) or the new key with agent.crt.new: LoadIdentity completes the switch.
func writeIdentity(stateDir string, keyPEM, certPEM []byte) error {
	keyPath, certPath := filepath.Join(stateDir, KeyFile), filepath.Join(stateDir, CertFile)
	if err := brokerstate.WriteFileAtomic(keyPath+pendingSuffix, keyPEM, 0o600); err != nil {
		return err
	}
	if err := brokerstate.WriteFileAtomic(certPath+pendingSuffix, certPEM, 0o644); err != nil {
		return err
	}
	return completePending(stateDir)
}

// completePending finishes a replacement of the key and certificate that writeIdentity began:
// with agent.crt.new present, the new files are complete and are renamed over the current ones;
// an agent.key.new alone is the remains of a replacement that never wrote its certificate, and is
// removed.
func completePending(stateDir string) error {
	keyPath, certPath := filepath.Join(stateDir, KeyFile), filepath.Join(stateDir, CertFile)
	_, certErr := os.Stat(certPath + pendingSuffix)
	if errors.Is(certErr, fs.ErrNotExist) {
		if err := os.Remove(keyPath + pendingSuffix); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("remove an incomplete new agent key: %w", err)
		}
		return nil
	}
	if err := os.Rename(keyPath+pendingSuffix, keyPath); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("replace the agent key: %w", err)
	}
	if err := os.Rename(certPath+pendingSuffix, certPath); err != nil {
		return fmt.Errorf("replace the agent certificate: %w", err)
	}
	d, err := os.Open(stateDir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", stateDir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", stateDir, err)
	}
	return nil
}

// CertificateRefused reports whether err is the broker refusing the agent's certificate for good:
// Unauthenticated, naming the certificate revoked or no longer good (the node joined again, or
// renewed twice since). Retrying with that certificate cannot succeed; the node must join again.
// msg is the broker's words.
func CertificateRefused(err error) (msg string, refused bool) {
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return "", false
	}
	s := se.GRPCStatus()
	if s.Code() != codes.Unauthenticated {
		return "", false
	}
	m := s.Message()
	if strings.Contains(m, "revoked") || strings.Contains(m, "no longer good") || strings.Contains(m, "not good for a renewal") {
		return m, true
	}
	return "", false
}
