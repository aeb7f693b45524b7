package admission

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/meshaddr"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// A mesh address is the node's: its record (NodeCertificate.mesh_address) holds it, so the node
// gets it back after its endpoint's lease expired. Which node holds an address is kept in a
// claim (apiv1.MeshAddressClaim, a store kind of its own keyed by the address), so that a
// registration finds a free address with a few point reads instead of reading every node of the
// mesh (a fleet of thousands registering at once would read the whole mesh thousands of times),
// and so that two broker replicas on etcd that pick the same address at once conflict over that
// one key and one of them runs again.

// MeshClaim is the claim of address a by node of cluster (incarnation uid), written at now.
func MeshClaim(a netip.Addr, cluster, uid, node string, now time.Time) *apiv1.MeshAddressClaim {
	return &apiv1.MeshAddressClaim{Address: a.String(), Cluster: cluster, ClusterUid: uid, Node: node, Claimed: timestamppb.New(now)}
}

// claimedBy says whether claim c is held by node of cluster incarnation uid.
func claimedBy(c *apiv1.MeshAddressClaim, cluster, uid, node string) bool {
	return c.GetCluster() == cluster && c.GetClusterUid() == uid && c.GetNode() == node
}

// MeshAssignment is what registering an endpoint writes for its mesh address.
type MeshAssignment struct {
	Address netip.Addr
	// Node is the node's record with Address in it, to store (TouchNodeCertificate: nobody
	// watches it for this); nil when the record already holds it or there is no record.
	Node *apiv1.NodeCertificate
	// Claim is the claim of Address to store; nil when the node already holds it.
	Claim *apiv1.MeshAddressClaim
	// Release are the node's previous addresses (outside a changed range) whose claims to delete.
	Release []string
	// Searched says Address was found searching from the hint: every address from the hint up to
	// it (wrapping around) was taken, so the next search may start after it.
	Searched bool
}

// AssignEndpointMeshAddress decides the mesh address of endpoint e, which agent id registers, and
// sets it on e: whatever the agent sent is overwritten (an agent never chooses its own address).
// The node keeps the address its record (rec, nil when none) holds, or else its stored endpoint
// (old, nil when none) carries, when that lies in range r and no other node claims it;
// otherwise it gets the first free address of r from hint on (wrapping around), or an
// *ExhaustedError naming r. claim reads the claim of an address (nil when there is none): a point
// read of the transaction, so that a concurrent claim of the same address makes the commit fail.
// A new claim is dated now.
func AssignEndpointMeshAddress(id pki.Identity, e *apiv1.Endpoint, rec *apiv1.NodeCertificate, old *apiv1.Endpoint, r netip.Prefix, hint netip.Addr,
	claim func(addr string) (*apiv1.MeshAddressClaim, error), now time.Time) (MeshAssignment, error) {
	e.MeshAddress = ""
	key := store.EndpointKey(e.Cluster, e.Node)
	// A record of an earlier cluster of the same name, or of a revoked node, holds nothing.
	ownRec := rec != nil && !rec.Revoked && rec.ClusterUid == id.ClusterUID
	var kept []string
	if ownRec && rec.MeshAddress != "" {
		kept = append(kept, rec.MeshAddress)
	}
	if old != nil && old.MeshAddress != "" && !slices.Contains(kept, old.MeshAddress) {
		kept = append(kept, old.MeshAddress)
	}
	var out MeshAssignment
	// take says whether a is free or already this node's, and records a new claim.
	take := func(a netip.Addr) (bool, error) {
		c, err := claim(a.String())
		if err != nil {
			return false, err
		}
		switch {
		case c == nil:
			out.Claim = MeshClaim(a, e.Cluster, id.ClusterUID, e.Node, now)
		case !claimedBy(c, e.Cluster, id.ClusterUID, e.Node):
			return false, nil
		}
		out.Address = a
		return true, nil
	}
	for _, k := range kept {
		a, err := netip.ParseAddr(k)
		if err != nil || !meshaddr.Usable(r, a) {
			continue
		}
		ok, err := take(a)
		if err != nil {
			return MeshAssignment{}, err
		}
		if ok {
			break
		}
	}
	if !out.Address.IsValid() {
		first := r.Addr().Next()
		a := first
		if meshaddr.Usable(r, hint) {
			a = hint
		}
		for range meshaddr.Size(r) {
			ok, err := take(a)
			if err != nil {
				return MeshAssignment{}, err
			}
			if ok {
				out.Searched = true
				break
			}
			if a = a.Next(); !meshaddr.Usable(r, a) {
				a = first
			}
		}
		if !out.Address.IsValid() {
			return MeshAssignment{}, &ExhaustedError{Resource: "mesh address",
				Err: fmt.Errorf("cannot allocate a mesh address for node %s: mesh address range %s is exhausted: widen --mesh-address-range", key, r)}
		}
	}
	e.MeshAddress = out.Address.String()
	// The node's earlier address, outside the range now, is free for whoever the range covers.
	for _, k := range kept {
		if a, err := netip.ParseAddr(k); err == nil && a != out.Address {
			if c, err := claim(a.String()); err != nil {
				return MeshAssignment{}, err
			} else if c != nil && claimedBy(c, e.Cluster, id.ClusterUID, e.Node) {
				out.Release = append(out.Release, c.Address)
			}
		}
	}
	if ownRec && rec.MeshAddress != e.MeshAddress {
		out.Node = proto.Clone(rec).(*apiv1.NodeCertificate)
		out.Node.MeshAddress = e.MeshAddress
	}
	return out, nil
}

