package agent

import (
	"context"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/routes"
)

// deadGateways is a health.NewPinger whose probes to the addresses in dead time out and the
// others answer; it records the targets it was asked for.
type deadGateways struct {
	mu      sync.Mutex
	dead    map[netip.Addr]bool
	targets []health.Target
}

func (d *deadGateways) open(t health.Target) (health.Pinger, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.targets = append(d.targets, t)
	return &gatewayPing{net: d, dst: t.Destination}, nil
}

func (d *deadGateways) kill(a netip.Addr, dead bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.dead[a] = dead
}

type gatewayPing struct {
	net *deadGateways
	dst netip.Addr
}

func (p *gatewayPing) Ping(ctx context.Context, timeout time.Duration) (time.Duration, error) {
	p.net.mu.Lock()
	dead := p.net.dead[p.dst]
	p.net.mu.Unlock()
	if dead {
		return 0, &health.TimeoutError{After: timeout}
	}
	return 100 * time.Microsecond, nil
}

func (p *gatewayPing) Close() error { return nil }

func TestNonGatewayRoutesAroundAGatewayThatStopsAnswering(t *testing.T) {
	b := newBroker(t)
	b.UpsertEndpoint(remoteEndpoint("east", "east-gw1", "127.0.0.11", "RUFTVC1rZXk="))
	b.UpsertEndpoint(remoteEndpoint("east", "east-gw2", "127.0.0.21", "RUFTVC1rZXky"))
	cfg := testConfig(t, b, false)
	gw1, gw2 := netip.MustParseAddr("127.0.0.11"), netip.MustParseAddr("127.0.0.21")
	net := &deadGateways{dead: map[netip.Addr]bool{}}
	var mu sync.Mutex
	var last []routes.Route
	r := startAgentWith(t, cfg, fakedriver.New(), func(o *Options) {
		o.Host.NewPinger = net.open
		o.Host.ApplyRoutes = func(rs []routes.Route) error {
			mu.Lock()
			defer mu.Unlock()
			last = rs
			return nil
		}
	})
	routesVia := func(gw netip.Addr) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(last) == 3 && !slices.ContainsFunc(last, func(r routes.Route) bool { return r.Gw != gw })
		}
	}
	eventually(t, "every remote cluster routed via east-gw1, the gateway the remote sides connect to", routesVia(gw1))
	eventually(t, "status shows both gateways probed and healthy", func() bool {
		st, _ := getStatus(t, cfg.StatusSocket)
		if st.Worker == nil || len(st.Worker.Gateways) != 2 {
			return false
		}
		for _, g := range st.Worker.Gateways {
			if !g.Probing || !g.Healthy || g.ProbesSent == 0 {
				return false
			}
		}
		return len(st.Worker.Routes) == 2 && st.Worker.Routes[0].Via == "east-gw1"
	})
	net.mu.Lock()
	for _, tg := range net.targets {
		if !tg.Source.IsValid() {
			t.Errorf("probe of %s opened without a source address", tg.Node)
		}
	}
	net.mu.Unlock()

	net.kill(gw1, true)
	eventually(t, "every remote cluster routed via east-gw2 once east-gw1 stops answering", routesVia(gw2))
	st, _ := getStatus(t, cfg.StatusSocket)
	if st.Worker == nil {
		t.Fatal("status of a non-gateway node has no worker section")
	}
	for _, g := range st.Worker.Gateways {
		if g.Node == "east-gw1" && (g.Healthy || g.ConsecutiveFailures < 3 || g.LastError == "") {
			t.Errorf("status shows dead east-gw1 as %+v, want unhealthy with its failures and last error", g)
		}
	}
	for _, rt := range st.Worker.Routes {
		if rt.Via != "east-gw2" || rt.Address != gw2.String() || rt.Reason == "" || !slices.Equal(rt.Carriers, []string{"east-gw1", "east-gw2"}) {
			t.Errorf("status route %+v, want via east-gw2 (127.0.0.21) with a reason, carriers east-gw1,east-gw2", rt)
		}
	}

	net.kill(gw1, false)
	eventually(t, "the routes come back to east-gw1 when it answers again", routesVia(gw1))
	r.stop()
}
