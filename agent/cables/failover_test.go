package cables

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// failoverState is east with gateways e1 and e2, west with w1 (and w2 when twoWest).
func failoverState(twoWest bool) *brokerstate.State {
	s := brokerstate.New()
	s.Revision = 5
	s.Clusters["east"] = &apiv1.Cluster{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}}
	s.Clusters["west"] = &apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}}
	eps := []struct{ c, n, ip string }{{"east", "e1", "10.0.0.21"}, {"east", "e2", "10.0.0.22"}, {"west", "w1", "10.0.0.31"}}
	if twoWest {
		eps = append(eps, struct{ c, n, ip string }{"west", "w2", "10.0.0.32"})
	}
	for _, e := range eps {
		s.Endpoints[brokerstate.EndpointKey(e.c, e.n)] = &apiv1.Endpoint{Cluster: e.c, Node: e.n, PrivateIp: e.ip, Drivers: []string{"wireguard"}, LeaseSeconds: 30,
			CableAttributes: map[string]*apiv1.CableAttributes{"wireguard": {Values: map[string]string{"publicKey": "K" + e.n}}},
			CablePorts:      map[string]uint32{"wireguard": 51820}}
	}
	return s
}

// planOf is the plan of gateway node of cluster on st.
func planOf(t *testing.T, st *brokerstate.State, cluster, node string, avoid []string) *plan.Plan {
	t.Helper()
	k := plan.Key{State: st, Revision: st.Revision}
	return plan.New(slog.New(slog.DiscardHandler)).Get(k, plan.Inputs{Cluster: cluster, Node: node, Drivers: reconcile.Drivers{"wireguard": nil}, Avoid: avoid},
		func() (plan.Key, *brokerstate.State) { return k, st.Clone() })
}

func probeResult(cluster, node string, answeredBefore bool) health.Result {
	r := health.Result{Target: health.Target{Cluster: cluster, Node: node}, ConsecutiveFailures: 3}
	if answeredBefore {
		r.LastSuccess = time.Unix(1000, 0)
	}
	return r
}

func TestFailoverWanted(t *testing.T) {
	tests := []struct {
		name        string
		twoWest     bool
		own, self   string
		probe       health.Result
		withdraw    string
		want        bool
		wantWhyPart string
	}{
		{"west's only gateway fails east's pair over when e1 dies", false, "west", "w1", probeResult("east", "e1", true), "", true, ""},
		{"a pair whose probes never answered is not failed over", false, "west", "w1", probeResult("east", "e1", false), "", false, "never answered"},
		{"a remote cluster with a single gateway has nowhere to go", false, "east", "e1", probeResult("west", "w1", true), "", false, "no other gateway"},
		{"the first carrier of its cluster fails over", true, "east", "e1", probeResult("west", "w1", true), "", true, ""},
		{"a standby gateway, whose probes fail while the remote side uses another, does not", true, "east", "e2", probeResult("west", "w1", true), "", false, "is not the one west's gateways connect to"},
		{"a gateway the broker withdrew is left to the plan", false, "west", "w1", probeResult("east", "e1", true), "east/e1", false, "no longer lists"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := failoverState(tt.twoWest)
			if tt.withdraw != "" {
				delete(st.Endpoints, tt.withdraw)
			}
			p := planOf(t, st, tt.own, tt.self, nil)
			why, got := failoverWanted(p.State, p, tt.own, tt.self, tt.probe)
			if got != tt.want {
				t.Fatalf("failoverWanted = %v (%q), want %v", got, why, tt.want)
			}
			if tt.wantWhyPart != "" && !strings.Contains(why, tt.wantWhyPart) {
				t.Errorf("reason %q does not say %q", why, tt.wantWhyPart)
			}
		})
	}
}

func TestReavoidBackoffDoublesUpToItsCap(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 10 * time.Second, 2: 20 * time.Second, 3: 40 * time.Second, 6: 5 * time.Minute, 50: 5 * time.Minute} {
		if got := reavoidBackoff(n); got != want {
			t.Errorf("reavoidBackoff(%d) = %v, want %v", n, got, want)
		}
	}
}

// underlayNet answers the underlay probes of the failover per destination.
type underlayNet struct {
	mu   sync.Mutex
	down map[netip.Addr]bool
}

