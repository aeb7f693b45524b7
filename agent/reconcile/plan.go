// Package reconcile turns the broker's state into cable connections. The planner (Desired, Plan)
// is pure: it reads broker records and what the driver observed, and returns actions. The
// applier (Reconciler) is the thin part that calls the driver.
package reconcile

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
)

// DefaultDriver is the driver of the mesh's default policy (full mesh over WireGuard) until
// policies arrive in a later issue.
const DefaultDriver = "wireguard"

// Problem is a remote cluster the planner had to skip or trim, with the reason (logged, shown in
// status).
type Problem struct {
	Cluster string
	Message string
}

// Desired returns, for every cluster other than local that has at least one usable endpoint,
// the one connection this node should have to it over driver, sorted by cluster name.
//
// The endpoint is chosen deterministically: the lexically smallest node name among the cluster's
// endpoints that publish what the driver needs (a port, and for wireguard a public key), so every
// remote agent and every restart picks the same one. The connection carries the cluster's pod and
// service CIDRs (or, if the cluster record has none, the endpoint's subnets).
func Desired(st *brokerstate.State, local, driver string) ([]cable.RemoteEndpoint, []Problem) {
	if st == nil {
		return nil, nil
	}
	byCluster := map[string][]*apiv1.Endpoint{}
	for _, e := range st.Endpoints {
		byCluster[e.GetCluster()] = append(byCluster[e.GetCluster()], e)
	}
	var out []cable.RemoteEndpoint
	var problems []Problem
	for _, name := range st.ClusterNames() {
		if name == local {
			continue
		}
		c := st.Clusters[name]
		eps := byCluster[name]
		if len(eps) == 0 {
			continue
		}
		sort.Slice(eps, func(i, j int) bool { return eps[i].GetNode() < eps[j].GetNode() })
		var chosen *apiv1.Endpoint
		var addr netip.Addr
		var port uint16
		var skipped []string
		for _, e := range eps {
			a, p, why := usable(e, driver)
			if why != "" {
				skipped = append(skipped, e.GetNode()+": "+why)
				continue
			}
			chosen, addr, port = e, a, p
			break
		}
		if chosen == nil {
			problems = append(problems, Problem{Cluster: name, Message: fmt.Sprintf("no usable %s endpoint (%v)", driver, skipped)})
			continue
		}
		cidrs := append(slices.Clone(c.GetPodCidrs()), c.GetServiceCidrs()...)
		if len(cidrs) == 0 {
			cidrs = chosen.GetSubnets()
		}
		subnets, bad := parsePrefixes(cidrs)
		for _, b := range bad {
			problems = append(problems, Problem{Cluster: name, Message: fmt.Sprintf("ignoring subnet %q: not a CIDR", b)})
		}
		out = append(out, cable.RemoteEndpoint{
			Cluster:   name,
			ClusterID: c.GetId(),
			Node:      chosen.GetNode(),
			Address:   addr,
			Port:      port,
			PublicKey: chosen.GetWireguardPublicKey(),
			Subnets:   subnets,
		})
	}
	return out, problems
}

// usable says whether e can carry a connection over driver, and where to.
func usable(e *apiv1.Endpoint, driver string) (netip.Addr, uint16, string) {
	ipStr := e.GetPrivateIp()
	if ipStr == "" {
		ipStr = e.GetPublicIp()
	}
	a, err := netip.ParseAddr(ipStr)
	if err != nil {
		return netip.Addr{}, 0, fmt.Sprintf("address %q is not an IP", ipStr)
	}
	if len(e.GetDrivers()) > 0 && !slices.Contains(e.GetDrivers(), driver) {
		return netip.Addr{}, 0, "does not run " + driver
	}
	p := e.GetCablePorts()[driver]
	if p == 0 || p > 65535 {
		return netip.Addr{}, 0, "publishes no " + driver + " port"
	}
	if driver == "wireguard" && e.GetWireguardPublicKey() == "" {
		return netip.Addr{}, 0, "publishes no wireguard key"
	}
	return a, uint16(p), ""
}

