package netns

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
	"github.com/cablemesh/cablemesh/tests/netns/nstest"
)

// dashboardPageBudget is how long the open page may take to show a change the broker knows.
const dashboardPageBudget = 3 * time.Second

// TestDashboardInABrowser runs `cablectl dashboard` against a mesh of three clusters and opens it
// in headless Chromium (the DevTools protocol, chromedp): the three clusters and their three pairs
// appear connected; then west's gateway is cut off the underlay (its cable to both others dies)
// and the open page, never reloaded, turns east–west down within dashboardPageBudget of the
// broker knowing. It saves a screenshot of every page to the artifacts directory it logs
// (CABLEMESH_ARTIFACTS, else a temporary directory kept when the test fails).
//
// The dashboard runs where an operator runs it, next to the broker (its namespace), on
// 127.0.0.1 there; the browser runs in the test's namespace and reaches it through a port the
// test forwards from its own 127.0.0.1. Chromium talks to nothing else: no sandbox (root), no
// background networking, every host name unresolvable.
func TestDashboardInABrowser(t *testing.T) {
	harness.RequireRoot(t)
	chromium, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("chromium is not installed (scripts/install-deps.sh netns installs it): %v", err)
	}
	artifacts := artifactsDir(t)
	m := harness.New(t)
	cs := m.AddClusters("east=10.1.0.0/16", "west=10.2.0.0/16", "north=10.3.0.0/16")
	west := cs[1]
	m.WaitConnected(2*time.Minute, cs...)
	if r := harness.Run(m.Ctx, m.Bin.Cablectl, "service", "export", "web", "-n", "shop", "--port", "http:8080/TCP",
		"--endpoint", west.PodIP.String(), "--socket", west.StatusSocket); r.Err != nil {
		t.Fatalf("export web from west: %s", r)
	}

	dashAddr, token := startDashboard(t, m)
	local := forwardIntoNamespace(t, m.BrokerNS, dashAddr)
	base := "http://" + local
	m.Logf("dashboard at %s in %s, forwarded to %s", dashAddr, m.BrokerNS, base)

	// The JSON behind the pages, first: the contract's keys.
	checkMeshAPI(t, base, token)

	ctx := startBrowser(t, chromium)
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/?token="+token)); err != nil {
		t.Fatalf("open the dashboard: %v", err)
	}
	start := time.Now()
	pairs := []string{"east|north", "east|west", "north|west"}
	var states map[string]string
	err = harness.WaitFor(3*time.Minute, 250*time.Millisecond, func() (bool, string) {
		states = pageStates(ctx, t)
		for _, p := range pairs {
			if states["cell "+p] != "connected" || states["edge "+p] != "connected" {
				return false, fmt.Sprintf("page shows %v", states)
			}
		}
		return states["clusters"] == "3", fmt.Sprintf("page shows %v", states)
	})
	if err != nil {
		saveScreenshot(ctx, t, artifacts, "mesh-not-connected")
		t.Fatalf("the page never showed three clusters and three connected pairs: %v\nmesh: %s", err, meshJSON(base, token))
	}
	m.Logf("the page shows 3 clusters, 3 pairs connected (%s after it opened): %v", time.Since(start).Round(time.Millisecond), states)
	for _, page := range []string{"mesh", "clusters", "policies", "services", "events"} {
		showPage(ctx, t, page)
		saveScreenshot(ctx, t, artifacts, page)
	}
	showPage(ctx, t, "mesh")

	// A mark in the page's window: a reload would lose it.
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__notReloaded = true`)); err != nil {
		t.Fatal(err)
	}
	port := underlayPort(west)
	if _, err := harness.MustRun(m.Ctx, "ip", "-n", m.UnderlayNS, "link", "set", port, "down"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = harness.MustRun(context.Background(), "ip", "-n", m.UnderlayNS, "link", "set", port, "up")
	})
	cut := time.Now()
	m.Logf("west's gateway cut off the underlay (%s down)", port)

	brokerKnew := make(chan time.Time, 1)
	go watchBrokerSaysDown(m, "east", "west", brokerKnew)
	var pageDown time.Time
	err = harness.WaitFor(90*time.Second, 50*time.Millisecond, func() (bool, string) {
		states = pageStates(ctx, t)
		if states["cell east|west"] == "down" && states["edge east|west"] == "down" {
			pageDown = time.Now()
			return true, ""
		}
		return false, fmt.Sprintf("page shows %v", states)
	})
	if err != nil {
		saveScreenshot(ctx, t, artifacts, "mesh-not-down")
		t.Fatalf("east–west never turned down on the open page: %v\nmesh: %s", err, meshJSON(base, token))
	}
	var knew time.Time
	select {
	case knew = <-brokerKnew:
	case <-time.After(10 * time.Second):
		t.Fatalf("the page shows east–west down, but the broker's links --all never said so")
	}
	lag := pageDown.Sub(knew)
	m.Logf("east–west down on the page %s after the cut, %s after the broker's links --all said so (budget %s)",
		pageDown.Sub(cut).Round(time.Millisecond), lag.Round(time.Millisecond), dashboardPageBudget)
	if lag > dashboardPageBudget {
		t.Errorf("the page showed east–west down %s after the broker knew, want within %s", lag.Round(time.Millisecond), dashboardPageBudget)
	}
	if still, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`window.__notReloaded === true`)); err != nil || !still {
		t.Errorf("the page was reloaded (mark %v, %v): it must update in place", still, err)
	}
	if states["cell east|north"] != "connected" {
		t.Errorf("east–north is %q on the page, want still connected: only west was cut", states["cell east|north"])
	}
	saveScreenshot(ctx, t, artifacts, "mesh-west-cut")
	showPage(ctx, t, "events")
	saveScreenshot(ctx, t, artifacts, "events-west-cut")
	if ev := meshJSON(base, token); !strings.Contains(ev, `"kind":"pair-down"`) {
		t.Errorf("no pair-down event in the mesh document: %s", ev)
	}
}

// artifactsDir is CABLEMESH_ARTIFACTS (created), or a temporary directory removed when the test
// passes; it is logged either way.
func artifactsDir(t *testing.T) string {
	t.Helper()
	if dir := os.Getenv("CABLEMESH_ARTIFACTS"); dir != "" {
		dir = filepath.Join(dir, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Logf("artifacts: %s", dir)
		return dir
	}
	dir, err := os.MkdirTemp("", "cablemesh-dashboard-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("artifacts kept: %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	t.Logf("artifacts: %s (removed if the test passes; set CABLEMESH_ARTIFACTS to keep them)", dir)
	return dir
}

var dashboardURL = regexp.MustCompile(`http://(127\.0\.0\.1:[0-9]+)/\?token=([0-9a-f]+)`)

