package admission

import (
	"errors"
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
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/registry"
	"github.com/cablemesh/cablemesh/broker/store"
	"github.com/cablemesh/cablemesh/cable"
)

// Leases are the broker's endpoint lease settings.
type Leases struct {
	Default time.Duration // the lease of an endpoint whose agent asks for none
	Max     time.Duration // the longest an agent may ask for; longer asks are cut to it
}

// AdmitEndpoint validates the endpoint agent id registers, fills its cluster and node from id
// where it leaves them empty, and stamps it with its lease from now. It refuses an endpoint of
// another cluster or node (*ForbiddenError) and malformed fields (*InvalidError). Its subnets are
// checked against the cluster's CIDRs by PlaceEndpoint.
func AdmitEndpoint(id pki.Identity, req *apiv1.RegisterEndpointRequest, leases Leases, now time.Time) (e *apiv1.Endpoint, leaseSeconds int64, err error) {
	if req.Endpoint == nil {
		return nil, 0, invalid("endpoint", "", errors.New("endpoint is missing"))
	}
	e = proto.Clone(req.Endpoint).(*apiv1.Endpoint)
	if e.Cluster == "" {
		e.Cluster = id.Cluster
	}
	if e.Node == "" {
		e.Node = id.Node
	}
	if e.Cluster != id.Cluster || e.Node != id.Node {
		target := store.EndpointKey(e.Cluster, e.Node)
		return nil, 0, &ForbiddenError{Caller: id.String(), Target: target,
			Err: fmt.Errorf("%s may write only its own endpoint %s, not endpoint %s", id, store.EndpointKey(id.Cluster, id.Node), target)}
	}
	if err := validateEndpoint(e); err != nil {
		return nil, 0, err
	}
	lease := leases.Default
	switch {
	case req.LeaseSeconds < 0:
		return nil, 0, invalidf("lease_seconds", strconv.FormatInt(req.LeaseSeconds, 10), "lease_seconds %d is negative", req.LeaseSeconds)
	case req.LeaseSeconds > 0:
		lease = min(time.Duration(req.LeaseSeconds)*time.Second, leases.Max)
	}
	leaseSeconds = int64((lease + time.Second - 1) / time.Second)
	e.LastHeartbeat = timestamppb.New(now)
	e.LeaseExpires = timestamppb.New(now.Add(lease))
	e.LeaseSeconds = leaseSeconds
	e.Revision = 0
	// The endpoint is bound to the certificate that registers it (CheckBinding): the broker sets
	// this, whatever the request says.
	e.CertificateSerial = id.Serial
	return e, leaseSeconds, nil
}

