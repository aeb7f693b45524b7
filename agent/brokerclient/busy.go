package brokerclient

import (
	"context"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// AcceptBusyKey is the request metadata key by which an agent tells the broker that it honours
// a busy answer to its RegisterEndpoint: ResourceExhausted with a google.rpc.RetryInfo detail,
// "come back in this long". A broker answers so only callers that sent the key (older agents
// would take it for a failure and wait a whole heartbeat interval); an older broker ignores the
// key and never answers so. Either way the call is otherwise the same.
const AcceptBusyKey = "cablemesh-accept-busy"

// MaxBusyWait caps how long an agent waits on a broker's busy answer, whatever the broker said:
// a registration is never put off longer than this by one answer.
const MaxBusyWait = 10 * time.Second

// AcceptBusy marks the outgoing call made with the returned context as one whose caller honours
// a busy answer (AcceptBusyKey).
func AcceptBusy(ctx context.Context) context.Context {
	return metadata.AppendToOutgoingContext(ctx, AcceptBusyKey, "1")
}

// BusyWait reports whether err is the broker's busy answer and, if so, how long to wait before
// trying again: the broker's hint, lengthened by up to a quarter of it at random, at most
// MaxBusyWait. The broker gives the agents it turns away return times one after the other, as
// fast as it measured it can take them: the hint is the earliest it has room, so coming back
// sooner only earns another busy answer; the jitter spreads the agents whose answers named the
// same moment (older brokers name one per backlog size).
func BusyWait(err error) (time.Duration, bool) {
	hint, ok := busyHint(err)
	if !ok {
		return 0, false
	}
	return busyWait(hint, rand.Int64N), true
}

// busyHint is the retry delay of a ResourceExhausted status carrying a RetryInfo; other
// ResourceExhausted answers (the mesh address range is full, ...) are not a busy broker.
func busyHint(err error) (time.Duration, bool) {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return 0, false
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok && ri.GetRetryDelay() != nil {
			if d := ri.GetRetryDelay().AsDuration(); d > 0 {
				return d, true
			}
		}
	}
	return 0, false
}

// busyWait is the jittered wait on a hint; n(k) returns a value in [0, k).
func busyWait(hint time.Duration, n func(int64) int64) time.Duration {
	hint = min(hint, MaxBusyWait)
	d := hint + time.Duration(n(int64(hint/busyJitter)+1))
	return min(d, MaxBusyWait)
}

// busyJitter is the share of the hint the wait is lengthened by at most: a quarter.
const busyJitter = 4