func parsePrefixes(cidrs []string) (good []netip.Prefix, bad []string) {
	for _, s := range cidrs {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			bad = append(bad, s)
			continue
		}
		good = append(good, p.Masked())
	}
	return good, bad
}

// ActionKind is what an action does.
type ActionKind string

const (
	Connect    ActionKind = "connect"
	Disconnect ActionKind = "disconnect"
)

// Action is one change to make through the driver.
type Action struct {
	Kind    ActionKind
	Cluster string
	Remote  cable.RemoteEndpoint // for Connect
	Reason  string
}

// Plan diffs desired connections against what the driver observed on the host and what this
// process last applied. It returns the actions in a stable order: disconnects first (freeing
// routes a new connection may need), then connects, each sorted by cluster.
//
// A desired connection is (re)connected when the device does not have it, when the device has
// it to another endpoint or with other subnets, when the device reports it in error (Connect is
// idempotent, so this repairs), or when it differs from what this process last applied (which
// catches a changed public key the device cannot show). applied is empty after a restart, so the
// first pass re-asserts every connection through the driver's idempotent Connect: no flap.
// A connection on the device that is not desired is disconnected. Nothing else is touched, so
// with unchanged inputs Plan returns no actions.
func Plan(desired []cable.RemoteEndpoint, observed []cable.ConnectionStatus, applied map[string]cable.RemoteEndpoint) []Action {
	want := map[string]cable.RemoteEndpoint{}
	for _, d := range desired {
		want[d.Cluster] = d
	}
	have := map[string]cable.ConnectionStatus{}
	for _, o := range observed {
		have[o.Cluster] = o
	}
	var disc, conn []Action
	for name := range have {
		if _, ok := want[name]; !ok {
			disc = append(disc, Action{Kind: Disconnect, Cluster: name, Reason: "cluster no longer has a usable endpoint"})
		}
	}
	for name, d := range want {
		o, onDevice := have[name]
		prev, wasApplied := applied[name]
		var reason string
		switch {
		case !onDevice:
			reason = "not on the device"
		case o.Endpoint != "" && o.Endpoint != EndpointString(d):
			reason = fmt.Sprintf("device has endpoint %s, want %s", o.Endpoint, EndpointString(d))
		case o.Subnets != nil && !samePrefixes(o.Subnets, d.Subnets):
			reason = fmt.Sprintf("device has subnets %v, want %v", o.Subnets, d.Subnets)
		case o.State == cable.StateError:
			reason = "device reports error: " + o.Message
		case !wasApplied:
			reason = "not applied by this process yet"
		case !Equal(prev, d):
			reason = "endpoint record changed"
		default:
			continue
		}
		conn = append(conn, Action{Kind: Connect, Cluster: name, Remote: d, Reason: reason})
	}
	sort.Slice(disc, func(i, j int) bool { return disc[i].Cluster < disc[j].Cluster })
	sort.Slice(conn, func(i, j int) bool { return conn[i].Cluster < conn[j].Cluster })
	return append(disc, conn...)
}

// EndpointString is the remote address:port as drivers report it in ConnectionStatus.Endpoint.
func EndpointString(r cable.RemoteEndpoint) string {
	if !r.Address.IsValid() {
		return ""
	}
	return netip.AddrPortFrom(r.Address, r.Port).String()
}

// Equal compares two remote endpoints field by field, subnets as sets.
func Equal(a, b cable.RemoteEndpoint) bool {
	return a.Cluster == b.Cluster && a.ClusterID == b.ClusterID && a.Node == b.Node && a.Address == b.Address &&
		a.Port == b.Port && a.PublicKey == b.PublicKey && samePrefixes(a.Subnets, b.Subnets)
}

func samePrefixes(a, b []netip.Prefix) bool {
	if len(a) != len(b) {
		return false
	}
	x := slices.Clone(a)
	y := slices.Clone(b)
	cmp := func(p, q netip.Prefix) int {
		if c := p.Addr().Compare(q.Addr()); c != 0 {
			return c
		}
		return p.Bits() - q.Bits()
	}
	slices.SortFunc(x, cmp)
	slices.SortFunc(y, cmp)
	return slices.Equal(x, y)
}
