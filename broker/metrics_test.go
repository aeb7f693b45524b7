package broker

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func scrape(t *testing.T, h http.Handler, path string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	body, _ := io.ReadAll(rec.Result().Body)
	return rec.Code, string(body)
}

// eventuallyScrape waits until the scrape of /metrics contains every line of want.
func eventuallyScrape(t *testing.T, h http.Handler, want ...string) string {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var body string
	for time.Now().Before(deadline) {
		_, body = scrape(t, h, "/metrics")
		ok := true
		for _, w := range want {
			ok = ok && strings.Contains(body, w)
		}
		if ok {
			return body
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("metrics never showed %q:\n%s", want, body)
	return ""
}

func TestBrokerMetricsAndProbes(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	h := b.srv.MetricsHandler(false)
	if code, _ := scrape(t, h, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz %d, want 200", code)
	}
	if code, body := scrape(t, h, "/readyz"); code != http.StatusOK || !strings.Contains(body, "store revision") {
		t.Errorf("/readyz %d %q on a serving broker, want 200 with the store revision", code, body)
	}
	// The profiles are there only when asked for (--pprof).
	if code, _ := scrape(t, h, "/debug/pprof/goroutine?debug=1"); code != http.StatusNotFound {
		t.Errorf("/debug/pprof/goroutine without --pprof: %d, want 404", code)
	}
	if code, body := scrape(t, b.srv.MetricsHandler(true), "/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "goroutine profile:") {
		t.Errorf("/debug/pprof/goroutine with --pprof: %d %.80q, want 200 with the goroutine profile", code, body)
	}
	// Every method is there from the start, at 0.
	body := eventuallyScrape(t, h, `cablemesh_broker_grpc_server_handled_total{grpc_code="OK",grpc_method="Watch",grpc_service="cablemesh.v1.Agent",grpc_type="server_stream"} 0`)
	if !strings.Contains(body, "cablemesh_broker_store_revision ") {
		t.Errorf("no store revision in:\n%s", body)
	}

	tok := b.token("east", "10.1.0.0/16")
	ag := mustJoin(t, b.addr, tok, "east", "gw1")
	ctx, cancel := context.WithCancel(context.Background())
	w, err := ag.client(t, b.addr).Watch(ctx, &apiv1.WatchRequest{})
	if err != nil {
		t.Fatal(err)
	}
	recv(t, w)
	eventuallyScrape(t, h,
		"cablemesh_broker_watch_streams 1",
		`cablemesh_broker_agents_connected{cluster="east"} 1`,
		`cablemesh_broker_grpc_server_handled_total{grpc_code="OK",grpc_method="Join",grpc_service="cablemesh.v1.Agent",grpc_type="unary"} 1`,
		`cablemesh_broker_grpc_server_started_total{grpc_method="Watch",grpc_service="cablemesh.v1.Agent",grpc_type="server_stream"} 1`)

	// A refused call is counted with its code: the metrics interceptor runs before auth.
	_, err = noCertConnAdmin(t, b).ListClusters(ctxT(t), &apiv1.ListClustersRequest{})
	if err == nil {
		t.Fatal("an admin call without a certificate was accepted")
	}
	eventuallyScrape(t, h, `cablemesh_broker_grpc_server_handled_total{grpc_code="Unauthenticated",grpc_method="ListClusters",grpc_service="cablemesh.v1.Admin",grpc_type="unary"} 1`)

	cancel()
	// A scrape reads the collectors concurrently: wait for both to reflect the close.
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, body = scrape(t, h, "/metrics")
		if strings.Contains(body, "cablemesh_broker_watch_streams 0") && !strings.Contains(body, `cablemesh_broker_agents_connected{cluster="east"}`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the watch closed, the stream count is not 0 or east keeps its agents_connected series:\n%s", body)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestBrokerNotReadyBeforeServing(t *testing.T) {
	dir := t.TempDir()
	srv, err := New(t.Context(), Config{DataDir: dir, Listen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	if code, body := scrape(t, srv.MetricsHandler(false), "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not serving") {
		t.Errorf("/readyz %d %q before Serve, want 503 saying why", code, body)
	}
}

func noCertConnAdmin(t *testing.T, b *testBroker) apiv1.AdminClient {
	t.Helper()
	return apiv1.NewAdminClient(noCertConn(t, b.addr, b.srv.currentPKI().CAPEM))
}
