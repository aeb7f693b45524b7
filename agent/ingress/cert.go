package ingress

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/xds"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// The ingress certificate: what the ingress Envoy serves its mesh mTLS listener with, handed
// out over the xDS server's SDS. It is never the agent's own certificate: whoever reads Envoy's
// secrets (the xDS socket's clients, Envoy's admin, its memory) must not become the node at the
// broker. The agent makes a key for it (stateDir/ingress.key, 0600) and has the broker issue a
// serving certificate for it (Agent.IssueIngressCertificate; stateDir/ingress.crt): extended key
// usage serverAuth only, Organization "cablemesh:ingress:<cluster>", refused by the broker for
// every call. It is renewed as the agent certificate is (two thirds into its life, or at once on
// a CA rotation). A broker without the RPC issues none: then no certificate is served over SDS
// (and the HTTP listener, which needs one, is left out), and status and the log say why.

// State-dir files of the ingress certificate.
const (
	IngressKeyFile  = "ingress.key"
	IngressCertFile = "ingress.crt"
)

// ingressCertRecheck is how often the loop looks again whether the certificate is due: the CA
// bundle (a rotation) can change at any time.
const ingressCertRecheck = time.Minute

// errNoIngressCertOldBroker is the status of an agent whose broker issues no ingress certificates.
const errNoIngressCertOldBroker = "the broker does not issue ingress certificates (Agent.IssueIngressCertificate is unimplemented: upgrade the broker): no certificate is served over SDS and the ingress's mTLS HTTP listener is left out; the agent's own key is never served"

// RunCertificate keeps stateDir's ingress certificate issued and current while the xDS server
// runs. It ends with ctx.
func (g *Gateway) RunCertificate(ctx context.Context, client apiv1.AgentClient) {
	bo := g.deps.Backoff()
	var quiet brokerclient.RepeatFilter
	for {
		wait := ingressCertRecheck
		due, reason := g.ingressCertDue()
		if due {
			err := g.issueIngressCert(ctx, client, reason)
			if ctx.Err() != nil {
				return
			}
			g.setIngressCertErr(err)
			switch {
			case err == nil:
				bo.Reset()
				quiet.Reset()
				g.triggerIngress()
			case status.Code(errors.Unwrap(err)) == codes.Unimplemented:
				g.log.Log(ctx, brokerclient.WarnLevel(quiet.Repeated(err)), errNoIngressCertOldBroker)
				wait = brokerclient.UnimplementedRetry
			default:
				wait = bo.Next()
				g.log.Log(ctx, brokerclient.WarnLevel(quiet.Repeated(err)), "cannot get an ingress certificate from the broker; retrying", "err", err, "retryIn", wait.Round(time.Millisecond).String())
			}
		}
		if !retry.Sleep(ctx, wait) {
			return
		}
	}
}

// setIngressCertErr records the last issuance's outcome for status.
func (g *Gateway) setIngressCertErr(err error) {
	msg := ""
	switch {
	case err == nil:
	case status.Code(errors.Unwrap(err)) == codes.Unimplemented:
		msg = errNoIngressCertOldBroker
	default:
		msg = "ingress certificate: " + err.Error()
	}
	g.ingress.mu.Lock()
	g.ingress.certErr = msg
	g.ingress.mu.Unlock()
}

// ingressCertDue says whether the ingress certificate must be (re)issued: missing, damaged, not
// of its key, or due by brokerclient.RenewalDue.
func (g *Gateway) ingressCertDue() (bool, string) {
	cert, err := loadIngressCert(g.cfg.StateDir)
	if err != nil {
		return true, err.Error()
	}
	at, reason := brokerclient.RenewalDue(cert.Leaf, g.deps.CABundle())
	if time.Now().Before(at) {
		return false, ""
	}
	return true, reason
}

// loadIngressCert loads and checks stateDir's ingress key and certificate.
func loadIngressCert(dir string) (*tls.Certificate, error) {
	c, err := tls.LoadX509KeyPair(filepath.Join(dir, IngressCertFile), filepath.Join(dir, IngressKeyFile))
	if err != nil {
		return nil, fmt.Errorf("no usable ingress certificate: %w", err)
	}
	if c.Leaf == nil {
		if c.Leaf, err = x509.ParseCertificate(c.Certificate[0]); err != nil {
			return nil, fmt.Errorf("ingress certificate: %w", err)
		}
	}
	if !pki.IsIngress(c.Leaf) {
		return nil, errors.New("ingress.crt is not an ingress certificate")
	}
	return &c, nil
}

