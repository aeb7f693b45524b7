package pki

import (
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/cablemesh/cablemesh/api/jointoken"
)

// CA rotation: the previous CA kept through the overlap, and its end (see the package comment).

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
