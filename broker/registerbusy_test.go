package broker

import (
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// A broker whose registrations and heartbeats in flight would keep a new one waiting too long
// turns away the registration of an agent that honours a busy answer, with a wait the agent
// reads; an agent that did not ask (older ones) is served as before, and so is everyone once the
// backlog drains.
func TestRegisterBusyOnlyForAgentsThatAccept(t *testing.T) {
	if acceptBusyKey != brokerclient.AcceptBusyKey {
		t.Fatalf("broker's key %q, agent's %q: they must match", acceptBusyKey, brokerclient.AcceptBusyKey)
	}
	b := startBroker(t, t.TempDir(), brokerOpts{})
	ag := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	c := ag.client(t, b.addr)
	req := &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1"), LeaseSeconds: 30}

	// 2,000 calls in flight, 100 done in the second since the first: a wait of 20 s at 100/s.
	clock := time.Now()
	b.srv.writes.setClock(func() time.Time { return clock })
	const inFlight = 2000
	for range inFlight {
		b.srv.writes.begin()
	}
	for range 100 {
		b.srv.writes.begin()
		b.srv.writes.end()
	}
	clock = clock.Add(time.Second)
	b.srv.writes.setClock(func() time.Time { return clock })
	_, err := c.RegisterEndpoint(brokerclient.AcceptBusy(ctxT(t)), req)
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("registration with %d calls in flight at 100/s: %v, want ResourceExhausted", inFlight, err)
	}
	wait, busy := brokerclient.BusyWait(err)
	if !busy {
		t.Fatalf("the busy answer %v carries no wait the agent reads", err)
	}
	if wait < registerBusyMaxHint || wait > brokerclient.MaxBusyWait {
		t.Fatalf("the agent waits %s on a 20 s backlog: want the longest hint, %s, to %s", wait, registerBusyMaxHint, brokerclient.MaxBusyWait)
	}
	if _, err := c.RegisterEndpoint(ctxT(t), req); err != nil {
		t.Fatalf("an agent that does not accept busy answers was refused: %v", err)
	}
	for range inFlight {
		b.srv.writes.end()
	}
	if _, err := c.RegisterEndpoint(brokerclient.AcceptBusy(ctxT(t)), req); err != nil {
		t.Fatalf("registration once the backlog drained: %v", err)
	}
}
