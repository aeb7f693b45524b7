// Package jointoken encodes, signs and verifies the join tokens an agent exchanges for its client
// certificate. A token is "cmj1.<payload>.<mac>": payload is base64url JSON claims, mac is the
// base64url HMAC-SHA256 of "cmj1.<payload>" under the broker's token key. Only the broker holds
// the key and verifies; an agent decodes the claims without verifying to learn the CA fingerprint
// it must pin when it first dials the broker (as kubeadm's discovery-token-ca-cert-hash).
package jointoken

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

const prefix = "cmj1"

// Claims are what a token binds.
type Claims struct {
	Cluster    string    `json:"cluster"`
	ClusterUID string    `json:"uid"`
	Expires    time.Time `json:"exp"`
	// CAHash is "sha256:<hex>" of the mesh CA certificate (DER).
	CAHash string `json:"ca"`
	// Nonce makes two tokens for the same cluster differ.
	Nonce string `json:"nonce"`
}

var (
	ErrMalformed = errors.New("malformed join token")
	ErrSignature = errors.New("join token signature is invalid (forged or from another broker)")
	ErrExpired   = errors.New("join token has expired")
)

// CAHash returns the fingerprint of a DER certificate in the form Claims.CAHash uses.
func CAHash(der []byte) string {
	sum := sha256.Sum256(der)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Sign encodes and signs claims under key.
func Sign(c Claims, key []byte) (string, error) {
	if len(key) < 32 {
		return "", fmt.Errorf("token key too short: %d bytes, want at least 32", len(key))
	}
	if err := c.validate(); err != nil {
		return "", err
	}
	body, err := json.Marshal(c)
	if err != nil {
		return "", fmt.Errorf("encode token claims: %w", err)
	}
	signed := prefix + "." + base64.RawURLEncoding.EncodeToString(body)
	return signed + "." + base64.RawURLEncoding.EncodeToString(mac(signed, key)), nil
}

// Decode parses a token's claims without verifying its signature or expiry. Agents use it to read
// the CA fingerprint; the broker must use Verify.
func Decode(token string) (Claims, error) {
	_, c, _, err := split(token)
	return c, err
}

// Verify checks the signature under key and the expiry against now, and returns the claims.
func Verify(token string, key []byte, now time.Time) (Claims, error) {
	signed, c, sig, err := split(token)
	if err != nil {
		return Claims{}, err
	}
	if subtle.ConstantTimeCompare(sig, mac(signed, key)) != 1 {
		return Claims{}, ErrSignature
	}
	if !now.Before(c.Expires) {
		return Claims{}, fmt.Errorf("%w: cluster %q, expired at %s", ErrExpired, c.Cluster, c.Expires.UTC().Format(time.RFC3339))
	}
	return c, nil
}

func split(token string) (signed string, c Claims, sig []byte, err error) {
	token = strings.TrimSpace(token)
	parts := strings.Split(token, ".")
	if len(parts) != 3 || parts[0] != prefix {
		return "", Claims{}, nil, fmt.Errorf("%w: want 3 dot-separated parts starting with %q", ErrMalformed, prefix)
	}
	body, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return "", Claims{}, nil, fmt.Errorf("%w: payload: %v", ErrMalformed, err)
	}
	sig, err = base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return "", Claims{}, nil, fmt.Errorf("%w: signature: %v", ErrMalformed, err)
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return "", Claims{}, nil, fmt.Errorf("%w: claims: %v", ErrMalformed, err)
	}
	if err := c.validate(); err != nil {
		return "", Claims{}, nil, err
	}
	return parts[0] + "." + parts[1], c, sig, nil
}

func (c Claims) validate() error {
	switch {
	case c.Cluster == "":
		return fmt.Errorf("%w: claim cluster is empty", ErrMalformed)
	case c.ClusterUID == "":
		return fmt.Errorf("%w: claim uid is empty", ErrMalformed)
	case c.Expires.IsZero():
		return fmt.Errorf("%w: claim exp is missing", ErrMalformed)
	case !strings.HasPrefix(c.CAHash, "sha256:") || len(c.CAHash) != len("sha256:")+64:
		return fmt.Errorf("%w: claim ca %q is not sha256:<64 hex>", ErrMalformed, c.CAHash)
	}
	return nil
}

func mac(signed string, key []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(signed))
	return h.Sum(nil)
}
