package mcs

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// EndpointScope is where the endpoints of one cluster's exports may lie: its pod and service
// CIDRs and, for a cluster in gateway mode, its gateways' mesh addresses. An export is a promise
// that the cluster serves those addresses; an address outside them (loopback, a metadata
// service, another cluster's pod, a clusterset VIP) would send importers' callers somewhere the
// exporting cluster does not own, so the agent refuses it before sending, the broker refuses it
// when it is written, and both leave it out when they serve imports.
type EndpointScope struct {
	Cluster  string
	Pods     []netip.Prefix
	Services []netip.Prefix
	// Mesh are the cluster's gateways' mesh addresses; allowed only in gateway mode, where the
	// cluster's services are reached at its gateways.
	Mesh        []netip.Addr
	GatewayMode bool
}

// ScopeOf is the scope of cluster c as stored (its CIDRs are canonical); mesh are the mesh
// addresses of its gateways. Entries that do not parse are left out: they widen nothing.
func ScopeOf(c *apiv1.Cluster, mesh []string) EndpointScope {
	s := EndpointScope{Cluster: c.GetName(), GatewayMode: c.GetGatewayMode(),
		Pods: parsePrefixes(c.GetPodCidrs()), Services: parsePrefixes(c.GetServiceCidrs())}
	if s.GatewayMode {
		for _, m := range mesh {
			if a, err := netip.ParseAddr(m); err == nil && a.Zone() == "" {
				s.Mesh = append(s.Mesh, a.Unmap())
			}
		}
		slices.SortFunc(s.Mesh, netip.Addr.Compare)
		s.Mesh = slices.Compact(s.Mesh)
	}
	return s
}

func parsePrefixes(in []string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range in {
		if p, err := netip.ParsePrefix(strings.TrimSpace(s)); err == nil && p.Addr().Zone() == "" {
			out = append(out, p.Masked())
		}
	}
	return out
}

// Contains says whether a may be an endpoint of the cluster. Loopback, link-local, unspecified
// and multicast addresses never are, whatever the CIDRs say: each names something on the
// caller's own node or link, not in the exporting cluster.
func (s EndpointScope) Contains(a netip.Addr) bool {
	if !a.IsValid() || a.Zone() != "" {
		return false
	}
	a = a.Unmap()
	if a.IsLoopback() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() || a.IsUnspecified() || a.IsMulticast() {
		return false
	}
	in := func(p netip.Prefix) bool { return p.Contains(a) }
	if slices.ContainsFunc(s.Pods, in) || slices.ContainsFunc(s.Services, in) {
		return true
	}
	return s.GatewayMode && slices.Contains(s.Mesh, a)
}

// Check refuses ip, the value of field, unless it is an address of the scope; the error names
// the field, the value and the CIDRs.
func (s EndpointScope) Check(field, ip string) error {
	a, err := netip.ParseAddr(ip)
	if err != nil {
		return fmt.Errorf("%s %q is not an IP address", field, ip)
	}
	if s.Contains(a) {
		return nil
	}
	return fmt.Errorf("%s %s is not in %s", field, ip, s.describe())
}

// describe names where the scope's endpoints may lie.
func (s EndpointScope) describe() string {
	d := fmt.Sprintf("cluster %s's pod CIDRs %s or service CIDRs %s", s.Cluster, prefixList(s.Pods), prefixList(s.Services))
	if s.GatewayMode {
		mesh := make([]string, len(s.Mesh))
		for i, m := range s.Mesh {
			mesh[i] = m.String()
		}
		d += fmt.Sprintf(", nor a mesh address of its gateways [%s]", strings.Join(mesh, " "))
	}
	return d
}

func prefixList(ps []netip.Prefix) string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return "[" + strings.Join(out, " ") + "]"
}

// CheckEndpoints refuses export e, known as field (e.g. "exports[2]"), when one of its
// endpoints lies outside s; the error names the first such endpoint as field.endpoints[i].ip.
func (s EndpointScope) CheckEndpoints(field string, e *apiv1.ServiceExport) error {
	for i, ep := range e.GetEndpoints() {
		if err := s.Check(fmt.Sprintf("%s.endpoints[%d].ip", field, i), ep.GetIp()); err != nil {
			return err
		}
	}
	return nil
}

// InScope is e without its endpoints outside s, and a message for each endpoint left out (nil
// when none: e itself is returned, not copied).
func (s EndpointScope) InScope(e *apiv1.ServiceExport) (*apiv1.ServiceExport, []string) {
	var out []string
	keep := make([]*apiv1.ServiceEndpoint, 0, len(e.GetEndpoints()))
	for i, ep := range e.GetEndpoints() {
		if err := s.Check(fmt.Sprintf("endpoints[%d].ip", i), ep.GetIp()); err != nil {
			out = append(out, err.Error())
			continue
		}
		keep = append(keep, ep)
	}
	if len(out) == 0 {
		return e, nil
	}
	c := proto.Clone(e).(*apiv1.ServiceExport)
	c.Endpoints = nil
	for _, ep := range keep {
		c.Endpoints = append(c.Endpoints, proto.Clone(ep).(*apiv1.ServiceEndpoint))
	}
	return c, out
}
