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

const (
	// acceptBusyKey is the metadata key by which an agent says it honours a busy answer; the
	// same as brokerclient.AcceptBusyKey (the broker does not import the agent's packages).
	acceptBusyKey = "cablemesh-accept-busy"
	// registerBusyThreshold is how many registrations and heartbeats may be in flight before a
	// registration is turned away as busy: a fleet registering at once fills the store's commit
	// groups; beyond this many, a call only waits in line, nearer its deadline, and holds back
	// the snapshots (Watch) of the agents that already registered.
	registerBusyThreshold = 512
	// registerBusyMaxHint caps the wait a busy answer asks for.
	registerBusyMaxHint = 8 * time.Second
)

// registerBusy is the busy answer to a registration, or nil when the broker has room for it or
// the agent did not say it honours such an answer (acceptBusyKey: older agents
// would wait a whole heartbeat interval on it). The wait asked for grows with the backlog: a
// second for each registerBusyThreshold calls in flight, at most registerBusyMaxHint; the agent
// jitters it.
func (a *agentService) registerBusy(ctx context.Context) error {
	if !acceptsBusy(ctx) {
		return nil
	}
	n := a.s.writing.inFlight()
	if n <= registerBusyThreshold {
		return nil
	}
	return busyStatus(n, busyHint(n))
}

// busyHint is the wait asked of a caller turned away with n calls in flight.
func busyHint(n int) time.Duration {
	return min(time.Duration(n)*time.Second/registerBusyThreshold, registerBusyMaxHint)
}

// busyStatus is ResourceExhausted with a google.rpc.RetryInfo of hint.
func busyStatus(n int, hint time.Duration) error {
	st := status.New(codes.ResourceExhausted, fmt.Sprintf("broker busy: %d registrations and heartbeats in flight; register again in %s", n, hint))
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

// inFlight is the current count.
func (b *backlog) inFlight() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.n
}
