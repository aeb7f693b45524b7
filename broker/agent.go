package broker

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/cable"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/registry"
	"github.com/cablemesh/cablemesh/broker/store"
)

type agentService struct {
	apiv1.UnimplementedAgentServer
	s *Server
}

func (a *agentService) Join(ctx context.Context, req *apiv1.JoinRequest) (*apiv1.JoinResponse, error) {
	claims, err := jointoken.Verify(req.Token, a.s.pki.TokenKey, a.s.cfg.Now())
	switch {
	case errors.Is(err, jointoken.ErrMalformed):
		return nil, status.Errorf(codes.InvalidArgument, "join token: %v", err)
	case err != nil:
		return nil, status.Errorf(codes.Unauthenticated, "join token refused: %v", err)
	}
	if req.Cluster == "" {
		return nil, status.Errorf(codes.InvalidArgument, "join request: cluster is empty (the token is for cluster %q)", claims.Cluster)
	}
	if claims.Cluster != req.Cluster {
		return nil, status.Errorf(codes.PermissionDenied, "join token is for cluster %q, not %q", claims.Cluster, req.Cluster)
	}
	if claims.CAHash != a.s.pki.CAHash() {
		return nil, status.Errorf(codes.Unauthenticated, "join token names mesh CA %s, but this broker's CA is %s", claims.CAHash, a.s.pki.CAHash())
	}
	if err := validation.ValidateNodeName(req.Node); err != nil {
		return nil, invalid(err)
	}
	var c *apiv1.Cluster
	err = a.s.store.View(ctx, func(tx store.ReadTx) error {
		var err error
		c, err = tx.Cluster(req.Cluster)
		return err
	})
	if err != nil {
		return nil, storeErr("join", err)
	}
	if c == nil || c.Uid != claims.ClusterUID {
		return nil, status.Errorf(codes.Unauthenticated, "join token is for cluster %q (uid %s), which was removed from the mesh after the token was issued; create a new token", claims.Cluster, claims.ClusterUID)
	}
	certPEM, err := a.s.pki.SignAgentCSR(req.CsrPem, c.Name, c.Uid, req.Node, a.s.cfg.Now())
	if err != nil {
		return nil, invalid(err)
	}
	a.s.log.Info("agent joined", "cluster", c.Name, "node", req.Node)
	return &apiv1.JoinResponse{CertificatePem: certPEM, CaPem: a.s.pki.CAPEM, Cluster: c}, nil
}

