package cablectl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// LinksAll is `cablectl links --all -o json|yaml`: the mesh's links, one item per cluster pair,
// from the link reports the gateways send the broker. The JSON keys are a contract (the
// dashboard serves the same items).
type LinksAll struct {
	Items []LinkPair `json:"items"`
}

// LinkPair is one pair of clusters with each end's view of the link between them.
type LinkPair struct {
	// Clusters are the pair's two clusters, in name order.
	Clusters [2]string `json:"clusters"`
	// Ends are the reports of the gateways of both clusters on this link, by cluster then node.
	Ends []LinkEnd `json:"ends"`
	// Agree: both clusters report the link, and every end says the same state and driver.
	Agree bool `json:"agree"`
	// Stale: an end's report is older than the broker's stale bound (its gateway stopped
	// reporting: gone, stopped or cut off from the broker).
	Stale bool `json:"stale"`

	// Alive: both clusters report the link, and every end is alive and fresh (the table's ALIVE).
	Alive bool `json:"-"`
	// Age is that of the oldest end's report, at the broker's clock.
	Age time.Duration `json:"-"`
}

// LinkEnd is one gateway's view of its link to the pair's other cluster.
type LinkEnd struct {
	Cluster string `json:"cluster"`
	Node    string `json:"node"`
	// State: connected | connecting | error.
	State  string `json:"state"`
	Driver string `json:"driver"`
	Policy string `json:"policy"`
	// Latencies are the probes' RTT percentiles in ms; null without samples.
	LatencyP50Ms  *float64   `json:"latencyP50Ms"`
	LatencyP95Ms  *float64   `json:"latencyP95Ms"`
	LatencyP99Ms  *float64   `json:"latencyP99Ms"`
	LastHandshake *time.Time `json:"lastHandshake"`
	// ReportedAt is when the broker last received this link's report.
	ReportedAt   time.Time `json:"reportedAt"`
	AgentVersion string    `json:"agentVersion"`

	// Not in the JSON (its keys are fixed), for the table and Go callers.
	Remote  string `json:"-"` // the other cluster of the pair
	Alive   bool   `json:"-"`
	Stale   bool   `json:"-"`
	Message string `json:"-"`
	RxBytes uint64 `json:"-"`
	TxBytes uint64 `json:"-"`
	MTU     int    `json:"-"`
}

// ErrLinkReportsUnsupported: the broker predates link reports (ListLinkReports is Unimplemented).
var ErrLinkReportsUnsupported = fmt.Errorf("the broker does not collect link reports (it predates them): upgrade it")

// FetchLinksAll asks the broker (with the admin credential of client) for every gateway's link
// report, every page, and pairs them (PairLinks).
func FetchLinksAll(ctx context.Context, client apiv1.AdminClient) (LinksAll, error) {
	resp, err := FetchLinkReports(ctx, client)
	if err != nil {
		return LinksAll{}, err
	}
	return LinksAll{Items: PairLinks(resp)}, nil
}

// maxLinkReportPages bounds the pages FetchLinkReports reads (a broker that kept answering with
// a next page would otherwise never end the call): far more than 5,100 gateways need.
const maxLinkReportPages = 10_000

// FetchLinkReports reads every page of ListLinkReports into one answer (the stale bound and the
// broker's clock of the last page).
func FetchLinkReports(ctx context.Context, client apiv1.AdminClient) (*apiv1.ListLinkReportsResponse, error) {
	all := &apiv1.ListLinkReportsResponse{}
	req := &apiv1.ListLinkReportsRequest{}
	for range maxLinkReportPages {
		resp, err := client.ListLinkReports(ctx, req)
		if status.Code(err) == codes.Unimplemented {
			return nil, ErrLinkReportsUnsupported
		}
		if err != nil {
			return nil, rpcError("list link reports", err)
		}
		all.Nodes = append(all.Nodes, resp.Nodes...)
		all.StaleAfterMs, all.BrokerTime = resp.StaleAfterMs, resp.BrokerTime
		if resp.NextPageToken == "" {
			return all, nil
		}
		if resp.NextPageToken <= req.PageToken {
			return nil, fmt.Errorf("list link reports: the broker's next page %q does not follow %q", resp.NextPageToken, req.PageToken)
		}
		req = &apiv1.ListLinkReportsRequest{PageToken: resp.NextPageToken}
	}
	return nil, fmt.Errorf("list link reports: more than %d pages", maxLinkReportPages)
}

// PairLinks turns the broker's per-gateway reports into one item per cluster pair, judging
// staleness at the broker's clock (resp.broker_time) against its bound (resp.stale_after_ms).
func PairLinks(resp *apiv1.ListLinkReportsResponse) []LinkPair {
	now := resp.GetBrokerTime().AsTime()
	staleAfter := time.Duration(resp.GetStaleAfterMs()) * time.Millisecond
	pairs := map[[2]string]*LinkPair{}
	for _, nr := range resp.GetNodes() {
		for _, l := range nr.GetLinks() {
			if l.GetRemoteCluster() == nr.GetCluster() {
				continue
			}
			k := pairKey(nr.GetCluster(), l.GetRemoteCluster())
			p := pairs[k]
			if p == nil {
				p = &LinkPair{Clusters: k}
				pairs[k] = p
			}
			p.Ends = append(p.Ends, linkEnd(nr, l, now, staleAfter))
		}
	}
	out := make([]LinkPair, 0, len(pairs))
	for _, p := range pairs {
		judgePair(p, now)
		out = append(out, *p)
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Clusters[0] < out[j].Clusters[0] || out[i].Clusters[0] == out[j].Clusters[0] && out[i].Clusters[1] < out[j].Clusters[1]
	})
	return out
}

