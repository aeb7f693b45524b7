package cablectl

import (
	"context"
	"errors"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cablectl/dashboard"
)

// dashboardLinks reads the broker's link reports for the dashboard, as `cablectl links --all`
// does (FetchLinksAll). A broker that predates link reports gives none: the dashboard then
// judges the pairs from the policies and the gateways alone.
func dashboardLinks(client apiv1.AdminClient) dashboard.LinksSource {
	return func(ctx context.Context) ([]dashboard.Link, error) {
		all, err := FetchLinksAll(ctx, client)
		if errors.Is(err, ErrLinkReportsUnsupported) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		return dashboardLinkItems(all.Items), nil
	}
}

// dashboardLinkItems converts links --all's items to the dashboard's (the same JSON), keeping
// each end's staleness, which the dashboard judges the pair by.
func dashboardLinkItems(items []LinkPair) []dashboard.Link {
	out := make([]dashboard.Link, 0, len(items))
	for _, p := range items {
		l := dashboard.Link{Clusters: p.Clusters, Agree: p.Agree, Stale: p.Stale, Ends: make([]dashboard.LinkEnd, 0, len(p.Ends))}
		for _, e := range p.Ends {
			at := e.ReportedAt
			l.Ends = append(l.Ends, dashboard.LinkEnd{Cluster: e.Cluster, Node: e.Node, State: e.State, Driver: e.Driver, Policy: e.Policy,
				LatencyP50Ms: e.LatencyP50Ms, LatencyP95Ms: e.LatencyP95Ms, LatencyP99Ms: e.LatencyP99Ms,
				LastHandshake: e.LastHandshake, ReportedAt: &at, AgentVersion: e.AgentVersion, Stale: e.Stale})
		}
		out = append(out, l)
	}
	return out
}
