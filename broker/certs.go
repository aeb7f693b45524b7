package broker

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// certState is the PKI the broker serves with, and the TLS configuration made from it. A CA
// rotation (RotateCA) and the end of its overlap replace both; every handshake reads the current
// configuration, so no restart is needed, and watches learn of the new CA bundle through changed.
type certState struct {
	mu        sync.RWMutex
	p         *pki.PKI
	tls       *tls.Config
	changed   chan struct{} // closed, and replaced, whenever p changes
	serverIPs []net.IP
}

func newCertState(p *pki.PKI, serverIPs []net.IP) *certState {
	c := &certState{serverIPs: serverIPs, changed: make(chan struct{})}
	c.p, c.tls = p, serverTLS(p)
	return c
}

// serverTLS is the broker's TLS configuration for p: the serving certificate, and client
// certificates of every trusted CA (optional: Join has none).
func serverTLS(p *pki.PKI) *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{p.ServerTLS},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    p.CAPool(),
		MinVersion:   tls.VersionTLS12,
	}
}

// tlsConfig is tls.Config.GetConfigForClient.
func (c *certState) tlsConfig(*tls.ClientHelloInfo) (*tls.Config, error) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.tls, nil
}

func (c *certState) get() (*pki.PKI, <-chan struct{}) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.p, c.changed
}

// setLocked replaces the PKI; c.mu is held.
func (c *certState) setLocked(p *pki.PKI) {
	c.p, c.tls = p, serverTLS(p)
	close(c.changed)
	c.changed = make(chan struct{})
}

// currentPKI is the PKI in force.
func (s *Server) currentPKI() *pki.PKI {
	p, _ := s.certs.get()
	return p
}

// caBundle is what clients are told of the CAs: the bundle (serving CA first), the issuing CA,
// and the end of the overlap of a rotation in progress.
func caBundle(p *pki.PKI) *apiv1.CABundle {
	b := &apiv1.CABundle{Pem: p.CAPEM, IssuingCa: p.IssuerHash()}
	if p.Previous != nil {
		b.PreviousTrustedUntil = timestamppb.New(p.PreviousUntil)
	}
	return b
}

// caInfos describes the CAs of p.
func caInfos(p *pki.PKI) []*apiv1.CAInfo {
	info := func(c *x509.Certificate) *apiv1.CAInfo {
		return &apiv1.CAInfo{Hash: jointoken.CAHash(c.Raw), Subject: c.Subject.String(), NotBefore: timestamppb.New(c.NotBefore),
			NotAfter: timestamppb.New(c.NotAfter), Issuing: c.Equal(p.CACert), Serving: c.Equal(p.ServingCA()), Pem: certPEMOf(c)}
	}
	out := []*apiv1.CAInfo{info(p.CACert)}
	if p.Previous != nil {
		prev := info(p.Previous)
		prev.TrustedUntil = timestamppb.New(p.PreviousUntil)
		out = append(out, prev)
	}
	return out
}

func certPEMOf(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

// rotateCA starts a CA rotation (overlap: how long the previous CA stays trusted) or, with
// finish, ends the one in progress. The broker's own admin.yaml is rewritten with the new admin
// certificate and the bundle, so the operator's cablectl keeps working through the rotation.
func (s *Server) rotateCA(overlap time.Duration, finish bool) (*pki.PKI, error) {
	if s.ha != nil {
		return nil, &admission.ProtectedError{Kind: "mesh CA", Name: "etcd",
			Err: errors.New("CA rotation is not available on a broker that keeps its CA in etcd yet: rotate on an embedded broker, or restart every replica on a data dir holding the new CA")}
	}
	s.certs.mu.Lock()
	defer s.certs.mu.Unlock()
	p := s.certs.p
	var (
		q   *pki.PKI
		err error
	)
	now := s.cfg.Now()
	if finish {
		if p.Previous == nil {
			return nil, &admission.ProtectedError{Kind: "mesh CA", Name: p.IssuerHash(), Err: errors.New("no CA rotation is in progress: nothing to finish")}
		}
		q, err = p.FinishRotation(s.cfg.DataDir, s.certs.serverIPs, now)
	} else {
		q, err = p.Rotate(s.cfg.DataDir, now, overlap)
		if errors.Is(err, pki.ErrRotationInProgress) {
			return nil, &admission.ProtectedError{Kind: "mesh CA", Name: p.IssuerHash(), Err: err}
		}
	}
	if err != nil {
		return nil, err
	}
	s.certs.setLocked(q)
	s.pki = q
	if err := s.rewriteAdminConfig(q); err != nil {
		s.log.Error("rewrite admin credential after a CA change", "err", err)
	}
	return q, nil
}

// rewriteAdminConfig rewrites DIR/admin.yaml, when there is one, with p's admin certificate and
// bundle, keeping its broker address.
func (s *Server) rewriteAdminConfig(p *pki.PKI) error {
	path := s.AdminConfigPath()
	c, err := adminconfig.Load(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	c.CA, c.Certificate, c.Key = string(p.CAPEM), string(p.AdminCert), string(p.AdminKey)
	b, err := c.Marshal()
	if err != nil {
		return err
	}
	if err := pki.WriteFile(path, b); err != nil {
		return err
	}
	s.log.Info("rewrote admin credential for the new CA bundle", "path", path)
	return nil
}

// caLoop ends a rotation's overlap when it is due. It wakes at the deadline, and again whenever
// the PKI changes.
func (s *Server) caLoop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		p, changed := s.certs.get()
		var due <-chan time.Time
		if p.Previous != nil {
			// The test clock may jump: look again at least every 10 seconds.
			t.Reset(min(max(p.PreviousUntil.Sub(s.cfg.Now()), 0), 10*time.Second))
			due = t.C
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-due:
			if s.cfg.Now().Before(p.PreviousUntil) {
				continue
			}
			if _, err := s.rotateCA(0, true); err != nil {
				var pe *admission.ProtectedError
				if !errors.As(err, &pe) {
					s.log.Error("end the CA rotation's overlap", "err", err)
				}
				continue
			}
			s.log.Info("CA rotation finished: the previous CA is no longer trusted", "ca", s.currentPKI().IssuerHash(), "previous", jointoken.CAHash(p.Previous.Raw))
		}
	}
}

