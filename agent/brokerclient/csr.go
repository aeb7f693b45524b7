package brokerclient

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
)

// KeyRequest is a fresh private key and a certificate request for it, both PEM: what the agent
// sends the broker to join, to renew its certificate and to get an ingress certificate. The key
// never leaves the node; it is written only once the broker's answer has been checked.
type KeyRequest struct {
	KeyPEM []byte // PKCS #8 "PRIVATE KEY"
	CSRPEM []byte // "CERTIFICATE REQUEST"
}

// NewKeyRequest generates a P-256 key and a request for subject; what names the key in errors
// ("agent", "ingress").
func NewKeyRequest(subject pkix.Name, what string) (KeyRequest, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return KeyRequest{}, fmt.Errorf("generate %s key: %w", what, err)
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: subject}, key)
	if err != nil {
		return KeyRequest{}, fmt.Errorf("create %s certificate request: %w", what, err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return KeyRequest{}, fmt.Errorf("encode %s key: %w", what, err)
	}
	return KeyRequest{
		KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		CSRPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csr}),
	}, nil
}

// ParsePair parses a PEM certificate and its key, and the certificate itself (set as Leaf).
func ParsePair(certPEM, keyPEM []byte) (tls.Certificate, *x509.Certificate, error) {
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	pair.Leaf = leaf
	return pair, leaf, nil
}
