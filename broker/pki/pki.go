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
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
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

// rotationState is ca-rotation.json.
type rotationState struct {
	PreviousUntil time.Time `json:"previousTrustedUntil"`
	Previous      string    `json:"previousCA"`
}

// loadPrevious loads the previous CA of a rotation in progress. One whose overlap has ended at
// now is dropped (its files removed): FinishRotation's work, done at start for a broker that was
// down when the overlap ended.
func (p *PKI) loadPrevious(dir string, now time.Time) error {
	certPath, keyPath, statePath := filepath.Join(dir, PreviousCACertFile), filepath.Join(dir, PreviousCAKeyFile), filepath.Join(dir, RotationFile)
	if !exists(certPath) && !exists(keyPath) && !exists(statePath) {
		return nil
	}
	b, err := os.ReadFile(statePath)
	if err != nil {
		return fmt.Errorf("load CA rotation state: %w (the previous CA %s is there: restore %s or remove both previous CA files)", err, certPath, RotationFile)
	}
	var st rotationState
	if err := json.Unmarshal(b, &st); err != nil || st.PreviousUntil.IsZero() {
		return fmt.Errorf("load CA rotation state %s: not {\"previousTrustedUntil\": <time>}: %v", statePath, err)
	}
	if !now.Before(st.PreviousUntil) {
		return removeFiles(certPath, keyPath, statePath)
	}
	cert, key, _, err := loadPair(certPath, keyPath)
	if err != nil {
		return fmt.Errorf("load previous mesh CA: %w", err)
	}
	if cert.Equal(p.CACert) {
		// A rotation that stopped before it wrote the new CA: there is nothing to overlap.
		return removeFiles(certPath, keyPath, statePath)
	}
	if !cert.IsCA {
		return fmt.Errorf("load previous mesh CA: %s is not a CA certificate", certPath)
	}
	p.Previous, p.PreviousKey, p.PreviousUntil = cert, key, st.PreviousUntil
	return nil
}

// ErrRotationInProgress refuses a rotation while the previous one's overlap lasts.
var ErrRotationInProgress = errors.New("a CA rotation is in progress")

// Rotate creates a new issuing CA in dir and keeps the current one as the previous CA, trusted
// (and serving) until now+overlap; a new admin certificate is issued from the new CA. It returns
// the PKI to use from now on (p is left as it was). A rotation whose overlap has not ended is
// refused (ErrRotationInProgress): finish it first.
func (p *PKI) Rotate(dir string, now time.Time, overlap time.Duration) (*PKI, error) {
	if p.Previous != nil {
		return nil, fmt.Errorf("%w: the previous CA %s is trusted until %s; finish that rotation first", ErrRotationInProgress,
			jointoken.CAHash(p.Previous.Raw), p.PreviousUntil.UTC().Format(time.RFC3339))
	}
	if overlap <= 0 {
		overlap = DefaultOverlap
	}
	q := *p
	q.Previous, q.PreviousKey, q.PreviousUntil = p.CACert, p.CAKey, now.Add(overlap)
	key, der, err := newCA(now)
	if err != nil {
		return nil, err
	}
	q.CACert, _ = x509.ParseCertificate(der)
	q.CAKey = key
	// The previous CA first (a crash before the new CA is written leaves the old one in place
	// and a rotation state naming it, which the next start detects), then the state, then the
	// new CA.
	if err := writePair(filepath.Join(dir, PreviousCACertFile), filepath.Join(dir, PreviousCAKeyFile), p.CACert.Raw, p.CAKey); err != nil {
		return nil, err
	}
	st, _ := json.Marshal(rotationState{PreviousUntil: q.PreviousUntil.UTC(), Previous: jointoken.CAHash(p.CACert.Raw)})
	if err := writeFile(filepath.Join(dir, RotationFile), st); err != nil {
		return nil, err
	}
	if err := writePair(filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile), der, key); err != nil {
		return nil, err
	}
	q.CAPEM = q.bundle()
	if err := q.issueAdminFiles(dir, now); err != nil {
		return nil, err
	}
	return &q, nil
}

// FinishRotation ends a rotation's overlap now: the previous CA is no longer trusted, its files
// are removed, and a serving certificate is issued from the issuing CA. It returns the PKI to use
// from now on; without a rotation in progress it returns p.
func (p *PKI) FinishRotation(dir string, serverIPs []net.IP, now time.Time) (*PKI, error) {
	if p.Previous == nil {
		return p, nil
	}
	q := *p
	q.Previous, q.PreviousKey, q.PreviousUntil = nil, nil, time.Time{}
	if err := q.issueServing(dir, serverIPs, now); err != nil {
		return nil, err
	}
	q.CAPEM = q.bundle()
	if err := removeFiles(filepath.Join(dir, PreviousCACertFile), filepath.Join(dir, PreviousCAKeyFile), filepath.Join(dir, RotationFile)); err != nil {
		return nil, err
	}
	return &q, nil
}