// RotateCA starts or finishes a CA rotation.
func (a *adminService) RotateCA(_ context.Context, req *apiv1.RotateCARequest) (*apiv1.RotateCAResponse, error) {
	overlap, err := admission.CAOverlap(req.OverlapSeconds, pki.DefaultOverlap)
	if err != nil {
		return nil, rpcError("rotate CA", err)
	}
	q, err := a.s.rotateCA(overlap, req.Finish)
	if err != nil {
		return nil, rpcError("rotate CA", err)
	}
	if req.Finish {
		a.s.log.Info("CA rotation finished early: the previous CA is no longer trusted", "ca", q.IssuerHash())
	} else {
		a.s.log.Info("mesh CA rotated: new certificates come from the new CA; both are trusted until the overlap ends",
			"ca", q.IssuerHash(), "previous", jointoken.CAHash(q.Previous.Raw), "previousTrustedUntil", q.PreviousUntil.UTC().Format(time.RFC3339))
	}
	return &apiv1.RotateCAResponse{Cas: caInfos(q)}, nil
}

// RenewAdminCertificate issues an admin certificate for the CSR's key from the issuing CA.
func (a *adminService) RenewAdminCertificate(_ context.Context, req *apiv1.RenewCertificateRequest) (*apiv1.RenewCertificateResponse, error) {
	if n := len(req.CsrPem); n > admission.MaxCSRBytes {
		return nil, rpcError("renew admin certificate", &admission.InvalidError{Field: "csr_pem", Err: fmt.Errorf("csr_pem: %d bytes, at most %d", n, admission.MaxCSRBytes)})
	}
	p := a.s.currentPKI()
	certPEM, cert, err := p.IssueAdmin(req.CsrPem, a.s.cfg.Now())
	if err != nil {
		return nil, rpcError("renew admin certificate", &admission.InvalidError{Field: "csr_pem", Err: err})
	}
	a.s.log.Info("admin certificate issued", "serial", pki.Serial(cert), "notAfter", cert.NotAfter.UTC().Format(time.RFC3339))
	return &apiv1.RenewCertificateResponse{CertificatePem: certPEM, CaPem: p.CAPEM, NotAfter: timestamppb.New(cert.NotAfter), Ca: caBundle(p)}, nil
}

// ListCertificates lists every node's certificates, the CAs and the caller's admin certificate.
func (a *adminService) ListCertificates(ctx context.Context, _ *apiv1.ListCertificatesRequest) (*apiv1.ListCertificatesResponse, error) {
	p := a.s.currentPKI()
	resp := &apiv1.ListCertificatesResponse{Cas: caInfos(p)}
	err := a.s.store.View(ctx, func(tx store.ReadTx) error {
		var err error
		resp.Nodes, err = tx.NodeCertificates()
		resp.Revision = tx.Revision()
		return err
	})
	if err != nil {
		return nil, rpcError("list certificates", err)
	}
	sort.Slice(resp.Nodes, func(i, j int) bool {
		return store.NodeCertificateKey(resp.Nodes[i].Cluster, resp.Nodes[i].Node) < store.NodeCertificateKey(resp.Nodes[j].Cluster, resp.Nodes[j].Node)
	})
	if id := identityFrom(ctx); id.Admin {
		resp.Admin = &apiv1.IssuedCertificate{Serial: id.Serial, NotAfter: timestamppb.New(id.NotAfter), Used: true}
	}
	return resp, nil
}

