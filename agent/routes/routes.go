// Package routes is what a non-gateway node does: it routes every remote cluster's CIDRs via its
// own cluster's gateway (the gateway then carries them over the cable). Desired is the pure
// decision from the broker's state; Apply hands it to cable/route, which plans and applies the
// kernel routes for the drivers too and marks every route with route.Protocol, so cleanup finds
// exactly ours.
package routes

import (
	"log/slog"
	"net/netip"
	"sort"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/cable/route"
	"github.com/cablemesh/cablemesh/policy"
)

// Route is one wanted route: Dst via Gw.
type Route struct {
	Dst netip.Prefix
	Gw  netip.Addr
}

// Desired routes every remote cluster's subnets (those of clusters the policies connect to this
// one and that have a usable gateway, as reconcile.Desired decides; res nil means the resolver
// built from st) via the local cluster's gateway: its endpoint with the smallest node name. With
// no local gateway there is nothing to route via, so nothing is wanted. No subnet guard refuses
// is routed (reconcile.Guard: the broker's addresses, the gateways', this node's underlay).
func Desired(st *brokerstate.State, local string, res *policy.Resolver, guard reconcile.Guard) []Route {
	if st == nil {
		return nil
	}
	var gwNode string
	var gw netip.Addr
	for _, e := range st.Endpoints {
		if e.GetCluster() != local {
			continue
		}
		a, err := netip.ParseAddr(e.GetPrivateIp())
		if err != nil {
			continue
		}
		if gwNode == "" || e.GetNode() < gwNode {
			gwNode, gw = e.GetNode(), a
		}
	}
	if !gw.IsValid() {
		return nil
	}
	// The local gateway's drivers are not checked here: it reports what it cannot carry.
	remotes, _, _ := reconcile.Desired(st, local, res, nil, guard)
	var out []Route
	for _, r := range remotes {
		for _, p := range r.Remote.Subnets {
			if p.Addr().Is4() == gw.Is4() {
				out = append(out, Route{Dst: p, Gw: gw})
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dst.String() < out[j].Dst.String() })
	return out
}

// Apply makes the main routing table hold exactly desired among the agent's routes: the routes
// with route.Protocol that go via a gateway (the drivers' routes over their own links are not
// the agent's to judge). Apply(nil, log) removes them all.
func Apply(desired []Route, log *slog.Logger) error {
	ours, err := route.List(route.Link{})
	if err != nil {
		return err
	}
	var existing []route.Spec
	for _, r := range ours {
		if r.Gw.IsValid() {
			existing = append(existing, r)
		}
	}
	return route.Apply(log, route.Link{}, route.PlanRoutes(existing, specs(desired), route.All), nil)
}

// specs is the kernel form of routes: each via its gateway, on whatever link reaches it.
func specs(routes []Route) []route.Spec {
	out := make([]route.Spec, 0, len(routes))
	for _, r := range routes {
		out = append(out, route.Spec{Dst: r.Dst, Gw: r.Gw})
	}
	return out
}