func (a *agentService) RegisterEndpoint(ctx context.Context, req *apiv1.RegisterEndpointRequest) (*apiv1.RegisterEndpointResponse, error) {
	id := identityFrom(ctx)
	if req.Endpoint == nil {
		return nil, invalid(errors.New("endpoint is missing"))
	}
	e := proto.Clone(req.Endpoint).(*apiv1.Endpoint)
	if e.Cluster == "" {
		e.Cluster = id.Cluster
	}
	if e.Node == "" {
		e.Node = id.Node
	}
	if e.Cluster != id.Cluster || e.Node != id.Node {
		return nil, status.Errorf(codes.PermissionDenied, "%s may write only its own endpoint %s, not endpoint %s",
			id, store.EndpointKey(id.Cluster, id.Node), store.EndpointKey(e.Cluster, e.Node))
	}
	if err := validateEndpoint(e); err != nil {
		return nil, invalid(err)
	}
	lease := a.s.cfg.Lease
	switch {
	case req.LeaseSeconds < 0:
		return nil, invalid(fmt.Errorf("lease_seconds %d is negative", req.LeaseSeconds))
	case req.LeaseSeconds > 0:
		lease = min(time.Duration(req.LeaseSeconds)*time.Second, a.s.cfg.MaxLease)
	}
	leaseSeconds := int64((lease + time.Second - 1) / time.Second)
	now := a.s.cfg.Now()
	e.LastHeartbeat = timestamppb.New(now)
	e.LeaseExpires = timestamppb.New(now.Add(lease))
	e.LeaseSeconds = leaseSeconds
	e.Revision = 0

	var stored *apiv1.Endpoint
	_, err := a.s.store.Update(ctx, func(tx store.Tx) error {
		c, err := tx.Cluster(id.Cluster)
		if err != nil {
			return err
		}
		if c == nil || c.Uid != id.ClusterUID {
			return status.Errorf(codes.Unauthenticated, "cluster %q was removed from the mesh", id.Cluster)
		}
		within := append(mustPrefixes(c.PodCidrs), mustPrefixes(c.ServiceCidrs)...)
		for _, s := range e.Subnets {
			p, _ := netip.ParsePrefix(s)
			if !registry.Within(p, within) {
				return status.Errorf(codes.InvalidArgument, "endpoint %s: subnet %s is not inside the pod CIDRs [%v] or service CIDRs [%v] of cluster %q",
					store.EndpointKey(e.Cluster, e.Node), s, c.PodCidrs, c.ServiceCidrs, c.Name)
			}
		}
		old, err := tx.Endpoint(e.Cluster, e.Node)
		if err != nil {
			return err
		}
		if old != nil && sameEndpoint(old, e) {
			// A restarted agent registering the same endpoint again only renews its lease, so
			// watchers see no change and nobody reconciles.
			if err := tx.TouchEndpoint(e); err != nil {
				return err
			}
		} else if err := tx.PutEndpoint(e); err != nil {
			return err
		}
		stored, err = tx.Endpoint(e.Cluster, e.Node)
		return err
	})
	if err != nil {
		return nil, storeErr("register endpoint", err)
	}
	a.s.log.Info("endpoint registered", "cluster", e.Cluster, "node", e.Node, "private_ip", e.PrivateIp, "revision", stored.Revision)
	return &apiv1.RegisterEndpointResponse{Endpoint: stored, LeaseSeconds: leaseSeconds}, nil
}

// sameEndpoint compares everything but the liveness fields and the revision.
func sameEndpoint(a, b *apiv1.Endpoint) bool {
	a, b = proto.Clone(a).(*apiv1.Endpoint), proto.Clone(b).(*apiv1.Endpoint)
	for _, e := range []*apiv1.Endpoint{a, b} {
		e.LastHeartbeat, e.LeaseExpires, e.Revision = nil, nil, 0
	}
	return proto.Equal(a, b)
}

// validateEndpoint checks the fields an agent sends; subnets are checked against the cluster's
// CIDRs inside the transaction.
func validateEndpoint(e *apiv1.Endpoint) error {
	key := store.EndpointKey(e.Cluster, e.Node)
	if e.PrivateIp == "" {
		return fmt.Errorf("endpoint %s: private_ip is empty", key)
	}
	for _, f := range []struct{ name, v string }{{"private_ip", e.PrivateIp}, {"public_ip", e.PublicIp}, {"health_check_ip", e.HealthCheckIp}} {
		if f.v == "" {
			continue
		}
		if _, err := netip.ParseAddr(f.v); err != nil {
			return fmt.Errorf("endpoint %s: %s %q is not an IP address", key, f.name, f.v)
		}
	}
	drivers := make([]string, 0, len(e.CablePorts))
	for d := range e.CablePorts {
		drivers = append(drivers, d)
	}
	sort.Strings(drivers)
	for _, d := range drivers {
		if err := validation.ValidateLabelValue("cable_ports", d); err != nil || d == "" {
			return fmt.Errorf("endpoint %s: cable_ports key %q is not a driver name", key, d)
		}
		if p := e.CablePorts[d]; p == 0 || p > 65535 {
			return fmt.Errorf("endpoint %s: cable_ports[%q] = %d is not a port (1..65535)", key, d, p)
		}
	}
	for _, d := range e.Drivers {
		if err := validation.ValidateLabelValue("drivers", d); err != nil || d == "" {
			return fmt.Errorf("endpoint %s: drivers entry %q is not a driver name", key, d)
		}
	}
	for _, d := range slices.Sorted(maps.Keys(e.CableAttributes)) {
		if _, known := cable.Lookup(d); !known {
			return fmt.Errorf("endpoint %s: cable_attributes key %q is not a registered cable driver (have %s)", key, d, strings.Join(cable.Names(), ", "))
		}
		if err := cable.CheckPublished(d, e.Attributes(d)); err != nil {
			return fmt.Errorf("endpoint %s: cable_attributes[%q]: %w", key, d, err)
		}
	}
	for _, s := range e.Subnets {
		if _, err := validation.ParseCIDR("endpoint "+key+": subnet", s); err != nil {
			return err
		}
	}
	if e.LeaseSeconds < 0 {
		return fmt.Errorf("endpoint %s: lease_seconds %d is negative", key, e.LeaseSeconds)
	}
	return nil
}