// RevokeNode revokes one node's certificates and withdraws its endpoint and exports.
func (a *adminService) RevokeNode(ctx context.Context, req *apiv1.RevokeNodeRequest) (*apiv1.RevokeNodeResponse, error) {
	if err := admission.CheckClusterName("cluster", req.Cluster); err != nil {
		return nil, rpcError("revoke node", err)
	}
	var (
		rev      admission.NodeRevocation
		vips     admission.VIPPlan
		released []string // the node's mesh address claim
	)
	_, err := a.s.store.Update(ctx, func(tx store.Tx) error {
		released = nil
		c, err := tx.Cluster(req.Cluster)
		if err != nil {
			return err
		}
		rec, err := tx.NodeCertificate(req.Cluster, req.Node)
		if err != nil {
			return err
		}
		ep, err := tx.Endpoint(req.Cluster, req.Node)
		if err != nil {
			return err
		}
		exports, err := tx.ServiceExports()
		if err != nil {
			return err
		}
		if rev, err = admission.RevokeNode(req.Cluster, req.Node, c, rec, ep, exports, a.s.cfg.Now()); err != nil || rev.Already {
			return err
		}
		if err := tx.PutNodeCertificate(rev.Node); err != nil {
			return err
		}
		// Its mesh address is released: the next node may have it.
		if released, err = releaseNodeMeshClaims(tx, req.Cluster, req.Node, rec, ep); err != nil {
			return err
		}
		if rev.Endpoint != nil {
			if err := tx.DeleteEndpoint(req.Cluster, req.Node); err != nil {
				return err
			}
		}
		for _, e := range rev.Exports {
			if err := tx.DeleteServiceExport(e.Cluster, e.Node, e.Namespace, e.Name); err != nil {
				return err
			}
		}
		if len(rev.Exports) > 0 {
			all, err := tx.ServiceExports()
			if err != nil {
				return err
			}
			stored, err := tx.ServiceVIPs()
			if err != nil {
				return err
			}
			vips = admission.VIPPlan{Release: admission.ReleaseVIPs(all, stored)}
			if err := a.s.applyVIPPlan(tx, vips); err != nil {
				return err
			}
		}
		rev.Node, err = tx.NodeCertificate(req.Cluster, req.Node)
		return err
	})
	if err != nil {
		return nil, rpcError("revoke node", err)
	}
	a.s.meshHint.released(released)
	if !rev.Already {
		a.s.log.Info("node revoked", "cluster", req.Cluster, "node", req.Node, "endpointRemoved", rev.Endpoint != nil, "exportsRemoved", len(rev.Exports))
		a.s.logVIPPlan(vips)
	}
	return &apiv1.RevokeNodeResponse{Node: rev.Node, EndpointRemoved: rev.Endpoint != nil, ExportsRemoved: uint32(len(rev.Exports))}, nil
}

// RenewCertificate issues a new certificate of the caller's own cluster and node.
func (a *agentService) RenewCertificate(ctx context.Context, req *apiv1.RenewCertificateRequest) (*apiv1.RenewCertificateResponse, error) {
	id := identityFrom(ctx)
	if n := len(req.CsrPem); n > admission.MaxCSRBytes {
		return nil, rpcError("renew certificate", &admission.InvalidError{Field: "csr_pem", Err: fmt.Errorf("csr_pem: %d bytes, at most %d", n, admission.MaxCSRBytes)})
	}
	p := a.s.currentPKI()
	now := a.s.cfg.Now()
	certPEM, cert, err := p.IssueAgentFor(req.CsrPem, id.Cluster, id.ClusterUID, id.Node, now, a.s.cfg.AgentCertificateLifetime)
	if err != nil {
		return nil, rpcError("renew certificate", &admission.InvalidError{Field: "csr_pem", Err: err})
	}
	var r admission.Renewal
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		rec, err := tx.NodeCertificate(id.Cluster, id.Node)
		if err != nil {
			return err
		}
		ep, err := tx.Endpoint(id.Cluster, id.Node)
		if err != nil {
			return err
		}
		if r, err = admission.Renew(id, rec, ep, admission.Issued(cert, p.IssuerHash(), "")); err != nil {
			return err
		}
		if err := tx.PutNodeCertificate(r.Node); err != nil {
			return err
		}
		if r.Endpoint != nil {
			return tx.PutEndpoint(r.Endpoint)
		}
		return nil
	})
	if err != nil {
		return nil, rpcError("renew certificate", err)
	}
	a.s.log.Info("agent certificate renewed", "cluster", id.Cluster, "node", id.Node, "serial", pki.Serial(cert), "previous", id.Serial,
		"notAfter", cert.NotAfter.UTC().Format(time.RFC3339))
	return &apiv1.RenewCertificateResponse{CertificatePem: certPEM, CaPem: p.CAPEM, NotAfter: timestamppb.New(cert.NotAfter), Ca: caBundle(p)}, nil
}
