package broker

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func link(remote, state, driver string) *apiv1.LinkReport {
	return &apiv1.LinkReport{RemoteCluster: remote, State: state, Driver: driver}
}

// linksOf is node k's links as the store lists them, "remote=state" joined by spaces.
func linksOf(r *linkReportStore, k nodeKey, now time.Time) string {
	for _, nr := range r.list(now) {
		if nr.Cluster == k.cluster && nr.Node == k.node {
			var s []string
			for _, l := range nr.Links {
				s = append(s, l.RemoteCluster+"="+l.State)
			}
			return strings.Join(s, " ")
		}
	}
	return "<none>"
}

func TestLinkReportStoreKeepsTheLatestViewOfEachNode(t *testing.T) {
	r := newLinkReportStore(time.Minute, 2*time.Second)
	t0 := time.Unix(1_700_000_000, 0)
	k := nodeKey{"a", "gw"}
	ok, _ := r.accept(k, &apiv1.ReportLinksRequest{Full: true, AgentVersion: "v1",
		Links: []*apiv1.LinkReport{link("b", "connected", "wireguard"), link("c", "connecting", "wireguard")}}, t0)
	if !ok {
		t.Fatal("the first report was dropped")
	}
	if got, want := linksOf(r, k, t0), "b=connected c=connecting"; got != want {
		t.Fatalf("after the full report: %q, want %q", got, want)
	}
	// A change updates one link and keeps the others; removed drops one.
	ok, _ = r.accept(k, &apiv1.ReportLinksRequest{Links: []*apiv1.LinkReport{link("c", "connected", "wireguard")}, Removed: []string{"b"}}, t0.Add(3*time.Second))
	if !ok {
		t.Fatal("a change after the minimum interval was dropped")
	}
	if got, want := linksOf(r, k, t0), "c=connected"; got != want {
		t.Fatalf("after a change: %q, want %q", got, want)
	}
	// A full report replaces everything.
	r.accept(k, &apiv1.ReportLinksRequest{Full: true, Links: []*apiv1.LinkReport{link("d", "error", "vxlan")}}, t0.Add(6*time.Second))
	if got, want := linksOf(r, k, t0), "d=error"; got != want {
		t.Fatalf("after a second full report: %q, want %q", got, want)
	}
	nr := r.list(t0.Add(6 * time.Second))[0]
	if got := nr.Links[0].ReportedAt.AsTime(); !got.Equal(t0.Add(6 * time.Second)) {
		t.Fatalf("reported_at = %v, want the broker's time of the report", got)
	}
	if nr.AgentVersion != "" {
		t.Fatalf("agent version %q kept from an earlier report; the latest said none", nr.AgentVersion)
	}
}

func TestLinkReportStoreRateLimitsEachNode(t *testing.T) {
	r := newLinkReportStore(time.Minute, 2*time.Second)
	t0 := time.Unix(1_700_000_000, 0)
	a, b := nodeKey{"a", "gw"}, nodeKey{"b", "gw"}
	full := func(state string) *apiv1.ReportLinksRequest {
		return &apiv1.ReportLinksRequest{Full: true, Links: []*apiv1.LinkReport{link("x", state, "wireguard")}}
	}
	if ok, _ := r.accept(a, full("connected"), t0); !ok {
		t.Fatal("first report of a dropped")
	}
	ok, retry := r.accept(a, full("error"), t0.Add(500*time.Millisecond))
	if ok {
		t.Fatal("a second report within the minimum interval was accepted")
	}
	if retry != 1500*time.Millisecond {
		t.Fatalf("retry after %v, want 1.5s", retry)
	}
	if got := linksOf(r, a, t0); got != "x=connected" {
		t.Fatalf("a dropped report changed the state: %q", got)
	}
	if ok, _ := r.accept(b, full("error"), t0.Add(500*time.Millisecond)); !ok {
		t.Fatal("another node's report was limited by the first node's")
	}
	if ok, _ := r.accept(a, full("error"), t0.Add(2*time.Second)); !ok {
		t.Fatal("a report after the minimum interval was dropped")
	}
}

func TestLinkReportStoreForgetsSilentNodes(t *testing.T) {
	r := newLinkReportStore(time.Minute, 2*time.Second)
	t0 := time.Unix(1_700_000_000, 0)
	r.accept(nodeKey{"a", "gw"}, &apiv1.ReportLinksRequest{Full: true, Links: []*apiv1.LinkReport{link("b", "connected", "wireguard")}}, t0)
	if n := len(r.list(t0.Add(r.forget))); n != 1 {
		t.Fatalf("%d reports at the forget bound, want 1 (kept, stale)", n)
	}
	if n := len(r.list(t0.Add(r.forget + r.summary))); n != 0 {
		t.Fatalf("%d reports past the forget bound, want 0", n)
	}
	if r.stale != 3*time.Minute+2*time.Second {
		t.Fatalf("stale bound %v, want three summaries and the rate limit", r.stale)
	}
}

