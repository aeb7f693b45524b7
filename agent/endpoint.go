package agent

import (
	"net"
	"net/netip"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// endpoint is this gateway's record for the broker.
func (a *Agent) endpoint() *apiv1.Endpoint {
	subnets := a.localSubnets()
	private, public := a.addrs.Endpoint() // the config's, or the Node's on Kubernetes
	ep := &apiv1.Endpoint{
		Cluster:   a.cfg.Cluster,
		Node:      a.cfg.Node,
		PrivateIp: private,
		PublicIp:  public,
	}
	for _, p := range subnets {
		ep.Subnets = append(ep.Subnets, p.String())
	}
	// Only the drivers that run are published: the node does not claim a cable it cannot carry.
	for _, d := range a.cables.Running() {
		le := d.LocalEndpoint()
		ep.Drivers = append(ep.Drivers, d.Name())
		if ep.CablePorts == nil {
			ep.CablePorts = map[string]uint32{}
		}
		ep.CablePorts[d.Name()] = uint32(le.Port)
		ep.SetAttributes(d.Name(), le.Attributes)
	}
	if ip := healthCheckIP(a.localPodCIDRs(), a.opts.InterfaceAddrs()); ip.IsValid() {
		ep.HealthCheckIp = ip.String()
	}
	return ep
}

// healthCheckIP is the first of this node's addresses inside its pod CIDRs.
func healthCheckIP(pods []netip.Prefix, addrs []netip.Addr) netip.Addr {
	for _, a := range addrs {
		for _, p := range pods {
			if p.Contains(a) {
				return a
			}
		}
	}
	return netip.Addr{}
}

func interfaceAddrs() []netip.Addr {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, ifa := range ifas {
		if n, ok := ifa.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a.Unmap())
			}
		}
	}
	return out
}

// importSelector is the imports.selector in force (reload.go swaps the config).
func (a *Agent) importSelector() string { return a.liveConfig().Imports.EffectiveSelector() }
