package brokerlink

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/config"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// registerClient answers the first `busy` registrations with the broker's busy answer (a
// RetryInfo of hint), then registers; it records when each call came and whether it said it
// honours busy answers, and cancels the loop once registered.
type registerClient struct {
	apiv1.AgentClient
	busy   int
	hint   time.Duration
	failed int // then this many calls fail with a deadline, without the broker's answer
	cancel context.CancelFunc

	mu       sync.Mutex
	calls    []time.Time
	accepted []bool
}

func (c *registerClient) RegisterEndpoint(ctx context.Context, req *apiv1.RegisterEndpointRequest, _ ...grpc.CallOption) (*apiv1.RegisterEndpointResponse, error) {
	md, _ := metadata.FromOutgoingContext(ctx)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls = append(c.calls, time.Now())
	c.accepted = append(c.accepted, len(md.Get(brokerclient.AcceptBusyKey)) > 0)
	if len(c.calls) <= c.busy {
		st, err := status.New(codes.ResourceExhausted, "broker busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(c.hint)})
		if err != nil {
			return nil, err
		}
		return nil, st.Err()
	}
	if len(c.calls) <= c.busy+c.failed {
		return nil, status.Error(codes.DeadlineExceeded, "context deadline exceeded")
	}
	c.cancel()
	return &apiv1.RegisterEndpointResponse{Endpoint: req.GetEndpoint()}, nil
}

func runRegisterLoop(t *testing.T, c *registerClient) time.Time {
	t.Helper()
	a := New(config.Static{Cluster: "east", Node: "gw1", Gateway: true, HeartbeatInterval: 10 * time.Second, LeaseSeconds: 30}, Deps{
		Log: slog.New(slog.DiscardHandler), Backoff: func() *retry.Backoff { return &retry.Backoff{Min: time.Second, Max: 15 * time.Second} },
		Endpoint: func() *apiv1.Endpoint { return &apiv1.Endpoint{Cluster: "east", Node: "gw1"} }, OnRegistered: func(*apiv1.Endpoint) {},
	})
	a.conn = newBrokerConn(nil)
	a.redial = func() {}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c.cancel = cancel
	start := time.Now()
	a.registerLoop(ctx, c)
	if ctx.Err() == context.DeadlineExceeded {
		t.Fatalf("not registered within 10s: %d calls", len(c.calls))
	}
	return start
}

// A gateway registers as soon as its loop starts: one joining a quiet mesh does not wait for a
// storm that is not happening (it used to wait up to a second at random).
func TestFirstRegistrationGoesAtOnce(t *testing.T) {
	c := &registerClient{}
	start := runRegisterLoop(t, c)
	if len(c.calls) != 1 {
		t.Fatalf("%d registrations, want 1", len(c.calls))
	}
	if d := c.calls[0].Sub(start); d > 100*time.Millisecond {
		t.Fatalf("first registration %s after the loop started, want at once", d)
	}
	if !c.accepted[0] {
		t.Fatalf("the registration did not say it honours busy answers (%s)", brokerclient.AcceptBusyKey)
	}
}

// A busy broker's answer is honoured: the agent registers again after about the hint (half of
// it to one and a half times it), not after a heartbeat interval, and not at once.
func TestBusyBrokerAnswerIsHonoured(t *testing.T) {
	const hint = 200 * time.Millisecond
	c := &registerClient{busy: 2, hint: hint}
	runRegisterLoop(t, c)
	if len(c.calls) != 3 {
		t.Fatalf("%d registrations, want 3 (two busy answers, then registered)", len(c.calls))
	}
	for i := 1; i < len(c.calls); i++ {
		// Scheduling may add to the wait, never take from it; 2s is far below the 8-10s a
		// failed registration waits.
		if gap := c.calls[i].Sub(c.calls[i-1]); gap < hint/2 || gap > 2*time.Second {
			t.Errorf("registration %d came %s after a busy answer with a %s hint, want within [%s, 2s]", i+1, gap, hint, hint/2)
		}
	}
}

// A registration that failed without the broker's answer (its deadline passed in a storm, the
// connection broke) is retried after the backoff's step (1s, then 2s, each plus up to half of
// it), not a heartbeat interval (8-10s) later.
func TestAFailedRegistrationIsRetriedAfterTheBackoffNotAHeartbeat(t *testing.T) {
	c := &registerClient{failed: 2}
	runRegisterLoop(t, c)
	if len(c.calls) != 3 {
		t.Fatalf("%d registrations, want 3 (two failed, then registered)", len(c.calls))
	}
	for i, want := range []time.Duration{time.Second, 2 * time.Second} {
		if gap := c.calls[i+1].Sub(c.calls[i]); gap < want || gap > want*3/2+500*time.Millisecond {
			t.Errorf("registration %d came %s after a failed one, want the backoff's step %s (plus up to half)", i+2, gap, want)
		}
	}
}
