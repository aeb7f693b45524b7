// Package fakebroker is an in-test broker: a real gRPC server over TLS on loopback that speaks
// the Agent service of api/v1 with the agreed wire facts (serving chain [leaf, CA], leaf SAN
// apiv1.BrokerServerName, client certificates verified if given), join tokens, and the broker's
// store (store.Memory) of clusters, endpoints and policies, whose changes tests drive directly
// and which the watches follow as the broker's do. Its key material is the broker's
// own (broker/pki): the mesh CA, the serving certificate, the token key, agent and ingress
// certificates in the broker's format, and a CA rotation with an overlap (RotateCA,
// FinishRotation) that serves from the previous CA until it finishes. Like the real broker it
// keeps, per node, the certificates that are good (the newest and the one it was renewed with),
// renews them (RenewCertificate), revokes them (Revoke) and sends the CA bundle on the watch.
// What the real broker cannot do for a test, it adds: certificates of a short lifetime
// (SetCertLifetime), refused calls (RefuseJoins, SetRenewError, ActAsOldBroker), imports set
// directly (SetImports).
//
// It is not the real broker run in-process: the broker package registers the real cable drivers
// (broker/policies.go), whose names the agent tests give their fake drivers, and it admits only
// what a real agent sends (single-use join tokens, no second join of a node with a live
// certificate, imports derived from exports), where these tests drive the mesh directly.
package fakebroker

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/watchzstd"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/broker/store"
)

// serverIPs are the addresses the serving certificate names besides apiv1.BrokerServerName.
var serverIPs = []net.IP{net.IPv4(127, 0, 0, 1).To4(), net.IPv6loopback}

// rotationOverlap is how long the previous CA stays trusted after RotateCA, as the bundle says.
const rotationOverlap = time.Hour

// withPKIDir runs f on a directory of its own, removed after: broker/pki writes the files of
// the material it creates, which the fake keeps in memory only.
func withPKIDir(f func(dir string) error) error {
	dir, err := os.MkdirTemp("", "fakebroker-pki-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	return f(dir)
}

// clusterUID is the UID the fake gives cluster in tokens and certificates.
func clusterUID(cluster string) string { return "uid-" + cluster }

// Broker is the fake broker's state and its (restartable) gRPC server.
type Broker struct {
	apiv1.UnimplementedAgentServer

	// store holds the clusters, endpoints and policies; a watch follows its commits.
	store *store.Memory

	mu sync.Mutex
	// changed is closed and replaced on every change a watch sends that is not the store's
	// (imports, the CA bundle, a revocation).
	changed chan struct{}
	// Services: what each node exported (by cluster/node), the imports each cluster's agents
	// get (set by the test), and the requests seen.
	exports        map[string][]*apiv1.ServiceExport
	imports        map[string]*apiv1.ServiceImports
	importsVersion uint64
	importsHeld    bool // HoldImports: watches send no imports until ReleaseImports
	exportsErr     error
	conflicts      []*apiv1.ServiceConflict

	// Certificates: the key material (a rotation replaces it), the lifetime of agent
	// certificates (0: the broker's, pki.Validity), and the serial of each node's last
	// authenticated call. Which certificates of a node are good is its record in the store
	// (apiv1.NodeCertificate), which the broker's rules (broker/admission) keep and check.
	pki          *pki.PKI
	certLifetime time.Duration
	lastSerial   map[string]string
	caVersion    uint64

	// knobs refuse calls and count those that succeeded (knobs.go).
	knobs *knobs

	srv  *grpc.Server
	lis  net.Listener
	addr string
}

// New makes a broker with no clusters. Start it with Start.
func New() (*Broker, error) {
	var p *pki.PKI
	err := withPKIDir(func(dir string) (err error) {
		p, _, err = pki.LoadOrCreate(dir, serverIPs, time.Now())
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Broker{pki: p, store: store.NewMemory(store.Options{}), knobs: newKnobs(),
		exports: map[string][]*apiv1.ServiceExport{}, imports: map[string]*apiv1.ServiceImports{}, changed: make(chan struct{}),
		lastSerial: map[string]string{}}, nil
}

// Start serves on addr ("127.0.0.1:0" for any port; the previous address to restart).
func (b *Broker) Start(addr string) error {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// Every handshake reads the current CAs: a rotation needs no restart.
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		MinVersion:         tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return b.serverTLS(), nil },
	})), grpc.UnaryInterceptor(b.knobs.unary), grpc.StreamInterceptor(b.knobs.stream))
	apiv1.RegisterAgentServer(srv, b)
	b.mu.Lock()
	b.srv, b.lis, b.addr = srv, lis, lis.Addr().String()
	b.mu.Unlock()
	go func() { _ = srv.Serve(lis) }()
	return nil
}

