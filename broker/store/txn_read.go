package store

import (
	"encoding/binary"
	"hash/maphash"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// The reads of a transaction, one pair (one, all) per kind.

func (t *txn) Cluster(name string) (*apiv1.Cluster, error) {
	return load[apiv1.Cluster](t.kv, bucketClusters, "cluster", name)
}

func (t *txn) Clusters() ([]*apiv1.Cluster, error) {
	return loadAll[apiv1.Cluster](t.kv, bucketClusters, "cluster")
}

// digestSeed seeds ClustersDigest: digests compare within one process only.
var digestSeed = maphash.MakeSeed()

func (t *txn) ClustersDigest() (uint64, error) {
	var h maphash.Hash
	h.SetSeed(digestSeed)
	var n [8]byte
	err := t.kv.scan(bucketClusters, nil, func(k, v []byte) error {
		// Each key and value with its length: no two different listings hash the same input.
		binary.BigEndian.PutUint32(n[:4], uint32(len(k)))
		binary.BigEndian.PutUint32(n[4:], uint32(len(v)))
		_, _ = h.Write(n[:])
		_, _ = h.Write(k)
		_, _ = h.Write(v)
		return nil
	})
	return h.Sum64(), err
}

func (t *txn) Endpoint(cluster, node string) (*apiv1.Endpoint, error) {
	return load[apiv1.Endpoint](t.kv, bucketEndpoints, "endpoint", EndpointKey(cluster, node))
}

func (t *txn) Endpoints() ([]*apiv1.Endpoint, error) {
	return loadAll[apiv1.Endpoint](t.kv, bucketEndpoints, "endpoint")
}

func (t *txn) Policy(name string) (*apiv1.Policy, error) {
	return load[apiv1.Policy](t.kv, bucketPolicies, "policy", name)
}

func (t *txn) Policies() ([]*apiv1.Policy, error) {
	return loadAll[apiv1.Policy](t.kv, bucketPolicies, "policy")
}

func (t *txn) ServiceExport(cluster, node, namespace, name string) (*apiv1.ServiceExport, error) {
	return load[apiv1.ServiceExport](t.kv, bucketExports, "service export", ServiceExportKey(cluster, node, namespace, name))
}

func (t *txn) ServiceExports() ([]*apiv1.ServiceExport, error) {
	return loadAll[apiv1.ServiceExport](t.kv, bucketExports, "service export")
}

func (t *txn) ServiceVIP(namespace, name string) (*apiv1.ServiceVIP, error) {
	return load[apiv1.ServiceVIP](t.kv, bucketVIPs, "service VIP", ServiceVIPKey(namespace, name))
}

func (t *txn) ServiceVIPs() ([]*apiv1.ServiceVIP, error) {
	return loadAll[apiv1.ServiceVIP](t.kv, bucketVIPs, "service VIP")
}

func (t *txn) JoinToken(nonce string) (*apiv1.JoinTokenRecord, error) {
	return load[apiv1.JoinTokenRecord](t.kv, bucketTokens, "join token", nonce)
}

func (t *txn) JoinTokens() ([]*apiv1.JoinTokenRecord, error) {
	return loadAll[apiv1.JoinTokenRecord](t.kv, bucketTokens, "join token")
}

func (t *txn) NodeCertificate(cluster, node string) (*apiv1.NodeCertificate, error) {
	return load[apiv1.NodeCertificate](t.kv, bucketNodeCerts, "node certificate", NodeCertificateKey(cluster, node))
}

func (t *txn) NodeCertificates() ([]*apiv1.NodeCertificate, error) {
	return loadAll[apiv1.NodeCertificate](t.kv, bucketNodeCerts, "node certificate")
}

func (t *txn) MeshAddressClaim(address string) (*apiv1.MeshAddressClaim, error) {
	return load[apiv1.MeshAddressClaim](t.kv, bucketMeshClaims, "mesh address claim", address)
}

func (t *txn) MeshAddressClaims() ([]*apiv1.MeshAddressClaim, error) {
	return loadAll[apiv1.MeshAddressClaim](t.kv, bucketMeshClaims, "mesh address claim")
}
