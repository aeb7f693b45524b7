package agent

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
)

func get(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code, rec.Body.String()
}

func TestReadyzOnlyAfterAFullSync(t *testing.T) {
	b := newBroker(t)
	a, err := New(Options{Config: testConfig(t, b, true), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := a.metricsHandler()
	if code, body := get(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d %q before any sync, want 200: liveness is not readiness", code, body)
	}
	if code, body := get(t, h, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "no full sync") {
		t.Errorf("/readyz %d %q before any sync, want 503 saying why", code, body)
	}
	a.markSynced(0) // a pass over the empty state of an agent that never heard from the broker
	if code, _ := get(t, h, "/readyz"); code != http.StatusServiceUnavailable {
		t.Errorf("/readyz %d after a pass over no state, want 503", code)
	}
	a.markSynced(7)
	a.markSynced(9)
	if code, body := get(t, h, "/readyz"); code != http.StatusOK || !strings.Contains(body, "revision 7") {
		t.Errorf("/readyz %d %q after the first full sync at 7, want 200 naming revision 7", code, body)
	}
}

// freeAddr returns a loopback address no one listens on (closed again at once).
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func httpGet(addr, path string) (int, string) {
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// TestReadyzFromTheBrokerThenFromTheCache: ready once the broker's snapshot is applied; after a
// restart with the broker gone, ready again from the cached state, and not unready because the
// broker is down.
func TestReadyzFromTheBrokerThenFromTheCache(t *testing.T) {
	b := newBroker(t)
	cfg := testConfig(t, b, true)
	cfg.MetricsAddress = freeAddr(t)
	d := fakedriver.New()
	r := startAgent(t, cfg, d, nil)
	eventually(t, "/readyz answers 200 after the broker's snapshot", func() bool {
		code, _ := httpGet(cfg.MetricsAddress, "/readyz")
		return code == http.StatusOK
	})
	if code, body := httpGet(cfg.MetricsAddress, "/metrics"); code != http.StatusOK || !strings.Contains(body, "cablemesh_agent_broker_revision") {
		t.Errorf("/metrics %d lacks the agent's metrics:\n%s", code, body)
	}
	r.stop()
	b.Stop()

	cfg.MetricsAddress = freeAddr(t)
	r2 := startAgent(t, cfg, d, nil)
	select {
	case <-r2.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("the restarted agent did not start on its cache")
	}
	eventually(t, "/readyz answers 200 from the cached state with the broker down", func() bool {
		code, _ := httpGet(cfg.MetricsAddress, "/readyz")
		return code == http.StatusOK
	})
	// Still ready a while later: the broker being down is no reason to take the node out.
	time.Sleep(500 * time.Millisecond)
	if code, body := httpGet(cfg.MetricsAddress, "/readyz"); code != http.StatusOK {
		t.Errorf("/readyz %d %q with the broker down after a sync from cache, want 200", code, body)
	}
	if _, body := httpGet(cfg.MetricsAddress, "/metrics"); !strings.Contains(body, "cablemesh_agent_broker_connected 0") {
		t.Errorf("/metrics does not say the broker is disconnected:\n%s", body)
	}
}