func (n *underlayNet) set(a string, down bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.down[netip.MustParseAddr(a)] = down
}

func (n *underlayNet) newPinger(t health.Target) (health.Pinger, error) {
	return underlayPing{n: n, dst: t.Destination}, nil
}

type underlayPing struct {
	n   *underlayNet
	dst netip.Addr
}

func (p underlayPing) Ping(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	p.n.mu.Lock()
	down := p.n.down[p.dst]
	p.n.mu.Unlock()
	if down {
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(timeout):
		}
		return 0, &health.TimeoutError{After: timeout}
	}
	return time.Millisecond, nil
}

func (underlayPing) Close() error { return nil }

func TestADeadRemoteGatewayIsAvoidedAndUsedAgainAfterTheHold(t *testing.T) {
	n := &underlayNet{down: map[netip.Addr]bool{}}
	var triggers atomic.Int32
	const hold = 200 * time.Millisecond
	f := newFailover(slog.New(slog.DiscardHandler), n.newPinger, func() { triggers.Add(1) },
		health.Settings{Period: 10 * time.Millisecond, Timeout: 10 * time.Millisecond, FailureThreshold: 3, RecoveryHold: hold})
	defer f.Close()
	st := failoverState(false)
	f.observe(planOf(t, st, "west", "w1", nil))

	// e1 dies: the pair's probes through the tunnel cross the threshold.
	n.set("10.0.0.21", true)
	f.tunnelChanged("west", "w1", probeResult("east", "e1", true), false)
	if got := f.Avoided(); !slices.Equal(got, []string{"east/e1"}) {
		t.Fatalf("avoided %v after e1 failed its probes, want [east/e1]", got)
	}
	if triggers.Load() != 1 {
		t.Errorf("%d passes asked for, want 1: the pair must move now", triggers.Load())
	}
	if p := planOf(t, st, "west", "w1", f.Avoided()); p.Wants[0].Remote.Node != "e2" {
		t.Errorf("the plan with e1 avoided connects east via %s, want e2", p.Wants[0].Remote.Node)
	}
	// The same crossing again (another pass, a restarted prober) changes nothing.
	f.tunnelChanged("west", "w1", probeResult("east", "e1", true), false)
	if triggers.Load() != 1 {
		t.Errorf("a repeated crossing asked for another pass")
	}
	// While e1 stays dead over the underlay too, it stays avoided.
	time.Sleep(3 * hold)
	if got := f.Avoided(); !slices.Equal(got, []string{"east/e1"}) {
		t.Fatalf("avoided %v while e1 is still dead, want [east/e1]", got)
	}
	// e1 answers again: it is used again after the hold, not at its first answer.
	back := time.Now()
	n.set("10.0.0.21", false)
	deadline := time.Now().Add(5 * time.Second)
	for len(f.Avoided()) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := f.Avoided(); len(got) != 0 {
		t.Fatalf("avoided %v after e1 answered for the hold, want none", got)
	}
	if d := time.Since(back); d < hold {
		t.Errorf("e1 used again %v after it answered, want at least the hold %v", d, hold)
	}
	if triggers.Load() != 2 {
		t.Errorf("%d passes asked for, want 2 (the move away and the move back)", triggers.Load())
	}

	// Avoided again right after its return: it waits an extra backoff before the next return.
	f.tunnelChanged("west", "w1", probeResult("east", "e1", true), false)
	f.mu.Lock()
	a := f.avoid["east/e1"]
	f.mu.Unlock()
	if a == nil || a.notBefore.Sub(a.since) != reavoidBackoffBase {
		t.Fatalf("a gateway avoided again within %v of its return: %+v, want an extra wait of %v", reavoidWindow, a, reavoidBackoffBase)
	}
	time.Sleep(3 * hold)
	if got := f.Avoided(); !slices.Equal(got, []string{"east/e1"}) {
		t.Errorf("avoided %v during the backoff, want [east/e1]", got)
	}

	// The broker withdraws it: the avoidance ends with it.
	delete(st.Endpoints, "east/e1")
	f.observe(planOf(t, st, "west", "w1", nil))
	if got := f.Avoided(); len(got) != 0 {
		t.Errorf("avoided %v after the broker withdrew e1, want none", got)
	}
}
