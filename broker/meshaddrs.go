package broker

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/meshaddr"
	"github.com/cablemesh/cablemesh/broker/store"
)

// meshRange is the configured mesh address range, or the default, checked against the VIP
// ranges.
func meshRange(r netip.Prefix, vips []netip.Prefix) (netip.Prefix, error) {
	s := meshaddr.DefaultRange
	if r.IsValid() {
		s = r.String()
	}
	out, err := meshaddr.ParseRange(s)
	if err != nil {
		return netip.Prefix{}, err
	}
	if err := meshaddr.CheckDisjoint(out, vips); err != nil {
		return netip.Prefix{}, err
	}
	return out, nil
}

// meshHint is where this broker starts looking for a free mesh address: the lowest it may know
// to be free. It is only a starting point (a registration checks each candidate's claim in its
// transaction, and another replica's allocations and releases are not seen here), so a stale
// hint costs a few more point reads, never a duplicate. Addresses are handed out lowest first
// from the range's start after a restart, and an address released here is the next one given.
type meshHint struct {
	mu   sync.Mutex
	next netip.Addr // invalid: the start of the range
}

func (h *meshHint) get() netip.Addr {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.next
}

// allocated moves the hint past a, the first free address a search from the hint found.
func (h *meshHint) allocated(a netip.Addr) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.next = a.Next()
}

// released moves the hint back to the lowest of the addresses whose claims were deleted.
func (h *meshHint) released(addrs []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, s := range addrs {
		a, err := netip.ParseAddr(s)
		if err == nil && (!h.next.IsValid() || a.Less(h.next)) {
			h.next = a
		}
	}
}

// releaseNodeMeshClaims deletes, in tx, the claims node of cluster holds on the addresses its
// record (rec) and its endpoint (ep) carry (either may be nil), and returns those addresses. Point
// reads: a node's claims are the addresses its record and endpoint name (registration writes
// them together), and a claim left behind otherwise is released by the next start's planning.
func releaseNodeMeshClaims(tx store.Tx, cluster, node string, rec *apiv1.NodeCertificate, ep *apiv1.Endpoint) ([]string, error) {
	var out []string
	for _, a := range []string{rec.GetMeshAddress(), ep.GetMeshAddress()} {
		if a == "" || slices.Contains(out, a) {
			continue
		}
		c, err := tx.MeshAddressClaim(a)
		if err != nil {
			return nil, err
		}
		if c == nil || c.Cluster != cluster || c.Node != node {
			continue
		}
		if err := tx.DeleteMeshAddressClaim(a); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, nil
}

// releaseClusterMeshClaims deletes, in tx, every claim held by a node of cluster (whatever its
// incarnation) and returns their addresses: a cluster's removal reads the whole mesh anyway.
func releaseClusterMeshClaims(tx store.Tx, cluster string) ([]string, error) {
	claims, err := tx.MeshAddressClaims()
	if err != nil {
		return nil, err
	}
	var out []string
	for _, c := range claims {
		if c.Cluster != cluster {
			continue
		}
		if err := tx.DeleteMeshAddressClaim(c.Address); err != nil {
			return nil, err
		}
		out = append(out, c.Address)
	}
	return out, nil
}

// reconcileMeshAddresses brings mesh addresses in line with the configured range at start (a
// pass over the whole mesh, the one place that reads it all): every stored endpoint gets an
// address (those registered before a range change or before mesh addresses get one now, not at
// their next registration), node records agree with their endpoints, every address held has its
// claim and no claim outlives its holder. A cluster whose CIDRs overlap a changed range is
// logged: it was admitted under the old range and is not removed.
func (s *Server) reconcileMeshAddresses(ctx context.Context) error {
	var plan admission.MeshPlan
	var overlaps []admission.MeshOverlap
	_, err := s.store.Update(ctx, func(tx store.Tx) error {
		eps, err := tx.Endpoints()
		if err != nil {
			return err
		}
		recs, err := tx.NodeCertificates()
		if err != nil {
			return err
		}
		claims, err := tx.MeshAddressClaims()
		if err != nil {
			return err
		}
		cs, err := tx.Clusters()
		if err != nil {
			return err
		}
		uids := map[string]string{}
		for _, c := range cs {
			uids[c.Name] = c.Uid
		}
		overlaps = admission.MeshRangeOverlaps(cs, s.cfg.MeshAddressRange)
		if plan, err = admission.PlanMeshAddresses(s.cfg.MeshAddressRange, eps, recs, claims, uids, s.cfg.Now()); err != nil {
			return err
		}
		for _, e := range plan.Endpoints {
			if err := tx.PutEndpoint(e); err != nil {
				return err
			}
		}
		for _, n := range plan.Nodes {
			if err := tx.TouchNodeCertificate(n); err != nil {
				return err
			}
		}
		for _, a := range plan.Release {
			if err := tx.DeleteMeshAddressClaim(a); err != nil {
				return err
			}
		}
		for _, c := range plan.Claims {
			if err := tx.PutMeshAddressClaim(c); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("mesh addresses at start: %w", err)
	}
	for _, e := range plan.Endpoints {
		s.log.Info("mesh address assigned", "cluster", e.Cluster, "node", e.Node, "meshAddress", e.MeshAddress)
	}
	for _, o := range overlaps {
		s.log.Warn("a cluster CIDR overlaps the mesh address range; gateway-mode pairs of that cluster may misroute: choose another --mesh-address-range",
			"cluster", o.Cluster, "cidr", o.CIDR.String(), "meshAddressRange", s.cfg.MeshAddressRange.String())
	}
	return nil
}
