package broker

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"errors"
	"fmt"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/labels"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/watchzstd"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/internal/version"
	"github.com/cablemesh/cablemesh/mcs"
)

// agentService serves the Agent API: each handler reads the store, lets admission decide, and
// writes what it decided.
type agentService struct {
	apiv1.UnimplementedAgentServer
	s *Server
}

// Join exchanges a join token for an agent certificate. The token must verify (admission.CheckJoin)
// and its cluster still be the one it was issued for; then, in one transaction, the node must not
// hold a live certificate and the token must have a node left (admission.AdmitJoin): the token's
// record counts the node, and the node's record lists the new certificate, the only one good for
// it from now on.
func (a *agentService) Join(ctx context.Context, req *apiv1.JoinRequest) (*apiv1.JoinResponse, error) {
	now := a.s.cfg.Now()
	p := a.s.currentPKI()
	claims, err := admission.CheckJoin(req, p.TokenKey, p.CAHash(), now)
	if err != nil {
		return nil, rpcError("join", err)
	}
	var (
		c         *apiv1.Cluster
		issued    *apiv1.IssuedCertificate
		cert      *x509.Certificate
		certPEM   []byte
		issuedUID string // the UID of the cluster cert was issued for
	)
	issue := func() error {
		var err error
		if certPEM, cert, err = p.IssueAgentFor(req.CsrPem, c.Name, c.Uid, req.Node, now, a.s.cfg.AgentCertificateLifetime); err != nil {
			return &admission.InvalidError{Field: "csr_pem", Err: err}
		}
		issued, issuedUID = admission.Issued(cert, p.IssuerHash(), claims.Nonce), c.Uid
		return nil
	}
	// The certificate is signed before the write, not in it: the store's one committer would
	// otherwise sign for every node of a fleet joining at once, one after the other. A
	// certificate is good only once its node's record lists it, which the write decides. The
	// read is the replica's local state (store.ViewLocal): the write decides again, and a
	// refusal is confirmed with a linearizable read (the cluster may have been created through
	// another replica a moment ago).
	readCluster := func(tx store.ReadTx) error {
		var err error
		if c, err = tx.Cluster(req.Cluster); err != nil {
			return err
		}
		if err := admission.JoinCluster(claims, c); err != nil {
			return err
		}
		return issue()
	}
	if err := store.ViewLocal(ctx, a.s.store, readCluster); err != nil {
		return nil, rpcError("join", err)
	}
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		var err error
		if c, err = tx.Cluster(req.Cluster); err != nil {
			return err
		}
		if err := admission.JoinCluster(claims, c); err != nil {
			return err
		}
		if c.Uid != issuedUID {
			// The cluster was removed and created again since the read.
			if err := issue(); err != nil {
				return err
			}
		}
		tok, err := tx.JoinToken(claims.Nonce)
		if err != nil {
			return err
		}
		rec, err := tx.NodeCertificate(c.Name, req.Node)
		if err != nil {
			return err
		}
		plan, err := admission.AdmitJoin(claims, req.Node, tok, rec, issued, now)
		if err != nil {
			return err
		}
		if err := tx.PutJoinToken(plan.Token); err != nil {
			return err
		}
		return tx.PutNodeCertificate(plan.Node)
	})
	if err != nil {
		return nil, rpcError("join", err)
	}
	a.s.log.Info("agent joined", "cluster", c.Name, "node", req.Node, "serial", issued.Serial)
	return &apiv1.JoinResponse{CertificatePem: certPEM, CaPem: p.CAPEM, Cluster: c, NotAfter: issued.NotAfter, Ca: caBundle(p)}, nil
}

