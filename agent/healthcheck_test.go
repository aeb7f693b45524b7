package agent

import (
	"context"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/metrics"
)

// switchPinger is a fake network: every target answers with a fixed RTT until told not to.
type switchPinger struct {
	mu   sync.Mutex
	down bool
}

func (s *switchPinger) set(down bool) { s.mu.Lock(); s.down = down; s.mu.Unlock() }

func (s *switchPinger) open(health.Target) (health.Pinger, error) { return s, nil }

func (s *switchPinger) Ping(_ context.Context, timeout time.Duration) (time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.down {
		return 0, &health.TimeoutError{After: timeout}
	}
	return 700 * time.Microsecond, nil
}

func (s *switchPinger) Close() error { return nil }

func TestGatewayProbesRemoteGatewaysAndReportsRTT(t *testing.T) {
	b := newBroker(t)
	west := remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5")
	west.HealthCheckIp = "10.2.0.1"
	b.UpsertEndpoint(west) // north keeps publishing no health-check address
	cfg := testConfig(t, b, true)
	cfg.HealthCheck.Period = 100 * time.Millisecond
	cfg.HealthCheck.Timeout = 20 * time.Millisecond
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	net := &switchPinger{}
	d := fakedriver.New()
	d.SetHandshake(time.Now())
	r := startAgentWith(t, cfg, d, func(o *Options) {
		o.Host.NewPinger = net.open
		o.Host.InterfaceAddrs = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("10.1.0.1")} }
	})
	select {
	case <-r.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready")
	}

	eventually(t, "west has RTT figures in status", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return len(s.Connections) == 2 && s.Connections[1].RTT != nil
	})
	s, m := getStatus(t, cfg.StatusSocket)
	w, n := s.Connections[1], s.Connections[0]
	if w.Cluster != "west" || w.State != "connected" || w.RTT.LastMs != 0.7 || w.RTT.P99Ms != 0.7 || w.Health == nil || !w.Health.Healthy ||
		w.Health.Source != "10.1.0.1" || w.Health.Target != "10.2.0.1" || w.Health.ProbesSent == 0 {
		t.Errorf("west = %+v, health %+v", w, w.Health)
	}
	rtt := m["connections"].([]any)[1].(map[string]any)["rtt"].(map[string]any)
	for _, k := range []string{"lastMs", "minMs", "avgMs", "maxMs", "p50Ms", "p95Ms", "p99Ms"} {
		if _, ok := rtt[k]; !ok {
			t.Errorf("rtt lacks %q: %v", k, rtt)
		}
	}
	if n.Cluster != "north" || n.RTT != nil || n.Health == nil || n.Health.Probing || !strings.Contains(n.Health.Reason, "no health_check_ip") || n.State != "connected" {
		t.Errorf("north (no health-check IP) = %+v, health %+v", n, n.Health)
	}

	// The remote gateway stops answering: error after three failures, though the device is fine.
	net.set(true)
	eventually(t, "west in error from its probes", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Connections[1].State == "error"
	})
	s, _ = getStatus(t, cfg.StatusSocket)
	if w := s.Connections[1]; !strings.HasPrefix(w.Message, "health probe: ") || !strings.HasSuffix(w.Message, " consecutive failures (last: timeout after 20ms)") {
		t.Errorf("west message = %q", w.Message)
	}
	metrics := gather(t, r.agent)
	if metrics["cablemesh_agent_probe_failures_total,cluster=west"] < 3 || metrics["cablemesh_agent_connection_state,cluster=west,driver=wireguard,state=error"] != 1 ||
		metrics["cablemesh_agent_connection_healthy,cluster=west,driver=wireguard"] != 0 {
		t.Errorf("metrics while failing: %v", metrics)
	}
	if metrics["cablemesh_agent_connection_rtt_seconds_count,cluster=west"] == 0 || metrics["cablemesh_agent_probes_total,cluster=west"] == 0 {
		t.Errorf("rtt histogram or probe counter missing: %v", metrics)
	}
	if _, ok := metrics["cablemesh_agent_probes_total,cluster=north"]; ok {
		t.Error("north is not probed but has a probe counter")
	}

	// It answers again: connected.
	net.set(false)
	eventually(t, "west recovers", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return s.Connections[1].State == "connected" && s.Connections[1].Health.Healthy
	})
}

// gather scrapes the agent's collector into name,label=value... -> value (histograms as _count).
func gather(t *testing.T, a *Agent) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(&metrics.Collector{Status: a.Status, Probes: a.metrics})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			name := mf.GetName()
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			if h := m.GetHistogram(); h != nil {
				name += "_count"
				v = float64(h.GetSampleCount())
			}
			for _, l := range m.GetLabel() {
				name += "," + l.GetName() + "=" + l.GetValue()
			}
			found[name] = v
		}
	}
	return found
}
