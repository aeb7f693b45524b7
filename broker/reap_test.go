package broker

import (
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func TestTheReaperFollowsTheShortestLease(t *testing.T) {
	tests := []struct {
		name                        string
		configured, lease, shortest time.Duration
		want                        time.Duration
	}{
		{"no endpoint: a tenth of the default lease", 0, 30 * time.Second, 0, 3 * time.Second},
		{"an endpoint with a 3s lease: a tenth of it", 0, 30 * time.Second, 3 * time.Second, 300 * time.Millisecond},
		{"leases longer than the default do not slow it", 0, 30 * time.Second, 5 * time.Minute, 3 * time.Second},
		{"a 1s lease still waits at least 100ms", 0, 30 * time.Second, time.Second, 100 * time.Millisecond},
		{"a configured interval wins", 20 * time.Millisecond, 30 * time.Second, 3 * time.Second, 20 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := reapInterval(tt.configured, tt.lease, tt.shortest); got != tt.want {
				t.Errorf("reapInterval(%s, %s, %s) = %s, want %s", tt.configured, tt.lease, tt.shortest, got, tt.want)
			}
		})
	}
}

// reapExpired reports the shortest lease among the endpoints it leaves, which the loop's next
// wait follows; an expired endpoint does not count.
func TestReapExpiredReportsTheShortestLeaseLeft(t *testing.T) {
	clk := newClock()
	b := startBroker(t, t.TempDir(), brokerOpts{clock: clk})
	shortest := func() time.Duration {
		t.Helper()
		d, err := b.srv.reapExpired(ctxT(t), clk.Now())
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	if got := shortest(); got != 0 {
		t.Fatalf("no endpoint: shortest %s, want 0", got)
	}
	east := mustJoin(t, b.addr, b.token("east", "10.1.0.0/16"), "east", "gw1").client(t, b.addr)
	if _, err := east.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("east", "gw1", "192.0.2.1"), LeaseSeconds: 3}); err != nil {
		t.Fatal(err)
	}
	west := mustJoin(t, b.addr, b.token("west", "10.2.0.0/16"), "west", "gw1").client(t, b.addr)
	if _, err := west.RegisterEndpoint(ctxT(t), &apiv1.RegisterEndpointRequest{Endpoint: endpoint("west", "gw1", "192.0.2.2"), LeaseSeconds: 20}); err != nil {
		t.Fatal(err)
	}
	if got := shortest(); got != 3*time.Second {
		t.Fatalf("leases 3s and 20s: shortest %s, want 3s", got)
	}
	clk.Advance(4 * time.Second) // east's lease runs out, west's does not
	if got := shortest(); got != 20*time.Second {
		t.Fatalf("after east expired: shortest %s, want west's 20s", got)
	}
	if eps := b.list().Endpoints; len(eps) != 1 || eps[0].Cluster != "west" {
		t.Fatalf("endpoints after the reap: %v, want west's alone", eps)
	}
}
