// Package routes is what a non-gateway node does: it routes every remote cluster's CIDRs via its
// own cluster's gateway (the gateway then carries them over the cable). The planner is pure; the
// applier uses netlink and marks every route it owns with Protocol so cleanup finds exactly ours.
package routes

import (
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"

	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/policy"
)

// Protocol marks the agent's routes (rtnetlink protocol number; 157 is unassigned in
// /etc/iproute2/rt_protos).
const Protocol netlink.RouteProtocol = 157

// Route is one wanted route: Dst via Gw.
type Route struct {
	Dst netip.Prefix
	Gw  netip.Addr
}

// Desired routes every remote cluster's subnets (those of clusters the policies connect to this
// one and that have a usable gateway, as reconcile.Desired decides; res nil means the resolver
// built from st) via the local cluster's gateway: its endpoint with the smallest node name. With
// no local gateway there is nothing to route via, so nothing is wanted.
func Desired(st *brokerstate.State, local string, res *policy.Resolver) []Route {
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
	remotes, _, _ := reconcile.Desired(st, local, res, nil)
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

// Plan returns the routes to replace (missing or different gateway) and the owned routes to
// delete (not wanted any more). Unchanged routes are left alone.
func Plan(desired, observed []Route) (replace, remove []Route) {
	have := map[netip.Prefix]netip.Addr{}
	for _, o := range observed {
		have[o.Dst] = o.Gw
	}
	want := map[netip.Prefix]bool{}
	for _, d := range desired {
		want[d.Dst] = true
		if gw, ok := have[d.Dst]; !ok || gw != d.Gw {
			replace = append(replace, d)
		}
	}
	for _, o := range observed {
		if !want[o.Dst] {
			remove = append(remove, o)
		}
	}
	return replace, remove
}

// Apply reconciles the main routing table's routes with Protocol against desired.
func Apply(desired []Route, log *slog.Logger) error {
	list, err := netlink.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: Protocol}, netlink.RT_FILTER_PROTOCOL)
	if err != nil {
		return fmt.Errorf("list routes with protocol %d: %w", Protocol, err)
	}
	var observed []Route
	for _, r := range list {
		if r.Dst == nil {
			continue
		}
		dst, ok := prefixOf(r.Dst)
		gw, ok2 := netip.AddrFromSlice(r.Gw)
		if ok && ok2 {
			observed = append(observed, Route{Dst: dst, Gw: gw.Unmap()})
		}
	}
	replace, remove := Plan(desired, observed)
	for _, r := range remove {
		if err := netlink.RouteDel(toNetlink(r)); err != nil {
			return fmt.Errorf("delete route %s via %s: %w", r.Dst, r.Gw, err)
		}
		log.Info("route removed", "dst", r.Dst.String(), "via", r.Gw.String())
	}
	for _, r := range replace {
		if err := netlink.RouteReplace(toNetlink(r)); err != nil {
			return fmt.Errorf("replace route %s via %s: %w", r.Dst, r.Gw, err)
		}
		log.Info("route set", "dst", r.Dst.String(), "via", r.Gw.String())
	}
	return nil
}

func toNetlink(r Route) *netlink.Route {
	return &netlink.Route{
		Dst:      &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), r.Dst.Addr().BitLen())},
		Gw:       r.Gw.AsSlice(),
		Protocol: Protocol,
	}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones).Masked(), true
}
