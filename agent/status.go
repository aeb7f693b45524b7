package agent

import (
	"context"
	"net/http"

	"github.com/cablemesh/cablemesh/agent/cables"
	"github.com/cablemesh/cablemesh/agent/preflight"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/internal/version"
)

// Status builds the status document from what each component contributes; a gateway's
// connection rows come from the cables (cables.Cables.Status).
func (a *Agent) Status(ctx context.Context) statusapi.Status {
	p := a.plan()
	st := p.State
	out := statusapi.Status{Cluster: a.cfg.Cluster, Node: a.cfg.Node, Gateway: a.cfg.Gateway, Version: version.String(),
		Connections: []statusapi.Connection{}}
	if c := st.Clusters[a.cfg.Cluster]; c != nil {
		out.ClusterID = c.GetId()
	} else if c := a.link.LocalCluster(); c != nil {
		out.ClusterID = c.GetId()
	}
	out.Problems = append(out.Problems, a.link.Status(&out.Broker)...)
	out.Problems = append(out.Problems, a.clusterPolicies.Problems()...)
	if p := preflight.TokenFileProblem(a.liveConfig().JoinTokenFile); p != "" {
		out.Problems = append(out.Problems, statusapi.Problem{Message: p})
	}
	out.Config = a.reload.Status()
	out.Problems = append(out.Problems, a.reload.Problems()...)
	out.Services = a.servicesStatus()
	a.ingress.Status(&out)
	if !a.cfg.Gateway {
		// The routes via the gateway leave out what the guard refuses too.
		out.Problems = append(out.Problems, cables.StatusProblems(p.Problems)...)
		out.Worker = a.worker.Status(p)
		return out
	}
	a.cables.Status(ctx, p, &out, a.liveConfig().CableDrivers, a.datapath().Traffic())
	return out
}

// serveStatus serves the status document, the services section and the runtime exports API on
// the status socket (statusapi.Serve).
func (a *Agent) serveStatus(ctx context.Context) (stop func(), err error) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+statusapi.Path, func(w http.ResponseWriter, r *http.Request) {
		statusapi.WriteJSON(w, http.StatusOK, a.Status(r.Context()))
	})
	mux.HandleFunc("GET "+statusapi.ServicesPath, func(w http.ResponseWriter, r *http.Request) {
		statusapi.WriteJSON(w, http.StatusOK, a.servicesStatus())
	})
	a.exports.Routes(mux)
	return statusapi.Serve(ctx, a.cfg.StatusSocket, mux, a.log)
}
