// Package route holds what every cable driver, and the agent on a non-gateway node, does with the
// routes to remote clusters: deciding which routes are wanted (one per remote subnet, with a
// source address of this node inside its own subnets, the tunnel MTU and the TCP MSS clamp),
// comparing them with the routes of ours the kernel holds, and applying the difference. Every
// route carries Protocol, so cleanup and pruning find exactly ours and nothing else.
//
// The planning half (Spec, Plan, PlanRoutes, Wanted, PickSource) is pure and table-tested; the
// rest (List, Apply, Sources, FindUnderlay) talks to the kernel through netlink in the calling
// process's network namespace.
package route

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"

	"github.com/cablemesh/cablemesh/internal/nldump"
	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/cable"
)

// Protocol marks every route Cablemesh installs (rtnetlink protocol number; 157 is unassigned
// in /etc/iproute2/rt_protos), so cleanup and pruning find exactly ours. `ip route show proto
// 157` lists them.
const Protocol netlink.RouteProtocol = 157

// TCPIPv4HeaderBytes is what an IPv4 + TCP header without options takes: the advertised MSS of a
// route is its MTU minus this.
const TCPIPv4HeaderBytes = 40

// Link is the link routes go over. The zero Link is none: List then lists our routes on every
// link, and Apply installs routes via a gateway and lets the kernel pick the link.
type Link struct {
	Index int
	Name  string
}

func (l Link) String() string {
	if l.Index == 0 {
		return "any link"
	}
	return "dev " + l.Name
}

// Spec is one route of ours as far as we care about it. On a link, routes without a gateway are
// scope-link routes over a point-to-point device (wireguard) and routes with one are onlink
// routes via the remote's tunnel address (vxlan), so the gateway needs no connected route of its
// own. Without a link (the agent's routes on a non-gateway node) a route goes via its gateway.
type Spec struct {
	Dst netip.Prefix
	Gw  netip.Addr // invalid when none
	Src netip.Addr // invalid when none
	MTU int
	// AdvMSS is the TCP MSS advertised for connections over the route (0: the kernel derives it
	// from the MTU). Setting it clamps the MSS of connections this node terminates.
	AdvMSS int
}

// String is the route as `ip route` would take it (without the link).
func (r Spec) String() string {
	var b strings.Builder
	b.WriteString(r.Dst.String())
	if r.Gw.IsValid() {
		fmt.Fprintf(&b, " via %s", r.Gw)
	}
	if r.Src.IsValid() {
		fmt.Fprintf(&b, " src %s", r.Src)
	}
	if r.MTU != 0 {
		fmt.Fprintf(&b, " mtu %d", r.MTU)
	}
	if r.AdvMSS != 0 {
		fmt.Fprintf(&b, " advmss %d", r.AdvMSS)
	}
	return b.String()
}

// Plan is the difference between the routes we have and those we want.
type Plan struct {
	Replace []Spec
	Delete  []Spec
}

// Empty reports whether the plan changes nothing.
func (p Plan) Empty() bool { return len(p.Replace) == 0 && len(p.Delete) == 0 }

// PlanRoutes compares existing (our routes on the link) with want. Only routes whose destination
// is owned are deleted when unwanted: owned is the set of subnets the caller is responsible for
// (one cluster's old and new subnets for Connect; every subnet for a full prune, see All).
func PlanRoutes(existing, want []Spec, owned func(netip.Prefix) bool) Plan {
	var plan Plan
	have := map[netip.Prefix]Spec{}
	for _, r := range existing {
		have[r.Dst] = r
	}
	wanted := map[netip.Prefix]bool{}
	for _, w := range want {
		wanted[w.Dst] = true
		if h, ok := have[w.Dst]; !ok || h != w {
			plan.Replace = append(plan.Replace, w)
		}
	}
	for _, r := range existing {
		if !wanted[r.Dst] && owned(r.Dst) {
			plan.Delete = append(plan.Delete, r)
		}
	}
	slices.SortFunc(plan.Replace, func(a, b Spec) int { return cable.ComparePrefix(a.Dst, b.Dst) })
	slices.SortFunc(plan.Delete, func(a, b Spec) int { return cable.ComparePrefix(a.Dst, b.Dst) })
	return plan
}

// All owns every destination: PlanRoutes with it prunes whatever is not wanted.
func All(netip.Prefix) bool { return true }

// Wanted gives one route per subnet with the source address of this node that suits the
// subnet's family, the MTU, and no gateway nor MSS clamp; callers that need those set them.
func Wanted(subnets []netip.Prefix, mtu int, src4, src6 netip.Addr) []Spec {
	out := make([]Spec, 0, len(subnets))
	for _, s := range subnets {
		src := src6
		if s.Addr().Is4() {
			src = src4
		}
		out = append(out, Spec{Dst: s, Src: src, MTU: mtu})
	}
	return out
}

