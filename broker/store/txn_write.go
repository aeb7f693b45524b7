package store

import (
	"errors"
	"fmt"
	"net/netip"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// The writes of a transaction, per kind: each puts or deletes the record and, unless the kind is
// quiet, logs the event.

// upsert stores m under key, stamped with the next revision (stamp sets it), and records the event.
func (t *txn) upsert(bucket []byte, kind, key string, m proto.Message, stamp func(uint64), res *apiv1.Resource) error {
	t.rev++
	stamp(t.rev)
	if err := putProto(t.kv, bucket, key, m); err != nil {
		return fmt.Errorf("put %s %q: %w", kind, key, err)
	}
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: kind, Key: key, Resource: res, Revision: t.rev})
	return nil
}

// remove deletes key, whose last value is in res, and records the event.
func (t *txn) remove(bucket []byte, kind, key string, res *apiv1.Resource) error {
	if err := t.kv.delete(bucket, []byte(key)); err != nil {
		return fmt.Errorf("delete %s %q: %w", kind, key, err)
	}
	t.rev++
	t.events = append(t.events, &apiv1.Event{Type: apiv1.Event_DELETE, Kind: kind, Key: key, Resource: res, Revision: t.rev})
	return nil
}

func (t *txn) PutCluster(c *apiv1.Cluster) error {
	if !t.writable {
		return errReadOnly
	}
	if c.GetName() == "" {
		return errors.New("put cluster: name is empty")
	}
	c = proto.Clone(c).(*apiv1.Cluster)
	// Pair PSKs are derived per watcher when the broker sends a cluster; they are never stored.
	c.PairPsk = nil
	return t.upsert(bucketClusters, KindCluster, c.Name, c, func(r uint64) { c.Revision = r },
		&apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: c}})
}

func (t *txn) DeleteCluster(name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Cluster(name)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketClusters, KindCluster, name, &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: old}})
}

func (t *txn) PutEndpoint(e *apiv1.Endpoint) error {
	if !t.writable {
		return errReadOnly
	}
	if e.GetCluster() == "" || e.GetNode() == "" {
		return errors.New("put endpoint: cluster or node is empty")
	}
	e = proto.Clone(e).(*apiv1.Endpoint)
	return t.upsert(bucketEndpoints, KindEndpoint, EndpointKey(e.Cluster, e.Node), e, func(r uint64) { e.Revision = r },
		&apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: e}})
}

func (t *txn) TouchEndpoint(e *apiv1.Endpoint) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Endpoint(e.GetCluster(), e.GetNode())
	if err != nil {
		return err
	}
	key := EndpointKey(e.GetCluster(), e.GetNode())
	if old == nil {
		return fmt.Errorf("touch endpoint %q: not found", key)
	}
	old.LastHeartbeat = e.LastHeartbeat
	old.LeaseExpires = e.LeaseExpires
	if err := putProto(t.kv, bucketEndpoints, key, old); err != nil {
		return fmt.Errorf("touch endpoint %q: %w", key, err)
	}
	return nil
}

func (t *txn) DeleteEndpoint(cluster, node string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Endpoint(cluster, node)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketEndpoints, KindEndpoint, EndpointKey(cluster, node), &apiv1.Resource{Kind: &apiv1.Resource_Endpoint{Endpoint: old}})
}

func (t *txn) PutPolicy(p *apiv1.Policy) error {
	if !t.writable {
		return errReadOnly
	}
	if p.GetName() == "" {
		return errors.New("put policy: name is empty")
	}
	p = proto.Clone(p).(*apiv1.Policy)
	p.StatusJson = nil
	return t.upsert(bucketPolicies, KindPolicy, p.Name, p, func(r uint64) { p.Revision = r },
		&apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: p}})
}

func (t *txn) DeletePolicy(name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.Policy(name)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketPolicies, KindPolicy, name, &apiv1.Resource{Kind: &apiv1.Resource_Policy{Policy: old}})
}

func (t *txn) PutServiceExport(e *apiv1.ServiceExport) error {
	if !t.writable {
		return errReadOnly
	}
	if e.GetCluster() == "" || e.GetNode() == "" || e.GetNamespace() == "" || e.GetName() == "" {
		return fmt.Errorf("put service export %q: cluster, node, namespace or name is empty",
			ServiceExportKey(e.GetCluster(), e.GetNode(), e.GetNamespace(), e.GetName()))
	}
	e = proto.Clone(e).(*apiv1.ServiceExport)
	return t.upsert(bucketExports, KindServiceExport, ServiceExportKey(e.Cluster, e.Node, e.Namespace, e.Name), e,
		func(r uint64) { e.Revision = r }, &apiv1.Resource{Kind: &apiv1.Resource_ServiceExport{ServiceExport: e}})
}

func (t *txn) DeleteServiceExport(cluster, node, namespace, name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.ServiceExport(cluster, node, namespace, name)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketExports, KindServiceExport, ServiceExportKey(cluster, node, namespace, name),
		&apiv1.Resource{Kind: &apiv1.Resource_ServiceExport{ServiceExport: old}})
}

