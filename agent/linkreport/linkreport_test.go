package linkreport

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// fakeBroker answers ReportLinks as told and records the requests.
type fakeBroker struct {
	mu      sync.Mutex
	reqs    []*apiv1.ReportLinksRequest
	answers []func() (*apiv1.ReportLinksResponse, error) // in turn; then accepted
}

func (f *fakeBroker) ReportLinks(_ context.Context, in *apiv1.ReportLinksRequest, _ ...grpc.CallOption) (*apiv1.ReportLinksResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reqs = append(f.reqs, in)
	if len(f.answers) > 0 {
		a := f.answers[0]
		f.answers = f.answers[1:]
		return a()
	}
	return &apiv1.ReportLinksResponse{Accepted: true, MinIntervalMs: 1000, SummaryIntervalMs: 10_000}, nil
}

type fixture struct {
	r     *Reporter
	b     *fakeBroker
	now   time.Time
	conns []statusapi.Connection
	log   bytes.Buffer
}

func newFixture() *fixture {
	f := &fixture{b: &fakeBroker{}, now: time.Unix(1_700_000_000, 0)}
	f.r = New(Deps{Log: slog.New(slog.NewTextHandler(&f.log, nil)), Version: "v1", Now: func() time.Time { return f.now },
		Links: func(context.Context) []statusapi.Connection { return f.conns }})
	f.r.spread = 0
	return f
}

func conn(cluster, state string) statusapi.Connection {
	return statusapi.Connection{Cluster: cluster, State: state, Driver: "wireguard", Policy: "default", MTU: 1420}
}

// step runs one check at the fixture's time and returns the wait.
func (f *fixture) step(t *testing.T) time.Duration {
	t.Helper()
	wait, stop := f.r.step(context.Background(), f.b)
	if stop {
		t.Fatal("the reporter stopped")
	}
	return wait
}

func (f *fixture) last() *apiv1.ReportLinksRequest { return f.b.reqs[len(f.b.reqs)-1] }

func TestReporterSendsChangesAtOnceAndTheRestAsASummary(t *testing.T) {
	f := newFixture()
	f.conns = []statusapi.Connection{conn("b", "connected"), conn("c", "connecting")}
	f.step(t)
	if len(f.b.reqs) != 1 || !f.last().Full || len(f.last().Links) != 2 || f.last().AgentVersion != "v1" {
		t.Fatalf("first report %v, want a full one of both links", f.b.reqs)
	}
	// Nothing changed: no report before the summary is due (RTT and bytes do not count).
	f.now = f.now.Add(time.Second)
	f.conns[0].RxBytes = 1000
	f.step(t)
	if len(f.b.reqs) != 1 {
		t.Fatalf("%d reports, want none for a change of bytes alone", len(f.b.reqs))
	}
	// A state change goes at once, alone; a removed link is named.
	f.now = f.now.Add(time.Second)
	f.conns = []statusapi.Connection{conn("b", "connected"), conn("d", "connected")}
	f.conns[0].State = "error"
	f.step(t)
	got := f.last()
	if got.Full || len(got.Links) != 2 || got.Links[0].RemoteCluster != "b" || got.Links[0].State != "error" ||
		got.Links[1].RemoteCluster != "d" || len(got.Removed) != 1 || got.Removed[0] != "c" {
		t.Fatalf("change report %v, want b's new state, d added and c removed", got)
	}
	// The summary comes within the broker's interval (10s, less up to a tenth).
	f.now = f.now.Add(10 * time.Second)
	f.step(t)
	if !f.last().Full || len(f.last().Links) != 2 {
		t.Fatalf("report after the summary interval %v, want full", f.last())
	}
}

func TestReporterWaitsWhenTheBrokerLimitsIt(t *testing.T) {
	f := newFixture()
	f.b.answers = []func() (*apiv1.ReportLinksResponse, error){
		func() (*apiv1.ReportLinksResponse, error) {
			return &apiv1.ReportLinksResponse{Accepted: false, RetryAfterMs: 1500, MinIntervalMs: 2000, SummaryIntervalMs: 60_000}, nil
		},
	}
	f.conns = []statusapi.Connection{conn("b", "connected")}
	if wait := f.step(t); wait != 1500*time.Millisecond {
		t.Fatalf("wait %v after a dropped report, want the broker's 1.5s", wait)
	}
	f.now = f.now.Add(time.Second)
	f.step(t)
	if len(f.b.reqs) != 1 {
		t.Fatalf("%d reports, want none before the retry time", len(f.b.reqs))
	}
	f.now = f.now.Add(time.Second)
	f.step(t)
	if len(f.b.reqs) != 2 || !f.last().Full {
		t.Fatalf("reports %v, want the dropped full report again after the retry time", f.b.reqs)
	}
}