// Addr is where the broker listens (or last listened).
func (b *Broker) Addr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.addr
}

// Stop ends the server and every stream, as a dying broker would.
func (b *Broker) Stop() {
	b.mu.Lock()
	srv := b.srv
	b.srv = nil
	b.mu.Unlock()
	if srv != nil {
		srv.Stop()
	}
}

// serverTLS is the TLS configuration of the next handshake: the serving certificate, and
// client certificates of every trusted CA.
func (b *Broker) serverTLS() *tls.Config {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &tls.Config{
		Certificates: []tls.Certificate{b.pki.ServerTLS},
		ClientAuth:   tls.VerifyClientCertIfGiven,
		ClientCAs:    b.pki.CAPool(),
		MinVersion:   tls.VersionTLS12,
	}
}

// bundleLocked is the CA bundle clients are told of, as the broker makes it: every trusted CA,
// the serving one first, the issuing one named.
func (b *Broker) bundleLocked() *apiv1.CABundle {
	out := &apiv1.CABundle{Pem: slices.Clone(b.pki.CAPEM), IssuingCa: b.pki.IssuerHash()}
	if b.pki.Previous != nil {
		out.PreviousTrustedUntil = timestamppb.New(b.pki.PreviousUntil)
	}
	return out
}

// Bundle is the CA bundle the broker sends now.
func (b *Broker) Bundle() *apiv1.CABundle {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bundleLocked()
}

// IssuingCA is the CA new certificates come from.
func (b *Broker) IssuingCA() *x509.Certificate {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pki.CACert
}

// CAHash is the fingerprint join tokens pin: the serving CA's.
func (b *Broker) CAHash() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pki.CAHash()
}

// SetCertLifetime sets how long the agent certificates issued from now on last (default the
// broker's, pki.Validity), for tests of their renewal.
func (b *Broker) SetCertLifetime(d time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.certLifetime = d
}

// RotateCA starts a rotation as the broker does (pki.Rotate): a new CA issues every certificate
// from now on, both are trusted, the old one still serves; watches get the new bundle.
func (b *Broker) RotateCA() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	err := withPKIDir(func(dir string) error {
		p, err := b.pki.Rotate(dir, time.Now(), rotationOverlap)
		if err == nil {
			b.pki = p
		}
		return err
	})
	if err != nil {
		return err
	}
	b.caChangedLocked()
	return nil
}

// FinishRotation ends the overlap (pki.FinishRotation): the new CA serves and is the only one
// trusted.
func (b *Broker) FinishRotation() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pki.Previous == nil {
		return
	}
	err := withPKIDir(func(dir string) error {
		p, err := b.pki.FinishRotation(dir, serverIPs, time.Now())
		if err == nil {
			b.pki = p
		}
		return err
	})
	if err != nil {
		panic(fmt.Sprintf("fakebroker: finish the CA rotation: %v", err)) // only a full disk gets here
	}
	b.caChangedLocked()
}

func (b *Broker) caChangedLocked() {
	b.caVersion++
	close(b.changed)
	b.changed = make(chan struct{})
}

