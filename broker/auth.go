package broker

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"strings"
	"time"

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
	if err := refuseIngressCertificate(leaf); err != nil {
		return refused(err)
	}
	id, err := pki.IdentityOf(leaf)
	if err != nil {
		return refused(fmt.Errorf("client certificate: %w", err))
	}
	return id, ti.State.VerifiedChains, nil
}

// refuseIngressCertificate refuses a node's ingress certificate for every call: Envoy holds its
// key, and whoever can read Envoy's secrets must not be able to act as the node. Its serverAuth-only
// usage already fails the TLS layer's client check, and its URI names no agent; this says so by
// name, whatever the chain.
func refuseIngressCertificate(leaf *x509.Certificate) error {
	if pki.IsIngress(leaf) {
		return fmt.Errorf("client certificate %q (%v) is an ingress certificate: it serves the node's ingress and authenticates no caller at the broker", leaf.Subject.CommonName, leaf.Subject.Organization)
	}
	return nil
}

// checkAgent checks, on every call and stream of agent id, that its cluster still exists with the
// UID its certificate names and that its certificate is still good for its node (not revoked, not
// replaced: admission.AgentCertificate). A certificate's first use is recorded, and one issued
// before the broker kept node records is adopted, in a write of its own.
//
// The check reads this replica's own state (store.ViewLocal): on etcd a linearizable read is a
// round trip to the leader for every call, and at 5,100 agents starting at once those reads
// were the longest wait of every call. What it lets through is decided again where it matters:
// an agent's writes check the certificate's binding in their own transaction, a watch checks
// again whenever the node's record changes, and a refusal is confirmed with a linearizable read
// before it is given (the local state may not yet hold a join that another replica committed).
func (s *Server) checkAgent(ctx context.Context, id pki.Identity, issuer string) error {
	var update *apiv1.NodeCertificate
	decide := func(tx store.ReadTx) (err error) {
		update, err = s.decideAgent(tx, id, issuer)
		return err
	}
	if err := store.ViewLocal(ctx, s.store, decide); err != nil {
		return rpcError("authorize", err)
	}
	if update == nil {
		return nil
	}
	// An agent's first calls come together (its watch and its registration): they share one
	// write of the first use, which does not end with the first caller's context.
	_, err, _ := s.firstUse.Do(id.Cluster+"/"+id.Node+"/"+id.Serial, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), firstUseTimeout)
		defer cancel()
		return nil, s.recordFirstUse(ctx, id, issuer)
	})
	return err
}

// firstUseTimeout bounds the write of a certificate's first use (the calls that wait for it
// have deadlines of their own).
const firstUseTimeout = 30 * time.Second

// decideAgent is checkAgent's decision on tx: an error when agent id may not call, else the node
// record to write first (nil when there is nothing to write).
func (s *Server) decideAgent(tx store.ReadTx, id pki.Identity, issuer string) (*apiv1.NodeCertificate, error) {
	c, err := tx.Cluster(id.Cluster)
	if err != nil {
		return nil, err
	}
	if err := admission.AgentCluster(id, c); err != nil {
		return nil, err
	}
	rec, err := tx.NodeCertificate(id.Cluster, id.Node)
	if err != nil {
		return nil, err
	}
	return admission.AgentCertificate(id, rec, issuer, s.cfg.Now())
}

// stillGood decides again, in a write's own transaction, that agent id's certificate is good:
// checkAgent authorized the call on the replica's local state, which may lag by a moment.
func (s *Server) stillGood(tx store.ReadTx, id pki.Identity) error {
	rec, err := tx.NodeCertificate(id.Cluster, id.Node)
	if err != nil {
		return err
	}
	_, err = admission.AgentCertificate(id, rec, "", s.cfg.Now())
	return err
}

// recordFirstUse records the first use of agent id's certificate (or adopts one issued before the
// broker kept node records), deciding again in the transaction: another call of the same
// certificate, or a join, may have written the record since.
func (s *Server) recordFirstUse(ctx context.Context, id pki.Identity, issuer string) error {
	_, err := s.store.Update(ctx, func(tx store.Tx) error {
		update, err := s.decideAgent(tx, id, issuer)
		if err != nil || update == nil {
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
