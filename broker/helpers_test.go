package broker

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	_ "github.com/cablemesh/cablemesh/cable/specs" // the broker validates what endpoints publish per driver

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/adminconfig"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/store"
)

// clock is a settable clock for leases and token expiry. TLS still checks certificates against
// the real time, so tests only move it forward by seconds to minutes.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Now()} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

type testBroker struct {
	t     *testing.T
	dir   string
	addr  string
	srv   *Server
	stop  func()
	admin apiv1.AdminClient
	clock *clock
}

type brokerOpts struct {
	addr          string // listen here (for restarts on the same port); default 127.0.0.1:0
	clock         *clock
	durable       bool // keep the state in dir/broker.db (restarts); default a memory store
	storeOpt      store.Options
	defaultDriver string         // Config.DefaultCableDriver
	logTo         io.Writer      // also write the broker's log here (tests read it)
	vipRanges     []netip.Prefix // Config.ServiceVIPRanges
	selfAddrs     []netip.Addr   // Config.SelfAddresses
	watchBudget   int            // Config.WatchMessageBytes
	meshRange     netip.Prefix   // Config.MeshAddressRange
	exportQuota   admission.ExportQuota
	certLifetime  time.Duration                 // Config.AgentCertificateLifetime
	unary         []grpc.UnaryServerInterceptor // Config.UnaryInterceptors
	// wrapStore wraps the memory store (not a durable one) before the broker gets it.
	wrapStore func(store.Store) store.Store
}

// startBroker runs a real broker on loopback with real TLS, and an admin client from the
// admin.yaml it wrote. Its state is in memory unless o.durable.
func startBroker(t *testing.T, dir string, o brokerOpts) *testBroker {
	t.Helper()
	if o.addr == "" {
		o.addr = "127.0.0.1:0"
	}
	if o.clock == nil {
		o.clock = newClock()
	}
	var logw io.Writer = io.Discard
	if testing.Verbose() {
		logw = &tlog{t}
	}
	if o.logTo != nil {
		logw = io.MultiWriter(logw, o.logTo)
	}
	log := slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := Config{DataDir: dir, Listen: o.addr, Logger: log, Now: o.clock.Now, ReapInterval: 20 * time.Millisecond,
		StoreOptions: o.storeOpt, DefaultCableDriver: o.defaultDriver, ServiceVIPRanges: o.vipRanges, WatchMessageBytes: o.watchBudget,
		MeshAddressRange: o.meshRange}
	cfg.ExportQuota = o.exportQuota
	cfg.AgentCertificateLifetime, cfg.UnaryInterceptors = o.certLifetime, o.unary
	if o.selfAddrs != nil {
		cfg.SelfAddresses = func() ([]netip.Addr, error) { return o.selfAddrs, nil }
	}
	if !o.durable {
		cfg.Store = store.NewMemory(o.storeOpt)
	}
	if o.wrapStore != nil && cfg.Store != nil {
		cfg.Store = o.wrapStore(cfg.Store)
	}
	srv, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatalf("start broker: %v", err)
	}
	lis, err := net.Listen("tcp", o.addr)
	if err != nil {
		srv.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatalf("serve: %v", err)
	}
	var once sync.Once
	b := &testBroker{t: t, dir: dir, addr: lis.Addr().String(), srv: srv, clock: o.clock}
	b.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("serve: %v", err)
			}
			srv.Close()
		})
	}
	t.Cleanup(b.stop)
	b.admin = apiv1.NewAdminClient(dialAdmin(t, dir, b.addr))
	return b
}

type tlog struct{ t *testing.T }

