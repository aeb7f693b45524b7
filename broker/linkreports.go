package broker

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/broker/admission"
)

// Link reports are soft state: each gateway's latest view of its links (ReportLinks), kept in
// memory only, never in the store. They describe the moment, are resent in full every summary
// interval, and a broker that restarts has them all again within one interval; writing them to
// the store would add a commit (and a watch event to every agent) per report for nothing an
// agent acts on. On etcd the replicas share them through etcd under a lease (linkreports_ha.go),
// so any replica answers ListLinkReports for the whole mesh.

const (
	// DefaultLinkReportInterval is Config.LinkReportInterval's default: how often a gateway
	// sends its full report.
	DefaultLinkReportInterval = time.Minute
	// DefaultLinkReportMinInterval is Config.LinkReportMinInterval's default: the shortest time
	// between two accepted reports of one node (changes wait at most this long).
	DefaultLinkReportMinInterval = 2 * time.Second
	// linkReportStaleFactor: a node's report is stale once it is older than this many summary
	// intervals (plus the rate limit): it missed two summaries in a row.
	linkReportStaleFactor = 3
	// linkReportForgetFactor: a node's report is forgotten once it is older than this many
	// summary intervals (a gateway removed for good leaves no trace beyond that).
	linkReportForgetFactor = 10
	// maxReportedLinks bounds one node's links (and so the memory a node can make the broker
	// hold): one per remote cluster.
	maxReportedLinks = 4096
	// maxLinkReportString bounds each string of a link report; longer messages are cut.
	maxLinkReportString = 512
)

// nodeKey names one gateway.
type nodeKey struct{ cluster, node string }

// nodeLinks is one gateway's latest report as the broker keeps it.
type nodeLinks struct {
	version    string
	reportedAt time.Time // the last report received
	accepted   time.Time // the last report accepted (the rate limit's reference)
	links      map[string]*apiv1.LinkReport
}

// linkReportStore holds the latest report of every gateway that reports to this replica. It
// rate-limits each node to one report per minInterval and forgets reports older than forget.
type linkReportStore struct {
	minInterval, summary, stale, forget time.Duration

	mu        sync.Mutex
	nodes     map[nodeKey]*nodeLinks
	lastPrune time.Time
}

func newLinkReportStore(summary, minInterval time.Duration) *linkReportStore {
	if summary <= 0 {
		summary = DefaultLinkReportInterval
	}
	if minInterval <= 0 {
		minInterval = DefaultLinkReportMinInterval
	}
	minInterval = min(minInterval, summary)
	return &linkReportStore{minInterval: minInterval, summary: summary,
		stale: linkReportStaleFactor*summary + minInterval, forget: linkReportForgetFactor * summary,
		nodes: map[nodeKey]*nodeLinks{}}
}

// checkLinkReport refuses what no gateway sends: too many links, a link without a cluster, a
// name that is no cluster name. It changes nothing.
func checkLinkReport(req *apiv1.ReportLinksRequest) error {
	if n := len(req.Links) + len(req.Removed); n > maxReportedLinks {
		return &admission.InvalidError{Field: "links", Value: fmt.Sprint(n),
			Err: fmt.Errorf("links: %d links and removals in one report, more than the %d a report may hold", n, maxReportedLinks)}
	}
	for i, l := range req.Links {
		if err := validation.ValidateClusterName(l.RemoteCluster); err != nil {
			return &admission.InvalidError{Field: "links.remote_cluster", Value: l.RemoteCluster,
				Err: fmt.Errorf("links[%d].remote_cluster %q: %w", i, l.RemoteCluster, err)}
		}
	}
	for i, c := range req.Removed {
		if err := validation.ValidateClusterName(c); err != nil {
			return &admission.InvalidError{Field: "removed", Value: c, Err: fmt.Errorf("removed[%d] %q: %w", i, c, err)}
		}
	}
	return nil
}

// cut bounds a string the broker keeps for a caller.
func cut(s string) string {
	if len(s) > maxLinkReportString {
		return s[:maxLinkReportString]
	}
	return s
}

// storedLink is the copy of l the broker keeps: bounded strings, stamped with now.
func storedLink(l *apiv1.LinkReport, now time.Time) *apiv1.LinkReport {
	c := proto.Clone(l).(*apiv1.LinkReport)
	c.State, c.Driver, c.Policy, c.Message = cut(c.State), cut(c.Driver), cut(c.Policy), cut(c.Message)
	c.ReportedAt = timestamppb.New(now)
	return c
}

// accept applies node k's report at now, unless it comes sooner than minInterval after the last
// one accepted: then it is dropped and retryAfter says when the next one is accepted.
func (r *linkReportStore) accept(k nodeKey, req *apiv1.ReportLinksRequest, now time.Time) (accepted bool, retryAfter time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(now)
	n := r.nodes[k]
	if n != nil && now.Sub(n.accepted) < r.minInterval && !n.accepted.After(now) {
		return false, r.minInterval - now.Sub(n.accepted)
	}
	if n == nil {
		n = &nodeLinks{}
		r.nodes[k] = n
	}
	if req.Full || n.links == nil {
		n.links = make(map[string]*apiv1.LinkReport, len(req.Links))
	}
	for _, c := range req.Removed {
		delete(n.links, c)
	}
	for _, l := range req.Links {
		if len(n.links) >= maxReportedLinks && n.links[l.RemoteCluster] == nil {
			break
		}
		n.links[l.RemoteCluster] = storedLink(l, now)
	}
	n.version, n.reportedAt, n.accepted = cut(req.AgentVersion), now, now
	return true, 0
}

