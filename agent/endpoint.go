package agent

import (
	"github.com/cablemesh/cablemesh/agent/cables"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// endpoint is this gateway's record for the broker (cables.Cables.Endpoint).
func (a *Agent) endpoint() *apiv1.Endpoint {
	private, public := a.addrs.Endpoint() // the config's, or the Node's on Kubernetes
	return a.cables.Endpoint(cables.EndpointInputs{Cluster: a.cfg.Cluster, Node: a.cfg.Node, Private: private, Public: public,
		Subnets: a.link.LocalSubnets(), PodCIDRs: a.link.LocalPodCIDRs(), Addrs: a.opts.Host.InterfaceAddrs()})
}

// importSelector is the imports.selector in force (reload.go swaps the config).
func (a *Agent) importSelector() string { return a.liveConfig().Imports.EffectiveSelector() }