func removeFiles(paths ...string) error {
	for _, path := range paths {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove %s: %w", path, err)
		}
	}
	return nil
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

// SignAgentCSR verifies a PEM CSR and issues a client certificate for the agent's key naming its
// cluster (with the cluster's UID) and node. The broker decides the identity; the CSR's subject is
// ignored.
func (p *PKI) SignAgentCSR(csrPEM []byte, cluster, uid, node string, now time.Time) ([]byte, error) {
	b, _, err := p.IssueAgent(csrPEM, cluster, uid, node, now)
	return b, err
}

// IssueAgent is SignAgentCSR returning the parsed certificate too.
func (p *PKI) IssueAgent(csrPEM []byte, cluster, uid, node string, now time.Time) ([]byte, *x509.Certificate, error) {
	csr, err := parseCSR(csrPEM)
	if err != nil {
		return nil, nil, err
	}
	idURI := &url.URL{Scheme: "cablemesh", Host: "cluster", Path: "/" + cluster + "/node/" + node}
	uidURI := &url.URL{Scheme: "cablemesh", Host: "cluster-uid", Path: "/" + uid}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: node, Organization: []string{"cablemesh:cluster:" + cluster}},
		URIs:         []*url.URL{idURI, uidURI},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	return p.sign(tmpl, csr, "agent")
}

// IngressOrgPrefix begins the subject Organization of every ingress certificate:
// "cablemesh:ingress:<cluster>". Agent certificates carry "cablemesh:cluster:<cluster>".
const IngressOrgPrefix = "cablemesh:ingress:"

// IssueIngress verifies a PEM CSR and issues the serving certificate of a node's ingress (the
// Envoy beside the agent presents it on its mesh mTLS listener, and gets it over SDS). It is
// made useless at the broker three ways: its extended key usage is serverAuth only (the
// broker's TLS layer accepts client certificates with clientAuth), its URI is
// cablemesh://ingress/<cluster>/node/<node> (not the cablemesh://cluster/... that IdentityOf
// reads an agent from), and its Organization begins with IngressOrgPrefix, which the broker's
// authorization refuses by name (IsIngress). Its key is the ingress's own, never the agent's.
func (p *PKI) IssueIngress(csrPEM []byte, cluster, node string, now time.Time) ([]byte, *x509.Certificate, error) {
	csr, err := parseCSR(csrPEM)
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: node, Organization: []string{IngressOrgPrefix + cluster}},
		URIs:         []*url.URL{{Scheme: "cablemesh", Host: "ingress", Path: "/" + cluster + "/node/" + node}},
		NotBefore:    now.Add(-5 * time.Minute),
		NotAfter:     now.Add(Validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	return p.sign(tmpl, csr, "ingress")
}

// IsIngress says cert is an ingress certificate (IssueIngress), by its Organization or its URI:
// one that must never authenticate a caller at the broker.
func IsIngress(cert *x509.Certificate) bool {
	for _, o := range cert.Subject.Organization {
		if strings.HasPrefix(o, IngressOrgPrefix) {
			return true
		}
	}
	for _, u := range cert.URIs {
		if u.Scheme == "cablemesh" && u.Host == "ingress" {
			return true
		}
	}
	return false
}

// IssueAdmin verifies a PEM CSR and issues an admin client certificate for its key.
func (p *PKI) IssueAdmin(csrPEM []byte, now time.Time) ([]byte, *x509.Certificate, error) {
	csr, err := parseCSR(csrPEM)
	if err != nil {
		return nil, nil, err
	}
	return p.sign(adminTemplate(now), csr, "admin")
}

func (p *PKI) sign(tmpl *x509.Certificate, csr *x509.CertificateRequest, what string) ([]byte, *x509.Certificate, error) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CACert, csr.PublicKey, p.CAKey)
	if err != nil {
		return nil, nil, fmt.Errorf("sign %s certificate: %w", what, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("sign %s certificate: %w", what, err)
	}
	return certPEM(der), cert, nil
}

// Serial formats a certificate's serial number as the broker records it: lower-case hex.
func Serial(cert *x509.Certificate) string { return cert.SerialNumber.Text(16) }

