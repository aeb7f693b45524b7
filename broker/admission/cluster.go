// Package admission decides what the broker accepts into its state and what an accepted request
// becomes: a new cluster with its ID, a relabelled cluster, an endpoint with its lease, a stored
// policy. Every function here is pure: it is given what the broker read from its store and the
// time, and returns the record to write or a typed refusal (errors.go). The broker's handlers
// read, call these, write the result, and turn refusals into gRPC status codes in one place.
//
// Name, CIDR and label rules are api/validation's; ID allocation and the CIDR overlap check are
// registry's.
package admission

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/broker/registry"
)

// CheckClusterName refuses a cluster name that is not a DNS label, as request field field.
func CheckClusterName(field, name string) error {
	if err := validation.ValidateClusterName(name); err != nil {
		return invalid(field, name, err)
	}
	return nil
}

// ClusterRequest is the cluster part of a join-token request, validated: the cluster it is for
// and, should it not exist yet, what to create it with.
type ClusterRequest struct {
	Name         string
	PodCIDRs     []netip.Prefix
	ServiceCIDRs []netip.Prefix
	Labels       map[string]string
	// GatewayMode: the cluster joins in gateway mode (Cluster.gateway_mode).
	GatewayMode bool
}

// ParseClusterRequest validates the cluster fields of a join-token request.
func ParseClusterRequest(req *apiv1.CreateJoinTokenRequest) (ClusterRequest, error) {
	if err := CheckClusterName("cluster", req.Cluster); err != nil {
		return ClusterRequest{}, err
	}
	pods, err := validation.ParseCIDRs("pod CIDR", req.PodCidrs)
	if err != nil {
		return ClusterRequest{}, invalid("pod_cidrs", strings.Join(req.PodCidrs, ","), err)
	}
	svcs, err := validation.ParseCIDRs("service CIDR", req.ServiceCidrs)
	if err != nil {
		return ClusterRequest{}, invalid("service_cidrs", strings.Join(req.ServiceCidrs, ","), err)
	}
	for _, f := range []struct {
		field, what string
		ps          []netip.Prefix
	}{{"pod_cidrs", "pod CIDR", pods}, {"service_cidrs", "service CIDR", svcs}} {
		if len(f.ps) > MaxClusterCIDRs {
			return ClusterRequest{}, invalidf(f.field, "", "%s: %d CIDRs, at most %d", f.field, len(f.ps), MaxClusterCIDRs)
		}
		for _, p := range f.ps {
			if err := validation.CheckClusterCIDR(f.what, p); err != nil {
				return ClusterRequest{}, invalid(f.field, p.String(), err)
			}
		}
	}
	if err := validation.ValidateLabels(req.Labels); err != nil {
		return ClusterRequest{}, invalid("labels", labelString(req.Labels), err)
	}
	if len(req.Labels) > MaxLabels {
		return ClusterRequest{}, invalidf("labels", "", "labels: %d labels, at most %d", len(req.Labels), MaxLabels)
	}
	return ClusterRequest{Name: req.Cluster, PodCIDRs: pods, ServiceCIDRs: svcs, Labels: req.Labels, GatewayMode: req.GatewayMode}, nil
}

// CheckReachable refuses the CIDRs of a new cluster that cover an address the mesh must keep
// reaching over the underlay: one of the broker's own addresses (self) or a registered gateway's
// private or public address (eps). Agents route a remote cluster's CIDRs over the cables, so such
// a CIDR would take the gateways' route to the broker, or to each other, away.
func CheckReachable(req ClusterRequest, self []netip.Addr, eps []*apiv1.Endpoint) error {
	for _, f := range []struct {
		field, what string
		ps          []netip.Prefix
	}{{"pod_cidrs", "pod CIDR", req.PodCIDRs}, {"service_cidrs", "service CIDR", req.ServiceCIDRs}} {
		for _, p := range f.ps {
			for _, a := range self {
				if p.Contains(a.Unmap()) {
					return invalidf(f.field, p.String(), "%s %s of cluster %q contains %s, an address of the broker itself: agents would route it over the cables and lose the broker; choose a CIDR outside the underlay network",
						f.what, p, req.Name, a)
				}
			}
			for _, e := range eps {
				for _, ip := range []struct{ name, v string }{{"private IP", e.PrivateIp}, {"public IP", e.PublicIp}} {
					if a, err := netip.ParseAddr(ip.v); err == nil && p.Contains(a.Unmap()) {
						return invalidf(f.field, p.String(), "%s %s of cluster %q contains %s, the %s of gateway %s of cluster %q: agents would route it over the cables and lose that gateway; choose a CIDR outside the underlay network",
							f.what, p, req.Name, a, ip.name, e.Node, e.Cluster)
					}
				}
			}
		}
	}
	return nil
}

