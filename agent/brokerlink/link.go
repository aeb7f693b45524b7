// Package brokerlink is the agent's link to the broker: it joins once (or loads the identity it
// got then), keeps the broker's state in a cache that survives restarts, watches the broker,
// registers and heartbeats a gateway's endpoint, renews the agent's certificate and follows the
// mesh CA bundle. It never tears anything down because the broker is unreachable: the cached
// state stands until the broker answers again.
//
// Locks: mu guards the fields below it. It is taken before (never under) the locks of the
// components the agent reads alongside the state (the ingress's mesh lock, for the plan's key);
// Read runs its function with mu held, so that function must take no lock that is ever held
// while calling into the Link.
package brokerlink

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/retry"
	"github.com/cablemesh/cablemesh/internal/syncloop"
)

// Deps are what the link takes from the rest of the agent.
type Deps struct {
	Log     *slog.Logger
	Backoff func() *retry.Backoff
	// Live is the live config in force: its imports.selector (a reload reopens the watch with
	// it) and its joinTokenFile (read before the first join).
	Live func() config.Live
	// Endpoint is this gateway's endpoint as it registers it; OnRegistered sees the broker's
	// answer (the mesh address it allocated).
	Endpoint     func() *apiv1.Endpoint
	OnRegistered func(*apiv1.Endpoint)
	// OnState is called after every watch message applied (the plan's inputs changed);
	// OnFirstMessage once a stream delivered its first message (the exports are sent again).
	OnState        func()
	OnFirstMessage func()
}

// Link is the component. Build with New; Start before the loops.
type Link struct {
	cfg  config.Static // broker, cluster, node, stateDir, gateway, timers
	deps Deps
	log  *slog.Logger

	wakeWatch syncloop.Trigger   // a successful register wakes a watch loop waiting out its backoff
	saver     *brokerstate.Saver // writes the state to the cache file, coalesced

	// Set by Start, before any loop runs; read without mu after.
	keyring *brokerclient.Keyring
	conn    *brokerConn
	redial  func() // makes the broker connection retry now
	clock   brokerClock
	// client is the client Dial made, for ReregisterNow from outside the link's loops (which
	// may run before Dial).
	client atomic.Pointer[apiv1.AgentClient]

	mu          sync.Mutex
	state       *brokerstate.State
	joinCluster *apiv1.Cluster // cluster record from Join, until the watch brings one
	watchUp     bool
	beatOK      bool
	lastContact time.Time
	lastErr     string
	cached      bool // running on state loaded from disk, not yet resynced
	certs       certState
	watch       watchState
}

// New returns the link of cfg.
func New(cfg config.Static, deps Deps) *Link {
	return &Link{cfg: cfg, deps: deps, log: deps.Log, state: brokerstate.New(), certs: certState{refusedCh: make(chan struct{})},
		saver: brokerstate.NewSaver(cfg.StateDir, brokerstate.DefaultSaveInterval, deps.Log)}
}

// Close writes the broker state the saver still holds, as the agent stops.
func (l *Link) Close() {
	if err := l.saver.Close(); err != nil {
		l.log.Error("cannot persist broker state on exit", "err", err)
	}
}

// Identify loads the agent's identity from the state dir, or joins the broker with the join
// token for one. It returns an error only when the node cannot join at all.
func (l *Link) Identify(ctx context.Context) error {
	id, err := l.identity(ctx)
	if err != nil {
		return err
	}
	l.keyring = brokerclient.NewKeyring(id)
	l.logCertificate(id)
	return nil
}

// LoadCache starts from the state cached on disk, if there is a readable one.
func (l *Link) LoadCache() {
	st, err := brokerstate.Load(l.cfg.StateDir)
	if err != nil {
		l.log.Warn("ignoring unreadable broker state cache; waiting for the broker", "err", err)
		return
	}
	if st == nil {
		return
	}
	l.mu.Lock()
	l.state, l.cached = st, true
	l.mu.Unlock()
	l.log.Info("loaded cached broker state", "revision", st.Revision, "clusters", len(st.Clusters), "endpoints", len(st.Endpoints))
}

// Dial opens the broker connection. Every handshake presents the keyring's certificate and
// verifies the broker with its CAs: a renewal or a new CA bundle needs no restart.
func (l *Link) Dial() (apiv1.AgentClient, func(), error) {
	cc, err := brokerclient.DialKeyring(l.cfg.Broker, l.keyring)
	if err != nil {
		return nil, nil, err
	}
	l.conn = newBrokerConn(cc)
	// Our loops pace the retries (watch backoff, heartbeat interval); gRPC's own reconnect
	// backoff would otherwise add its wait on top and delay the resync after an outage.
	l.redial = l.conn.ResetConnectBackoff
	client := apiv1.NewAgentClient(l.conn)
	l.client.Store(&client)
	return client, func() { _ = l.conn.Close() }, nil
}

// Read calls f with the cached state and the Join answer's cluster record, under the link's
// lock: f must not keep st nor change it.
func (l *Link) Read(f func(st *brokerstate.State, join *apiv1.Cluster)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f(l.state, l.joinCluster)
}