func TestReporterStopsQuietlyOnAnOldBroker(t *testing.T) {
	f := newFixture()
	f.b.answers = []func() (*apiv1.ReportLinksResponse, error){
		func() (*apiv1.ReportLinksResponse, error) {
			return nil, status.Error(codes.Unimplemented, "unknown method ReportLinks for service cablemesh.v1.Agent")
		},
	}
	f.conns = []statusapi.Connection{conn("b", "connected")}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	done := make(chan struct{})
	go func() { f.r.Run(ctx, f.b); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		t.Fatal("Run kept going after Unimplemented")
	}
	if !f.r.Stopped() || len(f.b.reqs) != 1 {
		t.Fatalf("stopped=%v after %d calls, want stopped after one", f.r.Stopped(), len(f.b.reqs))
	}
	if n := strings.Count(f.log.String(), "\n"); n != 1 || !strings.Contains(f.log.String(), "does not take link reports") {
		t.Fatalf("log %q, want exactly one line saying why", f.log.String())
	}
}

func TestReporterResendsEverythingAfterAFailure(t *testing.T) {
	f := newFixture()
	f.conns = []statusapi.Connection{conn("b", "connected"), conn("c", "connected")}
	f.step(t)
	f.b.answers = []func() (*apiv1.ReportLinksResponse, error){
		func() (*apiv1.ReportLinksResponse, error) { return nil, status.Error(codes.Unavailable, "broker gone") },
	}
	f.now = f.now.Add(2 * time.Second)
	f.conns[0].State = "error"
	wait := f.step(t)
	if wait < time.Second || wait > 5*time.Second+time.Second {
		t.Fatalf("wait %v after a failure, want between the minimum interval (1s) and half the summary (5s)", wait)
	}
	f.now = f.now.Add(wait)
	f.step(t)
	if !f.last().Full || len(f.last().Links) != 2 {
		t.Fatalf("report after a failure %v, want a full one", f.last())
	}
}

func TestReportCarriesTheStatusRow(t *testing.T) {
	hs := time.Unix(1_700_000_000, 0)
	c := statusapi.Connection{Cluster: "b", State: "connected", Driver: "vxlan", Policy: "p", RxBytes: 1, TxBytes: 2, MTU: 1400,
		LastHandshake: &hs, RTT: &statusapi.RTT{P50Ms: 1, P95Ms: 2, P99Ms: 3},
		Health: &statusapi.Health{Probing: true, Healthy: false, Samples: 5}}
	l := Report(c)
	if l.Alive {
		t.Fatal("a link whose probes fail reported alive")
	}
	if !l.HasLatency || l.LatencyP99Ms != 3 || l.Mtu != 1400 || l.RxBytes != 1 || l.TxBytes != 2 || !l.LastHandshake.AsTime().Equal(hs) {
		t.Fatalf("report %v does not carry the row", l)
	}
	c.Health.Samples = 0
	if Report(c).HasLatency {
		t.Fatal("latency reported without samples")
	}
}

func TestReporterSendsNothingBeforeTheFirstLink(t *testing.T) {
	f := newFixture()
	f.step(t)
	if len(f.b.reqs) != 0 {
		t.Fatalf("%d reports of a gateway without links, want none", len(f.b.reqs))
	}
	f.conns = []statusapi.Connection{conn("b", "connecting")}
	f.now = f.now.Add(2 * time.Second)
	f.step(t)
	if len(f.b.reqs) != 1 || !f.last().Full {
		t.Fatalf("reports %v, want a full one once a link exists", f.b.reqs)
	}
	// Once reported, losing every link is a change the broker hears of.
	f.conns = nil
	f.now = f.now.Add(2 * time.Second)
	f.step(t)
	if len(f.b.reqs) != 2 || len(f.last().Removed) != 1 {
		t.Fatalf("reports %v, want b removed", f.b.reqs)
	}
}

func TestTheFirstReportWaitsAtMostTheSpread(t *testing.T) {
	f := newFixture()
	f.r.spread = firstSpread
	f.conns = []statusapi.Connection{conn("b", "connected")}
	wait := f.step(t)
	if wait < 0 || wait > firstSpread || len(f.b.reqs) > 1 {
		t.Fatalf("first wait %v with %d reports, want at most %v", wait, len(f.b.reqs), firstSpread)
	}
	f.now = f.now.Add(wait)
	f.step(t)
	if len(f.b.reqs) != 1 || !f.last().Full {
		t.Fatalf("reports %v after the first wait, want the first, full", f.b.reqs)
	}
}

// The first report's spread follows the mesh's size: a gateway of a small mesh reports at once
// (an operator's `cablectl links --all` shows it), one of a large fleet waits its turn.
func TestTheFirstReportSpreadFollowsTheMeshSize(t *testing.T) {
	for _, tc := range []struct {
		gateways int
		max      time.Duration
	}{{3, 3 * perGatewaySpread}, {5100, firstSpread}, {100000, firstSpread}} {
		worst := time.Duration(0)
		for i := 0; i < 200; i++ {
			f := newFixture()
			f.r.spread = firstSpread
			f.r.deps.Gateways = func() int { return tc.gateways }
			f.conns = []statusapi.Connection{conn("b", "connected")}
			worst = max(worst, f.r.firstWait(f.now))
		}
		if worst > tc.max {
			t.Errorf("%d gateways: first report waited up to %v, want at most %v", tc.gateways, worst, tc.max)
		}
		if tc.gateways >= 5100 && worst < firstSpread/2 {
			t.Errorf("%d gateways: first reports all within %v, want them spread over %v", tc.gateways, worst, firstSpread)
		}
	}
}