// validateEndpoint checks the fields an agent sends; subnets are checked against the cluster's
// CIDRs by PlaceEndpoint.
func validateEndpoint(e *apiv1.Endpoint) error {
	key := store.EndpointKey(e.Cluster, e.Node)
	for _, f := range []struct {
		field string
		n     int
		max   int
	}{{"drivers", len(e.Drivers), MaxEndpointDrivers}, {"cable_ports", len(e.CablePorts), MaxEndpointDrivers},
		{"cable_attributes", len(e.CableAttributes), MaxEndpointDrivers}, {"subnets", len(e.Subnets), MaxEndpointSubnets}} {
		if f.n > f.max {
			return invalidf(f.field, "", "endpoint %s: %s has %d entries, at most %d", key, f.field, f.n, f.max)
		}
	}
	for _, d := range slices.Sorted(maps.Keys(e.CableAttributes)) {
		vals := e.CableAttributes[d].GetValues()
		if len(vals) > MaxAttributesPerDriver {
			return invalidf("cable_attributes", d, "endpoint %s: cable_attributes[%q] has %d values, at most %d", key, d, len(vals), MaxAttributesPerDriver)
		}
		for _, k := range slices.Sorted(maps.Keys(vals)) {
			if len(k) > MaxAttributeKeyBytes || len(vals[k]) > MaxAttributeValueBytes {
				return invalidf("cable_attributes", d, "endpoint %s: cable_attributes[%q][%.40q] is %d bytes with a key of %d, at most %d and %d", key, d, k,
					len(vals[k]), len(k), MaxAttributeValueBytes, MaxAttributeKeyBytes)
			}
		}
	}
	if e.PrivateIp == "" {
		return invalidf("private_ip", "", "endpoint %s: private_ip is empty", key)
	}
	for _, f := range []struct{ name, v string }{{"private_ip", e.PrivateIp}, {"public_ip", e.PublicIp}, {"health_check_ip", e.HealthCheckIp}} {
		if f.v == "" {
			continue
		}
		if _, err := netip.ParseAddr(f.v); err != nil {
			return invalidf(f.name, f.v, "endpoint %s: %s %q is not an IP address", key, f.name, f.v)
		}
	}
	for _, d := range slices.Sorted(maps.Keys(e.CablePorts)) {
		if err := validation.ValidateDriverName("cable_ports", d); err != nil {
			return invalidf("cable_ports", d, "endpoint %s: cable_ports key %q is not a driver name", key, d)
		}
		if p := e.CablePorts[d]; p == 0 || p > 65535 {
			return invalidf("cable_ports", strconv.FormatUint(uint64(p), 10), "endpoint %s: cable_ports[%q] = %d is not a port (1..65535)", key, d, p)
		}
	}
	for _, d := range e.Drivers {
		if err := validation.ValidateDriverName("drivers", d); err != nil {
			return invalidf("drivers", d, "endpoint %s: drivers entry %q is not a driver name", key, d)
		}
	}
	for _, d := range slices.Sorted(maps.Keys(e.CableAttributes)) {
		if _, known := cable.LookupSpec(d); !known {
			return invalidf("cable_attributes", d, "endpoint %s: cable_attributes key %q is not a registered cable driver (have %s)", key, d, strings.Join(cable.Names(), ", "))
		}
		if err := cable.CheckPublished(d, e.Attributes(d)); err != nil {
			return invalid("cable_attributes", d, fmt.Errorf("endpoint %s: cable_attributes[%q]: %w", key, d, err))
		}
	}
	for _, s := range e.Subnets {
		if _, err := validation.ParseCIDR("endpoint "+key+": subnet", s); err != nil {
			return invalid("subnets", s, err)
		}
	}
	if e.LeaseSeconds < 0 {
		return invalidf("lease_seconds", strconv.FormatInt(e.LeaseSeconds, 10), "endpoint %s: lease_seconds %d is negative", key, e.LeaseSeconds)
	}
	return nil
}

// PlaceEndpoint decides how e, admitted for agent id, is written, given id's cluster as stored
// (c, nil when there is none) and the endpoint stored under the same key (old, nil when there is
// none). It refuses a cluster that was removed or recreated since id's certificate was issued
// (*CredentialError) and subnets outside the cluster's CIDRs (*InvalidError). renewOnly says old
// is e but for the lease: a restarted agent registering again only renews it, so watchers see no
// change and nobody reconciles.
func PlaceEndpoint(id pki.Identity, e *apiv1.Endpoint, c *apiv1.Cluster, old *apiv1.Endpoint) (renewOnly bool, err error) {
	if c == nil || c.Uid != id.ClusterUID {
		return false, &CredentialError{Cluster: id.Cluster, Err: fmt.Errorf("cluster %q was removed from the mesh", id.Cluster)}
	}
	within := append(storedPrefixes(c.PodCidrs), storedPrefixes(c.ServiceCidrs)...)
	for _, s := range e.Subnets {
		p, _ := netip.ParsePrefix(s)
		if !registry.Within(p, within) {
			return false, invalidf("subnets", s, "endpoint %s: subnet %s is not inside the pod CIDRs [%v] or service CIDRs [%v] of cluster %q",
				store.EndpointKey(e.Cluster, e.Node), s, c.PodCidrs, c.ServiceCidrs, c.Name)
		}
	}
	return old != nil && sameEndpoint(old, e), nil
}

