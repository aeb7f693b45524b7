package broker

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// acceptBusyKey is the metadata key by which an agent says it honours a busy answer; the same
// as brokerclient.AcceptBusyKey (the broker does not import the agent's packages).
const acceptBusyKey = "cablemesh-accept-busy"

// registerBusy is the busy answer to a registration, or nil when the broker has room for it or
// the agent did not say it honours such an answer (acceptBusyKey: older agents would wait a
// whole heartbeat interval on it). Room is measured, not counted: the broker turns a
// registration away only when the registrations and heartbeats in flight would, at the rate it
// has been completing them, keep it waiting longer than registerWaitBudget (writemeter.go). A
// fast store takes a storm as it comes; a saturated one spreads it, telling each agent turned
// away when to come back.
func (a *agentService) registerBusy(ctx context.Context) error {
	if !acceptsBusy(ctx) {
		return nil
	}
	l, hint, ok := a.s.writes.admit()
	if ok {
		return nil
	}
	return busyStatus(l, hint)
}

// beginWrite counts a registration or heartbeat in flight until the returned func is called.
func (s *Server) beginWrite() func() {
	s.writing.enter()
	s.writes.begin()
	return func() {
		s.writes.end()
		s.writing.leave()
	}
}

// busyStatus is ResourceExhausted with a google.rpc.RetryInfo of hint.
func busyStatus(l writeLoad, hint time.Duration) error {
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("broker busy: %d registrations and heartbeats in flight, done at %.0f/s, a wait of %s; register again in %s",
		l.inFlight, l.rate, l.wait.Round(time.Millisecond), hint.Round(time.Millisecond)))
	if withHint, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(hint)}); err == nil {
		st = withHint
	}
	return st.Err()
}

// acceptsBusy reports whether the caller sent acceptBusyKey.
func acceptsBusy(ctx context.Context) bool {
	md, ok := metadata.FromIncomingContext(ctx)
	return ok && len(md.Get(acceptBusyKey)) > 0
}
