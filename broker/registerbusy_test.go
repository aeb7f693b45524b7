package broker

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// A broker with more registrations and heartbeats in flight than it has room for turns away the
// registration of an agent that honours a busy answer, with a wait the agent reads; an agent
// that did not ask (older ones) is served as before, and so is everyone once the backlog drains.
func TestRegisterBusyOnlyForAgentsThatAccept(t *testing.T) {
	if acceptBusyKey != brokerclient.AcceptBusyKey {
		t.Fatalf("broker's key %q, agent's %q: they must match", acceptBusyKey, brokerclient.AcceptBusyKey)
	}
	b := startBroker(t, t.TempDir(), brokerOpts{})
	ag := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	c := ag.client(t, b.addr)
	req := &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1"), LeaseSeconds: 30}

	const inFlight = 2 * registerBusyThreshold
	for range inFlight {
		b.srv.writing.enter()
	}
	_, err := c.RegisterEndpoint(brokerclient.AcceptBusy(ctxT(t)), req)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("registration with %d calls in flight: %v, want ResourceExhausted", inFlight, err)
	}
	wait, busy := brokerclient.BusyWait(err)
	if !busy {
		t.Fatalf("the busy answer %v carries no wait the agent reads", err)
	}
	if hint := busyHint(inFlight); hint != 2*time.Second || wait < hint/2 || wait > hint*3/2 {
		t.Fatalf("hint %s, agent waits %s: want a 2s hint and a wait within [1s, 3s]", hint, wait)
	}
	if _, err := c.RegisterEndpoint(ctxT(t), req); err != nil {
		t.Fatalf("an agent that does not accept busy answers was refused: %v", err)
	}
	for range inFlight {
		b.srv.writing.leave()
	}
	if _, err := c.RegisterEndpoint(brokerclient.AcceptBusy(ctxT(t)), req); err != nil {
		t.Fatalf("registration once the backlog drained: %v", err)
	}
}

func TestBusyHintGrowsWithTheBacklog(t *testing.T) {
	for _, tt := range []struct {
		n    int
		want time.Duration
	}{
		{registerBusyThreshold + 1, time.Second + time.Second/registerBusyThreshold},
		{2 * registerBusyThreshold, 2 * time.Second},
		{4 * registerBusyThreshold, 4 * time.Second},
		{100 * registerBusyThreshold, registerBusyMaxHint},
	} {
		if got := busyHint(tt.n); got != tt.want {
			t.Errorf("busyHint(%d) = %s, want %s", tt.n, got, tt.want)
		}
	}
}
