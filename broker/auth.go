package broker

import (
	"context"
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
	id, err := peerIdentity(ctx)
	if err != nil {
		return nil, rpcError("authorize", err)
	}
	if err := methodAllowed(method, id); err != nil {
		return nil, rpcError("authorize", err)
	}
	if !id.Admin {
		var c *apiv1.Cluster
		err := s.store.View(ctx, func(tx store.ReadTx) error {
			var err error
			c, err = tx.Cluster(id.Cluster)
			return err
		})
		if err != nil {
			return nil, rpcError(fmt.Sprintf("read cluster %q", id.Cluster), err)
		}
		if err := admission.AgentCluster(id, c); err != nil {
			return nil, rpcError("authorize", err)
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
// mesh CA (VerifyClientCertIfGiven: a certificate is optional, but if given it must verify).
func peerIdentity(ctx context.Context) (pki.Identity, error) {
	refused := func(err error) (pki.Identity, error) {
		return pki.Identity{}, &admission.CredentialError{Err: err}
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
	id, err := pki.IdentityOf(ti.State.VerifiedChains[0][0])
	if err != nil {
		return refused(fmt.Errorf("client certificate: %w", err))
	}
	return id, nil
}