func (a *agentService) Heartbeat(ctx context.Context, req *apiv1.HeartbeatRequest) (*apiv1.HeartbeatResponse, error) {
	id := identityFrom(ctx)
	node := req.Node
	if node == "" {
		node = id.Node
	}
	if node != id.Node {
		return nil, status.Errorf(codes.PermissionDenied, "%s may heartbeat only its own endpoint %s, not %s",
			id, store.EndpointKey(id.Cluster, id.Node), store.EndpointKey(id.Cluster, node))
	}
	now := a.s.cfg.Now()
	resp := &apiv1.HeartbeatResponse{}
	_, err := a.s.store.Update(ctx, func(tx store.Tx) error {
		e, err := tx.Endpoint(id.Cluster, node)
		if err != nil {
			return err
		}
		if e == nil {
			return status.Errorf(codes.NotFound, "endpoint %s is not registered (its lease expired or its cluster was removed); register it again", store.EndpointKey(id.Cluster, node))
		}
		lease := time.Duration(e.LeaseSeconds) * time.Second
		if lease <= 0 {
			lease = a.s.cfg.Lease
		}
		e.LastHeartbeat = timestamppb.New(now)
		e.LeaseExpires = timestamppb.New(now.Add(lease))
		resp.LeaseExpires = e.LeaseExpires
		resp.Revision = tx.Revision()
		return tx.TouchEndpoint(e)
	})
	if err != nil {
		return nil, storeErr("heartbeat", err)
	}
	return resp, nil
}

func (a *agentService) Watch(req *apiv1.WatchRequest, stream apiv1.Agent_WatchServer) error {
	ctx := stream.Context()
	id := identityFrom(ctx)
	w, err := a.s.store.Watch(ctx, req.SinceRevision)
	if err != nil {
		return storeErr("watch", err)
	}
	log := a.s.log.With("cluster", id.Cluster, "node", id.Node)
	log.Info("watch started", "since_revision", req.SinceRevision)
	for {
		select {
		case <-a.s.stopping:
			return status.Error(codes.Unavailable, "broker is shutting down; reconnect with since_revision")
		case b, ok := <-w.C():
			if !ok {
				if ctx.Err() != nil {
					return status.FromContextError(ctx.Err()).Err()
				}
				log.Warn("watch ended", "err", w.Err())
				if errors.Is(w.Err(), store.ErrWatcherTooSlow) {
					return status.Error(codes.ResourceExhausted, w.Err().Error())
				}
				return status.Errorf(codes.Unavailable, "watch ended: %v", w.Err())
			}
			// The batch is this watcher's own copy, so the PSKs of its pairs can go straight in.
			a.s.addPairPSKs(id.Cluster, b.Events)
			if err := stream.Send(&apiv1.WatchResponse{Snapshot: b.Snapshot, Events: b.Events, Revision: b.Revision}); err != nil {
				return err
			}
			// The watcher's own cluster went away (or was recreated under a new UID): its
			// certificate is no longer good, so end the stream after telling it.
			for _, ev := range b.Events {
				if ev.Kind != store.KindCluster || ev.Key != id.Cluster {
					continue
				}
				if ev.Type == apiv1.Event_DELETE || ev.GetResource().GetCluster().GetUid() != id.ClusterUID {
					return status.Errorf(codes.Unauthenticated, "cluster %q was removed from the mesh", id.Cluster)
				}
			}
		}
	}
}