// sameEndpoint compares everything but the liveness fields and the revision.
func sameEndpoint(a, b *apiv1.Endpoint) bool {
	a, b = proto.Clone(a).(*apiv1.Endpoint), proto.Clone(b).(*apiv1.Endpoint)
	for _, e := range []*apiv1.Endpoint{a, b} {
		e.LastHeartbeat, e.LeaseExpires, e.Revision = nil, nil, 0
	}
	return proto.Equal(a, b)
}

// HeartbeatNode is the node whose endpoint agent id heartbeats with a request naming node: its
// own (an empty node means that), never another (*ForbiddenError).
func HeartbeatNode(id pki.Identity, node string) (string, error) {
	if node == "" {
		node = id.Node
	}
	if node != id.Node {
		target := store.EndpointKey(id.Cluster, node)
		return "", &ForbiddenError{Caller: id.String(), Target: target,
			Err: fmt.Errorf("%s may heartbeat only its own endpoint %s, not %s", id, store.EndpointKey(id.Cluster, id.Node), target)}
	}
	return node, nil
}

// RenewLease renews the lease of endpoint cluster/node, stored as e (nil when it is not: its
// lease expired or its cluster was removed, *NotFoundError), for its lease period from now.
func RenewLease(cluster, node string, e *apiv1.Endpoint, def time.Duration, now time.Time) (*apiv1.Endpoint, error) {
	if e == nil {
		key := store.EndpointKey(cluster, node)
		return nil, &NotFoundError{Kind: "endpoint", Names: []string{key},
			Err: fmt.Errorf("endpoint %s is not registered (its lease expired or its cluster was removed); register it again", key)}
	}
	e = proto.Clone(e).(*apiv1.Endpoint)
	e.LastHeartbeat = timestamppb.New(now)
	e.LeaseExpires = timestamppb.New(now.Add(leaseOf(e, def)))
	return e, nil
}

// ExtendLeases gives every endpoint a full lease from now (the broker does at start: after
// downtime every lease would otherwise have expired, and every gateway would be withdrawn at once
// before its agent had a chance to reconnect).
func ExtendLeases(eps []*apiv1.Endpoint, def time.Duration, now time.Time) []*apiv1.Endpoint {
	out := make([]*apiv1.Endpoint, 0, len(eps))
	for _, e := range eps {
		e = proto.Clone(e).(*apiv1.Endpoint)
		e.LeaseExpires = timestamppb.New(now.Add(leaseOf(e, def)))
		out = append(out, e)
	}
	return out
}

// Expired are the endpoints of eps whose lease has expired at now: they are withdrawn.
func Expired(eps []*apiv1.Endpoint, now time.Time) []*apiv1.Endpoint {
	var out []*apiv1.Endpoint
	for _, e := range eps {
		if expired(e, now) {
			out = append(out, e)
		}
	}
	return out
}

// ShortestLease is the shortest lease period among the endpoints of eps that have not expired at
// now (by Expired's test), 0 when none registered one: the reaper runs often enough to withdraw
// it in time.
func ShortestLease(eps []*apiv1.Endpoint, now time.Time) time.Duration {
	var shortest time.Duration
	for _, e := range eps {
		if l := leaseOf(e, 0); l > 0 && (shortest == 0 || l < shortest) && !expired(e, now) {
			shortest = l
		}
	}
	return shortest
}

// expired says whether e's lease has expired at now.
func expired(e *apiv1.Endpoint, now time.Time) bool {
	return e.LeaseExpires != nil && now.After(e.LeaseExpires.AsTime())
}

// leaseOf is the lease period of e: what it registered with, or def.
func leaseOf(e *apiv1.Endpoint, def time.Duration) time.Duration {
	if lease := time.Duration(e.LeaseSeconds) * time.Second; lease > 0 {
		return lease
	}
	return def
}
