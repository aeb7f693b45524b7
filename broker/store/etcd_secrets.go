package store

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SecretKeySize is the size of the key that seals the secrets a broker keeps in etcd (AES-256).
const SecretKeySize = 32

// ErrNoSecretKey means the secret key file is missing while etcd already holds sealed secrets: a
// new key could not open them. The key must be copied from a replica that has it.
var ErrNoSecretKey = errors.New("secret key file is missing but etcd already holds secrets sealed with a key")

// EtcdSecrets keeps a set of named secrets (the mesh CA and its key, the join-token key, the mesh
// secret) in one etcd key, <root>secrets, sealed with AES-256-GCM under a key every replica holds
// in a file. Sealed:
//
//	{"v":1,"key":"<key id>","nonce":"<hex>","sealed":"<hex>"}
//
// where key id is the first 8 bytes of SHA-256("cablemesh secret key id|" + key), in hex, so that
// a replica with another key says so instead of failing to decrypt, and the additional data is
// the etcd key name, so a sealed value cannot be moved to another key. The plaintext is the JSON
// of the name -> bytes map. Etcd (its members, its backups, anyone who can read its keys) never
// sees a secret in the clear.
type EtcdSecrets struct {
	cli *clientv3.Client
	key string
	aad []byte
	kid string
	gcm cipher.AEAD
}

// NewEtcdSecrets seals with secretKey (SecretKeySize bytes) the secrets of the mesh under root.
func NewEtcdSecrets(cli *clientv3.Client, root string, secretKey []byte) (*EtcdSecrets, error) {
	if len(secretKey) != SecretKeySize {
		return nil, fmt.Errorf("secret key is %d bytes, want %d", len(secretKey), SecretKeySize)
	}
	block, err := aes.NewCipher(secretKey)
	if err != nil {
		return nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	k := root + "secrets"
	return &EtcdSecrets{cli: cli, key: k, aad: []byte(k), kid: SecretKeyID(secretKey), gcm: gcm}, nil
}

// SecretKeyID names a secret key without revealing it.
func SecretKeyID(key []byte) string {
	h := sha256.Sum256(append([]byte("cablemesh secret key id|"), key...))
	return hex.EncodeToString(h[:8])
}

// EtcdHasSecrets reports whether etcd holds the sealed secrets of the mesh under root.
func EtcdHasSecrets(ctx context.Context, cli *clientv3.Client, root string) (bool, error) {
	resp, err := cli.Get(ctx, root+"secrets", clientv3.WithCountOnly())
	if err != nil {
		return false, fmt.Errorf("read %ssecrets from etcd: %w", root, err)
	}
	return resp.Count > 0, nil
}

type sealed struct {
	V      int    `json:"v"`
	Key    string `json:"key"`
	Nonce  string `json:"nonce"`
	Sealed string `json:"sealed"`
}

// Load returns the secrets, or ok false when etcd holds none yet.
func (s *EtcdSecrets) Load(ctx context.Context) (secrets map[string][]byte, ok bool, err error) {
	resp, err := s.cli.Get(ctx, s.key)
	if err != nil {
		return nil, false, fmt.Errorf("read %s from etcd: %w", s.key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false, nil
	}
	m, err := s.open(resp.Kvs[0].Value)
	return m, err == nil, err
}

// Create stores secrets unless etcd holds some already (another replica was first); either way
// it returns what etcd holds now, and whether it was this call that stored it.
func (s *EtcdSecrets) Create(ctx context.Context, secrets map[string][]byte) (current map[string][]byte, created bool, err error) {
	v, err := s.seal(secrets)
	if err != nil {
		return nil, false, err
	}
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(s.key), "=", 0)).
		Then(clientv3.OpPut(s.key, string(v))).Else(clientv3.OpGet(s.key)).Commit()
	if err != nil {
		return nil, false, fmt.Errorf("store %s in etcd: %w", s.key, err)
	}
	if resp.Succeeded {
		return secrets, true, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return nil, false, fmt.Errorf("store %s in etcd: lost a race but found nothing", s.key)
	}
	m, err := s.open(kvs[0].Value)
	return m, false, err
}

