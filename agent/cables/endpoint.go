package cables

import (
	"net"
	"net/netip"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/health"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// EndpointInputs are what a gateway's endpoint record is made of besides its running drivers.
type EndpointInputs struct {
	Cluster, Node     string
	Private, Public   string         // the config's addresses, or the Node's on Kubernetes
	Subnets, PodCIDRs []netip.Prefix // the cluster's routed subnets, and its pod CIDRs
	Addrs             []netip.Addr   // this node's interface addresses
}

// Endpoint is this gateway's record for the broker. Only the drivers that run are published:
// the node does not claim a cable it cannot carry.
func (c *Cables) Endpoint(in EndpointInputs) *apiv1.Endpoint {
	ep := &apiv1.Endpoint{Cluster: in.Cluster, Node: in.Node, PrivateIp: in.Private, PublicIp: in.Public}
	for _, p := range in.Subnets {
		ep.Subnets = append(ep.Subnets, p.String())
	}
	for _, d := range c.Running() {
		le := d.LocalEndpoint()
		ep.Drivers = append(ep.Drivers, d.Name())
		if ep.CablePorts == nil {
			ep.CablePorts = map[string]uint32{}
		}
		ep.CablePorts[d.Name()] = uint32(le.Port)
		ep.SetAttributes(d.Name(), le.Attributes)
	}
	ip := HealthCheckIP(in.PodCIDRs, in.Addrs)
	if ip.IsValid() {
		ep.HealthCheckIp = ip.String()
	}
	c.mu.Lock()
	c.publishedHealthIP = ip
	c.mu.Unlock()
	return ep
}

// HealthCheckIP is the first of this node's addresses inside its pod CIDRs: the address remote
// gateways probe.
func HealthCheckIP(pods []netip.Prefix, addrs []netip.Addr) netip.Addr {
	for _, a := range addrs {
		for _, p := range pods {
			if p.Contains(a) {
				return a
			}
		}
	}
	return netip.Addr{}
}

// InterfaceAddrs are the addresses of every interface of this network namespace.
func InterfaceAddrs() []netip.Addr {
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

// HealthSettings are h's probe settings (defaults already applied by config).
func HealthSettings(h config.HealthCheck) health.Settings {
	return health.Settings{Period: h.Period, Timeout: h.Timeout, FailureThreshold: h.FailureThreshold, Window: h.Window}.WithDefaults()
}
