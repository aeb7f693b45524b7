// Package pki holds the broker's mesh CA and the certificates it issues: the broker's serving
// certificate, the admin client certificate, and agent client certificates signed from the
// agents' CSRs at Join. It also holds the HMAC key that signs join tokens. Everything is created
// on first start and persisted (0600) in the data directory, then reused.
//
// Identities are URI SANs: the admin is cablemesh://admin; an agent is
// cablemesh://cluster/<cluster>/node/<node> plus cablemesh://cluster-uid/<uid>, so the broker can
// refuse certificates of a cluster that was removed (and perhaps created again under the same
// name with a new UID). Certificates last one year (Validity) and are renewed over the API, each
// with its current certificate (the broker's RenewCertificate and RenewAdminCertificate).
//
// # CA rotation
//
// Rotate creates a new CA and keeps the one it replaces as the previous CA, trusted until the
// end of an overlap period:
//
//   - new certificates (agents' and the admin's) are issued from the new CA at once;
//   - client certificates of either CA are accepted (CAPool holds both);
//   - the serving certificate keeps chaining to the previous CA during the overlap, so that every
//     client, including those that do not hold the new CA yet, still verifies the broker, and
//     join tokens keep naming that CA (CAHash is the serving CA's);
//   - CAPEM, the bundle clients are given, holds both CAs, the serving CA first;
//   - when the overlap ends (FinishRotation, or LoadOrCreate after the deadline) the previous CA
//     is dropped and a new serving certificate is issued from the new CA: from then on a client
//     needs the new CA (from the bundle) and a certificate it issued.
//
// Files: ca.crt/ca.key are the issuing CA; ca-previous.crt/ca-previous.key and
// ca-rotation.json (the end of the overlap) exist only during an overlap.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Validity is how long every issued certificate lasts (the CA: ten years).
const (
	Validity   = 365 * 24 * time.Hour
	CAValidity = 10 * 365 * 24 * time.Hour
)

// File names inside the data directory.
const (
	CACertFile     = "ca.crt"
	CAKeyFile      = "ca.key"
	ServerCertFile = "server.crt"
	ServerKeyFile  = "server.key"
	AdminCertFile  = "admin.crt"
	AdminKeyFile   = "admin.key"
	TokenKeyFile   = "token.key"
	// PreviousCACertFile and PreviousCAKeyFile hold the CA a rotation replaced, while it is
	// still trusted; RotationFile says until when.
	PreviousCACertFile = "ca-previous.crt"
	PreviousCAKeyFile  = "ca-previous.key"
	RotationFile       = "ca-rotation.json"
)

// DefaultOverlap is how long a rotated CA stays trusted unless Rotate is told otherwise.
const DefaultOverlap = 30 * 24 * time.Hour

// Identity is who a verified client certificate names.
type Identity struct {
	Admin      bool
	Cluster    string
	ClusterUID string
	Node       string
	// Serial (Serial's form) and NotAfter are those of the certificate the identity was read
	// from; empty and zero for an identity made up in tests.
	Serial   string
	NotAfter time.Time
}

func (id Identity) String() string {
	if id.Admin {
		return "admin"
	}
	return fmt.Sprintf("agent %s/%s", id.Cluster, id.Node)
}

// PKI is the loaded key material. It is not modified once loaded: Rotate and FinishRotation
// return a new one.
type PKI struct {
	// CACert and CAKey are the issuing CA: every new certificate comes from it.
	CACert *x509.Certificate
	CAKey  *ecdsa.PrivateKey
	// CAPEM is the CA bundle clients are given: every trusted CA, the serving CA first.
	CAPEM []byte
	// Previous and PreviousKey are the CA a rotation replaced, trusted until PreviousUntil; nil
	// outside a rotation's overlap.
	Previous      *x509.Certificate
	PreviousKey   *ecdsa.PrivateKey
	PreviousUntil time.Time
	ServerTLS     tls.Certificate // leaf + serving CA chain
	AdminCert     []byte          // PEM
	AdminKey      []byte          // PEM
	TokenKey      []byte
}