// PlanKey names the broker-side inputs of a plan without copying them; registered is the mesh
// address of the last registration (the ingress's), asked with the link's lock held.
func (l *Link) PlanKey(registered func() netip.Addr) plan.Key {
	l.mu.Lock()
	defer l.mu.Unlock()
	return plan.Key{State: l.state, Revision: l.state.Revision, Join: l.joinCluster, Registered: registered()}
}

// StateCopy is a copy of the cached state for the planner, with the key it was taken at.
func (l *Link) StateCopy(registered func() netip.Addr) (plan.Key, *brokerstate.State) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return plan.Key{State: l.state, Revision: l.state.Revision, Join: l.joinCluster, Registered: registered()}, l.state.Clone()
}

// LocalCluster is this node's cluster record: from the broker state, else from the Join answer.
func (l *Link) LocalCluster() *apiv1.Cluster {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c := l.state.Clusters[l.cfg.Cluster]; c != nil {
		return c
	}
	return l.joinCluster
}

// LocalSubnets are the CIDRs behind this node: the config's, else the cluster's at the broker.
func (l *Link) LocalSubnets() []netip.Prefix {
	cidrs := append(slices.Clone(l.cfg.PodCIDRs), l.cfg.ServiceCIDRs...)
	if len(cidrs) == 0 {
		if c := l.LocalCluster(); c != nil {
			cidrs = append(slices.Clone(c.GetPodCidrs()), c.GetServiceCidrs()...)
		}
	}
	return config.Prefixes(cidrs)
}

// LocalPodCIDRs are the pod CIDRs behind this node: the config's, else the cluster's.
func (l *Link) LocalPodCIDRs() []netip.Prefix {
	if len(l.cfg.PodCIDRs) > 0 {
		return config.Prefixes(l.cfg.PodCIDRs)
	}
	if c := l.LocalCluster(); c != nil {
		return config.Prefixes(c.GetPodCidrs())
	}
	return nil
}

// Keyring is the agent's identity (set by Identify).
func (l *Link) Keyring() *brokerclient.Keyring { return l.keyring }

// Generation names the broker connection in use (0 before Dial).
func (l *Link) Generation() uint64 {
	if l.conn == nil {
		return 0
	}
	return l.conn.generation()
}

// CertificateRefused is the broker's words once it refused this node's certificate for good.
func (l *Link) CertificateRefused() string { return l.certificateRefused() }

// RefusedForGood records err, got over connection gen, when the broker refused the certificate
// for good, and says whether it did.
func (l *Link) RefusedForGood(err error, gen uint64) bool { return l.refusedForGood(err, gen) }

// CABundle is the last CA bundle the broker sent (nil until one came).
func (l *Link) CABundle() *apiv1.CABundle { return l.caBundle() }

// Revision is the revision of the cached state.
func (l *Link) Revision() uint64 { return l.revision() }

// Apply applies one watch message (for tests that feed the state directly).
func (l *Link) Apply(resp *apiv1.WatchResponse) error { return l.apply(resp) }

// Status fills in the broker section of the status document and returns the link's problems
// (a refused or failing certificate).
func (l *Link) Status(b *statusapi.Broker) []statusapi.Problem {
	connected, rev, last, errMsg, cached := l.brokerStatus()
	b.Address, b.Connected, b.Revision, b.Error, b.Cached = l.cfg.Broker, connected, rev, errMsg, cached
	if !last.IsZero() {
		t := last.UTC()
		b.LastContact = &t
	}
	l.clock.fill(b)
	return l.certStatus(b)
}

// Register sends the endpoint now (a reload changed the drivers' ports).
func (l *Link) Register(ctx context.Context, client apiv1.AgentClient) error {
	return l.register(ctx, client)
}

// reregisterAttempts bounds the endpoint registrations a driver change makes at once; the
// heartbeat loop re-registers later if the broker forgot the endpoint meanwhile.
const reregisterAttempts = 5

// Reregister sends the endpoint again at once, so that the broker publishes the new cable ports;
// a failure is retried a few times, then left to the heartbeat loop.
func (l *Link) Reregister(ctx context.Context, client apiv1.AgentClient) {
	if client == nil {
		return
	}
	var err error
	for i := range reregisterAttempts {
		if err = l.register(ctx, client); err == nil || ctx.Err() != nil {
			return
		}
		if !retry.Sleep(ctx, time.Duration(i+1)*500*time.Millisecond) {
			return
		}
	}
	l.log.Warn("endpoint not re-registered after a driver change; the broker publishes the old ports until the next registration", "err", err)
}

// ReregisterNow is Reregister with the client Dial made; before Dial it does nothing (the first
// registration carries what changed).
func (l *Link) ReregisterNow(ctx context.Context) {
	if c := l.client.Load(); c != nil {
		l.Reregister(ctx, *c)
	}
}

// RunWatch, RunRegister and RunCertificates are the link's loops; each returns when ctx ends or
// the broker refused the certificate for good.
func (l *Link) RunWatch(ctx context.Context, client apiv1.AgentClient) { l.watchLoop(ctx, client) }
func (l *Link) RunRegister(ctx context.Context, client apiv1.AgentClient) {
	l.registerLoop(ctx, client)
}
func (l *Link) RunCertificates(ctx context.Context, client apiv1.AgentClient) {
	l.certLoop(ctx, client)
}
