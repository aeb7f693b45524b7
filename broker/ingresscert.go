package broker

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/pki"
)

// IssueIngressCertificate issues the serving certificate of the caller's ingress, for the key of
// the CSR (the agent makes one for its Envoy: its own key never leaves the agent). The certificate
// names the caller's own cluster and node and authenticates nobody here (pki.IssueIngress,
// refuseIngressCertificate). Nothing is stored: the certificate grants no access at the broker,
// and a caller the broker no longer accepts cannot get here.
func (a *agentService) IssueIngressCertificate(ctx context.Context, req *apiv1.IssueIngressCertificateRequest) (*apiv1.IssueIngressCertificateResponse, error) {
	id := identityFrom(ctx)
	if n := len(req.GetCsrPem()); n > admission.MaxCSRBytes {
		return nil, rpcError("issue ingress certificate", &admission.InvalidError{Field: "csr_pem", Err: fmt.Errorf("csr_pem: %d bytes, at most %d", n, admission.MaxCSRBytes)})
	}
	certPEM, cert, err := a.s.currentPKI().IssueIngress(req.GetCsrPem(), id.Cluster, id.Node, a.s.cfg.Now())
	if err != nil {
		return nil, rpcError("issue ingress certificate", &admission.InvalidError{Field: "csr_pem", Err: err})
	}
	a.s.log.Info("ingress certificate issued", "cluster", id.Cluster, "node", id.Node, "serial", pki.Serial(cert),
		"notAfter", cert.NotAfter.UTC().Format(time.RFC3339))
	return &apiv1.IssueIngressCertificateResponse{CertificatePem: certPEM, NotAfter: timestamppb.New(cert.NotAfter)}, nil
}
