//go:build bench

package scale

import (
	"context"
	mrand "math/rand/v2"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// What cable-agent's linkreport does on a gateway (agent/linkreport), in the same order and
// with the same timings: nothing while it has no link (a fresh gateway), a full report once its
// links are up (here: once the agent holds every endpoint and cluster, one link per remote
// cluster, connected) after a wait of up to 20 s at random, then a full report every summary interval
// the broker gives, less up to a tenth at random; a report the broker drops (its rate limit)
// again after the time it says, a failed one again in full at random within half an interval; an older broker's
// Unimplemented ends the reports.

const (
	reportMinInterval = 2 * time.Second   // linkreport.DefaultMinInterval
	reportSummary     = time.Minute       // linkreport.DefaultSummaryInterval
	reportFirstSpread = reportSummary / 3 // linkreport's firstSpread
	reportVersion     = "scale-bench"
)

// linkSets builds once, per cluster, the links its gateways report: every other cluster.
type linkSets struct {
	once sync.Once
	sets map[string][]*apiv1.LinkReport
}

func (l *linkSets) of(f *fleet, cluster string) []*apiv1.LinkReport {
	l.once.Do(func() {
		hs := timestamppb.New(time.Now())
		l.sets = make(map[string][]*apiv1.LinkReport, len(f.clusters))
		for _, c := range f.clusters {
			links := make([]*apiv1.LinkReport, 0, len(f.clusters)-1)
			for _, r := range f.clusters {
				if r == c {
					continue
				}
				links = append(links, &apiv1.LinkReport{RemoteCluster: r, State: "connected", Driver: "wireguard", Policy: "default",
					HasLatency: true, LatencyP50Ms: 0.42, LatencyP95Ms: 0.9, LatencyP99Ms: 1.7, LastHandshake: hs,
					RxBytes: 123456, TxBytes: 654321, Mtu: 1420, Alive: true})
			}
			l.sets[c] = links
		}
	})
	return l.sets[cluster]
}

// reportLoop is linkreport.Reporter.Run for a simulated gateway.
func (a *simAgent) reportLoop(ctx context.Context) {
	select {
	case <-ctx.Done():
		return
	case <-a.linksUp:
	}
	if !sleepCtx(ctx, mrand.N(reportFirstSpread+1)) {
		return
	}
	links := a.f.linkSets.of(a.f, a.cluster)
	summary, ok := a.sendReport(ctx, &apiv1.ReportLinksRequest{AgentVersion: reportVersion, Full: true, Links: links})
	if !ok {
		return
	}
	for {
		if !sleepCtx(ctx, summary-mrand.N(summary/10+1)) {
			return
		}
		if summary, ok = a.sendReport(ctx, &apiv1.ReportLinksRequest{AgentVersion: reportVersion, Full: true, Links: links}); !ok {
			return
		}
	}
}

// sendReport sends req until the broker accepts it (a failed change goes again in full) and
// returns the broker's summary interval; false when the reports end (ctx, or an older broker).
func (a *simAgent) sendReport(ctx context.Context, req *apiv1.ReportLinksRequest) (time.Duration, bool) {
	for {
		a.f.calls.reports.Add(1)
		a.f.calls.reportBytes.Add(int64(proto.Size(req)))
		cctx, cancel := context.WithTimeout(ctx, callTimeout)
		resp, err := a.client.ReportLinks(cctx, req)
		cancel()
		if ctx.Err() != nil {
			return 0, false
		}
		var wait time.Duration
		switch {
		case status.Code(err) == codes.Unimplemented:
			a.f.calls.reportsUnimplemented.Add(1)
			return 0, false
		case err != nil:
			a.f.calls.reportErrors.Add(1)
			a.f.calls.failed("ReportLinks", err)
			wait = reportMinInterval + mrand.N(reportSummary/2-reportMinInterval+1)
			if !req.Full && len(req.Links) > 0 {
				req = &apiv1.ReportLinksRequest{AgentVersion: req.AgentVersion, Full: true, Links: req.Links}
			}
		case !resp.GetAccepted():
			a.f.calls.reportsDropped.Add(1)
			wait = max(time.Duration(resp.GetRetryAfterMs())*time.Millisecond, 100*time.Millisecond)
		default:
			summary := reportSummary
			if ms := resp.GetSummaryIntervalMs(); ms > 0 {
				summary = time.Duration(ms) * time.Millisecond
			}
			return summary, true
		}
		if !sleepCtx(ctx, wait) {
			return 0, false
		}
	}
}

// sleepCtx waits d (nothing when d <= 0); false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
