package pki

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"strings"
	"time"
)

// Issuing certificates: agents' (from their CSRs), ingress and admin ones, from the issuing CA.

// SignAgentCSR verifies a PEM CSR and issues a client certificate for the agent's key naming its
// cluster (with the cluster's UID) and node. The broker decides the identity; the CSR's subject is
// ignored.
func (p *PKI) SignAgentCSR(csrPEM []byte, cluster, uid, node string, now time.Time) ([]byte, error) {
	b, _, err := p.IssueAgent(csrPEM, cluster, uid, node, now)
	return b, err
}

// IssueAgent is SignAgentCSR returning the parsed certificate too.
func (p *PKI) IssueAgent(csrPEM []byte, cluster, uid, node string, now time.Time) ([]byte, *x509.Certificate, error) {
	return p.IssueAgentFor(csrPEM, cluster, uid, node, now, Validity)
}

// maxBackdate is how far before now a certificate's validity starts, for clocks behind the
// broker's.
const maxBackdate = 5 * time.Minute

// IssueAgentFor is IssueAgent with a certificate lifetime of its own (Validity: IssueAgent's).
// The certificate is valid from a little before now (at most maxBackdate, at most a tenth of the
// lifetime: the agent renews two thirds into the certificate's whole validity, which a backdate
// longer than a short lifetime would put in the past) until lifetime after now.
func (p *PKI) IssueAgentFor(csrPEM []byte, cluster, uid, node string, now time.Time, lifetime time.Duration) ([]byte, *x509.Certificate, error) {
	if lifetime <= 0 {
		return nil, nil, fmt.Errorf("agent certificate lifetime %s is not positive", lifetime)
	}
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
		NotBefore:    now.Add(-min(maxBackdate, lifetime/10)),
		NotAfter:     now.Add(lifetime),
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
