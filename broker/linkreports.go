package broker

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
	"unique"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/registry"
	"github.com/cablemesh/cablemesh/broker/store"
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
	// hold): one per cluster the mesh can hold.
	maxReportedLinks = registry.MaxClusterID
	// maxPageBytes bounds one page of ListLinkReports, encoded (a node's links are never split,
	// and one node's report is at most about 550 KB): far below a client's 4 MiB.
	maxPageBytes = 2 << 20
	// maxLinkReportString bounds each string of a link report; longer messages are cut.
	maxLinkReportString = 512
)

// nodeKey names one gateway.
type nodeKey struct{ cluster, node string }

// order is the key's place in the listing (and its etcd key's suffix): by "cluster/node".
func (k nodeKey) order() string { return k.cluster + "/" + k.node }

// linkAttrs are the fields a node's links mostly share (every link connected over one driver
// by one policy): interned, so that each of a fleet's links (5,100 gateways x 254 clusters)
// holds a handle instead of its own strings.
type linkAttrs struct {
	state, driver, policy, message string
	mtu                            int32
	alive, hasLatency              bool
}

// compactLink is one link as the broker keeps it (80 bytes; the decoded protobuf message with
// its timestamps and strings takes about 380).
type compactLink struct {
	remote           string // interned
	attrs            unique.Handle[linkAttrs]
	p50, p95, p99    float64
	lastHandshake    int64 // unix ns; 0 when none
	reportedAt       int64 // unix ns
	rxBytes, txBytes uint64
}