// Revoke revokes every certificate of cluster/node as the broker does (admission.RevokeNode):
// its record says revoked, its endpoint is withdrawn; its calls are refused, its watch ends.
func (b *Broker) Revoke(cluster, node string) {
	b.update(func(tx store.Tx) error {
		c, err := tx.Cluster(cluster)
		if err != nil {
			return err
		}
		if c == nil {
			c = &apiv1.Cluster{Name: cluster}
		}
		c = proto.Clone(c).(*apiv1.Cluster)
		c.Uid = clusterUID(cluster) // the incarnation the fake's certificates name
		rec, err := tx.NodeCertificate(cluster, node)
		if err != nil {
			return err
		}
		ep, err := tx.Endpoint(cluster, node)
		if err != nil {
			return err
		}
		r, err := admission.RevokeNode(cluster, node, c, rec, ep, nil, time.Now())
		if err != nil || r.Already {
			return err
		}
		if r.Endpoint != nil {
			if err := tx.DeleteEndpoint(cluster, node); err != nil {
				return err
			}
		}
		return tx.PutNodeCertificate(r.Node)
	})
}

// LastSerial is the serial (hex) of the certificate of cluster/node's last authenticated call.
func (b *Broker) LastSerial(cluster, node string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastSerial[cluster+"/"+node]
}

// GoodSerials are the serials of cluster/node's certificates the broker accepts, newest first.
func (b *Broker) GoodSerials(cluster, node string) []string {
	var out []string
	b.view(func(tx store.ReadTx) error {
		rec, err := tx.NodeCertificate(cluster, node)
		if rec != nil && !rec.Revoked {
			for _, c := range rec.Certificates {
				out = append(out, c.Serial)
			}
		}
		return err
	})
	return out
}

// issueLocked issues an agent certificate for the CSR from the issuing CA, in the broker's
// format (pki.IssueAgent), and returns it with the record of it (admission.Issued).
func (b *Broker) issueLocked(csrPEM []byte, cluster, node string) (*x509.Certificate, []byte, *apiv1.IssuedCertificate, error) {
	certPEM, cert, err := b.pki.IssueAgent(csrPEM, cluster, clusterUID(cluster), node, time.Now())
	if err != nil {
		return nil, nil, nil, status.Errorf(codes.InvalidArgument, "bad CSR: %v", err)
	}
	if b.certLifetime > 0 {
		if certPEM, cert, err = b.shortenLocked(cert); err != nil {
			return nil, nil, nil, status.Error(codes.Internal, err.Error())
		}
	}
	return cert, certPEM, admission.Issued(cert, b.pki.IssuerHash(), ""), nil
}

// shortenLocked is cert issued again, the same but for its validity: from now (less a second)
// to certLifetime from now. The broker's certificates all last pki.Validity; a renewal test
// cannot wait that long, and the agent renews two thirds into a certificate's lifetime, so it
// must start now.
func (b *Broker) shortenLocked(cert *x509.Certificate) ([]byte, *x509.Certificate, error) {
	tmpl := *cert
	now := time.Now()
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Second), now.Add(b.certLifetime)
	der, err := x509.CreateCertificate(rand.Reader, &tmpl, b.pki.CACert, cert.PublicKey, b.pki.CAKey)
	if err != nil {
		return nil, nil, err
	}
	short, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), short, nil
}

// Token returns a join token for cluster, signed with the broker's token key, that expires
// after validFor (a negative one: already expired).
func (b *Broker) Token(cluster string, validFor time.Duration) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, err := jointoken.Sign(jointoken.Claims{Cluster: cluster, ClusterUID: clusterUID(cluster), Expires: time.Now().Add(validFor), CAHash: b.pki.CAHash(), Nonce: "n"}, b.pki.TokenKey)
	if err != nil {
		panic(err)
	}
	return t
}

// Revision is the store revision.
func (b *Broker) Revision() uint64 {
	var rev uint64
	b.view(func(tx store.ReadTx) error {
		rev = tx.Revision()
		return nil
	})
	return rev
}

// Endpoint returns a copy of a registered endpoint, or nil.
func (b *Broker) Endpoint(cluster, node string) *apiv1.Endpoint {
	var e *apiv1.Endpoint
	b.view(func(tx store.ReadTx) (err error) {
		e, err = tx.Endpoint(cluster, node)
		return err
	})
	return e
}

// view reads the store; it fails only on a closed store, which the fake never closes.
func (b *Broker) view(fn func(store.ReadTx) error) {
	if err := b.store.View(context.Background(), fn); err != nil {
		panic(fmt.Sprintf("fakebroker: read the store: %v", err))
	}
}

