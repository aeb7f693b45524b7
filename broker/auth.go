package broker

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

type identityKey struct{}

// identityFrom returns the caller's identity that the interceptor put in ctx.
func identityFrom(ctx context.Context) pki.Identity {
	id, _ := ctx.Value(identityKey{}).(pki.Identity)
	return id
}

var (
	adminService_ = "/" + apiv1.Admin_ServiceDesc.ServiceName + "/"
	agentService_ = "/" + apiv1.Agent_ServiceDesc.ServiceName + "/"
)

func (s *Server) unaryAuth(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	ctx, err := s.authorize(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return h(ctx, req)
}

type authedStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (a authedStream) Context() context.Context { return a.ctx }

func (s *Server) streamAuth(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
	ctx, err := s.authorize(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return h(srv, authedStream{ServerStream: ss, ctx: ctx})
}

// authorize decides who may call method: Admin needs the admin certificate; Agent.Join needs no
// certificate (the join token is checked by Join itself); every other Agent call needs an agent
// certificate of a cluster that still exists with the UID the certificate names.
func (s *Server) authorize(ctx context.Context, method string) (context.Context, error) {
	if method == apiv1.Agent_Join_FullMethodName {
		return ctx, nil
	}
	id, chains, err := peerIdentity(ctx)
	if err != nil {
		return nil, rpcError("authorize", err)
	}
	issuer := s.currentPKI().IssuerOfChains(chains)
	if err := methodAllowed(method, id); err != nil {
		return nil, rpcError("authorize", err)
	}
	if !id.Admin {
		if err := s.checkAgent(ctx, id, issuer); err != nil {
			return nil, err
		}
	}
	s.log.Debug("authorized", "method", method, "caller", id.String())
	return context.WithValue(ctx, identityKey{}, id), nil
}

// methodAllowed decides whether id may call method at all: the Admin service is the admin
// certificate's, the Agent service the agents'.
func methodAllowed(method string, id pki.Identity) error {
	forbidden := func(format string, args ...any) error {
		return &admission.ForbiddenError{Caller: id.String(), Target: method, Err: fmt.Errorf(format, args...)}
	}
	switch {
	case strings.HasPrefix(method, adminService_):
		if !id.Admin {
			return forbidden("%s needs the admin certificate; the caller is %s", method, id)
		}
	case strings.HasPrefix(method, agentService_):
		if id.Admin {
			return forbidden("%s is for agents; the admin certificate may not call it", method)
		}
	default:
		return forbidden("method %s is not served to %s", method, id)
	}
	return nil
}

// peerIdentity reads the identity from the client certificate the TLS layer verified against the
// mesh CA (VerifyClientCertIfGiven: a certificate is optional, but if given it must verify), and
// returns the chains it verified.
func peerIdentity(ctx context.Context) (pki.Identity, [][]*x509.Certificate, error) {
	refused := func(err error) (pki.Identity, [][]*x509.Certificate, error) {
		return pki.Identity{}, nil, &admission.CredentialError{Err: err}
	}
	p, ok := peer.FromContext(ctx)
	if !ok {
		return refused(errors.New("no peer information"))
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return refused(errors.New("connection is not TLS"))
	}
	if len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return refused(errors.New("this call needs a client certificate of the mesh CA (the admin certificate, or the agent certificate issued at Join); none was presented"))
	}
	leaf := ti.State.VerifiedChains[0][0]
	id, err := pki.IdentityOf(leaf)
	if err != nil {
		return refused(fmt.Errorf("client certificate: %w", err))
	}
	return id, ti.State.VerifiedChains, nil
}

// checkAgent checks, on every call and stream of agent id, that its cluster still exists with the
// UID its certificate names and that its certificate is still good for its node (not revoked, not
// replaced: admission.AgentCertificate). A certificate's first use is recorded, and one issued
// before the broker kept node records is adopted, in a write of its own.
func (s *Server) checkAgent(ctx context.Context, id pki.Identity, issuer string) error {
	var (
		c      *apiv1.Cluster
		update *apiv1.NodeCertificate
	)
	decide := func(tx store.ReadTx) error {
		var err error
		if c, err = tx.Cluster(id.Cluster); err != nil {
			return err
		}
		if err := admission.AgentCluster(id, c); err != nil {
			return err
		}
		rec, err := tx.NodeCertificate(id.Cluster, id.Node)
		if err != nil {
			return err
		}
		update, err = admission.AgentCertificate(id, rec, issuer, s.cfg.Now())
		return err
	}
	if err := s.store.View(ctx, decide); err != nil {
		return rpcError("authorize", err)
	}
	if update == nil {
		return nil
	}
	// Decided again in the transaction: another call of the same certificate, or a join, may
	// have written the record since.
	_, err := s.store.Update(ctx, func(tx store.Tx) error {
		if err := decide(tx); err != nil || update == nil {
			return err
		}
		old, err := tx.NodeCertificate(id.Cluster, id.Node)
		if err != nil {
			return err
		}
		if old == nil {
			s.log.Info("adopted a certificate issued before node records: it is now the node's one certificate", "cluster", id.Cluster, "node", id.Node, "serial", id.Serial)
			return tx.PutNodeCertificate(update)
		}
		return tx.TouchNodeCertificate(update)
	})
	if err != nil {
		return rpcError("authorize", err)
	}
	return nil
}