func TestCheckLinkReportRefusesWhatNoGatewaySends(t *testing.T) {
	many := make([]*apiv1.LinkReport, maxReportedLinks+1)
	for i := range many {
		many[i] = link("c", "connected", "wireguard")
	}
	for _, tc := range []struct {
		name string
		req  *apiv1.ReportLinksRequest
		want string
	}{
		{"a link without a remote cluster", &apiv1.ReportLinksRequest{Links: []*apiv1.LinkReport{link("", "connected", "wg")}}, "links[0].remote_cluster"},
		{"a remote cluster that is no cluster name", &apiv1.ReportLinksRequest{Links: []*apiv1.LinkReport{link("Bad_Name", "connected", "wg")}}, `"Bad_Name"`},
		{"a removal that is no cluster name", &apiv1.ReportLinksRequest{Removed: []string{"a/b"}}, `removed[0] "a/b"`},
		{"more links than a report may hold", &apiv1.ReportLinksRequest{Links: many}, "more than the 255"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkLinkReport(tc.req)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one naming %s", err, tc.want)
			}
		})
	}
	if err := checkLinkReport(&apiv1.ReportLinksRequest{Links: []*apiv1.LinkReport{link("b", "connected", "wireguard")}}); err != nil {
		t.Fatalf("a good report refused: %v", err)
	}
}

// A page holds whole nodes up to maxPageBytes; the pages together hold every node once.
func TestLinkReportPagesHoldEveryNodeOnce(t *testing.T) {
	r := newLinkReportStore(time.Minute, 2*time.Second)
	t0 := time.Unix(1_700_000_000, 0)
	var links []*apiv1.LinkReport
	for i := range 254 {
		links = append(links, link(fmt.Sprintf("c%03d", i), "connected", "wireguard"))
	}
	const nodes = 500 // 500 x 254 links of about 40 bytes: several pages
	for i := range nodes {
		r.accept(nodeKey{fmt.Sprintf("c%03d", i%20), fmt.Sprintf("gw%02d", i/20)}, &apiv1.ReportLinksRequest{Full: true, Links: links}, t0)
	}
	seen := map[string]bool{}
	pages := 0
	for after := ""; ; pages++ {
		page, next := r.page(t0, after)
		n := 0
		for _, nr := range page {
			n += proto.Size(nr)
			k := nr.Cluster + "/" + nr.Node
			if seen[k] || k <= after {
				t.Fatalf("page %d: node %s again or out of order (after %q)", pages, k, after)
			}
			seen[k] = true
		}
		if n > maxPageBytes {
			t.Fatalf("page %d holds %d bytes, more than %d", pages, n, maxPageBytes)
		}
		if next == "" {
			break
		}
		after = next
	}
	if len(seen) != nodes || pages < 1 {
		t.Fatalf("%d nodes in %d pages after the first, want %d nodes in more than one page", len(seen), pages, nodes)
	}
}

func TestStoredLinkCutsLongStrings(t *testing.T) {
	l := compact(&apiv1.LinkReport{RemoteCluster: "b", Message: strings.Repeat("x", 10_000)}, time.Now())
	if m := l.attrs.Value().message; len(m) != maxLinkReportString {
		t.Fatalf("message kept at %d bytes, want %d", len(m), maxLinkReportString)
	}
}