// update writes the store; it fails only on a record without its key (a test's mistake).
func (b *Broker) update(fn func(store.Tx) error) {
	if _, err := b.store.Update(context.Background(), fn); err != nil {
		panic(fmt.Sprintf("fakebroker: write the store: %v", err))
	}
}

// UpsertCluster stores a cluster record.
func (b *Broker) UpsertCluster(c *apiv1.Cluster) {
	b.update(func(tx store.Tx) error { return tx.PutCluster(c) })
}

// UpsertPolicy stores a connection policy record (Json is policy.ClusterConnectionPolicy as
// JSON; IsDefault marks the mesh default).
func (b *Broker) UpsertPolicy(p *apiv1.Policy) {
	b.update(func(tx store.Tx) error { return tx.PutPolicy(p) })
}

// DeletePolicy removes a policy.
func (b *Broker) DeletePolicy(name string) {
	b.update(func(tx store.Tx) error { return tx.DeletePolicy(name) })
}

// pskSecret is the fake mesh secret the pair PSKs derive from.
var pskSecret = []byte("fake mesh secret for pair psks")

// PairPSK is the pre-shared key of the pair (a, b) as the broker derives it:
// HMAC-SHA256(meshSecret, "cablemesh psk v1|" + min + "|" + max).
func PairPSK(a, b string) []byte {
	if b < a {
		a, b = b, a
	}
	m := hmac.New(sha256.New, pskSecret)
	m.Write([]byte("cablemesh psk v1|" + a + "|" + b))
	return m.Sum(nil)
}

// forCaller returns ev as the agent of cluster caller receives it: every cluster record other
// than its own carries the pair's PSK.
func forCaller(ev *apiv1.Event, caller string) *apiv1.Event {
	c := ev.GetResource().GetCluster()
	if c == nil || c.GetName() == caller {
		return ev
	}
	ev = proto.Clone(ev).(*apiv1.Event)
	ev.GetResource().GetCluster().PairPsk = PairPSK(caller, c.GetName())
	return ev
}

// agentEvents are the events of evs an agent receives: those of clusters, endpoints and
// policies (node certificate records stay at the broker).
func agentEvents(evs []*apiv1.Event) []*apiv1.Event {
	return slices.DeleteFunc(slices.Clone(evs), func(ev *apiv1.Event) bool {
		return ev.Kind != store.KindCluster && ev.Kind != store.KindEndpoint && ev.Kind != store.KindPolicy
	})
}

func forCallerAll(evs []*apiv1.Event, caller string) []*apiv1.Event {
	out := make([]*apiv1.Event, len(evs))
	for i, ev := range evs {
		out[i] = forCaller(ev, caller)
	}
	return out
}

// UpsertEndpoint stores an endpoint record.
func (b *Broker) UpsertEndpoint(e *apiv1.Endpoint) {
	b.update(func(tx store.Tx) error { return tx.PutEndpoint(e) })
}

// DeleteEndpoint withdraws an endpoint, as a lease expiry would.
func (b *Broker) DeleteEndpoint(cluster, node string) {
	b.update(func(tx store.Tx) error { return tx.DeleteEndpoint(cluster, node) })
}