// Modify replaces the secrets with what fn makes of the current ones, with a compare-and-swap
// on their etcd revision, retrying when another replica changed them in between (fn may run more
// than once). A CA rotation stores its new key material this way.
func (s *EtcdSecrets) Modify(ctx context.Context, fn func(map[string][]byte) (map[string][]byte, error)) error {
	for {
		resp, err := s.cli.Get(ctx, s.key)
		if err != nil {
			return fmt.Errorf("read %s from etcd: %w", s.key, err)
		}
		cur, mod := map[string][]byte{}, int64(0)
		if len(resp.Kvs) > 0 {
			if cur, err = s.open(resp.Kvs[0].Value); err != nil {
				return err
			}
			mod = resp.Kvs[0].ModRevision
		}
		next, err := fn(cur)
		if err != nil {
			return err
		}
		v, err := s.seal(next)
		if err != nil {
			return err
		}
		tr, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(s.key), "=", mod)).Then(clientv3.OpPut(s.key, string(v))).Commit()
		if err != nil {
			return fmt.Errorf("store %s in etcd: %w", s.key, err)
		}
		if tr.Succeeded {
			return nil
		}
	}
}

func (s *EtcdSecrets) seal(secrets map[string][]byte) ([]byte, error) {
	plain, err := json.Marshal(secrets)
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, s.gcm.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return json.Marshal(sealed{V: 1, Key: s.kid, Nonce: hex.EncodeToString(nonce), Sealed: hex.EncodeToString(s.gcm.Seal(nil, nonce, plain, s.aad))})
}

func (s *EtcdSecrets) open(v []byte) (map[string][]byte, error) {
	var sv sealed
	if err := json.Unmarshal(v, &sv); err != nil || sv.V != 1 {
		return nil, fmt.Errorf("%s in etcd is not a sealed secret set of version 1", s.key)
	}
	if sv.Key != s.kid {
		return nil, fmt.Errorf("%s in etcd is sealed with secret key %s, this broker's key is %s: copy the secret key file from a running replica", s.key, sv.Key, s.kid)
	}
	nonce, err1 := hex.DecodeString(sv.Nonce)
	ct, err2 := hex.DecodeString(sv.Sealed)
	if err1 != nil || err2 != nil || len(nonce) != s.gcm.NonceSize() {
		return nil, fmt.Errorf("%s in etcd is malformed", s.key)
	}
	plain, err := s.gcm.Open(nil, nonce, ct, s.aad)
	if err != nil {
		return nil, fmt.Errorf("%s in etcd does not decrypt with secret key %s (tampered with?): %w", s.key, s.kid, err)
	}
	m := map[string][]byte{}
	if err := json.Unmarshal(plain, &m); err != nil {
		return nil, fmt.Errorf("%s in etcd: decode: %w", s.key, err)
	}
	return m, nil
}

// LoadOrCreateSecretKey reads the secret key at path. When the file does not exist it creates one
// (0600, SecretKeySize random bytes) only if mayCreate (etcd holds no secrets yet); otherwise it
// returns ErrNoSecretKey.
func LoadOrCreateSecretKey(path string, mayCreate bool) (key []byte, created bool, err error) {
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if len(b) != SecretKeySize {
			return nil, false, fmt.Errorf("secret key %s is %d bytes, want %d", path, len(b), SecretKeySize)
		}
		if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
			return nil, false, fmt.Errorf("secret key %s is readable by others (mode %v): chmod 600 it", path, fi.Mode().Perm())
		}
		return b, false, nil
	case !errors.Is(err, fs.ErrNotExist):
		return nil, false, fmt.Errorf("read secret key: %w", err)
	case !mayCreate:
		return nil, false, fmt.Errorf("%s: %w; copy it (mode 0600) from the replica that created it", path, ErrNoSecretKey)
	}
	b = make([]byte, SecretKeySize)
	if _, err := rand.Read(b); err != nil {
		return nil, false, err
	}
	// O_EXCL: two brokers sharing a data dir must not both write one.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, false, fmt.Errorf("create secret key: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		os.Remove(path)
		return nil, false, fmt.Errorf("write secret key: %w", err)
	}
	if err := f.Close(); err != nil {
		return nil, false, fmt.Errorf("write secret key: %w", err)
	}
	return b, true, nil
}
