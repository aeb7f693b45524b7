// Package testbroker runs the real broker (broker.New) in-process for the agent's tests: over
// TLS on loopback, on a store.Memory that outlives restarts of the server, with its PKI, mesh
// secret and admin credential in a temporary data dir. Everything the agent meets is the
// broker's own: joins, certificates, renewals, CA rotation, revocation, endpoint leases, the
// watch and the imports it derives from exports.
//
// What a test drives besides the agent under test, it drives as the broker would see it:
// clusters, policies and the endpoints and exports of simulated remote gateways are written to
// the broker's store (mesh.go), as the broker's admission writes them; join tokens are signed
// with the broker's token key and recorded as CreateJoinToken records them; CA rotation and
// revocation go through the real Admin API (certs.go). What no broker does (refusing a call it
// would answer, answering as an older broker, holding back the imports, counting calls) is a
// gRPC interceptor around the real services (knobs.go), given through broker.Config.
package testbroker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"

	_ "github.com/cablemesh/cablemesh/cable/specs" // the broker checks policies and endpoints against the drivers' specs

	"github.com/cablemesh/cablemesh/broker"
	"github.com/cablemesh/cablemesh/broker/store"
)

// Options are what a test chooses when it makes the broker.
type Options struct {
	// CertLifetime is broker.Config.AgentCertificateLifetime (0: the broker's default).
	CertLifetime time.Duration
}

// Broker is the real broker, restartable on the same state and address.
type Broker struct {
	t     testing.TB
	dir   string
	store *store.Memory
	opts  Options
	knobs *knobs

	mu     sync.Mutex
	srv    *broker.Server
	cancel context.CancelFunc
	done   chan error
	addr   string
	// simulatedVIPs are the VIP records SetImports wrote (namespace/name).
	simulatedVIPs map[string]bool
}

// New makes a broker with no clusters and an empty data dir. Start it with Start; the test's
// cleanup stops it.
func New(t testing.TB, o Options) *Broker {
	t.Helper()
	b := &Broker{t: t, dir: t.TempDir(), store: store.NewMemory(store.Options{}), opts: o}
	b.knobs = newKnobs(func(method string, err error) {
		if testing.Verbose() {
			t.Logf("broker: refused %s: %v", method, err)
		}
	})
	t.Cleanup(func() {
		b.Stop()
		b.store.Close()
	})
	return b
}

// keepOpen is the store as each server gets it: a server closes its store when it stops, and
// the next one (a restart) serves the same state.
type keepOpen struct{ store.Store }

func (keepOpen) Close() error { return nil }

// Start serves on addr ("127.0.0.1:0" for any port; the previous address to restart): a new
// server on the same data dir (CA, token key, mesh secret) and the same store.
func (b *Broker) Start(addr string) error {
	cfg := broker.Config{
		DataDir: b.dir, Listen: addr, Store: keepOpen{b.store}, Logger: b.logger(),
		AgentCertificateLifetime: b.opts.CertLifetime,
		UnaryInterceptors:        []grpc.UnaryServerInterceptor{b.knobs.unary},
		StreamInterceptors:       []grpc.StreamServerInterceptor{b.knobs.stream},
	}
	srv, err := broker.New(context.Background(), cfg)
	if err != nil {
		return fmt.Errorf("testbroker: make the broker: %w", err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		srv.Close()
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, lis) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		cancel()
		return fmt.Errorf("testbroker: serve: %w", err)
	}
	b.mu.Lock()
	b.srv, b.cancel, b.done, b.addr = srv, cancel, done, lis.Addr().String()
	b.mu.Unlock()
	return nil
}

// logger writes the broker's log to the test's log with -v, else nowhere.
func (b *Broker) logger() *slog.Logger {
	var w io.Writer = io.Discard
	if testing.Verbose() {
		w = testLog{b.t}
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testLog struct{ t testing.TB }

func (l testLog) Write(p []byte) (int, error) {
	l.t.Log("broker: " + strings.TrimSpace(string(p)))
	return len(p), nil
}

// Addr is where the broker listens (or last listened).
func (b *Broker) Addr() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.addr
}

// Stop stops the server as the broker stops (its watches end) and keeps its state for Start.
func (b *Broker) Stop() {
	b.mu.Lock()
	srv, cancel, done := b.srv, b.cancel, b.done
	b.srv = nil
	b.mu.Unlock()
	if srv == nil {
		return
	}
	cancel()
	if err := <-done; err != nil {
		b.t.Errorf("testbroker: serve: %v", err)
	}
	srv.Close()
}

// String describes the broker for test logs.
func (b *Broker) String() string {
	return fmt.Sprintf("testbroker(%s, rev %d)", b.Addr(), b.Revision())
}

// readFile reads a file of the broker's data dir.
func (b *Broker) readFile(name string) []byte {
	data, err := os.ReadFile(b.dir + "/" + name)
	if err != nil {
		panic(fmt.Sprintf("testbroker: read %s: %v", name, err))
	}
	return data
}