// Join implements the agent's first call.
func (b *Broker) Join(_ context.Context, req *apiv1.JoinRequest) (*apiv1.JoinResponse, error) {
	b.mu.Lock()
	tokenKey := b.pki.TokenKey
	b.mu.Unlock()
	claims, err := jointoken.Verify(req.GetToken(), tokenKey, time.Now())
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	if claims.Cluster != req.GetCluster() {
		return nil, status.Errorf(codes.PermissionDenied, "token is for cluster %q, not %q", claims.Cluster, req.GetCluster())
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cert, certPEM, issued, err := b.issueLocked(req.GetCsrPem(), req.GetCluster(), req.GetNode())
	if err != nil {
		return nil, err
	}
	// The node's record holds the new certificate only: every earlier one (and a revocation)
	// is gone, as after the broker's join.
	b.update(func(tx store.Tx) error {
		return tx.PutNodeCertificate(&apiv1.NodeCertificate{Cluster: req.GetCluster(), Node: req.GetNode(), ClusterUid: clusterUID(req.GetCluster()),
			Certificates: []*apiv1.IssuedCertificate{issued}})
	})
	var c *apiv1.Cluster
	b.view(func(tx store.ReadTx) (err error) {
		c, err = tx.Cluster(req.GetCluster())
		return err
	})
	if c == nil {
		c = &apiv1.Cluster{Name: req.GetCluster()}
	}
	bundle := b.bundleLocked()
	return &apiv1.JoinResponse{
		CertificatePem: certPEM,
		CaPem:          bundle.Pem,
		Cluster:        c,
		NotAfter:       timestamppb.New(cert.NotAfter),
		Ca:             bundle,
	}, nil
}

// RenewCertificate issues a new certificate of the caller's cluster and node from the issuing
// CA; the certificate renewed with stays good, any older one does not (admission.Renew).
func (b *Broker) RenewCertificate(ctx context.Context, req *apiv1.RenewCertificateRequest) (*apiv1.RenewCertificateResponse, error) {
	id, err := b.caller(ctx)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cert, certPEM, issued, err := b.issueLocked(req.GetCsrPem(), id.Cluster, id.Node)
	if err != nil {
		return nil, err
	}
	_, err = b.store.Update(ctx, func(tx store.Tx) error {
		rec, err := tx.NodeCertificate(id.Cluster, id.Node)
		if err != nil {
			return err
		}
		ep, err := tx.Endpoint(id.Cluster, id.Node)
		if err != nil {
			return err
		}
		r, err := admission.Renew(id, rec, ep, issued)
		if err != nil {
			return err
		}
		if r.Endpoint != nil {
			if err := tx.PutEndpoint(r.Endpoint); err != nil {
				return err
			}
		}
		return tx.PutNodeCertificate(r.Node)
	})
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	bundle := b.bundleLocked()
	return &apiv1.RenewCertificateResponse{CertificatePem: certPEM, CaPem: bundle.Pem, NotAfter: timestamppb.New(cert.NotAfter), Ca: bundle}, nil
}

// IssueIngressCertificate issues an ingress serving certificate for the caller's node from the
// issuing CA, as the broker does (pki.IssueIngress).
func (b *Broker) IssueIngressCertificate(ctx context.Context, req *apiv1.IssueIngressCertificateRequest) (*apiv1.IssueIngressCertificateResponse, error) {
	cluster, node, err := b.identity(ctx)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	certPEM, cert, err := b.pki.IssueIngress(req.GetCsrPem(), cluster, node, time.Now())
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "bad CSR: %v", err)
	}
	return &apiv1.IssueIngressCertificateResponse{CertificatePem: certPEM, NotAfter: timestamppb.New(cert.NotAfter)}, nil
}

// identity returns the cluster and node of the caller (see caller).
func (b *Broker) identity(ctx context.Context) (cluster, node string, err error) {
	id, err := b.caller(ctx)
	return id.Cluster, id.Node, err
}