func parseCSR(csrPEM []byte) (*x509.CertificateRequest, error) {
	block, _ := pem.Decode(csrPEM)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		return nil, errors.New("csr_pem is not a PEM \"CERTIFICATE REQUEST\" block")
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("csr_pem: %v", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("csr_pem: signature does not verify: %v", err)
	}
	switch k := csr.PublicKey.(type) {
	case *ecdsa.PublicKey:
		if k.Curve != elliptic.P256() && k.Curve != elliptic.P384() {
			return nil, fmt.Errorf("csr_pem: ECDSA curve %s not accepted, use P-256 or P-384", k.Curve.Params().Name)
		}
	default:
		return nil, fmt.Errorf("csr_pem: key type %T not accepted, use ECDSA P-256", csr.PublicKey)
	}
	return csr, nil
}

// IdentityOf reads the identity of a client certificate that already verified against the CA.
func IdentityOf(cert *x509.Certificate) (Identity, error) {
	var id Identity
	for _, u := range cert.URIs {
		if u.Scheme != "cablemesh" {
			continue
		}
		switch u.Host {
		case "admin":
			id.Admin = true
		case "cluster":
			parts := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
			if len(parts) != 3 || parts[1] != "node" || parts[0] == "" || parts[2] == "" {
				return Identity{}, fmt.Errorf("certificate URI %q is not cablemesh://cluster/<cluster>/node/<node>", u)
			}
			id.Cluster, id.Node = parts[0], parts[2]
		case "cluster-uid":
			id.ClusterUID = strings.TrimPrefix(u.Path, "/")
		}
	}
	id.Serial, id.NotAfter = Serial(cert), cert.NotAfter
	switch {
	case id.Admin && id.Cluster == "":
		return id, nil
	case !id.Admin && id.Cluster != "" && id.ClusterUID != "":
		return id, nil
	}
	return Identity{}, fmt.Errorf("certificate %q names no cablemesh identity", cert.Subject.CommonName)
}

// issuedByCA says cert was issued by a trusted CA.
func (p *PKI) issuedByCA(cert *x509.Certificate) bool {
	for _, ca := range p.Trusted() {
		if cert.CheckSignatureFrom(ca) == nil {
			return true
		}
	}
	return false
}

// IssuerOfChains is the fingerprint of the trusted CA that issued a certificate whose chains the
// TLS layer already verified (tls.ConnectionState.VerifiedChains): the root of the first chain
// that is still trusted, or "". No signature is checked again: at 5,000 agents a check on every call
// was 7 % of the broker's CPU. A chain verified against a CA that a finished rotation no longer
// trusts names no issuer.
func (p *PKI) IssuerOfChains(chains [][]*x509.Certificate) string {
	for _, chain := range chains {
		if len(chain) == 0 {
			continue
		}
		root := chain[len(chain)-1]
		for _, ca := range p.Trusted() {
			if root.Equal(ca) {
				return jointoken.CAHash(ca.Raw)
			}
		}
	}
	return ""
}

func coversIPs(cert *x509.Certificate, ips []net.IP) bool {
	for _, ip := range ips {
		found := false
		for _, c := range cert.IPAddresses {
			if c.Equal(ip) {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand failed: %v", err))
	}
	return n
}

func certPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func loadPair(certPath, keyPath string) (*x509.Certificate, *ecdsa.PrivateKey, []byte, error) {
	cb, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, nil, err
	}
	kb, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, nil, err
	}
	cblock, _ := pem.Decode(cb)
	if cblock == nil || cblock.Type != "CERTIFICATE" {
		return nil, nil, nil, fmt.Errorf("%s: no PEM CERTIFICATE block", certPath)
	}
	cert, err := x509.ParseCertificate(cblock.Bytes)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", certPath, err)
	}
	kblock, _ := pem.Decode(kb)
	if kblock == nil {
		return nil, nil, nil, fmt.Errorf("%s: no PEM block", keyPath)
	}
	key, err := x509.ParseECPrivateKey(kblock.Bytes)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	pub, ok := cert.PublicKey.(*ecdsa.PublicKey)
	if !ok || !pub.Equal(&key.PublicKey) {
		return nil, nil, nil, fmt.Errorf("%s does not hold the key of %s", keyPath, certPath)
	}
	return cert, key, cb, nil
}

func writePair(certPath, keyPath string, der []byte, key *ecdsa.PrivateKey) error {
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return fmt.Errorf("encode key %s: %w", keyPath, err)
	}
	if err := writeFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})); err != nil {
		return err
	}
	return writeFile(certPath, certPEM(der))
}

// writeFile writes atomically with mode 0600: a crash never leaves a half-written key behind.
func writeFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Chmod(tmp, 0o600); err != nil {
		return fmt.Errorf("chmod %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// WriteFile is writeFile for other broker packages (admin.yaml).
func WriteFile(path string, data []byte) error { return writeFile(path, data) }
