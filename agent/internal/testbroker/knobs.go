package testbroker

import (
	"context"
	"crypto/x509"
	"slices"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/watchzstd"
	"github.com/cablemesh/cablemesh/broker"
	"github.com/cablemesh/cablemesh/broker/pki"
)

// knobs are what a test asks of the broker that no broker does: refusing a call it would
// answer, answering as an older broker, holding back the imports, counting the calls that
// succeeded, and recording the callers and the watches. They are gRPC interceptors that run
// after the broker's authentication (broker.Config.UnaryInterceptors), around the real services.
// They outlive restarts of the server.
type knobs struct {
	mu sync.Mutex
	// refuse holds the error each refused method (its full name) fails with.
	refuse map[string]error
	// succeeded counts the calls of each method that returned no error.
	succeeded map[string]int
	// lastSerial is the serial of the certificate of each agent's (cluster/node) last call.
	lastSerial map[string]string
	// watchRequests are the watch requests received, in order; encodedSent counts the watch
	// messages sent compressed.
	watchRequests []*apiv1.WatchRequest
	encodedSent   int64
	// importsHeld: watches send no imports; heldWatches end the watches that had imports
	// held back, when the hold ends (the agent watches again and gets them).
	importsHeld bool
	heldWatches map[*observedStream]bool
	// refused logs a call the broker refused (with -v: the broker logs none of its answers).
	refused func(method string, err error)
}

func newKnobs(refused func(method string, err error)) *knobs {
	return &knobs{refuse: map[string]error{}, succeeded: map[string]int{}, lastSerial: map[string]string{},
		heldWatches: map[*observedStream]bool{}, refused: refused}
}

// refuseWith makes method fail with err before the service sees the call (nil: answer again).
func (k *knobs) refuseWith(method string, err error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if err == nil {
		delete(k.refuse, method)
		return
	}
	k.refuse[method] = err
}

// count is how many calls of method succeeded.
func (k *knobs) count(method string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.succeeded[method]
}

// before records the caller of a call the broker authenticated, and says whether it is refused.
func (k *knobs) before(ctx context.Context, method string) error {
	id, ok := agentIdentity(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	if ok {
		k.lastSerial[id.Cluster+"/"+id.Node] = id.Serial
	}
	return k.refuse[method]
}

// agentIdentity is the agent of the call's verified client certificate, if any.
func agentIdentity(ctx context.Context) (pki.Identity, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return pki.Identity{}, false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return pki.Identity{}, false
	}
	var leaf *x509.Certificate = ti.State.VerifiedChains[0][0]
	id, err := pki.IdentityOf(leaf)
	return id, err == nil && !id.Admin
}

// unary is the interceptor of the unary calls.
func (k *knobs) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if refused := k.before(ctx, info.FullMethod); refused != nil {
		return nil, refused
	}
	resp, err := handler(ctx, req)
	if err != nil {
		k.refused(info.FullMethod, err)
		return resp, err
	}
	k.mu.Lock()
	k.succeeded[info.FullMethod]++
	k.mu.Unlock()
	return resp, nil
}

// stream is the interceptor of the streams (the watch): it records each watch's request, counts
// the messages that went compressed, and holds back imports while they are held.
func (k *knobs) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if refused := k.before(ss.Context(), info.FullMethod); refused != nil {
		return refused
	}
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	s := &observedStream{ServerStream: ss, ctx: ctx, end: cancel, k: k}
	defer func() {
		k.mu.Lock()
		delete(k.heldWatches, s)
		k.mu.Unlock()
	}()
	err := handler(srv, s)
	if err != nil {
		k.refused(info.FullMethod, err)
	}
	return err
}

// observedStream is a watch as the knobs see it. Its context ends when the knobs end it.
type observedStream struct {
	grpc.ServerStream
	ctx context.Context
	end context.CancelFunc
	k   *knobs
}

func (s *observedStream) Context() context.Context { return s.ctx }

func (s *observedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*apiv1.WatchRequest); ok && err == nil {
		s.k.mu.Lock()
		s.k.watchRequests = append(s.k.watchRequests, proto.Clone(req).(*apiv1.WatchRequest))
		s.k.mu.Unlock()
	}
	return err
}