// caller is the identity of the caller's client certificate (pki.IdentityOf), refused as the
// broker refuses it (admission.AgentCertificate) when the node was revoked or the certificate is
// no longer one of its good ones.
func (b *Broker) caller(ctx context.Context) (pki.Identity, error) {
	leaf, err := clientCert(ctx)
	if err != nil {
		return pki.Identity{}, err
	}
	id, err := pki.IdentityOf(leaf)
	if err != nil || id.Admin {
		return pki.Identity{}, status.Errorf(codes.Unauthenticated, "not an agent certificate: %v", err)
	}
	if err := b.checkCertificate(ctx, id); err != nil {
		return pki.Identity{}, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastSerial[id.Cluster+"/"+id.Node] = id.Serial
	return id, nil
}

// checkCertificate checks id's certificate against its node's record, and writes the record
// when the check changes it (a certificate's first use), as the broker does on every call.
func (b *Broker) checkCertificate(ctx context.Context, id pki.Identity) error {
	_, err := b.store.Update(ctx, func(tx store.Tx) error {
		rec, err := tx.NodeCertificate(id.Cluster, id.Node)
		if err != nil {
			return err
		}
		changed, err := admission.AgentCertificate(id, rec, "", time.Now())
		if err != nil || changed == nil {
			return err
		}
		return tx.PutNodeCertificate(changed)
	})
	if err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	return nil
}

// clientCert is the verified client certificate of the call.
func clientCert(ctx context.Context) (*x509.Certificate, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 {
		return nil, status.Error(codes.Unauthenticated, "a client certificate is required")
	}
	return ti.State.VerifiedChains[0][0], nil
}

// RegisterEndpoint stores the caller's endpoint.
func (b *Broker) RegisterEndpoint(ctx context.Context, req *apiv1.RegisterEndpointRequest) (*apiv1.RegisterEndpointResponse, error) {
	cluster, node, err := b.identity(ctx)
	if err != nil {
		return nil, err
	}
	e := req.GetEndpoint()
	if e.GetCluster() != cluster || e.GetNode() != node {
		return nil, status.Errorf(codes.PermissionDenied, "agent %s/%s may not register %s/%s", cluster, node, e.GetCluster(), e.GetNode())
	}
	b.UpsertEndpoint(e)
	return &apiv1.RegisterEndpointResponse{Endpoint: e, LeaseSeconds: req.GetLeaseSeconds()}, nil
}

// Heartbeat renews the caller's endpoint; NotFound when it is not registered.
func (b *Broker) Heartbeat(ctx context.Context, req *apiv1.HeartbeatRequest) (*apiv1.HeartbeatResponse, error) {
	cluster, node, err := b.identity(ctx)
	if err != nil {
		return nil, err
	}
	if b.Endpoint(cluster, node) == nil {
		return nil, status.Errorf(codes.NotFound, "endpoint %s/%s is not registered", cluster, node)
	}
	return &apiv1.HeartbeatResponse{Revision: b.Revision()}, nil
}

// Watch sends a snapshot (or the deltas after since_revision) as the store's watch gives it,
// then every commit, and the imports and the CA bundle when they change.
func (b *Broker) Watch(req *apiv1.WatchRequest, stream grpc.ServerStreamingServer[apiv1.WatchResponse]) error {
	ctx := stream.Context()
	id, err := b.caller(ctx)
	if err != nil {
		return err
	}
	caller := id.Cluster
	w, err := b.store.Watch(ctx, req.GetSinceRevision())
	if err != nil {
		return status.Error(codes.Unavailable, err.Error())
	}
	var batch store.Batch
	select {
	case <-ctx.Done():
		return nil
	case batch = <-w.C():
	}
	b.mu.Lock()
	first := &apiv1.WatchResponse{Snapshot: batch.Snapshot, Revision: batch.Revision, Events: forCallerAll(agentEvents(batch.Events), caller)}
	sent := batch.Revision
	changed := b.changed
	sentImports := b.importsVersion
	if req.GetWantImports() && !b.importsHeld {
		first.Imports = b.importsForLocked(caller)
	} else {
		sentImports = notSent
	}
	first.Ca = b.bundleLocked()
	sentCA := b.caVersion
	b.mu.Unlock()
	// As the broker does, a large message goes compressed to an agent that accepts it.
	if slices.Contains(req.GetAcceptEncodings(), watchzstd.Name) {
		if first, err = b.compressed(first); err != nil {
			return err
		}
	}
	if err := stream.Send(first); err != nil {
		return err
	}
	for {
		var evs []*apiv1.Event
		select {
		case <-ctx.Done():
			return nil
		case batch, ok := <-w.C():
			if !ok {
				return status.Error(codes.Unavailable, fmt.Sprintf("watch ended: %v", w.Err()))
			}
			evs, sent = agentEvents(batch.Events), batch.Revision
		case <-changed:
		}
		// A watch ends once its certificate is no longer good (a revocation, a join since).
		if err := b.checkCertificate(ctx, id); err != nil {
			return err
		}
		b.mu.Lock()
		changed = b.changed
		var imps *apiv1.ServiceImports
		if req.GetWantImports() && !b.importsHeld && b.importsVersion != sentImports {
			imps = b.importsForLocked(caller)
			sentImports = b.importsVersion
		}
		var ca *apiv1.CABundle
		if b.caVersion != sentCA {
			ca, sentCA = b.bundleLocked(), b.caVersion
		}
		b.mu.Unlock()
		if len(evs) == 0 && imps == nil && ca == nil {
			continue
		}
		if err := stream.Send(&apiv1.WatchResponse{Revision: sent, Events: forCallerAll(evs, caller), Imports: imps, Ca: ca}); err != nil {
			return err
		}
	}
}

// compressed is resp as the broker sends it to an agent that accepts zstd: only its encoded
// field, when compressing makes it smaller.
func (b *Broker) compressed(resp *apiv1.WatchResponse) (*apiv1.WatchResponse, error) {
	raw, err := proto.Marshal(resp)
	if err != nil {
		return nil, err
	}
	msg := watchzstd.Encode(raw)
	if len(msg) == len(raw) {
		return resp, nil
	}
	out := &apiv1.WatchResponse{}
	if err := proto.Unmarshal(msg, out); err != nil {
		return nil, err
	}
	return out, nil
}

// String describes the broker for test logs.
func (b *Broker) String() string {
	return fmt.Sprintf("fakebroker(%s, rev %d)", b.Addr(), b.Revision())
}

// importsForLocked is a copy of the imports of cluster's agents (an empty set when none).
func (b *Broker) importsForLocked(cluster string) *apiv1.ServiceImports {
	if imps := b.imports[cluster]; imps != nil {
		return proto.Clone(imps).(*apiv1.ServiceImports)
	}
	return &apiv1.ServiceImports{}
}

// SetImports sets the imports the agents of cluster get, and sends them on their watches.
func (b *Broker) SetImports(cluster string, imports ...*apiv1.ServiceImport) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.imports[cluster] = &apiv1.ServiceImports{Imports: imports}
	b.importsVersion++
	close(b.changed)
	b.changed = make(chan struct{})
}

