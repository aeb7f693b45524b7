package broker

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/labels"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/mcs"
)

// agentService serves the Agent API: each handler reads the store, lets admission decide, and
// writes what it decided.
type agentService struct {
	apiv1.UnimplementedAgentServer
	s *Server
}

func (a *agentService) Join(ctx context.Context, req *apiv1.JoinRequest) (*apiv1.JoinResponse, error) {
	now := a.s.cfg.Now()
	claims, err := admission.CheckJoin(req, a.s.pki.TokenKey, a.s.pki.CAHash(), now)
	if err != nil {
		return nil, rpcError("join", err)
	}
	var c *apiv1.Cluster
	err = a.s.store.View(ctx, func(tx store.ReadTx) error {
		var err error
		c, err = tx.Cluster(req.Cluster)
		return err
	})
	if err == nil {
		err = admission.JoinCluster(claims, c)
	}
	if err != nil {
		return nil, rpcError("join", err)
	}
	certPEM, err := a.s.pki.SignAgentCSR(req.CsrPem, c.Name, c.Uid, req.Node, now)
	if err != nil {
		return nil, rpcError("join", &admission.InvalidError{Field: "csr_pem", Err: err})
	}
	a.s.log.Info("agent joined", "cluster", c.Name, "node", req.Node)
	return &apiv1.JoinResponse{CertificatePem: certPEM, CaPem: a.s.pki.CAPEM, Cluster: c}, nil
}

func (a *agentService) RegisterEndpoint(ctx context.Context, req *apiv1.RegisterEndpointRequest) (*apiv1.RegisterEndpointResponse, error) {
	id := identityFrom(ctx)
	e, leaseSeconds, err := admission.AdmitEndpoint(id, req, a.s.leases(), a.s.cfg.Now())
	if err != nil {
		return nil, rpcError("register endpoint", err)
	}
	var stored *apiv1.Endpoint
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		c, err := tx.Cluster(id.Cluster)
		if err != nil {
			return err
		}
		old, err := tx.Endpoint(e.Cluster, e.Node)
		if err != nil {
			return err
		}
		renewOnly, err := admission.PlaceEndpoint(id, e, c, old)
		switch {
		case err != nil:
			return err
		case renewOnly:
			err = tx.TouchEndpoint(e)
		default:
			err = tx.PutEndpoint(e)
		}
		if err != nil {
			return err
		}
		stored, err = tx.Endpoint(e.Cluster, e.Node)
		return err
	})
	if err != nil {
		return nil, rpcError("register endpoint", err)
	}
	a.s.log.Info("endpoint registered", "cluster", e.Cluster, "node", e.Node, "privateIP", e.PrivateIp, "revision", stored.Revision)
	return &apiv1.RegisterEndpointResponse{Endpoint: stored, LeaseSeconds: leaseSeconds}, nil
}

func (a *agentService) Heartbeat(ctx context.Context, req *apiv1.HeartbeatRequest) (*apiv1.HeartbeatResponse, error) {
	id := identityFrom(ctx)
	node, err := admission.HeartbeatNode(id, req.Node)
	if err != nil {
		return nil, rpcError("heartbeat", err)
	}
	now := a.s.cfg.Now()
	resp := &apiv1.HeartbeatResponse{}
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		e, err := tx.Endpoint(id.Cluster, node)
		if err != nil {
			return err
		}
		if e, err = admission.RenewLease(id.Cluster, node, e, a.s.cfg.Lease, now); err != nil {
			return err
		}
		resp.LeaseExpires = e.LeaseExpires
		resp.Revision = tx.Revision()
		return tx.TouchEndpoint(e)
	})
	if err != nil {
		return nil, rpcError("heartbeat", err)
	}
	return resp, nil
}

// errStopping ends the watches of a broker that shuts down.
var errStopping = errors.New("broker is shutting down; reconnect with since_revision")

// Watch streams the agent's view of the mesh: a snapshot or the deltas since its revision, then
// every later change. Service exports and VIPs are not sent as events: an agent that sets
// want_imports gets, on the first message and whenever the set changes, the complete set of
// imports it may use (those of its own cluster and of the clusters the policies connect it to,
// admitted by its import selector); an agent that does not sees exactly what it saw before
// services existed.
func (a *agentService) Watch(req *apiv1.WatchRequest, stream apiv1.Agent_WatchServer) error {
	ctx := stream.Context()
	id := identityFrom(ctx)
	var sel labels.Selector
	if req.WantImports {
		var err error
		if sel, err = mcs.ParseImportSelector(req.ImportSelector); err != nil {
			return rpcError("watch", &admission.InvalidError{Field: "import_selector", Value: req.ImportSelector, Err: fmt.Errorf("import_selector: %w", err)})
		}
	}
	// Exports and VIPs reach the agent as imports: the watch says only when they changed.
	w, err := a.s.store.Watch(ctx, req.SinceRevision, store.OmitResources(store.KindServiceExport, store.KindServiceVIP))
	if err != nil {
		return rpcError("watch", err)
	}
	log := a.s.log.With("cluster", id.Cluster, "node", id.Node)
	log.Info("watch started", "sinceRevision", req.SinceRevision, "wantImports", req.WantImports, "importSelector", req.ImportSelector)
	var (
		first = true
		sent  [sha256.Size]byte // fingerprint of the imports last sent
	)
	for {
		select {
		case <-a.s.stopping:
			return rpcError("watch", unavailableError{errStopping})
		case b, ok := <-w.C():
			if !ok {
				if ctx.Err() != nil {
					return rpcError("watch", ctx.Err())
				}
				err := w.Err()
				log.Warn("watch ended", "err", err)
				if !errors.Is(err, store.ErrWatcherTooSlow) {
					err = unavailableError{fmt.Errorf("watch ended: %v", err)}
				}
				return rpcError("watch", err)
			}
			evs, touches := agentEvents(b.Events)
			// The batch is this watcher's own copy, so the PSKs of its pairs can go straight in.
			a.s.addPairPSKs(id.Cluster, evs)
			resp := &apiv1.WatchResponse{Snapshot: b.Snapshot, Events: evs, Revision: b.Revision}
			if req.WantImports && (first || b.Snapshot || touches) {
				v, err := a.s.imports.at(ctx, b.Revision)
				if err != nil {
					return rpcError("watch", err)
				}
				t := v.importsFor(id.Cluster, req.ImportSelector, sel)
				if first || t.fingerprint != sent {
					resp.Imports, sent = t.imports, t.fingerprint
				}
			}
			// A batch of exports and VIPs that changes nothing this agent sees is not sent.
			if !first && len(evs) == 0 && resp.Imports == nil {
				continue
			}
			first = false
			if err := stream.Send(resp); err != nil {
				return err
			}
			// Its certificate is no longer good once its cluster is gone: end the stream after
			// telling it.
			if err := admission.WatcherRemoved(id, b.Events); err != nil {
				return rpcError("watch", err)
			}
		}
	}
}
