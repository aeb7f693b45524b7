package broker

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
)

// laggingStore is a store whose local reads lag: they answer as if the agent's node had no good
// certificate (a join committed through another replica the mirror does not hold yet), or as if
// all were well (a revocation it does not hold yet).
type laggingStore struct {
	store.Store
	refuse bool
	local  atomic.Int64
}

func (l *laggingStore) ViewLocal(ctx context.Context, fn func(store.ReadTx) error) error {
	l.local.Add(1)
	if l.refuse {
		return &admission.CredentialError{Cluster: "east", Err: errStale}
	}
	return nil // a lagging mirror that holds nothing against the caller
}

var errStale = status.Error(codes.Unauthenticated, "stale local read")

// An agent's calls are authorized on the replica's local state (no round trip to etcd's leader
// per call); a refusal there is confirmed with a linearizable read before it is given, so a
// replica whose mirror has not yet seen the agent's join does not turn it away.
func TestAgentCallsAreCheckedLocallyAndRefusalsConfirmed(t *testing.T) {
	lag := &laggingStore{refuse: true}
	b := startBroker(t, t.TempDir(), brokerOpts{wrapStore: func(s store.Store) store.Store { lag.Store = s; return lag }})
	ag := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1")
	c := ag.client(t, b.addr)
	if _, err := c.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1"), LeaseSeconds: 30}); err != nil {
		t.Fatalf("a call refused by the lagging local read: %v; want it confirmed, and let through, by a fresh one", err)
	}
	if lag.local.Load() == 0 {
		t.Fatal("the call was not checked on the local state")
	}

	// Revoked for good: the local read lets its calls through (stale), the writes' own
	// transactions do not.
	if _, err := b.admin.RevokeNode(ctxT(t), &apiv1.RevokeNodeRequest{Cluster: "east", Node: "gw1"}); err != nil {
		t.Fatal(err)
	}
	lag.refuse = false
	_, err := c.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1"), LeaseSeconds: 30})
	if status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a registration of a revoked node: %v, want it refused as revoked", err)
	}
	if _, err := c.Heartbeat(ctxT(t), &apiv1.HeartbeatRequest{Node: "gw1"}); err == nil {
		t.Fatal("a heartbeat of a revoked node was answered")
	}
}
