package routes

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/policy"
)

// Choice is how a non-gateway node routes one remote cluster: via which of its own cluster's
// gateways, and why.
type Choice struct {
	// Cluster is the remote cluster.
	Cluster string
	// Via is the local gateway node the routes go through, Address its private IP ("" and
	// invalid when the cluster is not routed: no local gateway of the right family).
	Via     string
	Address netip.Addr
	// Carriers are the local gateways able to carry the pair, in the order the remote side picks
	// them (the first is the one it connects to while every gateway is in the broker state; the
	// next one takes over when the broker withdraws the first).
	Carriers []string
	// Reason says why Via is not Carriers[0] ("" when it is).
	Reason string
	// Subnets are the routed subnets of the remote cluster.
	Subnets []netip.Prefix
}

// Healthy reports whether local gateway node answers this node's probes. Plan treats a nil
// Healthy, and any gateway it does not know, as healthy.
type Healthy func(node string) bool

// Plan is Desired with failover: every remote cluster is routed via the first local gateway that
// the remote side would connect the pair to (Carriers) and that answers this node's probes.
//
// Why the remote side's order: a remote gateway keeps one connection per cluster, to the
// lexically smallest usable endpoint of that cluster in the broker state (reconcile.DesiredAt)
// that its own probes have not found dead (agent/cables' failover), and only that gateway's
// traffic is accepted at its end (a WireGuard peer has one key). So the only gateway worth
// routing through is the one the remote side connects to; when it stops answering, the next in
// the remote side's order is the one the pair moves to: at once when the remote gateway's probes
// through the tunnel find it dead (the same 0.9-1.2s as this node's probes: both ends move
// together), at the latest when the broker withdraws it (lease expiry). Routing via any other
// gateway would black-hole the traffic for good. A gateway coming back is used again only after
// it has answered for health.DefaultRecoveryHold (healthy is Result.Usable), the hold after
// which the remote gateways move back to it too, so both ends return together.
//
// When no carrier answers the probes, the first carrier stays (a worker cut off from every
// gateway gains nothing from flapping its routes). A pair the remote side cannot carry through
// any local gateway (e.g. a gateway-mode pair whose mesh address is not allocated yet) is routed
// as Desired does: via the local gateway with the smallest node name.
func Plan(st *brokerstate.State, local string, res *policy.Resolver, guard reconcile.Guard, healthy Healthy) ([]Route, []Choice) {
	if st == nil {
		return nil, nil
	}
	if res == nil {
		res, _ = reconcile.Resolver(st)
	}
	if healthy == nil {
		healthy = func(string) bool { return true }
	}
	localEps := endpointsOf(st, local)
	if len(localEps) == 0 {
		return nil, nil
	}
	addrOf := map[string]netip.Addr{}
	for _, e := range localEps {
		if a, err := netip.ParseAddr(e.GetPrivateIp()); err == nil {
			addrOf[e.GetNode()] = a.Unmap()
		}
	}
	// The fallback of Desired: the smallest node name with a parseable private IP.
	var fallback string
	for _, e := range localEps {
		if _, ok := addrOf[e.GetNode()]; ok {
			fallback = e.GetNode()
			break
		}
	}
	if fallback == "" {
		return nil, nil
	}
	remotes, _, _ := reconcile.Desired(st, local, res, nil, guard)
	var out []Route
	var choices []Choice
	for _, r := range remotes {
		c := Choice{Cluster: r.Remote.Cluster, Carriers: Carriers(st, local, r.Remote.Cluster, res)}
		var usable []string
		for _, n := range c.Carriers {
			if _, ok := addrOf[n]; ok {
				usable = append(usable, n)
			}
		}
		switch {
		case len(usable) == 0:
			c.Via = fallback
			c.Reason = "no local gateway is among the remote side's choices; routed via the first local gateway"
		default:
			c.Via = usable[0]
			for _, n := range usable {
				if healthy(n) {
					c.Via = n
					break
				}
			}
			switch {
			case !healthy(c.Via):
				c.Reason = "no local gateway that carries the pair answers this node's probes; keeping " + c.Via
			case len(c.Carriers) > 0 && c.Via != c.Carriers[0]:
				c.Reason = "gateway " + c.Carriers[0] + " does not answer this node's probes (or has not answered for its recovery hold yet); routed via " + c.Via +
					", where the remote gateways move the pair when their own probes find " + c.Carriers[0] + " dead, or at the latest when the broker withdraws it"
				// The lease bounds how long a remote side that cannot probe may keep using it.
				if e := st.Endpoints[brokerstate.EndpointKey(local, c.Carriers[0])]; e.GetLeaseSeconds() > 0 {
					c.Reason += fmt.Sprintf(" (its lease: %ds)", e.GetLeaseSeconds())
				}
			}
		}
		c.Address = addrOf[c.Via]
		for _, p := range r.Remote.Subnets {
			if p.Addr().Is4() == c.Address.Is4() {
				out = append(out, Route{Dst: p, Gw: c.Address})
				c.Subnets = append(c.Subnets, p)
			}
		}
		choices = append(choices, c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Dst.String() < out[j].Dst.String() })
	return out, choices
}

// Carriers lists the gateways of cluster local that remote's agents would connect the pair
// {local, remote} to, in the order they would pick them: the one they pick with every gateway in
// the broker state, then the one they pick once the broker has withdrawn that one, and so on. It
// asks reconcile.DesiredAt from remote's point of view, so the order is exactly the remote side's
// rule (driver, published port, mesh address), never a copy of it. The state is narrowed to the
// two clusters first: the answer depends on nothing else, and each step stays cheap.
func Carriers(st *brokerstate.State, local, remote string, res *policy.Resolver) []string {
	if st == nil || st.Clusters[remote] == nil {
		return nil
	}
	view := &brokerstate.State{
		Revision:  st.Revision,
		Clusters:  map[string]*apiv1.Cluster{remote: st.Clusters[remote]},
		Endpoints: map[string]*apiv1.Endpoint{},
		Policies:  st.Policies,
	}
	if c := st.Clusters[local]; c != nil {
		view.Clusters[local] = c
	} else {
		view.Clusters[local] = &apiv1.Cluster{Name: local}
	}
	for k, e := range st.Endpoints {
		if e.GetCluster() == local || e.GetCluster() == remote {
			view.Endpoints[k] = e
		}
	}
	var order []string
	// Each step removes one local endpoint, so this ends after at most that many steps.
	for range len(view.Endpoints) {
		wants, _, _ := reconcile.DesiredAt(view, remote, "", res, nil, reconcile.Guard{})
		i := slices.IndexFunc(wants, func(w reconcile.Want) bool { return w.Remote.Cluster == local })
		if i < 0 {
			break
		}
		node := wants[i].Remote.Node
		order = append(order, node)
		delete(view.Endpoints, brokerstate.EndpointKey(local, node))
	}
	return order
}

// endpointsOf returns cluster's endpoints sorted by node name.
func endpointsOf(st *brokerstate.State, cluster string) []*apiv1.Endpoint {
	var eps []*apiv1.Endpoint
	for _, e := range st.Endpoints {
		if e.GetCluster() == cluster {
			eps = append(eps, e)
		}
	}
	sort.Slice(eps, func(i, j int) bool { return eps[i].GetNode() < eps[j].GetNode() })
	return eps
}