// ServingCA is the CA the serving certificate chains to: the previous CA during a rotation's
// overlap, the issuing CA otherwise.
func (p *PKI) ServingCA() *x509.Certificate {
	if p.Previous != nil {
		return p.Previous
	}
	return p.CACert
}

func (p *PKI) servingKey() *ecdsa.PrivateKey {
	if p.Previous != nil {
		return p.PreviousKey
	}
	return p.CAKey
}

// CAHash is the join-token fingerprint of the serving CA: the CA a joining agent pins.
func (p *PKI) CAHash() string { return jointoken.CAHash(p.ServingCA().Raw) }

// IssuerHash is the fingerprint of the issuing CA.
func (p *PKI) IssuerHash() string { return jointoken.CAHash(p.CACert.Raw) }

// Trusted are the CAs whose client certificates are accepted: the issuing CA and, during an
// overlap, the previous one.
func (p *PKI) Trusted() []*x509.Certificate {
	if p.Previous != nil {
		return []*x509.Certificate{p.CACert, p.Previous}
	}
	return []*x509.Certificate{p.CACert}
}

// TrustedHashes are the fingerprints of Trusted.
func (p *PKI) TrustedHashes() []string {
	var out []string
	for _, c := range p.Trusted() {
		out = append(out, jointoken.CAHash(c.Raw))
	}
	return out
}

// CAPool returns a pool holding every trusted CA.
func (p *PKI) CAPool() *x509.CertPool {
	pool := x509.NewCertPool()
	for _, c := range p.Trusted() {
		pool.AddCert(c)
	}
	return pool
}

// bundle is CAPEM: the serving CA first, then the others.
func (p *PKI) bundle() []byte {
	out := certPEM(p.ServingCA().Raw)
	for _, c := range p.Trusted() {
		if !c.Equal(p.ServingCA()) {
			out = append(out, certPEM(c.Raw)...)
		}
	}
	return out
}

// LoadOrCreate loads the material in dir, creating what is missing. serverIPs are put in the
// serving certificate besides apiv1.BrokerServerName; the serving certificate is reissued when
// it lacks one of them or expires within 30 days (clients verify by name, so this is harmless).
// It reports whether the CA was created now.
func LoadOrCreate(dir string, serverIPs []net.IP, now time.Time) (*PKI, bool, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("create data dir %s: %w", dir, err)
	}
	p := &PKI{}
	created := false
	caCertPath, caKeyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	if exists(caCertPath) || exists(caKeyPath) {
		cert, key, certPEM, err := loadPair(caCertPath, caKeyPath)
		if err != nil {
			return nil, false, fmt.Errorf("load mesh CA: %w", err)
		}
		if !cert.IsCA {
			return nil, false, fmt.Errorf("load mesh CA: %s is not a CA certificate", caCertPath)
		}
		p.CACert, p.CAKey, p.CAPEM = cert, key, certPEM
	} else {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, false, fmt.Errorf("generate CA key: %w", err)
		}
		tmpl := &x509.Certificate{
			SerialNumber:          serial(),
			Subject:               pkix.Name{CommonName: "Cablemesh mesh CA", Organization: []string{"cablemesh"}},
			NotBefore:             now.Add(-time.Hour),
			NotAfter:              now.Add(CAValidity),
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLenZero:        true,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
		if err != nil {
			return nil, false, fmt.Errorf("create CA certificate: %w", err)
		}
		cert, _ := x509.ParseCertificate(der)
		p.CACert, p.CAKey, p.CAPEM = cert, key, certPEM(der)
		if err := writePair(caCertPath, caKeyPath, der, key); err != nil {
			return nil, false, err
		}
		created = true
	}

	if err := p.loadPrevious(dir, now); err != nil {
		return nil, false, err
	}
	p.CAPEM = p.bundle()

	// Token key.
	tokPath := filepath.Join(dir, TokenKeyFile)
	if b, err := os.ReadFile(tokPath); err == nil {
		if len(b) < 32 {
			return nil, false, fmt.Errorf("token key %s is %d bytes, want at least 32", tokPath, len(b))
		}
		p.TokenKey = b
	} else if errors.Is(err, os.ErrNotExist) {
		p.TokenKey = make([]byte, 32)
		if _, err := rand.Read(p.TokenKey); err != nil {
			return nil, false, fmt.Errorf("generate token key: %w", err)
		}
		if err := writeFile(tokPath, p.TokenKey); err != nil {
			return nil, false, err
		}
	} else {
		return nil, false, fmt.Errorf("read token key: %w", err)
	}

	// Serving certificate.
	srvCert, srvKey := filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile)
	reissue := true
	if cert, key, _, err := loadPair(srvCert, srvKey); err == nil {
		reissue = cert.CheckSignatureFrom(p.ServingCA()) != nil || now.Add(30*24*time.Hour).After(cert.NotAfter) || !coversIPs(cert, serverIPs)
		if !reissue {
			p.ServerTLS = tls.Certificate{Certificate: [][]byte{cert.Raw, p.ServingCA().Raw}, PrivateKey: key, Leaf: cert}
		}
	} else if exists(srvCert) || exists(srvKey) {
		return nil, false, fmt.Errorf("load serving certificate: %w", err)
	}
	if reissue {
		if err := p.issueServing(dir, serverIPs, now); err != nil {
			return nil, false, err
		}
	}

	// Admin client certificate.
	admCert, admKey := filepath.Join(dir, AdminCertFile), filepath.Join(dir, AdminKeyFile)
	if cert, _, _, err := loadPair(admCert, admKey); err == nil && p.issuedByCA(cert) {
		p.AdminCert, _ = os.ReadFile(admCert)
		p.AdminKey, _ = os.ReadFile(admKey)
	} else if exists(admCert) || exists(admKey) {
		return nil, false, fmt.Errorf("load admin certificate %s: not a valid certificate of this CA: %v", admCert, err)
	} else if err := p.issueAdminFiles(dir, now); err != nil {
		return nil, false, err
	}
	return p, created, nil
}