// startDashboard runs `cablectl dashboard` in the broker's namespace on a free port of its
// 127.0.0.1 and returns the address and token it printed.
func startDashboard(t *testing.T, m *harness.Mesh) (addr, token string) {
	t.Helper()
	logPath := filepath.Join(m.Dir, "dashboard.log")
	p, err := harness.StartProcess("cablectl dashboard", m.BrokerNS, logPath,
		m.Bin.Cablectl, "--config", m.AdminConfig(), "dashboard", "--listen", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if code, err := p.Stop(10 * time.Second); err != nil || code != 0 {
			t.Errorf("cablectl dashboard stopped with code %d (%v), want 0 on SIGTERM:\n%s", code, err, p.LogTail(20))
		}
	})
	err = harness.WaitFor(15*time.Second, 100*time.Millisecond, func() (bool, string) {
		if exited, code := p.Exited(); exited {
			t.Fatalf("cablectl dashboard exited with code %d:\n%s", code, p.LogTail(20))
		}
		mm := dashboardURL.FindStringSubmatch(p.Log())
		if mm == nil {
			return false, "no URL printed yet"
		}
		addr, token = mm[1], mm[2]
		return true, ""
	})
	if err != nil {
		t.Fatalf("cablectl dashboard printed no URL: %v\n%s", err, p.LogTail(20))
	}
	return addr, token
}

// forwardIntoNamespace listens on the test's 127.0.0.1 and connects every connection to target
// inside namespace ns; it returns the local address. Its cleanup closes the connections still
// open (the browser's stream, an HTTP client's idle keep-alive).
func forwardIntoNamespace(t *testing.T, ns, target string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]bool{}
	)
	track := func(c net.Conn) {
		mu.Lock()
		defer mu.Unlock()
		conns[c] = true
	}
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			track(c)
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				var up net.Conn
				if err := nstest.Within(ns, func() (err error) {
					up, err = net.DialTimeout("tcp", target, 5*time.Second)
					return err
				}); err != nil {
					return
				}
				track(up)
				defer up.Close()
				done := make(chan struct{}, 2)
				go func() { _, _ = io.Copy(up, c); done <- struct{}{} }()
				go func() { _, _ = io.Copy(c, up); done <- struct{}{} }()
				<-done
			}()
		}
	}()
	return ln.Addr().String()
}