// MeshPlan is what the broker writes at start to bring mesh addresses in line with the range:
// endpoints and node records to rewrite, claims to store and the addresses whose claims to
// delete.
type MeshPlan struct {
	Endpoints []*apiv1.Endpoint
	Nodes     []*apiv1.NodeCertificate
	Claims    []*apiv1.MeshAddressClaim
	Release   []string
}

// PlanMeshAddresses gives every endpoint of eps an address in r, keeping the one its node's
// record or itself holds when it is in r and nobody else holds it (else the lowest free), makes
// every node record that holds an address agree, stores a claim for every address held, and
// deletes every stored claim that no record or endpoint holds any more (a holder gone or moved).
// New claims are dated now. It is the broker's start-up pass over the whole mesh, so it reads
// everything: the rare case.
func PlanMeshAddresses(r netip.Prefix, eps []*apiv1.Endpoint, recs []*apiv1.NodeCertificate, stored []*apiv1.MeshAddressClaim, uids map[string]string, now time.Time) (MeshPlan, error) {
	var plan MeshPlan
	byNode := map[string]*apiv1.NodeCertificate{}
	for _, rec := range recs {
		if !rec.Revoked && rec.ClusterUid == uids[rec.Cluster] {
			byNode[store.NodeCertificateKey(rec.Cluster, rec.Node)] = rec
		}
	}
	held := map[netip.Addr]string{}                // address → holder key, as decided
	claims := map[string]*apiv1.MeshAddressClaim{} // by address
	for _, c := range stored {
		claims[c.Address] = c
	}
	// Addresses in r that records hold come first: they are what nodes get back.
	hold := func(k string, cands ...string) netip.Addr {
		for _, c := range cands {
			if a, err := netip.ParseAddr(c); err == nil && meshaddr.Usable(r, a) {
				if h, ok := held[a]; !ok || h == k {
					held[a] = k
					return a
				}
			}
		}
		return netip.Addr{}
	}
	want := map[string]netip.Addr{} // holder key → address
	for _, k := range slices.Sorted(maps.Keys(byNode)) {
		if a := hold(k, byNode[k].MeshAddress); a.IsValid() {
			want[k] = a
		}
	}
	eps = slices.Clone(eps) // sorted here, not in the caller's slice
	slices.SortFunc(eps, func(a, b *apiv1.Endpoint) int {
		return strings.Compare(store.EndpointKey(a.Cluster, a.Node), store.EndpointKey(b.Cluster, b.Node))
	})
	for _, e := range eps {
		k := store.EndpointKey(e.Cluster, e.Node)
		if _, ok := want[k]; ok {
			continue
		}
		if a := hold(k, e.MeshAddress); a.IsValid() {
			want[k] = a
		}
	}
	used := map[netip.Addr]bool{}
	for a := range held {
		used[a] = true
	}
	for _, e := range eps {
		k := store.EndpointKey(e.Cluster, e.Node)
		a, ok := want[k]
		if !ok {
			var err error
			if a, err = meshaddr.Allocate(r, used); err != nil {
				return MeshPlan{}, &ExhaustedError{Resource: "mesh address", Err: fmt.Errorf("cannot allocate a mesh address for node %s: %w", k, err)}
			}
			used[a], held[a], want[k] = true, k, a
		}
		if e.MeshAddress != a.String() {
			ne := proto.Clone(e).(*apiv1.Endpoint)
			ne.MeshAddress = a.String()
			plan.Endpoints = append(plan.Endpoints, ne)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(want)) {
		a := want[k]
		rec := byNode[k]
		if rec != nil && rec.MeshAddress != a.String() {
			nr := proto.Clone(rec).(*apiv1.NodeCertificate)
			nr.MeshAddress = a.String()
			plan.Nodes = append(plan.Nodes, nr)
		}
		cluster, node, _ := strings.Cut(k, "/")
		uid := uids[cluster]
		if c := claims[a.String()]; c == nil || !claimedBy(c, cluster, uid, node) {
			plan.Claims = append(plan.Claims, MeshClaim(a, cluster, uid, node, now))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(claims)) {
		a, err := netip.ParseAddr(k)
		if err != nil {
			plan.Release = append(plan.Release, k) // the store refuses such keys; gone all the same
			continue
		}
		if _, ok := held[a]; !ok {
			plan.Release = append(plan.Release, k)
		}
	}
	return plan, nil
}