func pairKey(a, b string) [2]string {
	if b < a {
		a, b = b, a
	}
	return [2]string{a, b}
}

func linkEnd(nr *apiv1.NodeLinkReports, l *apiv1.LinkReport, now time.Time, staleAfter time.Duration) LinkEnd {
	e := LinkEnd{Cluster: nr.GetCluster(), Node: nr.GetNode(), State: l.GetState(), Driver: l.GetDriver(), Policy: l.GetPolicy(),
		AgentVersion: nr.GetAgentVersion(), Remote: l.GetRemoteCluster(), Alive: l.GetAlive(), Message: l.GetMessage(),
		RxBytes: l.GetRxBytes(), TxBytes: l.GetTxBytes(), MTU: int(l.GetMtu())}
	e.ReportedAt = l.GetReportedAt().AsTime()
	if l.ReportedAt == nil {
		e.ReportedAt = nr.GetReportedAt().AsTime()
	}
	e.Stale = staleAfter > 0 && now.Sub(e.ReportedAt) > staleAfter
	if l.GetHasLatency() {
		p50, p95, p99 := l.GetLatencyP50Ms(), l.GetLatencyP95Ms(), l.GetLatencyP99Ms()
		e.LatencyP50Ms, e.LatencyP95Ms, e.LatencyP99Ms = &p50, &p95, &p99
	}
	if l.LastHandshake != nil {
		t := l.LastHandshake.AsTime()
		e.LastHandshake = &t
	}
	return e
}

// judgePair sorts p's ends and decides Agree, Stale, Alive and Age. A pair one cluster does not
// report (an agent too old to report, or no gateway that links it) does not agree: nothing
// confirms that end.
func judgePair(p *LinkPair, now time.Time) {
	slices.SortFunc(p.Ends, func(a, b LinkEnd) int {
		if c := strings.Compare(a.Cluster, b.Cluster); c != 0 {
			return c
		}
		return strings.Compare(a.Node, b.Node)
	})
	sides := map[string]bool{}
	p.Agree, p.Alive = true, true
	oldest := now
	for i, e := range p.Ends {
		sides[e.Cluster] = true
		if e.State != p.Ends[0].State || e.Driver != p.Ends[0].Driver {
			p.Agree = false
		}
		p.Stale = p.Stale || e.Stale
		p.Alive = p.Alive && e.Alive && !e.Stale
		if i == 0 || e.ReportedAt.Before(oldest) {
			oldest = e.ReportedAt
		}
	}
	both := sides[p.Clusters[0]] && sides[p.Clusters[1]]
	p.Agree = p.Agree && both
	p.Alive = p.Alive && both
	p.Age = max(now.Sub(oldest), 0)
}

// printLinksAll writes the pairs as a table (one row per pair) or as LinksAll in JSON or YAML.
func printLinksAll(w io.Writer, format string, all LinksAll) error {
	if format != "table" {
		return printData(w, format, all)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER_A\tCLUSTER_B\tSTATE_A\tSTATE_B\tDRIVER_A\tDRIVER_B\tP50/P99_A\tP50/P99_B\tALIVE\tAGE\tMARK")
	for _, p := range all.Items {
		a, b := sideEnds(p, p.Clusters[0]), sideEnds(p, p.Clusters[1])
		alive := "False"
		if p.Alive {
			alive = "True"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", p.Clusters[0], p.Clusters[1],
			endsField(a, func(e LinkEnd) string { return e.State }), endsField(b, func(e LinkEnd) string { return e.State }),
			endsField(a, func(e LinkEnd) string { return e.Driver }), endsField(b, func(e LinkEnd) string { return e.Driver }),
			endsField(a, latencyCell), endsField(b, latencyCell), alive, reportAge(p.Age), pairMark(p))
	}
	return tw.Flush()
}

// sideEnds are p's ends of one cluster.
func sideEnds(p LinkPair, cluster string) []LinkEnd {
	var out []LinkEnd
	for _, e := range p.Ends {
		if e.Cluster == cluster {
			out = append(out, e)
		}
	}
	return out
}

// endsField is f of each end, joined with commas (a cluster may have several gateways); "-"
// when the cluster sent no report of the link.
func endsField(ends []LinkEnd, f func(LinkEnd) string) string {
	if len(ends) == 0 {
		return "-"
	}
	vals := make([]string, len(ends))
	for i, e := range ends {
		vals[i] = f(e)
		if vals[i] == "" {
			vals[i] = "-"
		}
	}
	return strings.Join(vals, ",")
}

func latencyCell(e LinkEnd) string {
	if e.LatencyP50Ms == nil {
		return "-"
	}
	return msOrDash(e.LatencyP50Ms) + "/" + msOrDash(e.LatencyP99Ms)
}

// pairMark flags what an operator should look at: ends that disagree, or a stale report.
func pairMark(p LinkPair) string {
	var marks []string
	if !p.Agree {
		marks = append(marks, "DISAGREE")
	}
	if p.Stale {
		marks = append(marks, "STALE")
	}
	return strings.Join(marks, ",")
}

// reportAge is d rounded for a table: seconds under two minutes, then minutes, then hours.
func reportAge(d time.Duration) string {
	switch {
	case d < 2*time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < 2*time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	default:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
}