// checkMeshAPI reads GET /api/v1/mesh with the token (and refuses it without).
func checkMeshAPI(t *testing.T, base, token string) {
	t.Helper()
	resp, err := http.Get(base + "/api/v1/mesh")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /api/v1/mesh without the token: %s, want 401", resp.Status)
	}
	var doc map[string]json.RawMessage
	if err := json.Unmarshal([]byte(meshJSON(base, token)), &doc); err != nil {
		t.Fatalf("GET /api/v1/mesh: %v", err)
	}
	for _, k := range []string{"clusters", "links", "policies", "services"} {
		if _, ok := doc[k]; !ok {
			t.Errorf("GET /api/v1/mesh has no %q", k)
		}
	}
	req, _ := http.NewRequest(http.MethodPost, base+"/api/v1/mesh", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer "+token)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST /api/v1/mesh: %v %v, want 405", resp, err)
	}
}

func meshJSON(base, token string) string {
	req, _ := http.NewRequest(http.MethodGet, base+"/api/v1/mesh", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// startBrowser starts headless Chromium for the test and returns the context of its tab.
func startBrowser(t *testing.T, path string) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // root: Chromium's sandbox refuses to run as root
		chromedp.WindowSize(1400, 900),
		chromedp.UserDataDir(t.TempDir()),
		// Nothing but the forwarded 127.0.0.1 port: no name resolves, no proxy, no component
		// updates or other background traffic.
		chromedp.Flag("host-resolver-rules", "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"),
		chromedp.Flag("no-proxy-server", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-domain-reliability", true),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	if err := chromedp.Do(ctx); err != nil { // starts the browser
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

// pageStates reads what the open page shows: each matrix cell's and graph edge's state, by
// pair, and the number of clusters in the summary.
func pageStates(ctx context.Context, t *testing.T) map[string]string {
	t.Helper()
	const js = `(() => {
		const out = {};
		for (const e of document.querySelectorAll("td[data-pair]")) out["cell " + e.dataset.pair] = e.dataset.state;
		for (const e of document.querySelectorAll("line[data-pair]")) out["edge " + e.dataset.pair] = e.dataset.state;
		const c = document.querySelector("#sum-clusters b");
		out.clusters = c ? c.textContent : "";
		return out;
	})()`
	states, err := chromedp.Run(ctx, chromedp.Evaluate[map[string]string](js))
	if err != nil {
		t.Logf("read the page: %v", err)
		return nil
	}
	return states
}

// showPage switches the open page to one of its views (the hash; no reload).
func showPage(ctx context.Context, t *testing.T, page string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`(location.hash = %q, true)`, page))); err != nil {
		t.Fatalf("show page %s: %v", page, err)
	}
	// Wait for the page to show: its section visible.
	err := harness.WaitFor(5*time.Second, 50*time.Millisecond, func() (bool, string) {
		shown, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`!document.getElementById("page-%s").hidden`, page)))
		return err == nil && shown, fmt.Sprint(err)
	})
	if err != nil {
		t.Fatalf("page %s not shown: %v", page, err)
	}
}

func saveScreenshot(ctx context.Context, t *testing.T, dir, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Errorf("screenshot %s: %v", name, err)
		return
	}
	path := filepath.Join(dir, name+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Errorf("save screenshot: %v", err)
		return
	}
	t.Logf("screenshot %s (%d bytes)", path, len(png))
}

// watchBrokerSaysDown polls `cablectl links --all -o json` until an end of the pair a–b reports
// a state other than connected, and sends when.
func watchBrokerSaysDown(m *harness.Mesh, a, b string, out chan<- time.Time) {
	for m.Ctx.Err() == nil {
		r := m.Cablectl("links", "--all", "-o", "json")
		var all struct {
			Items []struct {
				Clusters [2]string `json:"clusters"`
				Ends     []struct {
					Cluster string `json:"cluster"`
					State   string `json:"state"`
				} `json:"ends"`
			} `json:"items"`
		}
		if r.Err == nil && json.Unmarshal([]byte(r.Stdout), &all) == nil {
			for _, p := range all.Items {
				if p.Clusters != [2]string{a, b} {
					continue
				}
				for _, e := range p.Ends {
					if e.State != "connected" {
						out <- time.Now()
						return
					}
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}