func (t *txn) PutServiceVIP(v *apiv1.ServiceVIP) error {
	if !t.writable {
		return errReadOnly
	}
	if v.GetNamespace() == "" || v.GetName() == "" {
		return fmt.Errorf("put service VIP %q: namespace or name is empty", ServiceVIPKey(v.GetNamespace(), v.GetName()))
	}
	v = proto.Clone(v).(*apiv1.ServiceVIP)
	return t.upsert(bucketVIPs, KindServiceVIP, ServiceVIPKey(v.Namespace, v.Name), v,
		func(r uint64) { v.Revision = r }, &apiv1.Resource{Kind: &apiv1.Resource_ServiceVip{ServiceVip: v}})
}

func (t *txn) DeleteServiceVIP(namespace, name string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.ServiceVIP(namespace, name)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketVIPs, KindServiceVIP, ServiceVIPKey(namespace, name),
		&apiv1.Resource{Kind: &apiv1.Resource_ServiceVip{ServiceVip: old}})
}

func (t *txn) PutJoinToken(r *apiv1.JoinTokenRecord) error {
	if !t.writable {
		return errReadOnly
	}
	if r.GetNonce() == "" {
		return errors.New("put join token: nonce is empty")
	}
	if err := putProto(t.kv, bucketTokens, r.Nonce, r); err != nil {
		return fmt.Errorf("put join token %q: %w", r.Nonce, err)
	}
	return nil
}

func (t *txn) DeleteJoinToken(nonce string) error {
	if !t.writable {
		return errReadOnly
	}
	if err := t.kv.delete(bucketTokens, []byte(nonce)); err != nil {
		return fmt.Errorf("delete join token %q: %w", nonce, err)
	}
	return nil
}

func (t *txn) PutNodeCertificate(n *apiv1.NodeCertificate) error {
	if !t.writable {
		return errReadOnly
	}
	if n.GetCluster() == "" || n.GetNode() == "" {
		return errors.New("put node certificate: cluster or node is empty")
	}
	n = proto.Clone(n).(*apiv1.NodeCertificate)
	return t.upsert(bucketNodeCerts, KindNodeCertificate, NodeCertificateKey(n.Cluster, n.Node), n, func(r uint64) { n.Revision = r },
		&apiv1.Resource{Kind: &apiv1.Resource_NodeCertificate{NodeCertificate: n}})
}

func (t *txn) TouchNodeCertificate(n *apiv1.NodeCertificate) error {
	if !t.writable {
		return errReadOnly
	}
	key := NodeCertificateKey(n.GetCluster(), n.GetNode())
	old, err := t.NodeCertificate(n.GetCluster(), n.GetNode())
	if err != nil {
		return err
	}
	if old == nil {
		return fmt.Errorf("touch node certificate %q: not found", key)
	}
	n = proto.Clone(n).(*apiv1.NodeCertificate)
	n.Revision = old.Revision
	if err := putProto(t.kv, bucketNodeCerts, key, n); err != nil {
		return fmt.Errorf("touch node certificate %q: %w", key, err)
	}
	return nil
}

func (t *txn) DeleteNodeCertificate(cluster, node string) error {
	if !t.writable {
		return errReadOnly
	}
	old, err := t.NodeCertificate(cluster, node)
	if err != nil || old == nil {
		return err
	}
	return t.remove(bucketNodeCerts, KindNodeCertificate, NodeCertificateKey(cluster, node),
		&apiv1.Resource{Kind: &apiv1.Resource_NodeCertificate{NodeCertificate: old}})
}

func (t *txn) PutMeshAddressClaim(c *apiv1.MeshAddressClaim) error {
	if !t.writable {
		return errReadOnly
	}
	if err := checkClaimAddress(c.GetAddress()); err != nil {
		return fmt.Errorf("put mesh address claim: %w", err)
	}
	if err := putProto(t.kv, bucketMeshClaims, c.Address, c); err != nil {
		return fmt.Errorf("put mesh address claim %q: %w", c.Address, err)
	}
	return nil
}

func (t *txn) DeleteMeshAddressClaim(address string) error {
	if !t.writable {
		return errReadOnly
	}
	if err := t.kv.delete(bucketMeshClaims, []byte(address)); err != nil {
		return fmt.Errorf("delete mesh address claim %q: %w", address, err)
	}
	return nil
}

// checkClaimAddress refuses a claim key that is not an address in its canonical text, without a
// zone: "2001:DB8::1" or "fe80::1%eth0" would be a second key for an address another claim may
// hold, and uniqueness rests on one key per address.
func checkClaimAddress(s string) error {
	a, err := netip.ParseAddr(s)
	if err != nil {
		return fmt.Errorf("address %q is not an IP address", s)
	}
	if a.Zone() != "" {
		return fmt.Errorf("address %q has a zone (a mesh address is mesh-wide, not of one interface)", s)
	}
	if a.String() != s {
		return fmt.Errorf("address %q is not in canonical form (%s)", s, a)
	}
	return nil
}
