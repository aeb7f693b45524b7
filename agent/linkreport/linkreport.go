// Package linkreport is the agent component that reports a gateway's links to the broker
// (Agent.ReportLinks), for the mesh-wide views (cablectl links --all, the dashboard): per remote
// cluster its state, driver, deciding policy, probe RTT percentiles, last handshake, bytes and
// MTU, read from the connection rows of the status document.
//
// Bounded and cheap: the component reads the rows every check interval and sends only what
// changed (state, driver, policy, alive) at once, and everything as a summary every summary
// interval (nothing until the gateway has a link); the broker sets both (it rate-limits each node to one report per min interval and
// answers a report that comes sooner with a time to retry). An older broker answers
// Unimplemented: the component then logs once and stops reporting.
package linkreport

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Defaults until the broker says otherwise (ReportLinksResponse).
const (
	DefaultMinInterval     = 2 * time.Second
	DefaultSummaryInterval = time.Minute
	// firstSpread spreads the first reports of a fleet that starts together (their links come
	// up together): the first report waits up to this long, at random, so that 5,100 gateways
	// send about 250 a second rather than all within a few seconds.
	firstSpread = DefaultSummaryInterval / 3
	// perGatewaySpread is the spread per gateway of the mesh (Deps.Gateways), up to firstSpread:
	// 250 first reports a second at most, and a small mesh reports at once (3 gateways: 12ms).
	perGatewaySpread = 4 * time.Millisecond
	// callTimeout bounds one report.
	callTimeout = 10 * time.Second
)

// Client is the broker call the component makes (apiv1.AgentClient has it).
type Client interface {
	ReportLinks(ctx context.Context, in *apiv1.ReportLinksRequest, opts ...grpc.CallOption) (*apiv1.ReportLinksResponse, error)
}

// Deps are what the component reads.
type Deps struct {
	Log *slog.Logger
	// Links returns the gateway's connection rows as the status shows them.
	Links func(context.Context) []statusapi.Connection
	// Gateways is how many gateway endpoints the mesh has (the fleet whose first reports are
	// spread); nil: as many as spread the first report over the whole firstSpread.
	Gateways func() int
	// Version is the agent's build.
	Version string
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// signature is what makes a link's change worth a report at once.
type signature struct {
	state, driver, policy string
	alive                 bool
}

// Reporter sends the gateway's link reports. Build with New, run with Run.
type Reporter struct {
	deps Deps

	mu sync.Mutex // guards the fields below (Stopped reads them from another goroutine)
	// sent is what the broker holds (per remote cluster), nil until a full report was accepted
	// or after a failure (the next report is full then).
	sent                 map[string]signature
	minInterval, summary time.Duration
	nextFull, notBefore  time.Time
	failures             int
	stopped              bool
	// reported: the broker accepted a report of this process once. Until then a gateway
	// without links sends nothing (nothing to show, and a fleet that starts together would
	// otherwise make one more call each while the broker is busiest).
	reported bool
	// firstAt: when the first report may go (set once the first link is seen); spread is
	// firstSpread (tests set 0).
	firstAt time.Time
	spread  time.Duration
}

// New builds a Reporter; it sends nothing until Run.
func New(deps Deps) *Reporter {
	if deps.Log == nil {
		deps.Log = slog.Default()
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	return &Reporter{deps: deps, minInterval: DefaultMinInterval, summary: DefaultSummaryInterval, spread: firstSpread}
}

// Run reports until ctx ends or the broker turns out not to take reports.
func (r *Reporter) Run(ctx context.Context, client Client) {
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		wait, stop := r.step(ctx, client)
		if stop {
			return
		}
		t.Reset(wait)
	}
}

// step sends one report if one is due, and says how long to wait for the next check.
func (r *Reporter) step(ctx context.Context, client Client) (wait time.Duration, stop bool) {
	now := r.deps.Now()
	r.mu.Lock()
	if d := r.notBefore.Sub(now); d > 0 {
		r.mu.Unlock()
		return d, false
	}
	full := r.sent == nil || !now.Before(r.nextFull)
	prev := r.sent
	r.mu.Unlock()

	links := Reports(r.deps.Links(ctx))
	r.mu.Lock()
	reported := r.reported
	r.mu.Unlock()
	if !reported {
		if len(links) == 0 {
			return r.checkInterval(), false
		}
		if d := r.firstWait(now); d > 0 {
			return d, false
		}
	}
	req := &apiv1.ReportLinksRequest{AgentVersion: r.deps.Version, Full: full}
	if full {
		req.Links = links
	} else {
		req.Links, req.Removed = Diff(prev, links)
		if len(req.Links) == 0 && len(req.Removed) == 0 {
			return r.checkInterval(), false
		}
	}
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	resp, err := client.ReportLinks(cctx, req)
	cancel()
	return r.answered(ctx, req, links, resp, err, now)
}

// answered records the broker's answer to req (links: every link at the time) and says how
// long to wait.
func (r *Reporter) answered(ctx context.Context, req *apiv1.ReportLinksRequest, links []*apiv1.LinkReport, resp *apiv1.ReportLinksResponse, err error, now time.Time) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case status.Code(err) == codes.Unimplemented:
		r.stopped = true
		r.deps.Log.Info("the broker does not take link reports (it predates them); not reporting this gateway's links")
		return 0, true
	case err != nil:
		if ctx.Err() != nil {
			return 0, true
		}
		r.failures++
		r.sent = nil // the broker may have lost them (a restart, another replica): resend all
		if r.failures == 1 {
			r.deps.Log.Warn("report links to the broker", "err", err)
		}
		// At random up to half the interval: a broker that comes back has every gateway's
		// report failed at once, and their resends must not meet its resuming watches.
		return r.minInterval + rand.N(max(r.summary/2-r.minInterval, 0)+1), false
	}
	r.failures = 0
	if ms := resp.GetMinIntervalMs(); ms > 0 {
		r.minInterval = time.Duration(ms) * time.Millisecond
	}
	if ms := resp.GetSummaryIntervalMs(); ms > 0 {
		r.summary = time.Duration(ms) * time.Millisecond
	}
	if !resp.GetAccepted() {
		// Rate-limited: the changes are still unsent, and go at the time the broker gave.
		retry := max(time.Duration(resp.GetRetryAfterMs())*time.Millisecond, 100*time.Millisecond)
		r.notBefore = now.Add(retry)
		return retry, false
	}
	if req.Full {
		r.sent = make(map[string]signature, len(links))
		// Spread the summaries of a fleet that started together over a tenth of the interval.
		r.nextFull = now.Add(r.summary - rand.N(r.summary/10+1))
	}
	for _, l := range req.Links {
		r.sent[l.RemoteCluster] = sign(l)
	}
	for _, c := range req.Removed {
		delete(r.sent, c)
	}
	r.notBefore = now.Add(r.minInterval)
	r.reported = true
	return r.checkInterval(), false
}

