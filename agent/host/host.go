// Package host is what the agent reaches on its node besides the broker: the cable drivers,
// the probes' sockets, the node's addresses and routes, eBPF, nftables and the resolver. Each
// hook defaults to the kernel's (WithDefaults, or the component's own default when left nil);
// tests replace them to run an agent without touching the machine.
package host

import (
	"context"
	"log/slog"
	"net/netip"

	"github.com/cablemesh/cablemesh/agent/cables"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/ingress"
	"github.com/cablemesh/cablemesh/agent/ingress/nftables"
	"github.com/cablemesh/cablemesh/agent/routes"
	"github.com/cablemesh/cablemesh/agent/servicedp"
	"github.com/cablemesh/cablemesh/bpf"
)

// Hooks are the agent's ways onto its node.
type Hooks struct {
	// NewDriver builds each of the config's cableDrivers on gateway nodes; default cable.New.
	NewDriver cables.DriverFactory
	// ApplyRoutes applies the routes of a non-gateway node; default routes.Apply.
	ApplyRoutes func([]routes.Route) error
	// NewPinger opens the health probes' sockets; default health.ICMPPinger.
	NewPinger health.NewPinger
	// InterfaceAddrs lists this node's addresses, for its health-check address; default the
	// host's interface addresses.
	InterfaceAddrs func() []netip.Addr
	// MSS installs the TCP MSS clamp on gateways, for the links the running drivers name;
	// default cables.KernelMSS (nftables in this network namespace).
	MSS cables.MSSClamp
	// OpenLB opens the eBPF socket load balancer; default bpf.Open.
	OpenLB func(context.Context, bpf.Options) (servicedp.LoadBalancer, error)
	// OpenCounters opens the per-cluster traffic counters of gateways; default bpf.OpenCounters.
	OpenCounters func(context.Context, bpf.Options) (servicedp.TrafficCounters, error)
	// ListLinks lists the links of the agent's network namespace by name, with their index (for
	// the counters); default netlink.
	ListLinks func() (map[string]int, error)
	// Underlay returns the network of the link that holds an address of this node (its connected
	// prefix), which no cable route may cover; default: from the interface addresses.
	Underlay func(netip.Addr) (netip.Prefix, error)
	// LookupHost resolves the broker's host names (once, at start); default the system resolver.
	LookupHost func(context.Context, string) ([]netip.Addr, error)
	// OpenIngress opens a gateway's ingress data plane (gateway mode); default the kernel's
	// (agent/ingress/nftables, in this network namespace). MeshLink puts the mesh address on
	// cbl-mesh0; default agent/ingress's.
	OpenIngress func(*slog.Logger) (ingress.Dataplane, error)
	MeshLink    ingress.MeshLink
}

// WithDefaults fills the hooks the agent itself calls; the others stay nil, and the component
// that takes them uses its own default.
func (h Hooks) WithDefaults() Hooks {
	if h.NewPinger == nil {
		h.NewPinger = health.ICMPPinger
	}
	if h.InterfaceAddrs == nil {
		h.InterfaceAddrs = cables.InterfaceAddrs
	}
	if h.OpenIngress == nil {
		h.OpenIngress = nftables.Open
	}
	return h
}