// PickSource returns the first of addrs (in the given order) inside one of local, of the wanted
// family: an address of this node inside its own pod subnets, so that traffic the gateway itself
// originates carries a source the remote end accepts and routes back.
func PickSource(addrs []netip.Addr, local []netip.Prefix, v4 bool) netip.Addr {
	for _, a := range addrs {
		a = a.Unmap()
		if a.Is4() != v4 || a.IsLoopback() || a.IsLinkLocalUnicast() {
			continue
		}
		for _, p := range local {
			if p.Contains(a) {
				return a
			}
		}
	}
	return netip.Addr{}
}

// PrefixFromIPNet converts what netlink reports, unmapping IPv4 and masking.
func PrefixFromIPNet(n net.IPNet) (netip.Prefix, error) {
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, fmt.Errorf("bad IP %v", n.IP)
	}
	ones, bits := n.Mask.Size()
	a = a.Unmap()
	if bits == 128 && a.Is4() {
		ones -= 96
	}
	return netip.PrefixFrom(a, ones).Masked(), nil
}

// IPNetFromPrefix is the netlink form of p.
func IPNetFromPrefix(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// List returns the routes with Protocol in the main table on link (on every link for the zero
// Link).
func List(link Link) ([]Spec, error) {
	filter, mask := &netlink.Route{Protocol: Protocol}, uint64(netlink.RT_FILTER_PROTOCOL)
	if link.Index != 0 {
		filter.LinkIndex, mask = link.Index, mask|netlink.RT_FILTER_OIF
	}
	rs, err := nldump.Retry(func() ([]netlink.Route, error) { return netlink.RouteListFiltered(netlink.FAMILY_ALL, filter, mask) })
	if err != nil {
		return nil, fmt.Errorf("list routes with protocol %d on %s: %w", Protocol, link, err)
	}
	out := make([]Spec, 0, len(rs))
	for _, r := range rs {
		if r.Dst == nil {
			continue
		}
		dst, err := PrefixFromIPNet(*r.Dst)
		if err != nil {
			continue
		}
		spec := Spec{Dst: dst, MTU: r.MTU, AdvMSS: r.AdvMSS}
		if src, ok := netip.AddrFromSlice(r.Src); ok {
			spec.Src = src.Unmap()
		}
		if gw, ok := netip.AddrFromSlice(r.Gw); ok {
			spec.Gw = gw.Unmap()
		}
		out = append(out, spec)
	}
	return out, nil
}

// Apply deletes then replaces the routes of plan on link, logging each change and calling
// changed (when not nil) once per route touched: the drivers count them to prove idempotence.
// A route already gone is no error.
func Apply(log *slog.Logger, link Link, plan Plan, changed func()) error {
	if changed == nil {
		changed = func() {}
	}
	for _, r := range plan.Delete {
		if err := netlink.RouteDel(netlinkRoute(link, r)); err != nil && !IsNotFound(err) {
			return fmt.Errorf("delete route %s %s: %w", r, link, err)
		}
		changed()
		log.Info("route deleted", "route", r.String())
	}
	for _, r := range plan.Replace {
		if err := netlink.RouteReplace(netlinkRoute(link, r)); err != nil {
			return fmt.Errorf("replace route %s %s: %w", r, link, err)
		}
		changed()
		log.Info("route replaced", "route", r.String())
	}
	return nil
}

func netlinkRoute(link Link, r Spec) *netlink.Route {
	dst := IPNetFromPrefix(r.Dst)
	nr := &netlink.Route{
		LinkIndex: link.Index,
		Dst:       &dst,
		Protocol:  Protocol,
		Scope:     netlink.SCOPE_LINK,
		MTU:       r.MTU,
		AdvMSS:    r.AdvMSS,
	}
	if r.Gw.IsValid() {
		nr.Gw = r.Gw.AsSlice()
		nr.Scope = netlink.SCOPE_UNIVERSE
		if link.Index != 0 {
			// onlink: the gateway is the remote's tunnel address, reachable on the link without
			// a connected route (several tunnel links may hold the same tunnel prefix).
			nr.Flags = int(netlink.FLAG_ONLINK)
		}
	}
	if r.Src.IsValid() {
		nr.Src = r.Src.AsSlice()
	}
	return nr
}

// IsNotFound reports the errors netlink gives when deleting something that is not there.
func IsNotFound(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) || errors.Is(err, syscall.ENOENT)
}

// Sources picks this node's addresses inside local, per family, as route sources. Invalid
// addresses mean none (no local subnet, or no address of this node inside one).
func Sources(local []netip.Prefix) (v4, v6 netip.Addr, err error) {
	if len(local) == 0 {
		return netip.Addr{}, netip.Addr{}, nil
	}
	list, err := nldump.Retry(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_ALL) })
	if err != nil {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("list addresses for the route source: %w", err)
	}
	addrs := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			addrs = append(addrs, ip.Unmap())
		}
	}
	return PickSource(addrs, local, true), PickSource(addrs, local, false), nil
}
