package dashboard

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

const testToken = "0123456789abcdef"

// serve starts the dashboard's server over a poller of f that has polled once.
func serve(t *testing.T, f *fakeBroker) (*Poller, *httptest.Server) {
	t.Helper()
	p := newTestPoller(f)
	p.Poll(context.Background(), t0)
	done := make(chan struct{})
	srv := httptest.NewServer(NewServer(p, testToken, done))
	t.Cleanup(func() { close(done); srv.Close() })
	return p, srv
}

func get(t *testing.T, srv *httptest.Server, path string, auth bool) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth {
		req.Header.Set("Authorization", "Bearer "+testToken)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return resp
}

func TestAPIMeshAnswersTheContractKeys(t *testing.T) {
	_, srv := serve(t, threeClusters(t))
	resp := get(t, srv, "/api/v1/mesh", true)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("GET /api/v1/mesh: %s %q", resp.Status, resp.Header.Get("Content-Type"))
	}
	var doc map[string]json.RawMessage
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"clusters", "links", "policies", "services"} {
		var items []map[string]any
		if err := json.Unmarshal(doc[k], &items); err != nil || len(items) == 0 {
			t.Errorf("%s: %s (%v), want a non-empty list", k, doc[k], err)
		}
	}
	var links []map[string]any
	_ = json.Unmarshal(doc["links"], &links)
	keys := func(m map[string]any) []string {
		var out []string
		for k := range m {
			out = append(out, k)
		}
		slices.Sort(out)
		return out
	}
	if got := keys(links[0]); !slices.Equal(got, []string{"agree", "clusters", "ends", "stale"}) {
		t.Errorf("a link has keys %v, want links --all's item keys", got)
	}
	end := links[0]["ends"].([]any)[0].(map[string]any)
	want := []string{"agentVersion", "cluster", "driver", "lastHandshake", "latencyP50Ms", "latencyP95Ms", "latencyP99Ms", "node", "policy", "reportedAt", "state"}
	if got := keys(end); !slices.Equal(got, want) {
		t.Errorf("a link end has keys %v, want %v", got, want)
	}
}

func TestTheStreamDeliversAChange(t *testing.T) {
	f := threeClusters(t)
	p, srv := serve(t, f)
	resp := get(t, srv, "/api/v1/stream", true)
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q, want text/event-stream", ct)
	}
	events := make(chan Mesh, 4)
	go readStream(t, resp.Body, events)
	first := receive(t, events)
	if got := pairOf(first, "east", "west").State; got != StateConnected {
		t.Fatalf("first event: east-west %q, want connected", got)
	}
	// west's only gateway goes away (its lease expired: the broker withdrew it).
	f.update(func(f *fakeBroker) {
		f.clusters.Endpoints = slices.DeleteFunc(f.clusters.Endpoints, func(e *apiv1.Endpoint) bool { return e.Cluster == "west" })
	})
	p.Poll(context.Background(), t0.Add(time.Second))
	next := receive(t, events)
	if got := pairOf(next, "east", "west"); got.State != StateDown || !strings.Contains(got.Reason, "no gateway of west") {
		t.Errorf("after west's gateway left: east-west %q (%s), want down", got.State, got.Reason)
	}
	if len(next.Events) == 0 || next.Events[0].Kind != EventPairDown && next.Events[0].Kind != EventCluster {
		t.Errorf("events %+v, want west's gateway and the pair down", next.Events)
	}
	// Nothing changed: no event (a poll that finds the same state sends nothing).
	p.Poll(context.Background(), t0.Add(2*time.Second))
	select {
	case m := <-events:
		t.Errorf("an unchanged poll sent a document (revision %d)", m.Revision)
	case <-time.After(200 * time.Millisecond):
	}
}

// readStream decodes the "mesh" events of a server-sent event stream into out.
func readStream(t *testing.T, body io.Reader, out chan<- Mesh) {
	sc := bufio.NewScanner(body)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	event := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			event = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: ") && event == "mesh":
			var m Mesh
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &m); err != nil {
				t.Errorf("stream data is not the document: %v", err)
				return
			}
			out <- m
		}
	}
}

func receive(t *testing.T, events <-chan Mesh) Mesh {
	t.Helper()
	select {
	case m := <-events:
		return m
	case <-time.After(5 * time.Second):
		t.Fatal("no event on the stream within 5s")
		return Mesh{}
	}
}

func TestTheDashboardIsReadOnly(t *testing.T) {
	f := threeClusters(t)
	_, srv := serve(t, f)
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions} {
		for _, path := range []string{"/", "/api/v1/mesh", "/api/v1/stream"} {
			req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(`{}`))
			req.Header.Set("Authorization", "Bearer "+testToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed || resp.Header.Get("Allow") != "GET, HEAD" {
				t.Errorf("%s %s: %s (Allow %q), want 405 allowing GET, HEAD", method, path, resp.Status, resp.Header.Get("Allow"))
			}
		}
	}
}

func TestEveryRequestNeedsTheToken(t *testing.T) {
	_, srv := serve(t, threeClusters(t))
	for _, path := range []string{"/", "/app.js", "/api/v1/mesh", "/api/v1/stream"} {
		resp := get(t, srv, path, false)
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET %s without the token: %s, want 401", path, resp.Status)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/mesh", nil)
	req.Header.Set("Authorization", "Bearer wrong")
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("a wrong token: %v %v, want 401", resp, err)
	}
	// The printed URL sets the cookie and leaves the token out of the address.
	noFollow := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noFollow.Get(srv.URL + "/?token=" + testToken)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookies := resp.Cookies()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/" || len(cookies) != 1 || !cookies[0].HttpOnly {
		t.Fatalf("GET /?token=: %s to %q with cookies %v, want 303 to / setting an HttpOnly cookie", resp.Status, resp.Header.Get("Location"), cookies)
	}
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/", nil)
	req.AddCookie(cookies[0])
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), `<script src="/app.js">`) {
		t.Errorf("GET / with the cookie: %s, want the page", resp.Status)
	}
	if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Errorf("Content-Security-Policy %q, want only this server's assets", csp)
	}
}

func TestEveryAssetIsEmbedded(t *testing.T) {
	_, srv := serve(t, threeClusters(t))
	for _, path := range []string{"/", "/app.js", "/style.css"} {
		resp := get(t, srv, path, true)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || len(body) < 500 {
			t.Errorf("GET %s: %s, %d bytes; want the asset", path, resp.Status, len(body))
		}
		// Nothing may come from anywhere but this server.
		for _, remote := range []string{"http://", "https://", "//cdn"} {
			if strings.Contains(strings.ReplaceAll(string(body), "http://www.w3.org/2000/svg", ""), remote) {
				t.Errorf("%s refers to %q: every asset must be served by the dashboard", path, remote)
			}
		}
	}
}