// pruneLocked forgets the reports older than forget, at most once per summary interval.
func (r *linkReportStore) pruneLocked(now time.Time) {
	if now.Sub(r.lastPrune) < r.summary {
		return
	}
	r.lastPrune = now
	for k, n := range r.nodes {
		if now.Sub(n.reportedAt) > r.forget {
			delete(r.nodes, k)
		}
	}
}

// list returns every node's latest report, by cluster and node, links by remote cluster.
func (r *linkReportStore) list(now time.Time) []*apiv1.NodeLinkReports {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(now)
	out := make([]*apiv1.NodeLinkReports, 0, len(r.nodes))
	for k, n := range r.nodes {
		out = append(out, n.report(k))
	}
	sortNodeReports(out)
	return out
}

// report is n as the API gives it (the links are shared, never changed in place: accept
// replaces them).
func (n *nodeLinks) report(k nodeKey) *apiv1.NodeLinkReports {
	nr := &apiv1.NodeLinkReports{Cluster: k.cluster, Node: k.node, AgentVersion: n.version,
		ReportedAt: timestamppb.New(n.reportedAt), Links: make([]*apiv1.LinkReport, 0, len(n.links))}
	for _, l := range n.links {
		nr.Links = append(nr.Links, l)
	}
	sort.Slice(nr.Links, func(i, j int) bool { return nr.Links[i].RemoteCluster < nr.Links[j].RemoteCluster })
	return nr
}

func sortNodeReports(out []*apiv1.NodeLinkReports) {
	sort.Slice(out, func(i, j int) bool {
		if out[i].Cluster != out[j].Cluster {
			return out[i].Cluster < out[j].Cluster
		}
		return out[i].Node < out[j].Node
	})
}

// reportTimings is what the broker tells a reporting agent about its pace.
func (r *linkReportStore) timings(resp *apiv1.ReportLinksResponse) *apiv1.ReportLinksResponse {
	resp.MinIntervalMs, resp.SummaryIntervalMs = r.minInterval.Milliseconds(), r.summary.Milliseconds()
	return resp
}

// ReportLinks keeps the calling gateway's link report (soft state, see above).
func (a *agentService) ReportLinks(ctx context.Context, req *apiv1.ReportLinksRequest) (*apiv1.ReportLinksResponse, error) {
	id := identityFrom(ctx)
	if id.Cluster == "" || id.Node == "" {
		return nil, rpcError("report links", &admission.ForbiddenError{Caller: id.String(), Target: "link reports",
			Err: errors.New("link reports need an agent certificate naming a cluster and a node")})
	}
	if err := checkLinkReport(req); err != nil {
		return nil, rpcError("report links", err)
	}
	r := a.s.linkReports
	now := a.s.cfg.Now()
	k := nodeKey{id.Cluster, id.Node}
	ok, retry := r.accept(k, req, now)
	if !ok {
		return r.timings(&apiv1.ReportLinksResponse{RetryAfterMs: max(retry.Milliseconds(), 1)}), nil
	}
	if a.s.ha != nil {
		a.s.shareLinkReport(ctx, k, now)
	}
	return r.timings(&apiv1.ReportLinksResponse{Accepted: true}), nil
}

// ListLinkReports returns every gateway's latest link report.
func (s *adminService) ListLinkReports(ctx context.Context, _ *apiv1.ListLinkReportsRequest) (*apiv1.ListLinkReportsResponse, error) {
	now := s.s.cfg.Now()
	nodes := s.s.linkReports.list(now)
	if s.s.ha != nil {
		shared, err := s.s.sharedLinkReports(ctx)
		if err != nil {
			return nil, rpcError("list link reports", err)
		}
		nodes = mergeNodeReports(nodes, shared)
	}
	return &apiv1.ListLinkReportsResponse{Nodes: nodes, StaleAfterMs: s.s.linkReports.stale.Milliseconds(),
		BrokerTime: timestamppb.New(now)}, nil
}

// mergeNodeReports keeps, of each node, the newest report of a and b.
func mergeNodeReports(a, b []*apiv1.NodeLinkReports) []*apiv1.NodeLinkReports {
	newest := map[nodeKey]*apiv1.NodeLinkReports{}
	for _, nr := range append(a, b...) {
		k := nodeKey{nr.Cluster, nr.Node}
		if cur := newest[k]; cur == nil || nr.ReportedAt.AsTime().After(cur.ReportedAt.AsTime()) {
			newest[k] = nr
		}
	}
	out := make([]*apiv1.NodeLinkReports, 0, len(newest))
	for _, nr := range newest {
		out = append(out, nr)
	}
	sortNodeReports(out)
	return out
}