// ClusterNetworks are the pod and service CIDRs of every cluster, parsed once (NetworksOf) for
// the checks of many registrations.
type ClusterNetworks []clusterNetwork

type clusterNetwork struct {
	cluster, what string
	prefix        netip.Prefix
}

// NetworksOf is the ClusterNetworks of clusters.
func NetworksOf(clusters []*apiv1.Cluster) ClusterNetworks {
	var out ClusterNetworks
	for _, c := range clusters {
		for _, p := range storedPrefixes(c.PodCidrs) {
			out = append(out, clusterNetwork{c.Name, "pod CIDR", p})
		}
		for _, p := range storedPrefixes(c.ServiceCidrs) {
			out = append(out, clusterNetwork{c.Name, "service CIDR", p})
		}
	}
	return out
}

// CheckEndpointAddresses refuses an endpoint whose private or public address lies inside a
// cluster's pod or service CIDR (nets: NetworksOf every cluster): every gateway routes those over
// the cables, so the address would be unreachable.
func CheckEndpointAddresses(e *apiv1.Endpoint, nets ClusterNetworks) error {
	key := e.Cluster + "/" + e.Node
	for _, ip := range []struct{ field, v string }{{"private_ip", e.PrivateIp}, {"public_ip", e.PublicIp}} {
		a, err := netip.ParseAddr(ip.v)
		if err != nil {
			continue
		}
		a = a.Unmap()
		for _, n := range nets {
			if n.prefix.Contains(a) {
				return invalidf(ip.field, ip.v, "endpoint %s: %s %s lies inside %s %s of cluster %q: gateways route that CIDR over the cables, so this address would be unreachable; register the gateway's underlay address",
					key, ip.field, a, n.what, n.prefix, n.cluster)
			}
		}
	}
	return nil
}

// TokenValidity is how long a join token asked for with validForSeconds is valid: def for 0, at
// most max.
func TokenValidity(validForSeconds int64, def, max time.Duration) (time.Duration, error) {
	v := strconv.FormatInt(validForSeconds, 10)
	switch {
	case validForSeconds < 0:
		return 0, invalidf("valid_for_seconds", v, "valid_for_seconds %d is negative", validForSeconds)
	case validForSeconds > int64(max/time.Second):
		return 0, invalidf("valid_for_seconds", v, "valid_for_seconds %d is more than the maximum %s", validForSeconds, max)
	case validForSeconds > 0:
		return time.Duration(validForSeconds) * time.Second, nil
	}
	return def, nil
}

// AdmitCluster decides a join-token request against the clusters of the mesh. A stored cluster of
// that name that agrees with the request is returned as it is (created false): the token is for
// another node of it. Otherwise the request creates the cluster (created true) with the lowest
// free ID, joined now, under uid, unless it gives no pod CIDRs (*InvalidError), its CIDRs overlap
// another cluster's (*OverlapError) or the mesh is full (ErrMeshFull).
func AdmitCluster(req ClusterRequest, existing []*apiv1.Cluster, now time.Time, uid string) (c *apiv1.Cluster, created bool, err error) {
	if i := slices.IndexFunc(existing, func(c *apiv1.Cluster) bool { return c.Name == req.Name }); i >= 0 {
		if err := checkSameCluster(existing[i], req); err != nil {
			return nil, false, err
		}
		return existing[i], false, nil
	}
	if len(req.PodCIDRs) == 0 {
		return nil, false, invalidf("pod_cidrs", "", "cluster %q does not exist yet: its pod CIDRs are required to create it (--pod-cidr)", req.Name)
	}
	used := map[uint32]bool{}
	var others []registry.ClusterCIDRs
	for _, c := range existing {
		used[c.Id] = true
		others = append(others, registry.ClusterCIDRs{Name: c.Name, PodCIDRs: storedPrefixes(c.PodCidrs), ServiceCIDRs: storedPrefixes(c.ServiceCidrs), GatewayMode: c.GatewayMode})
	}
	if err := registry.CheckOverlap(registry.ClusterCIDRs{Name: req.Name, PodCIDRs: req.PodCIDRs, ServiceCIDRs: req.ServiceCIDRs, GatewayMode: req.GatewayMode}, others); err != nil {
		return nil, false, err
	}
	id, err := registry.AllocateID(used)
	if err != nil {
		return nil, false, fmt.Errorf("cannot add cluster %q: %w", req.Name, err)
	}
	return &apiv1.Cluster{
		Name:         req.Name,
		Id:           id,
		Labels:       req.Labels,
		PodCidrs:     validation.Strings(req.PodCIDRs),
		ServiceCidrs: validation.Strings(req.ServiceCIDRs),
		JoinedAt:     timestamppb.New(now),
		Uid:          uid,
		GatewayMode:  req.GatewayMode,
	}, true, nil
}

