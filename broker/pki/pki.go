// Package pki holds the broker's mesh CA and the certificates it issues: the broker's serving
// certificate, the admin client certificate, and agent client certificates signed from the
// agents' CSRs at Join. It also holds the HMAC key that signs join tokens. Everything is created
// on first start and persisted (0600) in the data directory, then reused.
//
// Identities are URI SANs: the admin is cablemesh://admin; an agent is
// cablemesh://cluster/<cluster>/node/<node> plus cablemesh://cluster-uid/<uid>, so the broker can
// refuse certificates of a cluster that was removed (and perhaps created again under the same
// name with a new UID). Certificates last one year; renewal is not implemented yet.
package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
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
)

// Identity is who a verified client certificate names.
type Identity struct {
	Admin      bool
	Cluster    string
	ClusterUID string
	Node       string
}

func (id Identity) String() string {
	if id.Admin {
		return "admin"
	}
	return fmt.Sprintf("agent %s/%s", id.Cluster, id.Node)
}

// PKI is the loaded key material.
type PKI struct {
	CACert    *x509.Certificate
	CAKey     *ecdsa.PrivateKey
	CAPEM     []byte
	ServerTLS tls.Certificate // leaf + CA chain
	AdminCert []byte          // PEM
	AdminKey  []byte          // PEM
	TokenKey  []byte
}

// CAHash is the join-token fingerprint of the CA.
func (p *PKI) CAHash() string { return jointoken.CAHash(p.CACert.Raw) }

// CAPool returns a pool holding only the mesh CA.
func (p *PKI) CAPool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(p.CACert)
	return pool
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
		reissue = !p.issuedByCA(cert) || now.Add(30*24*time.Hour).After(cert.NotAfter) || !coversIPs(cert, serverIPs)
		if !reissue {
			p.ServerTLS = tls.Certificate{Certificate: [][]byte{cert.Raw, p.CACert.Raw}, PrivateKey: key, Leaf: cert}
		}
	} else if exists(srvCert) || exists(srvKey) {
		return nil, false, fmt.Errorf("load serving certificate: %w", err)
	}
	if reissue {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, false, fmt.Errorf("generate serving key: %w", err)
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
		der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CACert, &key.PublicKey, p.CAKey)
		if err != nil {
			return nil, false, fmt.Errorf("create serving certificate: %w", err)
		}
		if err := writePair(srvCert, srvKey, der, key); err != nil {
			return nil, false, err
		}
		leaf, _ := x509.ParseCertificate(der)
		p.ServerTLS = tls.Certificate{Certificate: [][]byte{der, p.CACert.Raw}, PrivateKey: key, Leaf: leaf}
	}

	// Admin client certificate.
	admCert, admKey := filepath.Join(dir, AdminCertFile), filepath.Join(dir, AdminKeyFile)
	if cert, _, _, err := loadPair(admCert, admKey); err == nil && p.issuedByCA(cert) {
		p.AdminCert, _ = os.ReadFile(admCert)
		p.AdminKey, _ = os.ReadFile(admKey)
	} else if exists(admCert) || exists(admKey) {
		return nil, false, fmt.Errorf("load admin certificate %s: not a valid certificate of this CA: %v", admCert, err)
	} else {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, false, fmt.Errorf("generate admin key: %w", err)
		}
		u, _ := url.Parse("cablemesh://admin")
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{CommonName: "cablemesh-admin", Organization: []string{"cablemesh"}},
			URIs:         []*url.URL{u},
			NotBefore:    now.Add(-time.Hour),
			NotAfter:     now.Add(Validity),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CACert, &key.PublicKey, p.CAKey)
		if err != nil {
			return nil, false, fmt.Errorf("create admin certificate: %w", err)
		}
		if err := writePair(admCert, admKey, der, key); err != nil {
			return nil, false, err
		}
		p.AdminCert, _ = os.ReadFile(admCert)
		p.AdminKey, _ = os.ReadFile(admKey)
	}
	return p, created, nil
}

// SignAgentCSR verifies a PEM CSR and issues a client certificate for the agent's key naming its
// cluster (with the cluster's UID) and node. The broker decides the identity; the CSR's subject is
// ignored.
func (p *PKI) SignAgentCSR(csrPEM []byte, cluster, uid, node string, now time.Time) ([]byte, error) {
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
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.CACert, csr.PublicKey, p.CAKey)
	if err != nil {
		return nil, fmt.Errorf("sign agent certificate: %w", err)
	}
	return certPEM(der), nil
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
	switch {
	case id.Admin && id.Cluster == "":
		return id, nil
	case !id.Admin && id.Cluster != "" && id.ClusterUID != "":
		return id, nil
	}
	return Identity{}, fmt.Errorf("certificate %q names no cablemesh identity", cert.Subject.CommonName)
}

func (p *PKI) issuedByCA(cert *x509.Certificate) bool {
	return cert.CheckSignatureFrom(p.CACert) == nil
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
