package admission

import (
	"crypto/x509"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/validation"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// Join tokens serve at most MaxNodes distinct nodes; DefaultTokenNodes when the request says 0.
const (
	DefaultTokenNodes = 1
	MaxTokenNodes     = 10000
)

// TokenNodes is how many distinct nodes a join token asked for with maxNodes may join.
func TokenNodes(maxNodes uint32) (uint32, error) {
	switch {
	case maxNodes == 0:
		return DefaultTokenNodes, nil
	case maxNodes > MaxTokenNodes:
		return 0, invalidf("max_nodes", fmt.Sprint(maxNodes), "max_nodes %d is more than the limit of %d nodes per join token", maxNodes, MaxTokenNodes)
	}
	return maxNodes, nil
}

// NewTokenRecord is the record the broker keeps of a token it issues for cluster c.
func NewTokenRecord(nonce string, c *apiv1.Cluster, maxNodes uint32, expires, now time.Time) *apiv1.JoinTokenRecord {
	return &apiv1.JoinTokenRecord{Nonce: nonce, Cluster: c.Name, ClusterUid: c.Uid, MaxNodes: maxNodes,
		Expires: timestamppb.New(expires), Created: timestamppb.New(now)}
}

// ExpiredTokens are the records of tokens that expired before now: no join can use them, so
// they can go.
func ExpiredTokens(recs []*apiv1.JoinTokenRecord, now time.Time) []string {
	var out []string
	for _, r := range recs {
		if r.Expires != nil && now.After(r.Expires.AsTime()) {
			out = append(out, r.Nonce)
		}
	}
	return out
}

// Issued is the record of a certificate the broker just issued.
func Issued(cert *x509.Certificate, issuer, tokenNonce string) *apiv1.IssuedCertificate {
	return &apiv1.IssuedCertificate{Serial: pki.Serial(cert), NotBefore: timestamppb.New(cert.NotBefore),
		NotAfter: timestamppb.New(cert.NotAfter), IssuerCa: issuer, JoinToken: tokenNonce}
}

// JoinPlan is what an admitted join writes: the token's record with the node counted, and the
// node's new certificate record.
type JoinPlan struct {
	Token *apiv1.JoinTokenRecord
	Node  *apiv1.NodeCertificate
}

// AdmitJoin decides a join of node with a verified token (claims) whose cluster JoinCluster
// accepted, given the token's record (nil: a token an older broker issued, counted from now on
// as a token of one node), the node's certificate record (nil when it has none) and the
// certificate the broker signed for the request (issued).
//
// A node that holds a live certificate (unrevoked, unexpired at now) is refused whatever the
// token (*ConflictError): a join cannot take the name of a running node. The one exception is a
// join with the same token whose earlier certificates were never used: the agent retries a join
// whose answer it did not get. A token joins at most its max_nodes distinct nodes; a node it
// joined before may join with it again (after a revocation). Past that the join is refused
// (*CredentialError, "join token already used").
func AdmitJoin(claims jointoken.Claims, node string, tok *apiv1.JoinTokenRecord, rec *apiv1.NodeCertificate, issued *apiv1.IssuedCertificate, now time.Time) (JoinPlan, error) {
	if live := LiveCertificates(rec, claims.ClusterUID, now); len(live) > 0 {
		retry := !slices.ContainsFunc(live, func(c *apiv1.IssuedCertificate) bool { return c.Used || c.JoinToken != claims.Nonce })
		if !retry {
			c := live[0]
			return JoinPlan{}, &ConflictError{Kind: "node", Name: store.NodeCertificateKey(claims.Cluster, node), Field: "node",
				Err: fmt.Errorf("node %q of cluster %q already holds a live certificate (serial %s, valid until %s): a join cannot take the name of a node that has one; if that node is gone for good, revoke it first with `cablectl cluster revoke-node %s %s`, then join again",
					node, claims.Cluster, c.Serial, c.NotAfter.AsTime().UTC().Format(time.RFC3339), claims.Cluster, node)}
		}
	}
	if tok == nil {
		tok = &apiv1.JoinTokenRecord{Nonce: claims.Nonce, Cluster: claims.Cluster, ClusterUid: claims.ClusterUID, MaxNodes: DefaultTokenNodes,
			Expires: timestamppb.New(claims.Expires), Created: timestamppb.New(now)}
	} else {
		tok = proto.Clone(tok).(*apiv1.JoinTokenRecord)
	}
	if !slices.Contains(tok.Nodes, node) {
		max := max(tok.MaxNodes, 1)
		if uint32(len(tok.Nodes)) >= max {
			return JoinPlan{}, &CredentialError{Cluster: claims.Cluster,
				Err: fmt.Errorf("join token already used: it joined %s of cluster %q and serves at most %d distinct node(s); create a new token for node %q with `cablectl cluster join-token %s` (add --max-nodes N for a token several nodes share)",
					quoteNodes(tok.Nodes), claims.Cluster, max, node, claims.Cluster)}
		}
		tok.Nodes = append(tok.Nodes, node)
	}
	n := &apiv1.NodeCertificate{Cluster: claims.Cluster, Node: node, ClusterUid: claims.ClusterUID, Certificates: []*apiv1.IssuedCertificate{issued}}
	// A node that joins again (its certificates expired, or a retried join) keeps its mesh
	// address; a revoked node's was released, and a new incarnation of the cluster starts afresh.
	if rec != nil && !rec.Revoked && rec.ClusterUid == claims.ClusterUID {
		n.MeshAddress = rec.MeshAddress
	}
	return JoinPlan{Token: tok, Node: n}, nil
}

func quoteNodes(nodes []string) string {
	q := make([]string, len(nodes))
	for i, n := range nodes {
		q[i] = fmt.Sprintf("%q", n)
	}
	if len(q) == 1 {
		return "node " + q[0]
	}
	return "nodes " + strings.Join(q, ", ")
}

// LiveCertificates are the certificates of rec that are good at now: rec is not revoked, is of
// the cluster incarnation uid, and they have not expired.
func LiveCertificates(rec *apiv1.NodeCertificate, uid string, now time.Time) []*apiv1.IssuedCertificate {
	if rec == nil || rec.Revoked || rec.ClusterUid != uid {
		return nil
	}
	var out []*apiv1.IssuedCertificate
	for _, c := range rec.Certificates {
		if c.NotAfter == nil || now.Before(c.NotAfter.AsTime()) {
			out = append(out, c)
		}
	}
	return out
}

// hasSerial says whether rec lists the certificate serial.
func hasSerial(rec *apiv1.NodeCertificate, serial string) bool {
	return rec != nil && slices.ContainsFunc(rec.Certificates, func(c *apiv1.IssuedCertificate) bool { return c.Serial == serial })
}

// AgentCertificate checks the certificate agent id called with against its node's record (nil
// when the node has none) on every call and stream: a revoked node, or a certificate the record
// does not list (the node joined again or renewed twice since), is refused (*CredentialError).
// It returns the record to write when the call changes it (nil when nothing changes): a
// certificate's first use is marked, and a certificate issued before the broker kept records
// (the node has none) is adopted as the node's one certificate.
func AgentCertificate(id pki.Identity, rec *apiv1.NodeCertificate, issuer string, now time.Time) (*apiv1.NodeCertificate, error) {
	if rec == nil {
		return &apiv1.NodeCertificate{Cluster: id.Cluster, Node: id.Node, ClusterUid: id.ClusterUID, Certificates: []*apiv1.IssuedCertificate{{
			Serial: id.Serial, NotAfter: timestamppb.New(id.NotAfter), IssuerCa: issuer, Used: true,
		}}}, nil
	}
	switch {
	case rec.Revoked:
		return nil, &CredentialError{Cluster: id.Cluster, Err: fmt.Errorf("the certificate of %s was revoked at %s (cablectl cluster revoke-node); join again with a new token",
			id, rec.RevokedAt.AsTime().UTC().Format(time.RFC3339))}
	case rec.ClusterUid != id.ClusterUID || !hasSerial(rec, id.Serial):
		return nil, &CredentialError{Cluster: id.Cluster, Err: fmt.Errorf("the certificate of %s (serial %s) is no longer good: the node joined again or renewed its certificate since; use its current certificate or join again with a new token",
			id, id.Serial)}
	}
	i := slices.IndexFunc(rec.Certificates, func(c *apiv1.IssuedCertificate) bool { return c.Serial == id.Serial })
	if rec.Certificates[i].Used {
		return nil, nil
	}
	out := proto.Clone(rec).(*apiv1.NodeCertificate)
	out.Certificates[i].Used = true
	return out, nil
}

// WatcherCertificate says whether the events of a batch a watch of agent id receives change its
// node's certificate record: then the watch checks the record again (AgentCertificate).
func WatcherCertificate(id pki.Identity, evs []*apiv1.Event) bool {
	key := store.NodeCertificateKey(id.Cluster, id.Node)
	return slices.ContainsFunc(evs, func(ev *apiv1.Event) bool { return ev.Kind == store.KindNodeCertificate && ev.Key == key })
}

// CheckBinding refuses a write to endpoint e (as stored; nil when there is none) by agent id
// unless e is bound to id's certificate or to another good certificate of the same node (rec,
// its record: a renewal). An endpoint registered before endpoints were bound is not bound.
func CheckBinding(id pki.Identity, e *apiv1.Endpoint, rec *apiv1.NodeCertificate) error {
	if e == nil || e.CertificateSerial == "" || e.CertificateSerial == id.Serial || (hasSerial(rec, e.CertificateSerial) && !rec.Revoked) {
		return nil
	}
	key := store.EndpointKey(e.Cluster, e.Node)
	return &ForbiddenError{Caller: id.String(), Target: key,
		Err: fmt.Errorf("endpoint %s is bound to the certificate that registered it (serial %s), not to the certificate of this call (serial %s): only that node may write it",
			key, e.CertificateSerial, id.Serial)}
}

// Renewal is what RenewCertificate writes: the node's record with the new certificate first and
// the one renewed with kept (every other is dropped), and the node's endpoint rebound when it was
// bound to a certificate the record no longer lists.
type Renewal struct {
	Node     *apiv1.NodeCertificate
	Endpoint *apiv1.Endpoint // nil: unchanged
}

// Renew decides a renewal by agent id, whose certificate AgentCertificate accepted: rec is its
// node's record, ep its endpoint (nil when none), issued the new certificate.
func Renew(id pki.Identity, rec *apiv1.NodeCertificate, ep *apiv1.Endpoint, issued *apiv1.IssuedCertificate) (Renewal, error) {
	if rec == nil || rec.Revoked || !hasSerial(rec, id.Serial) {
		return Renewal{}, &CredentialError{Cluster: id.Cluster, Err: fmt.Errorf("the certificate of %s is not good for a renewal (revoked or replaced); join again with a new token", id)}
	}
	out := proto.Clone(rec).(*apiv1.NodeCertificate)
	i := slices.IndexFunc(out.Certificates, func(c *apiv1.IssuedCertificate) bool { return c.Serial == id.Serial })
	out.Certificates = []*apiv1.IssuedCertificate{issued, out.Certificates[i]}
	r := Renewal{Node: out}
	if ep != nil && ep.CertificateSerial != "" && !hasSerial(out, ep.CertificateSerial) {
		r.Endpoint = proto.Clone(ep).(*apiv1.Endpoint)
		r.Endpoint.CertificateSerial = id.Serial
	}
	return r, nil
}

// NodeRevocation is what revoking a node writes, in one transaction: its record revoked, and its
// endpoint and exports withdrawn.
type NodeRevocation struct {
	Node     *apiv1.NodeCertificate
	Endpoint *apiv1.Endpoint        // to delete; nil when none
	Exports  []*apiv1.ServiceExport // to delete
	// Already says the node was revoked before: nothing is written.
	Already bool
}

// RevokeNode decides the revocation of node of cluster name, stored as c (nil when there is
// none): rec is the node's certificate record, ep its endpoint, exports every export of the
// mesh. A node the broker knows nothing of (no record, no endpoint) is *NotFoundError; a node
// whose certificate predates the records but that has an endpoint gets a revoked record.
func RevokeNode(name, node string, c *apiv1.Cluster, rec *apiv1.NodeCertificate, ep *apiv1.Endpoint, exports []*apiv1.ServiceExport, now time.Time) (NodeRevocation, error) {
	if err := validation.ValidateNodeName(node); err != nil {
		return NodeRevocation{}, invalid("node", node, err)
	}
	if c == nil {
		return NodeRevocation{}, clusterNotFound(name)
	}
	if rec != nil && rec.ClusterUid != c.Uid {
		rec = nil // of an earlier cluster of the same name
	}
	if rec == nil && ep == nil {
		key := store.NodeCertificateKey(name, node)
		return NodeRevocation{}, &NotFoundError{Kind: "node", Names: []string{key},
			Err: fmt.Errorf("node %q of cluster %q not found: the broker issued it no certificate and it has no endpoint", node, name)}
	}
	if rec != nil && rec.Revoked {
		return NodeRevocation{Node: rec, Already: true}, nil
	}
	out := &apiv1.NodeCertificate{Cluster: name, Node: node, ClusterUid: c.Uid}
	if rec != nil {
		out = proto.Clone(rec).(*apiv1.NodeCertificate)
	}
	out.Revoked, out.RevokedAt = true, timestamppb.New(now)
	out.MeshAddress = "" // released: another node may have it
	r := NodeRevocation{Node: out, Endpoint: ep}
	for _, e := range exports {
		if e.GetCluster() == name && e.GetNode() == node {
			r.Exports = append(r.Exports, e)
		}
	}
	return r, nil
}

// CAOverlap is how long the previous CA stays trusted after a rotation asked for with
// overlapSeconds: def for 0, at least a minute, at most a year.
func CAOverlap(overlapSeconds int64, def time.Duration) (time.Duration, error) {
	v := fmt.Sprint(overlapSeconds)
	switch {
	case overlapSeconds == 0:
		return def, nil
	case overlapSeconds < 0:
		return 0, invalidf("overlap_seconds", v, "overlap_seconds %d is negative", overlapSeconds)
	case overlapSeconds < 60:
		return 0, invalidf("overlap_seconds", v, "overlap_seconds %d is shorter than a minute: agents need time to fetch the new CA and renew", overlapSeconds)
	case overlapSeconds > 366*24*3600:
		return 0, invalidf("overlap_seconds", v, "overlap_seconds %d is longer than a year", overlapSeconds)
	}
	return time.Duration(overlapSeconds) * time.Second, nil
}