// checkSameCluster refuses a join-token request for an existing cluster that gives different
// CIDRs or labels: names are unique in the mesh, so a request that disagrees is most likely a
// second cluster under a name already taken.
func checkSameCluster(c *apiv1.Cluster, req ClusterRequest) error {
	conflict := func(field, format string, args ...any) error {
		return &ConflictError{Kind: "cluster", Name: c.Name, Field: field, Err: fmt.Errorf(format, args...)}
	}
	if len(req.PodCIDRs) > 0 && !validation.SameCIDRs(req.PodCIDRs, storedPrefixes(c.PodCidrs)) {
		return conflict("pod_cidrs", "cluster %q already exists with pod CIDRs [%s], not [%s]: cluster names are unique in the mesh; to add a node to it, give the same --pod-cidr or none",
			c.Name, strings.Join(c.PodCidrs, ","), strings.Join(validation.Strings(req.PodCIDRs), ","))
	}
	if len(req.ServiceCIDRs) > 0 && !validation.SameCIDRs(req.ServiceCIDRs, storedPrefixes(c.ServiceCidrs)) {
		return conflict("service_cidrs", "cluster %q already exists with service CIDRs [%s], not [%s]: cluster names are unique in the mesh; to add a node to it, give the same --service-cidr or none",
			c.Name, strings.Join(c.ServiceCidrs, ","), strings.Join(validation.Strings(req.ServiceCIDRs), ","))
	}
	// A cluster's mode decides whether its CIDRs may overlap others' (admitted when it was
	// created), so a request in the other mode is for another cluster, or a mistake.
	if req.GatewayMode != c.GatewayMode {
		return conflict("gateway_mode", "cluster %q already exists in %s mode, not %s mode: a cluster's mode is fixed when it is created; to add a node to it, %s --gateway-mode",
			c.Name, modeName(c.GatewayMode), modeName(req.GatewayMode), map[bool]string{true: "give", false: "leave out"}[c.GatewayMode])
	}
	for _, k := range slices.Sorted(maps.Keys(req.Labels)) {
		old, ok := c.Labels[k]
		if !ok {
			return conflict("labels", "cluster %q already exists without label %q (asked for %q=%q): change labels with `cablectl cluster label`", c.Name, k, k, req.Labels[k])
		}
		if old != req.Labels[k] {
			return conflict("labels", "cluster %q already exists and its label %q is %q, not %q: change labels with `cablectl cluster label`", c.Name, k, old, req.Labels[k])
		}
	}
	return nil
}

func modeName(gateway bool) string {
	if gateway {
		return "gateway"
	}
	return "direct"
}

// CheckMeshRange refuses the CIDRs of a new cluster that overlap the mesh address range: a
// gateway-mode pair's cable carries the gateways' mesh addresses, which must never be taken for
// a pod or service address of either cluster.
func CheckMeshRange(req ClusterRequest, meshRange netip.Prefix) error {
	for _, f := range []struct {
		field, what string
		ps          []netip.Prefix
	}{{"pod_cidrs", "pod CIDR", req.PodCIDRs}, {"service_cidrs", "service CIDR", req.ServiceCIDRs}} {
		for _, p := range f.ps {
			if p.Overlaps(meshRange) {
				return invalidf(f.field, p.String(), "%s %s of cluster %q overlaps the mesh address range %s (cable-broker --mesh-address-range), from which gateways get their mesh addresses; choose a CIDR outside it",
					f.what, p, req.Name, meshRange)
			}
		}
	}
	return nil
}

// MeshOverlap is a stored cluster CIDR that overlaps the mesh address range.
type MeshOverlap struct {
	Cluster string
	CIDR    netip.Prefix
}