// firstWait is how long the first report still waits (drawn at random when the first link is
// seen, over perGatewaySpread per gateway of the mesh, firstSpread at most).
func (r *Reporter) firstWait(now time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.firstAt.IsZero() {
		spread := r.spread
		if r.deps.Gateways != nil {
			spread = min(spread, time.Duration(r.deps.Gateways())*perGatewaySpread)
		}
		r.firstAt = now.Add(rand.N(spread + 1))
	}
	return r.firstAt.Sub(now)
}

// checkInterval is how often the links are read for changes: the broker's rate limit, since a
// change found sooner could not be sent sooner.
func (r *Reporter) checkInterval() time.Duration { return max(r.minInterval, 500*time.Millisecond) }

// Stopped says whether the component gave up (an older broker).
func (r *Reporter) Stopped() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stopped
}

func sign(l *apiv1.LinkReport) signature {
	return signature{state: l.State, driver: l.Driver, policy: l.Policy, alive: l.Alive}
}

// Diff returns the links whose signature differs from prev's and the remote clusters of prev no
// longer linked. It is pure.
func Diff(prev map[string]signature, links []*apiv1.LinkReport) (changed []*apiv1.LinkReport, removed []string) {
	now := make(map[string]bool, len(links))
	for _, l := range links {
		now[l.RemoteCluster] = true
		if s, ok := prev[l.RemoteCluster]; !ok || s != sign(l) {
			changed = append(changed, l)
		}
	}
	for c := range prev {
		if !now[c] {
			removed = append(removed, c)
		}
	}
	return changed, removed
}

// Reports turns the status's connection rows into link reports, one per remote cluster (the
// first row of a cluster wins: a cluster is one row).
func Reports(conns []statusapi.Connection) []*apiv1.LinkReport {
	out := make([]*apiv1.LinkReport, 0, len(conns))
	seen := make(map[string]bool, len(conns))
	for _, c := range conns {
		if seen[c.Cluster] || c.Cluster == "" {
			continue
		}
		seen[c.Cluster] = true
		out = append(out, Report(c))
	}
	return out
}

// Report is one connection row as a link report.
func Report(c statusapi.Connection) *apiv1.LinkReport {
	l := &apiv1.LinkReport{RemoteCluster: c.Cluster, State: c.State, Driver: c.Driver, Policy: c.Policy,
		RxBytes: c.RxBytes, TxBytes: c.TxBytes, Mtu: int32(c.MTU), Message: c.Message,
		// As cablectl links' ALIVE: up on the device and, where probed, answering.
		Alive: c.State == "connected" && (c.Health == nil || !c.Health.Probing || c.Health.Healthy)}
	if c.RTT != nil && c.Health != nil && c.Health.Samples > 0 {
		l.HasLatency, l.LatencyP50Ms, l.LatencyP95Ms, l.LatencyP99Ms = true, c.RTT.P50Ms, c.RTT.P95Ms, c.RTT.P99Ms
	}
	if c.LastHandshake != nil && !c.LastHandshake.IsZero() {
		l.LastHandshake = timestamppb.New(*c.LastHandshake)
	}
	return l
}