// nodeLinks is one gateway's latest report as the broker keeps it.
type nodeLinks struct {
	version    string
	reportedAt time.Time     // the last report received
	accepted   time.Time     // the last report accepted (the rate limit's reference)
	links      []compactLink // by remote cluster
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

// checkLinkReport refuses what no gateway sends: more links than the mesh has clusters, a link
// without a cluster, a name that is no cluster name. It changes nothing.
func checkLinkReport(req *apiv1.ReportLinksRequest) error {
	if n := len(req.Links) + len(req.Removed); n > maxReportedLinks {
		return &admission.InvalidError{Field: "links", Value: fmt.Sprint(n),
			Err: fmt.Errorf("links: %d links and removals in one report, more than the %d a report may hold (one per cluster of the mesh)", n, maxReportedLinks)}
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

func unixNanos(ts *timestamppb.Timestamp) int64 {
	if ts == nil {
		return 0
	}
	return ts.AsTime().UnixNano()
}

// compact is the copy of l the broker keeps: bounded strings, interned, stamped with now.
func compact(l *apiv1.LinkReport, now time.Time) compactLink {
	return compactLink{
		remote: unique.Make(l.RemoteCluster).Value(),
		attrs: unique.Make(linkAttrs{state: cut(l.State), driver: cut(l.Driver), policy: cut(l.Policy), message: cut(l.Message),
			mtu: l.Mtu, alive: l.Alive, hasLatency: l.HasLatency}),
		p50: l.LatencyP50Ms, p95: l.LatencyP95Ms, p99: l.LatencyP99Ms,
		lastHandshake: unixNanos(l.LastHandshake), reportedAt: now.UnixNano(),
		rxBytes: l.RxBytes, txBytes: l.TxBytes,
	}
}

// proto is c as the API gives it.
func (c *compactLink) proto() *apiv1.LinkReport {
	a := c.attrs.Value()
	l := &apiv1.LinkReport{RemoteCluster: c.remote, State: a.state, Driver: a.driver, Policy: a.policy, Message: a.message,
		Mtu: a.mtu, Alive: a.alive, HasLatency: a.hasLatency, LatencyP50Ms: c.p50, LatencyP95Ms: c.p95, LatencyP99Ms: c.p99,
		RxBytes: c.rxBytes, TxBytes: c.txBytes, ReportedAt: timestamppb.New(time.Unix(0, c.reportedAt))}
	if c.lastHandshake != 0 {
		l.LastHandshake = timestamppb.New(time.Unix(0, c.lastHandshake))
	}
	return l
}

// set replaces or adds the link of c.remote, keeping links sorted.
func setLink(links []compactLink, c compactLink) []compactLink {
	i, found := slices.BinarySearchFunc(links, c.remote, func(l compactLink, r string) int { return strings.Compare(l.remote, r) })
	if found {
		links[i] = c
		return links
	}
	if len(links) >= maxReportedLinks {
		return links
	}
	return slices.Insert(links, i, c)
}

func removeLink(links []compactLink, remote string) []compactLink {
	i, found := slices.BinarySearchFunc(links, remote, func(l compactLink, r string) int { return strings.Compare(l.remote, r) })
	if !found {
		return links
	}
	return slices.Delete(links, i, i+1)
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
	links := n.links
	if req.Full {
		links = make([]compactLink, 0, len(req.Links))
	} else {
		// A copy: the listings may hold the old slice.
		links = slices.Clone(links)
	}
	for _, c := range req.Removed {
		links = removeLink(links, c)
	}
	for _, l := range req.Links {
		links = setLink(links, compact(l, now))
	}
	n.links = links
	n.version, n.reportedAt, n.accepted = unique.Make(cut(req.AgentVersion)).Value(), now, now
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

// page returns, in key order, the reports of the nodes after the key after ("" from the first),
// up to maxPageBytes encoded (at least one node), and the key to continue after ("" when this
// was the last page).
func (r *linkReportStore) page(now time.Time, after string) (out []*apiv1.NodeLinkReports, next string) {
	type entry struct {
		k nodeKey
		n nodeLinks
	}
	r.mu.Lock()
	r.pruneLocked(now)
	entries := make([]entry, 0, len(r.nodes))
	for k, n := range r.nodes {
		if k.order() > after {
			entries = append(entries, entry{k, *n}) // the links slice is never changed in place
		}
	}
	r.mu.Unlock()
	slices.SortFunc(entries, func(a, b entry) int { return strings.Compare(a.k.order(), b.k.order()) })
	size := 0
	for i, e := range entries {
		nr := e.n.report(e.k)
		n := proto.Size(nr)
		if i > 0 && size+n > maxPageBytes {
			return out, entries[i-1].k.order()
		}
		size += n
		out = append(out, nr)
	}
	return out, ""
}

// list returns every node's latest report (tests and small meshes).
func (r *linkReportStore) list(now time.Time) []*apiv1.NodeLinkReports {
	var all []*apiv1.NodeLinkReports
	for after := ""; ; {
		page, next := r.page(now, after)
		all = append(all, page...)
		if next == "" {
			return all
		}
		after = next
	}
}

// report is n as the API gives it.
func (n *nodeLinks) report(k nodeKey) *apiv1.NodeLinkReports {
	nr := &apiv1.NodeLinkReports{Cluster: k.cluster, Node: k.node, AgentVersion: n.version,
		ReportedAt: timestamppb.New(n.reportedAt), Links: make([]*apiv1.LinkReport, len(n.links))}
	for i := range n.links {
		nr.Links[i] = n.links[i].proto()
	}
	return nr
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
		a.s.linkShare.mark(k, now)
	}
	return r.timings(&apiv1.ReportLinksResponse{Accepted: true}), nil
}

// ListLinkReports returns the gateways' latest link reports, a page at a time. On etcd they come
// from etcd, where every replica writes the reports it accepts (linkreports_ha.go).
func (s *adminService) ListLinkReports(ctx context.Context, req *apiv1.ListLinkReportsRequest) (*apiv1.ListLinkReportsResponse, error) {
	now := s.s.cfg.Now()
	var (
		nodes []*apiv1.NodeLinkReports
		next  string
		err   error
	)
	if s.s.ha != nil {
		nodes, next, err = s.s.sharedLinkReports(ctx, req.PageToken)
		if err != nil {
			return nil, rpcError("list link reports", err)
		}
	} else {
		nodes, next = s.s.linkReports.page(now, req.PageToken)
	}
	known := map[string]bool{}
	err = store.ViewLocal(ctx, s.s.store, func(tx store.ReadTx) error {
		cs, err := tx.Clusters()
		for _, c := range cs {
			known[c.Name] = true
		}
		return err
	})
	if err != nil {
		return nil, rpcError("list link reports", err)
	}
	return &apiv1.ListLinkReportsResponse{Nodes: knownClustersOnly(nodes, known), NextPageToken: next,
		StaleAfterMs: s.s.linkReports.stale.Milliseconds(), BrokerTime: timestamppb.New(now)}, nil
}

// knownClustersOnly drops the reports of clusters no longer in the mesh, and the links to them:
// a removed cluster leaves the view at once rather than when its reports are forgotten.
func knownClustersOnly(nodes []*apiv1.NodeLinkReports, known map[string]bool) []*apiv1.NodeLinkReports {
	out := nodes[:0]
	for _, nr := range nodes {
		if !known[nr.Cluster] {
			continue
		}
		links := make([]*apiv1.LinkReport, 0, len(nr.Links))
		for _, l := range nr.Links {
			if known[l.RemoteCluster] {
				links = append(links, l)
			}
		}
		if len(links) != len(nr.Links) {
			// A copy: nr may be the one the store shares with other callers.
			nr = &apiv1.NodeLinkReports{Cluster: nr.Cluster, Node: nr.Node, AgentVersion: nr.AgentVersion, ReportedAt: nr.ReportedAt, Links: links}
		}
		out = append(out, nr)
	}
	return out
}