func (a *agentService) RegisterEndpoint(ctx context.Context, req *apiv1.RegisterEndpointRequest) (*apiv1.RegisterEndpointResponse, error) {
	if err := a.registerBusy(ctx); err != nil {
		return nil, err
	}
	defer a.s.beginWrite()()
	id := identityFrom(ctx)
	e, leaseSeconds, err := admission.AdmitEndpoint(id, req, a.s.leases(), a.s.cfg.Now())
	if err != nil {
		return nil, rpcError("register endpoint", err)
	}
	var (
		stored *apiv1.Endpoint
		mesh   admission.MeshAssignment
	)
	_, err = a.s.store.Update(ctx, func(tx store.Tx) error {
		c, err := tx.Cluster(id.Cluster)
		if err != nil {
			return err
		}
		nets, err := a.s.clusterNets.of(tx)
		if err != nil {
			return err
		}
		if err := admission.CheckEndpointAddresses(e, nets); err != nil {
			return err
		}
		old, err := tx.Endpoint(e.Cluster, e.Node)
		if err != nil {
			return err
		}
		rec, err := tx.NodeCertificate(e.Cluster, e.Node)
		if err != nil {
			return err
		}
		// The call was authorized on this replica's local state (checkAgent); the write
		// decides on the committed one.
		if _, err := admission.AgentCertificate(id, rec, "", a.s.cfg.Now()); err != nil {
			return err
		}
		if err := admission.CheckBinding(id, old, rec); err != nil {
			return err
		}
		// The mesh address is decided here, in the transaction that stores it: a claim read
		// here that another replica writes meanwhile makes this commit fail and run again.
		mesh, err = admission.AssignEndpointMeshAddress(id, e, rec, old, a.s.cfg.MeshAddressRange, a.s.meshHint.get(), tx.MeshAddressClaim, a.s.cfg.Now())
		if err != nil {
			return err
		}
		// The hint moves on at once, not after the commit: the registrations of one commit
		// group would otherwise all search from the same address, the last of 256 past 255
		// claims of its own group. Should this transaction not commit, the address it skips is
		// found again by a search that wraps around the range.
		if mesh.Searched {
			a.s.meshHint.allocated(mesh.Address)
		}
		if mesh.Node != nil {
			if err := tx.TouchNodeCertificate(mesh.Node); err != nil {
				return err
			}
		}
		if mesh.Claim != nil {
			if err := tx.PutMeshAddressClaim(mesh.Claim); err != nil {
				return err
			}
		}
		for _, a := range mesh.Release {
			if err := tx.DeleteMeshAddressClaim(a); err != nil {
				return err
			}
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
	a.s.log.Info("endpoint registered", "cluster", e.Cluster, "node", e.Node, "privateIP", e.PrivateIp, "meshAddress", stored.MeshAddress, "revision", stored.Revision)
	// The broker's clock at the answer (not at the request) and build: the agent's clock skew
	// and `cablectl version` come from them.
	return &apiv1.RegisterEndpointResponse{Endpoint: stored, LeaseSeconds: leaseSeconds,
		BrokerTime: timestamppb.New(a.s.cfg.Now()), BrokerVersion: version.String()}, nil
}

func (a *agentService) Heartbeat(ctx context.Context, req *apiv1.HeartbeatRequest) (*apiv1.HeartbeatResponse, error) {
	defer a.s.beginWrite()()
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
		rec, err := tx.NodeCertificate(id.Cluster, node)
		if err != nil {
			return err
		}
		if _, err := admission.AgentCertificate(id, rec, "", now); err != nil {
			return err
		}
		if err := admission.CheckBinding(id, e, rec); err != nil {
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
	resp.BrokerTime, resp.BrokerVersion = timestamppb.New(a.s.cfg.Now()), version.String()
	return resp, nil
}

// errStopping ends the watches of a broker that shuts down.
var errStopping = errors.New("broker is shutting down; reconnect with since_revision")

// Watch streams the agent's view of the mesh: a snapshot or the deltas since its revision, then
// every later change. Service exports and VIPs are not sent as events: an agent that sets
// want_imports gets, on the first message and whenever the set changes, the complete set of
// imports it may use (those of its own cluster and of the clusters the policies connect it to,
// admitted by its import selector); an agent that does not sees exactly what it saw before
// services existed. Node certificate records are never sent: the watch ends once its own says the
// agent's certificate is no longer good (revoked, replaced), and when the certificate expires.
// The CA bundle comes on the first message and whenever a rotation changes it. No message is
// larger than the agent can receive: a batch too large for one is sent in parts (sendBatch).
func (a *agentService) Watch(req *apiv1.WatchRequest, stream apiv1.Agent_WatchServer) error {
	ctx := stream.Context()
	id := identityFrom(ctx)
	var sel labels.Selector
	if n := len(req.ImportSelector); n > admission.MaxSelectorBytes {
		return rpcError("watch", &admission.InvalidError{Field: "import_selector", Err: fmt.Errorf("import_selector: %d bytes, at most %d", n, admission.MaxSelectorBytes)})
	}
	zstd, err := admission.WatchEncodings(req.AcceptEncodings, watchzstd.Name)
	if err != nil {
		return rpcError("watch", err)
	}
	if req.WantImports {
		var err error
		if sel, err = mcs.ParseImportSelector(req.ImportSelector); err != nil {
			return rpcError("watch", &admission.InvalidError{Field: "import_selector", Value: req.ImportSelector, Err: fmt.Errorf("import_selector: %w", err)})
		}
	}
	// Exports and VIPs reach the agent as imports: the watch says only when they changed. Node
	// certificates only ever end a watch.
	w, err := a.s.store.Watch(ctx, req.SinceRevision, store.OmitResources(store.KindServiceExport, store.KindServiceVIP, store.KindNodeCertificate))
	if err != nil {
		return rpcError("watch", err)
	}
	log := a.s.log.With("cluster", id.Cluster, "node", id.Node)
	watcher := watcherOf{cluster: id.Cluster, clusterUID: id.ClusterUID, log: log, zstd: zstd}
	log.Info("watch started", "sinceRevision", req.SinceRevision, "wantImports", req.WantImports, "importSelector", req.ImportSelector, "zstd", zstd)
	var expired <-chan time.Time
	if !id.NotAfter.IsZero() {
		t := time.NewTimer(time.Until(id.NotAfter))
		defer t.Stop()
		expired = t.C
	}
	var (
		first   = true
		sent    [sha256.Size]byte // fingerprint of the imports last sent
		sentCA  []byte            // the CA bundle last sent
		lastRev uint64            // the revision of the last message sent
	)
	for {
		p, caChanged := a.s.certs.get()
		select {
		case <-a.s.stopping:
			return rpcError("watch", unavailableError{errStopping})
		case <-expired:
			return rpcError("watch", &admission.CredentialError{Cluster: id.Cluster,
				Err: fmt.Errorf("the certificate of %s expired at %s; renew it (RenewCertificate) before it expires, or join again", id, id.NotAfter.UTC().Format(time.RFC3339))})
		case <-caChanged:
			if first {
				continue
			}
			if p := a.s.currentPKI(); !bytes.Equal(p.CAPEM, sentCA) {
				sentCA = p.CAPEM
				if err := stream.Send(&apiv1.WatchResponse{Revision: lastRev, Ca: caBundle(p)}); err != nil {
					return err
				}
			}
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
			// group: the delta batches of this message, each sent as it was encoded once for
			// every watcher (sendShared); the first message is the watcher's own.
			var group []store.Batch
			switch {
			case b.Snapshot:
			case first:
				b = coalesce(b, w.C())
			default:
				b, group = coalesceGroup(b, w.C())
			}
			// A revocation (or a join that replaced this certificate) ends the stream before
			// the batch that made it is delivered.
			if !b.Snapshot && admission.WatcherCertificate(id, b.Events) {
				if err := a.s.recheckAgent(ctx, id); err != nil {
					log.Info("watch ended: the certificate is no longer good", "err", err)
					return err
				}
			}
			// The store shares a batch's events between watchers, and so does the encoding
			// (sendBatch): the PSKs of this agent's pairs go into its clusters as they are
			// encoded, never into the shared events.
			// A snapshot's agent events are shared between its watchers (sharedSnapshot).
			var (
				evs     []*apiv1.Event
				touches bool
			)
			if b.Snapshot {
				evs = a.s.sharedSnapshot(b, watcher, a.s.messageBudget()).evs
			} else {
				evs, touches = agentEvents(b.Events)
			}
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
			if first || !bytes.Equal(p.CAPEM, sentCA) {
				resp.Ca, sentCA = caBundle(p), p.CAPEM
			}
			// A batch of exports and VIPs that changes nothing this agent sees is not sent.
			if !first && len(evs) == 0 && resp.Imports == nil && resp.Ca == nil {
				continue
			}
			first = false
			// A snapshot waits for one of a few hundred slots: thousands of agents starting at
			// once would otherwise all be sent theirs at the same time, and crowd out the
			// commits that register them.
			if b.Snapshot {
				// While a fleet connects and registers, or its registrations and heartbeats
				// queue, snapshots wait (at most maxSnapshotHold): sent meanwhile, they took
				// the CPU and the connections the handshakes and writes needed, which then
				// missed their deadline (and a gateway whose heartbeats miss loses its lease).
				hold := time.Now().Add(maxSnapshotHold)
				if !a.s.handshakes.waiting.idle(ctx, hold) || !a.s.writing.idle(ctx, hold) {
					return rpcError("watch", ctx.Err())
				}
				select {
				case a.s.snapshotSends <- struct{}{}:
				case <-ctx.Done():
					return rpcError("watch", ctx.Err())
				case <-a.s.stopping:
					return rpcError("watch", unavailableError{errStopping})
				}
			}
			var err error
			switch {
			case b.Snapshot:
				err = a.s.sendSnapshot(stream, b, resp, watcher)
			case group != nil:
				err = a.s.sendShared(stream, group, resp, watcher)
			default:
				err = a.s.sendBatch(stream, resp, watcher)
			}
			if b.Snapshot {
				<-a.s.snapshotSends
			}
			if err != nil {
				return err
			}
			lastRev = b.Revision
			// Its certificate is no longer good once its cluster is gone: end the stream after
			// telling it.
			if err := admission.WatcherRemoved(id, b.Events); err != nil {
				return rpcError("watch", err)
			}
		}
	}
}

// recheckAgent decides again, on a watch, whether agent id's certificate is still good.
func (s *Server) recheckAgent(ctx context.Context, id pki.Identity) error {
	err := s.store.View(ctx, func(tx store.ReadTx) error {
		rec, err := tx.NodeCertificate(id.Cluster, id.Node)
		if err != nil {
			return err
		}
		if rec == nil {
			return nil // its cluster was removed: WatcherRemoved ends the watch once it is told
		}
		_, err = admission.AgentCertificate(id, rec, "", s.cfg.Now())
		return err
	})
	return rpcError("watch", err)
}

// maxCoalescedEvents bounds how many events coalesce gathers into one batch: a message of a few
// tens of kilobytes. gRPC holds every stream's encoded message until it is written, so a
// thousand watchers sent much larger ones at once cost the broker that much memory each.
const maxCoalescedEvents = 256

// coalesce appends to delta batch b the batches already waiting in ch (not more than
// maxCoalescedEvents events in all): a watcher that fell behind, as every watcher does while a
// fleet registers at once, catches up in one message instead of one per commit, and the work per
// agent stays bounded by what it is sent, not by how many commits there were. The result carries
// the revision of the last batch taken. Only batches already buffered are taken (len(ch)), so
// the close of ch is never consumed here.
func coalesce(b store.Batch, ch <-chan store.Batch) store.Batch {
	b, _ = coalesceGroup(b, ch)
	return b
}

// coalesceGroup is coalesce that also returns the batches it took, in order (b first): the
// broker sends each as encoded once for every watcher (sendShared).
func coalesceGroup(b store.Batch, ch <-chan store.Batch) (store.Batch, []store.Batch) {
	group := []store.Batch{b}
	n := len(ch)
	if n == 0 {
		return b, group
	}
	evs := slices.Clone(b.Events)
	for ; n > 0 && len(evs) < maxCoalescedEvents; n-- {
		nb := <-ch
		group = append(group, nb)
		evs = append(evs, nb.Events...)
		b.Revision = nb.Revision
	}
	b.Events = evs
	return b, group
}
