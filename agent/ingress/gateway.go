package ingress

import (
	"context"
	"crypto/x509"
	"log/slog"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
)

// Deps are what a gateway's ingress takes from the rest of the agent.
type Deps struct {
	Log *slog.Logger
	// Exports is the node's export set (the services the ingress serves); Plan the plan in force
	// (the gateway-mode pairs, this node's mesh address).
	Exports func() []*apiv1.ServiceExport
	Plan    func() *plan.Plan
	// OpenDataplane opens the gateway-mode data plane; MeshLink puts the mesh address on
	// cbl-mesh0 (default the kernel's).
	OpenDataplane func(*slog.Logger) (Dataplane, error)
	MeshLink      MeshLink
	// CleanupOnExit removes the table and cbl-mesh0 when the gateway stops.
	CleanupOnExit bool
	// CleanupDecision, when set, is asked as the gateway stops whether to remove them all the
	// same (the agent's uninstall check); CleanupOnExit true needs no question.
	CleanupDecision func() bool
	// CABundle is the broker's last CA bundle (renewal timing of the ingress certificate); CAs the
	// mesh CAs an answer must chain to.
	CABundle func() *apiv1.CABundle
	CAs      func() *x509.CertPool
	Backoff  func() *retry.Backoff
	// OnRegistered is called when the registration gave this node another mesh address (the plan
	// changes).
	OnRegistered func()
}

// Gateway is a gateway's ingress: the ports it allocates to exported service ports, the xDS
// server that hands Envoy its configuration and certificate, the ingress certificate's renewal,
// and, in gateway mode, the mesh address on cbl-mesh0 and the nftables data plane.
//
// Locks: ingress.mu and mesh.mu each guard their struct; they are never held together, and no
// other lock is taken under them.
type Gateway struct {
	cfg     config.Static // a reload refuses to change ingress and gateway
	deps    Deps
	log     *slog.Logger
	ingress ingressState
	mesh    meshState
}

// New returns the ingress of cfg.
func New(cfg config.Static, deps Deps) *Gateway {
	if deps.MeshLink == nil {
		deps.MeshLink = kernelMeshLink{}
	}
	return &Gateway{cfg: cfg, deps: deps, log: deps.Log}
}

// Changed asks the xDS snapshot and the data plane to follow a change (exports, plan).
func (g *Gateway) Changed() {
	g.triggerIngress()
	g.triggerMesh()
}

// Start starts the xDS server and the mesh data plane; the returned
// stop ends them.
func (g *Gateway) Start(ctx context.Context) (stop func(), err error) {
	stopXDS, err := g.startIngress(ctx)
	if err != nil {
		return nil, err
	}
	stopMesh := g.startMeshIngress(ctx)
	return func() { stopMesh(); stopXDS() }, nil
}

// Status fills in the ingress's part of the status: the ingress section, the mesh address and
// the xDS clients' refusals.
func (g *Gateway) Status(out *statusapi.Status) {
	out.Ingress = g.ingressStatus()
	var dataplane *statusapi.IngressDataplane
	out.MeshAddress, dataplane = g.meshStatus()
	if out.Ingress != nil {
		out.Ingress.Dataplane = dataplane
	}
	out.Problems = append(out.Problems, ingressProblems(out.Ingress)...)
}
