package broker

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/cablemesh/cablemesh/broker/pki"
)

// MeshSecretFile holds the mesh secret, from which every cluster pair's pre-shared key is derived.
const MeshSecretFile = "mesh-secret.key"

// meshSecretSize is the size of a new mesh secret (HMAC-SHA256 wants a key of at least 32 bytes).
const meshSecretSize = 32

// loadOrCreateMeshSecret reads DIR/mesh-secret.key, creating it (0600) with 32 random bytes on
// first start. The secret must outlive restarts: every pair's PSK is derived from it, so a new
// secret would change every key at once and break every IPsec tunnel until both ends caught up.
func loadOrCreateMeshSecret(dir string) (secret []byte, created bool, err error) {
	path := filepath.Join(dir, MeshSecretFile)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(b) < meshSecretSize {
			return nil, false, fmt.Errorf("mesh secret %s is %d bytes, want at least %d", path, len(b), meshSecretSize)
		}
		return b, false, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, false, fmt.Errorf("read mesh secret: %w", err)
	}
	b = make([]byte, meshSecretSize)
	if _, err := rand.Read(b); err != nil {
		return nil, false, fmt.Errorf("generate mesh secret: %w", err)
	}
	if err := pki.WriteFile(path, b); err != nil {
		return nil, false, fmt.Errorf("write mesh secret: %w", err)
	}
	return b, true, nil
}

// PairPSK is the pre-shared key of the cluster pair {a, b}, given as the clusters' UIDs:
// HMAC-SHA256(meshSecret, "cablemesh psk v2|" + min(a,b) + "|" + max(a,b)), 32 bytes. It depends
// only on the unordered pair, so both ends get the same key, and a cluster that knows its own
// keys learns nothing about another pair's. UIDs, not names: a cluster removed and created again
// under the same name is a new cluster, and its pairs get new keys, so an agent of the removed
// one (or anyone who learnt its keys) cannot use them against the new one.
func PairPSK(meshSecret []byte, a, b string) []byte {
	if b < a {
		a, b = b, a
	}
	m := hmac.New(sha256.New, meshSecret)
	m.Write([]byte("cablemesh psk v2|" + a + "|" + b))
	return m.Sum(nil)
}
