package servicedp

import (
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/services"
)

// PlannedPairs is what the plan says of every remote cluster with a live gateway endpoint, for
// services.Reachability: the decision, the node chosen and the problem. A gateway adds what its
// devices and probes say (Deps.Pairs).
func PlannedPairs(p *plan.Plan) map[string]services.Pair {
	wants, problems, decisions := p.Wants, p.Problems, p.Decisions
	out := map[string]services.Pair{}
	for _, dec := range decisions {
		out[dec.Cluster] = services.Pair{Connect: dec.Connect, Policy: dec.Policy, GatewayMode: dec.Mode == reconcile.ModeGateway}
	}
	for _, w := range wants {
		pr := out[w.Remote.Cluster]
		pr.RemoteNode = w.Remote.Node
		out[w.Remote.Cluster] = pr
	}
	for _, prob := range problems {
		if prob.Cluster == "" || prob.Partial {
			continue // a subnet left out: the pair is connected all the same
		}
		pr := out[prob.Cluster]
		pr.Problem = prob.Message
		out[prob.Cluster] = pr
	}
	return out
}
