package pki

import (
	"crypto/ecdsa"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
)

// The data directory's files: key pairs and their atomic writes.

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