// SendMsg sends m, counted, or without its imports while they are held.
func (s *observedStream) SendMsg(m any) error {
	resp, err := watchResponse(m)
	if err != nil || resp == nil {
		return s.ServerStream.SendMsg(m)
	}
	s.k.mu.Lock()
	if len(resp.GetEncoded()) > 0 {
		s.k.encodedSent++
	}
	held := s.k.importsHeld
	s.k.mu.Unlock()
	if !held {
		return s.ServerStream.SendMsg(m)
	}
	if err := watchzstd.Expand(resp); err != nil {
		return status.Errorf(codes.Internal, "testbroker: expand a watch message: %v", err)
	}
	if resp.Imports == nil {
		return s.ServerStream.SendMsg(resp)
	}
	resp.Imports = nil
	s.k.mu.Lock()
	s.k.heldWatches[s] = true
	s.k.mu.Unlock()
	if len(resp.GetEvents()) == 0 && resp.GetCa() == nil && !resp.GetSnapshot() {
		return nil // it held nothing but the imports
	}
	return s.ServerStream.SendMsg(resp)
}

// watchResponse is m decoded when it is a watch message (nil when it is not).
func watchResponse(m any) (*apiv1.WatchResponse, error) {
	switch m := m.(type) {
	case broker.PreEncoded:
		resp := &apiv1.WatchResponse{}
		return resp, proto.Unmarshal(m.WireBytes(), resp)
	case *apiv1.WatchResponse:
		return proto.Clone(m).(*apiv1.WatchResponse), nil
	}
	return nil, nil
}

// releaseImports ends the hold and every watch that had imports held back: the agent watches
// again and gets its imports on the new watch's first message.
func (k *knobs) releaseImports() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.importsHeld = false
	for s := range k.heldWatches {
		s.end()
	}
	clear(k.heldWatches)
}

// Renewals is how many RenewCertificate calls succeeded.
func (b *Broker) Renewals() int { return b.knobs.count(apiv1.Agent_RenewCertificate_FullMethodName) }

// IngressIssued counts the ingress certificates issued.
func (b *Broker) IngressIssued() int {
	return b.knobs.count(apiv1.Agent_IssueIngressCertificate_FullMethodName)
}

// Counts returns how many Join, RegisterEndpoint and Heartbeat calls succeeded.
func (b *Broker) Counts() (joins, registers, beats int) {
	return b.knobs.count(apiv1.Agent_Join_FullMethodName), b.knobs.count(apiv1.Agent_RegisterEndpoint_FullMethodName),
		b.knobs.count(apiv1.Agent_Heartbeat_FullMethodName)
}

// SetRenewError makes RenewCertificate fail with err (nil: answer again).
func (b *Broker) SetRenewError(err error) {
	b.knobs.refuseWith(apiv1.Agent_RenewCertificate_FullMethodName, err)
}

// RefuseJoins makes Join fail with err (nil: answer again).
func (b *Broker) RefuseJoins(err error) { b.knobs.refuseWith(apiv1.Agent_Join_FullMethodName, err) }

// ActAsOldBroker makes IssueIngressCertificate answer Unimplemented, as a broker older than it.
func (b *Broker) ActAsOldBroker() {
	b.knobs.refuseWith(apiv1.Agent_IssueIngressCertificate_FullMethodName,
		status.Error(codes.Unimplemented, "method IssueIngressCertificate not implemented"))
}

// LastSerial is the serial (hex) of the certificate of cluster/node's last authenticated call.
func (b *Broker) LastSerial(cluster, node string) string {
	b.knobs.mu.Lock()
	defer b.knobs.mu.Unlock()
	return b.knobs.lastSerial[cluster+"/"+node]
}

// EncodedSent is how many watch messages went compressed.
func (b *Broker) EncodedSent() int64 {
	b.knobs.mu.Lock()
	defer b.knobs.mu.Unlock()
	return b.knobs.encodedSent
}

// WatchRequests returns the watch requests received, in order.
func (b *Broker) WatchRequests() []*apiv1.WatchRequest {
	b.knobs.mu.Lock()
	defer b.knobs.mu.Unlock()
	return slices.Clone(b.knobs.watchRequests)
}

// HoldImports makes watches send no imports, not even the first (empty) set, until
// ReleaseImports: a test can then see the agent before its imports are synced.
func (b *Broker) HoldImports() {
	b.knobs.mu.Lock()
	defer b.knobs.mu.Unlock()
	b.knobs.importsHeld = true
}

// ReleaseImports ends HoldImports: the watches that had imports held back end, and the agent's
// next watch gets them.
func (b *Broker) ReleaseImports() { b.knobs.releaseImports() }
