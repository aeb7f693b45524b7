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
	// certificates (0: the broker's, pki.Validity), the good serials of each node (newest first,
	// at most two), revoked nodes, and the serial of each node's last authenticated call.
	pki          *pki.PKI
	certLifetime time.Duration
	goodSerials  map[string][]string
	revoked      map[string]bool
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
		goodSerials: map[string][]string{}, revoked: map[string]bool{}, lastSerial: map[string]string{}}, nil
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

// Revoke revokes every certificate of cluster/node: its calls are refused, its watch ends.
func (b *Broker) Revoke(cluster, node string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.revoked[cluster+"/"+node] = true
	close(b.changed)
	b.changed = make(chan struct{})
}

// LastSerial is the serial (hex) of the certificate of cluster/node's last authenticated call.
func (b *Broker) LastSerial(cluster, node string) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.lastSerial[cluster+"/"+node]
}

// GoodSerials are the serials of cluster/node's certificates the broker accepts, newest first.
func (b *Broker) GoodSerials(cluster, node string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.goodSerials[cluster+"/"+node]...)
}

// issueLocked issues an agent certificate for the CSR from the issuing CA, in the broker's
// format (pki.IssueAgent), and records it as the node's newest good certificate (keep: how many
// of the node's earlier ones stay good).
func (b *Broker) issueLocked(csrPEM []byte, cluster, node string, keep int) (*x509.Certificate, []byte, error) {
	certPEM, cert, err := b.pki.IssueAgent(csrPEM, cluster, clusterUID(cluster), node, time.Now())
	if err != nil {
		return nil, nil, status.Errorf(codes.InvalidArgument, "bad CSR: %v", err)
	}
	if b.certLifetime > 0 {
		if certPEM, cert, err = b.shortenLocked(cert); err != nil {
			return nil, nil, status.Error(codes.Internal, err.Error())
		}
	}
	key := cluster + "/" + node
	good := append([]string{pki.Serial(cert)}, b.goodSerials[key][:min(keep, len(b.goodSerials[key]))]...)
	b.goodSerials[key] = good
	return cert, certPEM, nil
}

// shortenLocked is cert issued again, the same but for its NotAfter: certLifetime from now.
// The broker's certificates all last pki.Validity; a renewal test cannot wait that long.
func (b *Broker) shortenLocked(cert *x509.Certificate) ([]byte, *x509.Certificate, error) {
	tmpl := *cert
	tmpl.NotAfter = time.Now().Add(b.certLifetime)
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
	delete(b.revoked, req.GetCluster()+"/"+req.GetNode())
	cert, certPEM, err := b.issueLocked(req.GetCsrPem(), req.GetCluster(), req.GetNode(), 0)
	if err != nil {
		return nil, err
	}
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
// CA; the certificate renewed with stays good, any older one does not.
func (b *Broker) RenewCertificate(ctx context.Context, req *apiv1.RenewCertificateRequest) (*apiv1.RenewCertificateResponse, error) {
	cluster, node, err := b.identity(ctx)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	cert, certPEM, err := b.issueLocked(req.GetCsrPem(), cluster, node, 1)
	if err != nil {
		return nil, err
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

// identity returns the cluster and node of the caller's client certificate (pki.IdentityOf),
// refusing it as the real broker does when the node was revoked or the certificate is no longer
// one of its good ones.
func (b *Broker) identity(ctx context.Context) (cluster, node string, err error) {
	leaf, err := clientCert(ctx)
	if err != nil {
		return "", "", err
	}
	id, err := pki.IdentityOf(leaf)
	if err != nil || id.Admin {
		return "", "", status.Errorf(codes.Unauthenticated, "not an agent certificate: %v", err)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkLocked(id.Cluster, id.Node, id.Serial); err != nil {
		return "", "", err
	}
	b.lastSerial[id.Cluster+"/"+id.Node] = id.Serial
	return id.Cluster, id.Node, nil
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

// checkLocked refuses a revoked node's certificates and those it no longer lists.
func (b *Broker) checkLocked(cluster, node, serial string) error {
	key := cluster + "/" + node
	switch good := b.goodSerials[key]; {
	case b.revoked[key]:
		return status.Errorf(codes.Unauthenticated, "the certificate of %s was revoked at %s (cablectl cluster revoke-node); join again with a new token",
			key, time.Now().UTC().Format(time.RFC3339))
	case len(good) > 0 && !slices.Contains(good, serial):
		return status.Errorf(codes.Unauthenticated, "the certificate of %s (serial %s) is no longer good: the node joined again or renewed its certificate since; use its current certificate or join again with a new token", key, serial)
	}
	return nil
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
	caller, node, err := b.identity(stream.Context())
	if err != nil {
		return err
	}
	leaf, err := clientCert(stream.Context())
	if err != nil {
		return err
	}
	serial := pki.Serial(leaf)
	ctx := stream.Context()
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
	first := &apiv1.WatchResponse{Snapshot: batch.Snapshot, Revision: batch.Revision, Events: forCallerAll(batch.Events, caller)}
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
			evs, sent = batch.Events, batch.Revision
		case <-changed:
		}
		b.mu.Lock()
		if err := b.checkLocked(caller, node, serial); err != nil {
			b.mu.Unlock()
			return err
		}
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
