package fakebroker

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// knobs are what a test asks of the broker that no broker does: refusing a call it would
// answer, answering as an older broker, counting the calls that succeeded, and recording the
// watches. They wrap the Agent service as gRPC interceptors, apart from what the service does.
type knobs struct {
	mu sync.Mutex
	// refuse holds the error each refused method (its full name) fails with.
	refuse map[string]error
	// succeeded counts the calls of each method that returned no error.
	succeeded map[string]int
	// watchRequests are the watch requests received, in order; encodedSent counts the watch
	// messages sent compressed.
	watchRequests []*apiv1.WatchRequest
	encodedSent   atomic.Int64
}

func newKnobs() *knobs { return &knobs{refuse: map[string]error{}, succeeded: map[string]int{}} }

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

// unary is the interceptor of the unary Agent calls.
func (k *knobs) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	k.mu.Lock()
	refused := k.refuse[info.FullMethod]
	k.mu.Unlock()
	if refused != nil {
		return nil, refused
	}
	resp, err := handler(ctx, req)
	if err == nil {
		k.mu.Lock()
		k.succeeded[info.FullMethod]++
		k.mu.Unlock()
	}
	return resp, err
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

// SetRenewError makes RenewCertificate fail with err (nil: succeed).
func (b *Broker) SetRenewError(err error) {
	b.knobs.refuseWith(apiv1.Agent_RenewCertificate_FullMethodName, err)
}

// RefuseJoins makes Join fail with err (nil: accept again).
func (b *Broker) RefuseJoins(err error) { b.knobs.refuseWith(apiv1.Agent_Join_FullMethodName, err) }

// ActAsOldBroker makes IssueIngressCertificate answer Unimplemented, as a broker older than it.
func (b *Broker) ActAsOldBroker() {
	b.knobs.refuseWith(apiv1.Agent_IssueIngressCertificate_FullMethodName,
		status.Error(codes.Unimplemented, "method IssueIngressCertificate not implemented"))
}

// stream is the interceptor of the Watch stream: it records each watch's request and counts
// the messages that went compressed.
func (k *knobs) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, &observedStream{ServerStream: ss, k: k})
}

// observedStream is a watch as the knobs see it.
type observedStream struct {
	grpc.ServerStream
	k *knobs
}

func (s *observedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*apiv1.WatchRequest); ok && err == nil {
		s.k.mu.Lock()
		s.k.watchRequests = append(s.k.watchRequests, proto.Clone(req).(*apiv1.WatchRequest))
		s.k.mu.Unlock()
	}
	return err
}

func (s *observedStream) SendMsg(m any) error {
	if resp, ok := m.(*apiv1.WatchResponse); ok && len(resp.GetEncoded()) > 0 {
		s.k.encodedSent.Add(1)
	}
	return s.ServerStream.SendMsg(m)
}

// EncodedSent is how many watch messages went compressed.
func (b *Broker) EncodedSent() int64 { return b.knobs.encodedSent.Load() }

// WatchRequests returns the watch requests received, in order.
func (b *Broker) WatchRequests() []*apiv1.WatchRequest {
	b.knobs.mu.Lock()
	defer b.knobs.mu.Unlock()
	return slices.Clone(b.knobs.watchRequests)
}