// MeshRangeOverlaps are the pod and service CIDRs of clusters that overlap meshRange, cluster by
// cluster, pod CIDRs first. CheckMeshRange keeps new clusters out of it; these were admitted under
// an earlier range, and are reported, not removed.
func MeshRangeOverlaps(clusters []*apiv1.Cluster, meshRange netip.Prefix) []MeshOverlap {
	var out []MeshOverlap
	for _, n := range NetworksOf(clusters) {
		if n.prefix.Overlaps(meshRange) {
			out = append(out, MeshOverlap{Cluster: n.cluster, CIDR: n.prefix})
		}
	}
	return out
}

// LabelChange is a validated label request: labels to set and keys to remove on cluster Name.
type LabelChange struct {
	Name   string
	Set    map[string]string
	Remove []string
}

// ParseLabelChange validates a label request.
func ParseLabelChange(req *apiv1.LabelClusterRequest) (LabelChange, error) {
	if err := CheckClusterName("name", req.Name); err != nil {
		return LabelChange{}, err
	}
	if n := len(req.Set) + len(req.Remove); n > MaxLabelChanges {
		return LabelChange{}, invalidf("set", "", "set and remove: %d label changes in one request, at most %d", n, MaxLabelChanges)
	}
	if err := validation.ValidateLabels(req.Set); err != nil {
		return LabelChange{}, invalid("set", labelString(req.Set), err)
	}
	for _, k := range req.Remove {
		if err := validation.ValidateLabelKey(k); err != nil {
			return LabelChange{}, invalid("remove", k, err)
		}
		if _, ok := req.Set[k]; ok {
			return LabelChange{}, invalidf("remove", k, "label %q is both set and removed", k)
		}
	}
	return LabelChange{Name: req.Name, Set: req.Set, Remove: req.Remove}, nil
}

// Relabel applies ch to c, the stored cluster (nil when there is none). changed is false when the
// labels stay as they are: then out is c and nothing need be written.
func Relabel(c *apiv1.Cluster, ch LabelChange) (out *apiv1.Cluster, changed bool, err error) {
	if c == nil {
		return nil, false, clusterNotFound(ch.Name)
	}
	labels := maps.Clone(c.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, ch.Set)
	for _, k := range ch.Remove {
		delete(labels, k)
	}
	if maps.Equal(labels, c.Labels) || (len(labels) == 0 && len(c.Labels) == 0) {
		return c, false, nil
	}
	if len(labels) > MaxLabels {
		return nil, false, invalidf("set", "", "cluster %q would have %d labels, at most %d", c.Name, len(labels), MaxLabels)
	}
	out = proto.Clone(c).(*apiv1.Cluster)
	out.Labels = labels
	return out, true, nil
}

// ClusterRemoval is what goes with a removed cluster, in the same transaction.
type ClusterRemoval struct {
	Endpoints []*apiv1.Endpoint      // its gateways
	Exports   []*apiv1.ServiceExport // every export of its nodes
}

// RemoveCluster decides the removal of cluster name, stored as c (nil when there is none): the
// endpoints of eps and the exports of exports that go with it. The VIPs its exports leave
// without an export are released by ReleaseVIPs over what is left.
func RemoveCluster(name string, c *apiv1.Cluster, eps []*apiv1.Endpoint, exports []*apiv1.ServiceExport) (ClusterRemoval, error) {
	if c == nil {
		return ClusterRemoval{}, clusterNotFound(name)
	}
	var out ClusterRemoval
	for _, e := range eps {
		if e.Cluster == name {
			out.Endpoints = append(out.Endpoints, e)
		}
	}
	for _, e := range exports {
		if e.GetCluster() == name {
			out.Exports = append(out.Exports, e)
		}
	}
	return out, nil
}

func clusterNotFound(name string) error {
	return &NotFoundError{Kind: "cluster", Names: []string{name}, Err: fmt.Errorf("cluster %q not found", name)}
}

// storedPrefixes parses CIDRs the broker stored itself (validated on the way in).
func storedPrefixes(ss []string) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ss))
	for _, s := range ss {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// labelString is labels as one value, k=v in key order, for InvalidError.Value.
func labelString(labels map[string]string) string {
	parts := make([]string, 0, len(labels))
	for _, k := range slices.Sorted(maps.Keys(labels)) {
		parts = append(parts, k+"="+labels[k])
	}
	return strings.Join(parts, ",")
}