// issueIngressCert makes a new key, has the broker issue its certificate, checks the answer and
// writes both (the key first: a crash between the two leaves a pair that does not match, which
// ingressCertDue finds and replaces).
func (g *Gateway) issueIngressCert(ctx context.Context, client apiv1.AgentClient, reason string) error {
	g.log.Info("requesting an ingress certificate from the broker", "reason", reason)
	kr, err := brokerclient.NewKeyRequest(pkix.Name{}, "ingress")
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	resp, err := client.IssueIngressCertificate(cctx, &apiv1.IssueIngressCertificateRequest{CsrPem: kr.CSRPEM})
	if err != nil {
		return fmt.Errorf("issue ingress certificate: %w", err)
	}
	keyPEM := kr.KeyPEM
	leaf, err := g.checkIngressAnswer(resp.GetCertificatePem(), keyPEM)
	if err != nil {
		return err
	}
	if err := brokerstate.WriteFileAtomic(filepath.Join(g.cfg.StateDir, IngressKeyFile), keyPEM, 0o600); err != nil {
		return err
	}
	if err := brokerstate.WriteFileAtomic(filepath.Join(g.cfg.StateDir, IngressCertFile), resp.GetCertificatePem(), 0o644); err != nil {
		return err
	}
	g.log.Info("ingress certificate issued; serving it over SDS", "serial", leaf.SerialNumber.Text(16), "notAfter", leaf.NotAfter.UTC().Format(time.RFC3339))
	return nil
}

// checkIngressAnswer checks the broker's answer before anything is written: a serving
// certificate of the mesh CAs for the key just made, an ingress certificate, never one that a
// broker would take as a client's.
func (g *Gateway) checkIngressAnswer(certPEM, keyPEM []byte) (*x509.Certificate, error) {
	_, leaf, err := brokerclient.ParsePair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("ingress certificate answer: %w", err)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: g.deps.CAs(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, fmt.Errorf("ingress certificate answer: not a serving certificate of the mesh CAs: %w", err)
	}
	if !pki.IsIngress(leaf) {
		return nil, fmt.Errorf("ingress certificate answer: %q is not an ingress certificate", leaf.Subject)
	}
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: g.deps.CAs(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err == nil {
		return nil, errors.New("ingress certificate answer: it is also good as a client certificate; refusing to hand it to Envoy")
	}
	return leaf, nil
}

// readCerts reads what the ingress serves over SDS: the ingress certificate and its key (never
// agent.key) and the mesh CA bundle; nil until the node has all three.
func readCerts(dir string) *xds.Certs {
	var c xds.Certs
	for _, f := range []struct {
		name string
		dst  *[]byte
	}{{IngressCertFile, &c.CertPEM}, {IngressKeyFile, &c.KeyPEM}, {brokerclient.CAFile, &c.CAPEM}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		if err != nil || len(bytes.TrimSpace(b)) == 0 {
			return nil
		}
		*f.dst = b
	}
	// A pair that does not match (a crash between the two writes) is not served.
	if _, err := tls.X509KeyPair(c.CertPEM, c.KeyPEM); err != nil {
		return nil
	}
	return &c
}

// ingressCertStatus says what the last snapshot serves over SDS, for status.
func ingressCertStatus(c *xds.Certs, certErr string) string {
	if c == nil {
		if certErr != "" {
			return "none: " + certErr
		}
		return "none yet: the ingress certificate has not been issued (no secret is served, nor the HTTP listener)"
	}
	block, _ := pem.Decode(c.CertPEM)
	if block == nil {
		return "unreadable"
	}
	leaf, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return "unreadable: " + err.Error()
	}
	return fmt.Sprintf("ingress certificate %s (%s, %v) until %s", leaf.SerialNumber.Text(16), leaf.Subject.CommonName, leaf.Subject.Organization, leaf.NotAfter.UTC().Format(time.RFC3339))
}