// Over the API: an agent reports under its certificate's identity, the admin lists it, and the
// rate limit answers accepted=false with a retry time.
func TestReportLinksOverTheAPI(t *testing.T) {
	b := startBroker(t, t.TempDir(), brokerOpts{})
	ag := mustJoin(t, b.addr, b.token("alpha", "10.1.0.0/16"), "alpha", "gw1")
	b.token("beta", "10.2.0.0/16")
	client := ag.client(t, b.addr)
	resp, err := client.ReportLinks(ctxT(t), &apiv1.ReportLinksRequest{Full: true, AgentVersion: "v9",
		Links: []*apiv1.LinkReport{{RemoteCluster: "beta", State: "connected", Driver: "wireguard", Policy: "default",
			HasLatency: true, LatencyP50Ms: 1.5, LatencyP99Ms: 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Accepted || resp.SummaryIntervalMs != DefaultLinkReportInterval.Milliseconds() || resp.MinIntervalMs != DefaultLinkReportMinInterval.Milliseconds() {
		t.Fatalf("answer %v, want accepted with the default intervals", resp)
	}
	again, err := client.ReportLinks(ctxT(t), &apiv1.ReportLinksRequest{Full: true})
	if err != nil {
		t.Fatal(err)
	}
	if again.Accepted || again.RetryAfterMs <= 0 {
		t.Fatalf("second report at once: %v, want dropped with a retry time", again)
	}
	list, err := b.admin.ListLinkReports(ctxT(t), &apiv1.ListLinkReportsRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Nodes) != 1 || list.Nodes[0].Cluster != "alpha" || list.Nodes[0].Node != "gw1" || list.Nodes[0].AgentVersion != "v9" ||
		len(list.Nodes[0].Links) != 1 || list.Nodes[0].Links[0].LatencyP50Ms != 1.5 {
		t.Fatalf("listed %v, want alpha/gw1's one link", list.Nodes)
	}
	if list.StaleAfterMs <= 0 || list.BrokerTime == nil {
		t.Fatalf("no stale bound or broker time: %v", list)
	}
	_, err = client.ReportLinks(ctxT(t), &apiv1.ReportLinksRequest{Links: []*apiv1.LinkReport{{RemoteCluster: "NOT OK"}}})
	wantCode(t, err, codes.InvalidArgument, "remote_cluster", "NOT OK")
	// The admin certificate may not report, an agent may not list.
	_, err = apiv1.NewAgentClient(dialAdmin(t, b.dir, b.addr)).ReportLinks(ctxT(t), &apiv1.ReportLinksRequest{})
	wantCode(t, err, codes.PermissionDenied)
	_, err = apiv1.NewAdminClient(ag.dial(t, b.addr)).ListLinkReports(ctxT(t), &apiv1.ListLinkReportsRequest{})
	wantCode(t, err, codes.PermissionDenied)
}

func TestListedReportsLeaveOutRemovedClusters(t *testing.T) {
	nodes := []*apiv1.NodeLinkReports{
		{Cluster: "a", Node: "gw", Links: []*apiv1.LinkReport{link("b", "connected", "wg"), link("gone", "error", "wg")}},
		{Cluster: "gone", Node: "gw", Links: []*apiv1.LinkReport{link("a", "connected", "wg")}},
	}
	shared := nodes[0]
	out := knownClustersOnly(nodes, map[string]bool{"a": true, "b": true})
	if len(out) != 1 || out[0].Cluster != "a" || len(out[0].Links) != 1 || out[0].Links[0].RemoteCluster != "b" {
		t.Fatalf("kept %v, want a's link to b only", out)
	}
	if len(shared.Links) != 2 {
		t.Fatal("the store's report was changed in place")
	}
}

// FuzzLinkReport: whatever bytes an agent sends as a report, the broker either refuses it or
// keeps at most maxReportedLinks links of bounded strings, and never panics.
func FuzzLinkReport(f *testing.F) {
	seed, _ := proto.Marshal(&apiv1.ReportLinksRequest{Full: true, AgentVersion: "v1", Links: []*apiv1.LinkReport{link("b", "connected", "wireguard")}})
	f.Add(seed)
	delta, _ := proto.Marshal(&apiv1.ReportLinksRequest{Links: []*apiv1.LinkReport{link("c", "error", "vxlan")}, Removed: []string{"b"}})
	f.Add(delta)
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &apiv1.ReportLinksRequest{}
		if proto.Unmarshal(b, req) != nil || checkLinkReport(req) != nil {
			return
		}
		r := newLinkReportStore(time.Minute, time.Second)
		t0 := time.Unix(1_700_000_000, 0)
		r.accept(nodeKey{"a", "gw"}, &apiv1.ReportLinksRequest{Full: true, Links: []*apiv1.LinkReport{link("b", "connected", "wg")}}, t0)
		r.accept(nodeKey{"a", "gw"}, req, t0.Add(2*time.Second))
		for _, nr := range r.list(t0) {
			if len(nr.Links) > maxReportedLinks {
				t.Fatalf("%d links kept", len(nr.Links))
			}
			for i, l := range nr.Links {
				if len(l.Message) > maxLinkReportString || len(l.State) > maxLinkReportString {
					t.Fatalf("a string of %d bytes kept", len(l.Message))
				}
				if i > 0 && nr.Links[i-1].RemoteCluster >= l.RemoteCluster {
					t.Fatalf("links out of order or twice: %q then %q", nr.Links[i-1].RemoteCluster, l.RemoteCluster)
				}
			}
		}
	})
}