// issueServing issues a serving certificate from the serving CA, writes it and sets ServerTLS.
func (p *PKI) issueServing(dir string, serverIPs []net.IP, now time.Time) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate serving key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: apiv1.BrokerServerName},
		DNSNames:     []string{apiv1.BrokerServerName},
		IPAddresses:  serverIPs,
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ServingCA(), &key.PublicKey, p.servingKey())
	if err != nil {
		return fmt.Errorf("create serving certificate: %w", err)
	}
	if err := writePair(filepath.Join(dir, ServerCertFile), filepath.Join(dir, ServerKeyFile), der, key); err != nil {
		return err
	}
	leaf, _ := x509.ParseCertificate(der)
	p.ServerTLS = tls.Certificate{Certificate: [][]byte{der, p.ServingCA().Raw}, PrivateKey: key, Leaf: leaf}
	return nil
}

// issueAdminFiles issues a new admin certificate and key from the issuing CA and writes them to
// admin.crt/admin.key.
func (p *PKI) issueAdminFiles(dir string, now time.Time) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("generate admin key: %w", err)
	}
	der, err := x509.CreateCertificate(rand.Reader, adminTemplate(now), p.CACert, &key.PublicKey, p.CAKey)
	if err != nil {
		return fmt.Errorf("create admin certificate: %w", err)
	}
	admCert, admKey := filepath.Join(dir, AdminCertFile), filepath.Join(dir, AdminKeyFile)
	if err := writePair(admCert, admKey, der, key); err != nil {
		return err
	}
	p.AdminCert, _ = os.ReadFile(admCert)
	p.AdminKey, _ = os.ReadFile(admKey)
	return nil
}

func adminTemplate(now time.Time) *x509.Certificate {
	u, _ := url.Parse("cablemesh://admin")
	return &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: "cablemesh-admin", Organization: []string{"cablemesh"}},
		URIs:         []*url.URL{u},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
}

func newCA(now time.Time) (*ecdsa.PrivateKey, []byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Cablemesh mesh CA", Organization: []string{"cablemesh"}, SerialNumber: now.UTC().Format("20060102T150405Z")},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(CAValidity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("create CA certificate: %w", err)
	}
	return key, der, nil
}