// notSent is the imports version of a watch that has sent no imports yet.
const notSent = ^uint64(0)

// HoldImports makes watches send no imports, not even the first (empty) set, until
// ReleaseImports: a test can then see the agent before its imports are synced.
func (b *Broker) HoldImports() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.importsHeld = true
}

// ReleaseImports ends HoldImports and sends every watch its imports.
func (b *Broker) ReleaseImports() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.importsHeld = false
	close(b.changed)
	b.changed = make(chan struct{})
}

// SetExportsAnswer makes SetExports fail with err (nil: succeed), and answer conflicts.
func (b *Broker) SetExportsAnswer(err error, conflicts ...*apiv1.ServiceConflict) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.exportsErr, b.conflicts = err, conflicts
}

// SetExports stores the caller's exports (the broker's rule: its own cluster and node only).
func (b *Broker) SetExports(ctx context.Context, req *apiv1.SetExportsRequest) (*apiv1.SetExportsResponse, error) {
	cluster, node, err := b.identity(ctx)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.exportsErr != nil {
		return nil, b.exportsErr
	}
	var stored []*apiv1.ServiceExport
	for _, e := range req.GetExports() {
		if e.GetCluster() != cluster || e.GetNode() != node {
			return nil, status.Errorf(codes.PermissionDenied, "agent %s/%s may not export for %s/%s", cluster, node, e.GetCluster(), e.GetNode())
		}
		stored = append(stored, proto.Clone(e).(*apiv1.ServiceExport))
	}
	b.exports[cluster+"/"+node] = stored
	return &apiv1.SetExportsResponse{Exports: stored, Conflicts: b.conflicts, Revision: b.Revision()}, nil
}

// Exports returns what cluster/node last set, and how many SetExports calls succeeded.
func (b *Broker) Exports(cluster, node string) ([]*apiv1.ServiceExport, int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*apiv1.ServiceExport
	for _, e := range b.exports[cluster+"/"+node] {
		out = append(out, proto.Clone(e).(*apiv1.ServiceExport))
	}
	return out, b.knobs.count(apiv1.Agent_SetExports_FullMethodName)
}