func (l *tlog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// dialAdmin dials with DIR/admin.yaml, overriding the address (a test restarts on a new port).
func dialAdmin(t *testing.T, dir, addr string) *grpc.ClientConn {
	t.Helper()
	cfg, err := adminconfig.Load(dir + "/" + AdminConfigFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Broker = addr
	conn, err := adminconfig.Dial(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (b *testBroker) token(cluster string, pods ...string) string {
	b.t.Helper()
	resp, err := b.admin.CreateJoinToken(ctxT(b.t), &apiv1.CreateJoinTokenRequest{Cluster: cluster, PodCidrs: pods})
	if err != nil {
		b.t.Fatalf("create join token for %s: %v", cluster, err)
	}
	return resp.Token
}

// reap runs the lease reaper once at the test clock's time.
func (b *testBroker) reap() {
	b.t.Helper()
	if _, err := b.srv.reapExpired(ctxT(b.t), b.clock.Now()); err != nil {
		b.t.Fatalf("reap: %v", err)
	}
}

func (b *testBroker) list() *apiv1.ListClustersResponse {
	b.t.Helper()
	resp, err := b.admin.ListClusters(ctxT(b.t), &apiv1.ListClustersRequest{})
	if err != nil {
		b.t.Fatal(err)
	}
	return resp
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// agent is a test agent: its key, and after a successful join its certificate.
type agent struct {
	key     *ecdsa.PrivateKey
	cert    []byte
	ca      []byte
	cluster string
	node    string
}

// join performs the agreed agent flow: dial without a client certificate, pin the CA by the
// token's CAHash, send a CSR.
func join(t *testing.T, addr, token, cluster, node string) (*agent, error) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csrDER, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: node}}, key)
	if err != nil {
		t.Fatal(err)
	}
	want := ""
	if c, err := jointoken.Decode(token); err == nil {
		want = c.CAHash
	}
	tc := &tls.Config{
		InsecureSkipVerify: true, // replaced by the CA pin below
		VerifyPeerCertificate: func(raw [][]byte, _ [][]*x509.Certificate) error {
			if want == "" {
				return nil // an undecodable token: the test is about the broker refusing it
			}
			var ca *x509.Certificate
			for _, r := range raw {
				if jointoken.CAHash(r) == want {
					ca, _ = x509.ParseCertificate(r)
				}
			}
			if ca == nil || len(raw) == 0 {
				return errors.New("broker presented no CA matching the token's CAHash")
			}
			leaf, err := x509.ParseCertificate(raw[0])
			if err != nil {
				return err
			}
			return leaf.CheckSignatureFrom(ca)
		},
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	resp, err := apiv1.NewAgentClient(conn).Join(ctxT(t), &apiv1.JoinRequest{
		Token: token, Cluster: cluster, Node: node,
		CsrPem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: csrDER}),
	})
	if err != nil {
		return nil, err
	}
	return &agent{key: key, cert: resp.CertificatePem, ca: resp.CaPem, cluster: cluster, node: node}, nil
}

func mustJoin(t *testing.T, addr, token, cluster, node string) *agent {
	t.Helper()
	a, err := join(t, addr, token, cluster, node)
	if err != nil {
		t.Fatalf("join %s/%s: %v", cluster, node, err)
	}
	return a
}

// dial connects with the agent certificate, verifying the broker normally.
func (a *agent) dial(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	kder, _ := x509.MarshalECPrivateKey(a.key)
	cert, err := tls.X509KeyPair(a.cert, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(a.ca) {
		t.Fatal("no CA in join response")
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, ServerName: apiv1.BrokerServerName}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func (a *agent) client(t *testing.T, addr string) apiv1.AgentClient {
	return apiv1.NewAgentClient(a.dial(t, addr))
}

func endpoint(cluster, node, ip string, subnets ...string) *apiv1.Endpoint {
	return &apiv1.Endpoint{
		Cluster: cluster, Node: node, PrivateIp: ip,
		CablePorts:      map[string]uint32{"wireguard": 51820},
		CableAttributes: map[string]*apiv1.CableAttributes{"wireguard": {Values: map[string]string{"publicKey": "HIgo9xNzJMWLKASShiTqIybxZ0U3wGLiUeJ1PKf8ykw="}}},
		Drivers:         []string{"wireguard"},
		Subnets:         subnets,
	}
}

// wantCode checks an RPC error's code and that its message contains every fragment.
func wantCode(t *testing.T, err error, code codes.Code, fragments ...string) {
	t.Helper()
	st, _ := status.FromError(err)
	if err == nil || st.Code() != code {
		t.Fatalf("got %v, want code %s", err, code)
	}
	for _, f := range fragments {
		if !strings.Contains(st.Message(), f) {
			t.Fatalf("error %q does not contain %q", st.Message(), f)
		}
	}
}

// recv reads one watch message or fails after a timeout.
func recv(t *testing.T, s apiv1.Agent_WatchClient) *apiv1.WatchResponse {
	t.Helper()
	type res struct {
		m   *apiv1.WatchResponse
		err error
	}
	ch := make(chan res, 1)
	go func() {
		m, err := s.Recv()
		ch <- res{m, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatalf("watch recv: %v", r.err)
		}
		return r.m
	case <-time.After(10 * time.Second):
		t.Fatal("no watch message within 10s")
	}
	return nil
}

func keys(evs []*apiv1.Event) string {
	var parts []string
	for _, e := range evs {
		parts = append(parts, fmt.Sprintf("%s:%s:%s@%d", e.Type, e.Kind, e.Key, e.Revision))
	}
	return strings.Join(parts, " ")
}

func sameBytes(a, b []byte) bool { return bytes.Equal(a, b) }

// noCertConn verifies the broker but presents no client certificate.
func noCertConn(t *testing.T, addr string, caPEM []byte) *grpc.ClientConn {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	tc := &tls.Config{RootCAs: pool, ServerName: apiv1.BrokerServerName}
	conn, err := grpc.NewClient("passthrough:///"+addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}
