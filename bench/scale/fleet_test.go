//go:build bench

package scale

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/api/watchzstd"
	"github.com/cablemesh/cablemesh/internal/retry"
	"github.com/cablemesh/cablemesh/mcs"
)

// The agent's timings (agent/config defaults, agent/endpoint.go, agent/backoff.go).
const (
	heartbeatInterval = 10 * time.Second
	leaseSeconds      = 30
	callTimeout       = 10 * time.Second // RegisterEndpoint, Heartbeat, SetExports
	joinTimeout       = 15 * time.Second // brokerclient.Join's default
	minBackoff        = time.Second
	maxBackoff        = 15 * time.Second
)

// fleet is every simulated agent of one run and what they share.
type fleet struct {
	broker   string
	clusters []string
	epIndex  map[string]int32 // "cluster/node" → agent index
	clIndex  map[string]int32 // cluster name → index
	agents   []*simAgent
	jitter   bool // the agent's current heartbeat jitter (brokerclient.HeartbeatDelay)
	// firstDelay: the first registration waits up to a second at random, as cable-agent did up
	// to 98843a3 (previousFirstRegistrationDelay); acceptBusy: registrations honour the broker's
	// busy answers (brokerclient.AcceptBusy, BusyWait), as cable-agent does now.
	firstDelay bool
	acceptBusy bool
	zstd       bool // the agent accepts compressed watch messages (watchzstd), as cable-agent does
	// reports: the agent reports its links (Agent.ReportLinks), as cable-agent's linkreport
	// does on a gateway (reports.go); linkSets are each cluster's links, shared by its agents.
	reports   bool
	linkSets  linkSets
	frames    frameCache
	dialOpts  []grpc.DialOption
	t0        time.Time
	probe     atomic.Pointer[probe]
	epoch     atomic.Int32 // bumped before a broker restart: agents record their first message after it
	ctx       context.Context
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	beats     beatLog
	calls     callCounters
	regRevMax atomic.Uint64 // the highest revision a RegisterEndpoint answered with
}

// callCounters count the calls of every agent by outcome.
type callCounters struct {
	joins, joinErrors, joinDeadlines                   atomic.Int64
	registers, registerErrors, registerDeadlines       atomic.Int64
	registerBusy                                       atomic.Int64 // busy answers (not errors)
	heartbeats, heartbeatErrors, heartbeatDeadlines    atomic.Int64
	setExports, setExportsErrors, setExportsDeadlines  atomic.Int64
	watches, watchErrors, watchSnapshots, watchResumes atomic.Int64
	// busyWaitMs and busyWaitMaxMs sum and bound the waits the busy answers asked for
	// (brokerclient.BusyWait: the broker's hint, jittered), in milliseconds.
	busyWaitMs, busyWaitMaxMs atomic.Int64
	// Link reports: calls, those the broker dropped (its rate limit), errors, Unimplemented
	// answers (an older broker) and the bytes of the requests.
	reports, reportsDropped, reportErrors, reportsUnimplemented, reportBytes atomic.Int64

	// kinds counts the errors of calls other than deadlines, by method, code and message (its
	// first 100 bytes): the figures say how many failed, these say why.
	kindsMu sync.Mutex
	kinds   map[string]int
}

var addrPattern = regexp.MustCompile(`[0-9]+(\.[0-9]+){3}:[0-9]+`)

// busyWaited records the wait taken on one busy answer.
func (c *callCounters) busyWaited(d time.Duration) {
	ms := d.Milliseconds()
	c.busyWaitMs.Add(ms)
	for {
		cur := c.busyWaitMaxMs.Load()
		if ms <= cur || c.busyWaitMaxMs.CompareAndSwap(cur, ms) {
			return
		}
	}
}

// failed records err, an error of method that is not a deadline.
func (c *callCounters) failed(method string, err error) {
	if deadline(err) {
		return
	}
	st := status.Convert(err)
	msg := addrPattern.ReplaceAllString(st.Message(), "ADDR") // one kind, whatever the ports
	if len(msg) > 100 {
		msg = msg[:100]
	}
	c.kindsMu.Lock()
	defer c.kindsMu.Unlock()
	if c.kinds == nil {
		c.kinds = map[string]int{}
	}
	c.kinds[fmt.Sprintf("%s: %s: %s", method, st.Code(), msg)]++
}

// errorKinds lists the kinds of errors failed recorded, sorted, each as "N x KIND".
func (c *callCounters) errorKinds() []string {
	c.kindsMu.Lock()
	defer c.kindsMu.Unlock()
	kinds := make([]string, 0, len(c.kinds))
	for k, n := range c.kinds {
		kinds = append(kinds, fmt.Sprintf("%d x %s", n, k))
	}
	slices.Sort(kinds)
	return kinds
}

// beatLog records when every heartbeat started (per second since t0) and how long it took.
type beatLog struct {
	perSecond [7200]atomic.Int32
	mu        sync.Mutex
	latencies []beatSample
}

type beatSample struct {
	at  time.Time
	dur time.Duration
	err bool
}

// probe is one change being measured: every agent records when an event of kind and key first
// reaches it.
type probe struct {
	kind  string
	key   []byte
	start time.Time
	recv  []atomic.Int64 // unix nanos, by agent
}

// simAgent is one simulated gateway agent.
type simAgent struct {
	f         *fleet
	idx       int
	cluster   string
	node      string
	tokenFile string
	stateDir  string
	ep        *apiv1.Endpoint

	id     *brokerclient.Identity
	conn   *grpc.ClientConn
	client apiv1.AgentClient

	// Written by the agent's goroutines; read once the phase that writes them is over.
	joinStart, joinDone time.Time
	joinAttempts        int
	joinErr             error
	firstRegDur         atomic.Int64 // ns; 0 until the first RegisterEndpoint returned
	firstRegOK          atomic.Bool
	firstRegStart       time.Time    // the first RegisterEndpoint attempt (written by beat only)
	registeredAt        atomic.Int64 // unix ns of the first registration that succeeded; 0 until then
	registered          atomic.Bool
	watchUp             atomic.Bool
	wake                chan struct{}
	linksUp             chan struct{} // closed once the agent is current: its links are up
	timerMu             sync.Mutex
	timer               *time.Timer

	// The watch's state: only the watch goroutine (inside the codec) writes it.
	rev         atomic.Uint64
	eps         []uint64 // bitset by agent index
	epCount     int
	cls         []uint64 // bitset by cluster index
	clCount     int
	policies    int
	inSnapshot  bool
	streamEpoch int32 // the epoch the current stream was opened in
	gotOnStream bool

	firstMsgAt      atomic.Int64 // unix nanos of the first message of the first stream
	snapStart       time.Time    // when the stream that brought the first snapshot was opened
	snapBytes       atomic.Int64 // bytes of the first snapshot (all parts)
	snapEndpoints   atomic.Int64 // endpoints it held
	snapDoneAt      atomic.Int64
	currentAt       atomic.Int64 // unix nanos when it first held every endpoint and cluster
	resumedAt       atomic.Int64 // unix nanos of the first message after a restart
	resumedSnapshot atomic.Bool
	holdsAll        atomic.Bool // after the last complete message: every endpoint and cluster
	streamOpenedAt  time.Time
	msgs            atomic.Int64
	bytesIn         atomic.Int64
}

func newFleet(broker string, clusters []string, gateways int, tokenFiles []string, stateBase string, jitter bool) *fleet {
	f := &fleet{broker: broker, clusters: clusters, epIndex: map[string]int32{}, clIndex: map[string]int32{}, jitter: jitter}
	for ci, c := range clusters {
		f.clIndex[c] = int32(ci)
	}
	n := len(clusters) * gateways
	words := (n + 63) / 64
	cwords := (len(clusters) + 63) / 64
	for ci, c := range clusters {
		for g := range gateways {
			idx := len(f.agents)
			node := fmt.Sprintf("gw%02d", g+1)
			a := &simAgent{
				f: f, idx: idx, cluster: c, node: node, tokenFile: tokenFiles[ci],
				stateDir: filepath.Join(stateBase, c+"-"+node),
				ep:       endpointOf(c, node, ci+1, idx),
				wake:     make(chan struct{}, 1),
				linksUp:  make(chan struct{}),
				eps:      make([]uint64, words),
				cls:      make([]uint64, cwords),
			}
			f.epIndex[c+"/"+node] = int32(idx)
			f.agents = append(f.agents, a)
		}
	}
	return f
}

// podCIDR and serviceCIDR are cluster number n's (1..255).
func podCIDR(n int) string     { return fmt.Sprintf("10.%d.0.0/17", n) }
func serviceCIDR(n int) string { return fmt.Sprintf("10.%d.128.0/17", n) }

// endpointOf is a gateway's record as cable-agent publishes it with the wireguard driver.
func endpointOf(cluster, node string, n, idx int) *apiv1.Endpoint {
	key := make([]byte, 32)
	rand.Read(key)
	ep := &apiv1.Endpoint{
		Cluster:       cluster,
		Node:          node,
		PrivateIp:     fmt.Sprintf("100.64.%d.%d", idx/250, idx%250+1),
		Subnets:       []string{podCIDR(n), serviceCIDR(n)},
		Drivers:       []string{"wireguard"},
		CablePorts:    map[string]uint32{"wireguard": 51820},
		HealthCheckIp: fmt.Sprintf("10.%d.0.1", n),
	}
	ep.SetAttributes("wireguard", map[string]string{"publicKey": base64.StdEncoding.EncodeToString(key)})
	return ep
}

func (f *fleet) n() int { return len(f.agents) }

// start starts every agent at once.
func (f *fleet) start(parent context.Context) {
	f.ctx, f.cancel = context.WithCancel(parent)
	f.t0 = time.Now()
	for _, a := range f.agents {
		f.wg.Go(func() { a.run(f.ctx) })
	}
}

// stop ends every agent and waits for their goroutines.
func (f *fleet) stop() {
	f.cancel()
	for _, a := range f.agents {
		a.timerMu.Lock()
		if a.timer != nil {
			a.timer.Stop()
		}
		a.timerMu.Unlock()
	}
	f.wg.Wait()
	for _, a := range f.agents {
		if a.conn != nil {
			a.conn.Close()
		}
	}
}

// joinAll joins every agent at once; it fails with the first agent's error that retrying could
// not fix.
func (f *fleet) joinAll(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, a := range f.agents {
		wg.Go(func() { a.joinErr = a.join(ctx) })
	}
	wg.Wait()
	for _, a := range f.agents {
		if a.joinErr != nil {
			return fmt.Errorf("%s/%s: %w", a.cluster, a.node, a.joinErr)
		}
	}
	return nil
}

// run is the agent once it has joined: dial, register and heartbeat (on a timer), watch (this
// goroutine).
func (a *simAgent) run(ctx context.Context) {
	conn, err := brokerclient.Dial(a.f.broker, a.id, a.f.dialOpts...)
	if err != nil {
		a.joinErr = err
		return
	}
	a.conn = conn
	a.client = apiv1.NewAgentClient(conn)
	first := time.Duration(0)
	if a.f.firstDelay {
		first = previousFirstRegistrationDelay(heartbeatInterval)
	}
	a.timerMu.Lock()
	a.timer = time.AfterFunc(first, func() { a.beat(ctx, false) })
	a.timerMu.Unlock()
	if a.f.reports {
		a.f.wg.Go(func() { a.reportLoop(ctx) })
	}
	a.watchLoop(ctx)
}

// join is agent.identity: join, retrying transient failures with the agent's backoff.
func (a *simAgent) join(ctx context.Context) error {
	bo := retry.Backoff{Min: minBackoff, Max: maxBackoff}
	a.joinStart = time.Now()
	for {
		a.joinAttempts++
		a.f.calls.joins.Add(1)
		id, _, err := brokerclient.Join(ctx, brokerclient.JoinParams{
			Broker: a.f.broker, Cluster: a.cluster, Node: a.node, TokenFile: a.tokenFile, StateDir: a.stateDir,
		})
		if err == nil {
			a.id = id
			a.joinDone = time.Now()
			return nil
		}
		a.f.calls.joinErrors.Add(1)
		if status.Code(errors.Unwrap(err)) == codes.DeadlineExceeded || errors.Is(err, context.DeadlineExceeded) {
			a.f.calls.joinDeadlines.Add(1)
		}
		if brokerclient.Permanent(err) {
			return err
		}
		if !retry.Sleep(ctx, bo.Next()) {
			return ctx.Err()
		}
	}
}

// beat is one turn of agent.registerLoop: register until that succeeds, then heartbeat; a
// heartbeat the broker answers with NotFound registers again. It schedules the next turn.
func (a *simAgent) beat(ctx context.Context, redial bool) {
	if ctx.Err() != nil {
		return
	}
	if redial {
		a.conn.ResetConnectBackoff()
	}
	var err error
	justRegistered := false
	if !a.registered.Load() {
		err = a.register(ctx, a.ep)
		a.registered.Store(err == nil)
		justRegistered = err == nil
	} else if err = a.heartbeat(ctx); err != nil {
		a.registered.Store(false)
		if status.Code(err) == codes.NotFound {
			if err = a.register(ctx, a.ep); err == nil {
				a.registered.Store(true)
				justRegistered = true
			}
		}
	}
	if ctx.Err() != nil {
		return
	}
	if err == nil && !a.watchUp.Load() {
		select {
		case a.wake <- struct{}{}:
		default:
		}
	}
	d := heartbeatInterval
	busyWait, busy := brokerclient.BusyWait(err)
	switch {
	case busy:
		// The broker answered it has no room now: again when it said, on the same connection.
		d, err = busyWait, nil
		a.f.calls.busyWaited(busyWait)
	case a.f.jitter && justRegistered:
		d = brokerclient.AfterRegistrationDelay(heartbeatInterval)
	case a.f.jitter:
		d = brokerclient.HeartbeatDelay(heartbeatInterval)
	}
	a.timerMu.Lock()
	a.timer = time.AfterFunc(d, func() { a.beat(ctx, err != nil) })
	a.timerMu.Unlock()
}

func deadline(err error) bool { return status.Code(err) == codes.DeadlineExceeded }

func (a *simAgent) register(ctx context.Context, ep *apiv1.Endpoint) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	start := time.Now()
	if a.firstRegStart.IsZero() {
		a.firstRegStart = start
	}
	a.f.calls.registers.Add(1)
	if a.f.acceptBusy {
		cctx = brokerclient.AcceptBusy(cctx)
	}
	resp, err := a.client.RegisterEndpoint(cctx, &apiv1.RegisterEndpointRequest{Endpoint: ep, LeaseSeconds: leaseSeconds})
	if _, busy := brokerclient.BusyWait(err); busy {
		// Turned away before any work: the first registration's latency counts from its first
		// attempt to the one that is answered.
		a.f.calls.registerBusy.Add(1)
		return err
	}
	if a.firstRegDur.Load() == 0 {
		a.firstRegDur.Store(int64(max(time.Since(a.firstRegStart), 1)))
		a.firstRegOK.Store(err == nil)
	}
	if err == nil && a.registeredAt.Load() == 0 {
		a.registeredAt.Store(time.Now().UnixNano())
	}
	if err != nil {
		if ctx.Err() == nil {
			a.f.calls.registerErrors.Add(1)
			a.f.calls.failed("RegisterEndpoint", err)
			if deadline(err) {
				a.f.calls.registerDeadlines.Add(1)
			}
		}
		return err
	}
	for {
		cur := a.f.regRevMax.Load()
		r := resp.GetEndpoint().GetRevision()
		if r <= cur || a.f.regRevMax.CompareAndSwap(cur, r) {
			break
		}
	}
	return nil
}

// registerUntilNotBusy registers ep, waiting on the broker's busy answers as the agent does: an
// endpoint change the broker put off is measured from the first attempt, not missed.
func (a *simAgent) registerUntilNotBusy(ctx context.Context, ep *apiv1.Endpoint) error {
	for {
		err := a.register(ctx, ep)
		d, busy := brokerclient.BusyWait(err)
		if !busy {
			return err
		}
		a.f.calls.busyWaited(d)
		if !retry.Sleep(ctx, d) {
			return ctx.Err()
		}
	}
}

func (a *simAgent) heartbeat(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	start := time.Now()
	if s := int(start.Sub(a.f.t0) / time.Second); s >= 0 && s < len(a.f.beats.perSecond) {
		a.f.beats.perSecond[s].Add(1)
	}
	a.f.calls.heartbeats.Add(1)
	_, err := a.client.Heartbeat(cctx, &apiv1.HeartbeatRequest{Node: a.node})
	dur := time.Since(start)
	if err != nil && ctx.Err() == nil {
		a.f.calls.heartbeatErrors.Add(1)
		a.f.calls.failed("Heartbeat", err)
		if deadline(err) {
			a.f.calls.heartbeatDeadlines.Add(1)
		}
	}
	if ctx.Err() == nil {
		a.f.beats.mu.Lock()
		a.f.beats.latencies = append(a.f.beats.latencies, beatSample{at: start, dur: dur, err: err != nil})
		a.f.beats.mu.Unlock()
	}
	return err
}

// setExports is what the agent's exports loop sends on every new stream: its (empty) exports.
func (a *simAgent) setExports(ctx context.Context) {
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	a.f.calls.setExports.Add(1)
	if _, err := a.client.SetExports(cctx, &apiv1.SetExportsRequest{}); err != nil && ctx.Err() == nil {
		a.f.calls.setExportsErrors.Add(1)
		a.f.calls.failed("SetExports", err)
		if deadline(err) {
			a.f.calls.setExportsDeadlines.Add(1)
		}
	}
}

// watchLoop is agent.watchLoop: one stream at a time, resumed from the revision held, with the
// agent's backoff, cut short when a registration or heartbeat succeeds.
func (a *simAgent) watchLoop(ctx context.Context) {
	bo := retry.Backoff{Min: minBackoff, Max: maxBackoff}
	for {
		got, err := a.watchOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		a.watchUp.Store(false)
		a.f.calls.watchErrors.Add(1)
		_ = err
		if got {
			bo.Reset()
		}
		select {
		case <-a.wake:
		default:
		}
		t := time.NewTimer(bo.Next())
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-a.wake:
			t.Stop()
		}
		a.conn.ResetConnectBackoff()
	}
}

var watchDesc = &grpc.StreamDesc{StreamName: "Watch", ServerStreams: true}

func (a *simAgent) watchOnce(ctx context.Context) (got bool, err error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a.f.calls.watches.Add(1)
	a.streamEpoch = a.f.epoch.Load()
	a.gotOnStream = false
	a.streamOpenedAt = time.Now()
	stream, err := a.conn.NewStream(ctx, watchDesc, apiv1.Agent_Watch_FullMethodName, grpc.ForceCodecV2(lightCodec{}))
	if err != nil {
		return false, err
	}
	req := &apiv1.WatchRequest{SinceRevision: a.rev.Load(), WantImports: true, ImportSelector: mcs.DefaultImportSelector}
	if a.f.zstd {
		req.AcceptEncodings = []string{watchzstd.Name}
	}
	if err := stream.SendMsg(req); err != nil {
		return false, err
	}
	if err := stream.CloseSend(); err != nil {
		return false, err
	}
	m := &watchMsg{a: a}
	for {
		if err := stream.RecvMsg(m); err != nil {
			return got, err
		}
		if !got {
			got = true
			a.watchUp.Store(true)
			go a.setExports(ctx)
		}
	}
}

// lightCodec encodes requests as protobuf and applies the broker's watch messages to the
// agent's bookkeeping as they are decoded, without building the resources.
type lightCodec struct{}

func (lightCodec) Name() string { return "proto" }

func (lightCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := proto.Marshal(v.(proto.Message))
	if err != nil {
		return nil, err
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (lightCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*watchMsg)
	if !ok {
		return encoding.GetCodecV2("proto").Unmarshal(data, v)
	}
	var b []byte
	if len(data) == 1 {
		b = data[0].ReadOnlyData()
	} else {
		b = data.Materialize()
	}
	return m.a.apply(b, time.Now())
}

// frameCache decodes each distinct compressed frame once for the whole fleet. The broker
// compresses a shared message once and sends every agent the same frame; each cable-agent
// expands its copy on its own node (about a millisecond for a snapshot of 5,100 endpoints,
// `go test -bench . ./api/watchzstd/`), but here 5,100 agents share two CPUs with the broker,
// and expanding 5.7 GB for them took a quarter of this process's CPU: a cost of the simulation,
// not of the broker. What each agent does with the content (its bookkeeping) it still does
// itself. Two generations of at most frameCacheBytes of content bound the memory.
type frameCache struct {
	mu       sync.Mutex
	cur, old map[string]*frameEntry
	bytes    int
}

type frameEntry struct {
	once    sync.Once
	content []byte
	err     error
}

const frameCacheBytes = 64 << 20

func (c *frameCache) decode(frame []byte) ([]byte, error) {
	c.mu.Lock()
	e := c.cur[string(frame)]
	if e == nil {
		if e = c.old[string(frame)]; e == nil {
			e = &frameEntry{}
		}
		if c.cur == nil || c.bytes > frameCacheBytes {
			c.old, c.cur, c.bytes = c.cur, map[string]*frameEntry{}, 0
		}
		c.cur[string(frame)] = e
		c.bytes += len(frame) * 4
	}
	c.mu.Unlock()
	e.once.Do(func() { e.content, e.err = watchzstd.Decode(frame) })
	return e.content, e.err
}

// watchMsg is the receive target of a watch stream.
type watchMsg struct{ a *simAgent }

const (
	kindOther = iota
	kindCluster
	kindEndpoint
	kindPolicy
)

// apply applies one watch message, as encoded, to the agent's bookkeeping.
func (a *simAgent) apply(b []byte, now time.Time) error {
	var (
		snapshot, more bool
		revision       uint64
		lastEventRev   uint64
		size           = len(b)
		p              = a.f.probe.Load()
	)
	// The snapshot flag comes first on the wire (field 1), before any event; a compressed
	// message (field 7) holds the fields of the message it replaces.
	var scan func(b []byte, nested bool) error
	scan = func(b []byte, nested bool) error {
		for len(b) > 0 {
			num, typ, n := protowire.ConsumeTag(b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			switch {
			case num == 7 && typ == protowire.BytesType && !nested:
				v, n2 := protowire.ConsumeBytes(b)
				n = n2
				if n >= 0 {
					content, err := a.f.frames.decode(v)
					if err != nil {
						return err
					}
					if err := scan(content, true); err != nil {
						return err
					}
				}
			case num == 1 && typ == protowire.VarintType:
				v, n2 := protowire.ConsumeVarint(b)
				n = n2
				snapshot = v != 0
				if snapshot {
					a.resetState()
					a.inSnapshot = true
				}
			case num == 2 && typ == protowire.BytesType:
				v, n2 := protowire.ConsumeBytes(b)
				n = n2
				if n >= 0 {
					r, err := a.applyEvent(v, p, now)
					if err != nil {
						return err
					}
					lastEventRev = max(lastEventRev, r)
				}
			case num == 3 && typ == protowire.VarintType:
				revision, n = protowire.ConsumeVarint(b)
			case num == 5 && typ == protowire.VarintType:
				var v uint64
				v, n = protowire.ConsumeVarint(b)
				more = v != 0
			default:
				n = protowire.ConsumeFieldValue(num, typ, b)
			}
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
		}
		return nil
	}
	if err := scan(b, false); err != nil {
		return err
	}
	a.msgs.Add(1)
	a.bytesIn.Add(int64(size))
	nanos := now.UnixNano()
	firstOnStream := !a.gotOnStream
	a.gotOnStream = true
	if a.firstMsgAt.Load() == 0 {
		a.firstMsgAt.Store(nanos)
	}
	if a.inSnapshot && a.snapDoneAt.Load() == 0 {
		a.snapBytes.Add(int64(size))
	}
	if firstOnStream {
		if snapshot {
			a.f.calls.watchSnapshots.Add(1)
		} else {
			a.f.calls.watchResumes.Add(1)
		}
		if a.streamEpoch > 0 && a.resumedAt.Load() == 0 {
			a.resumedSnapshot.Store(snapshot)
			a.resumedAt.Store(nanos)
		}
	}
	if more {
		if revision != 0 {
			a.rev.Store(revision)
		} else if lastEventRev != 0 {
			a.rev.Store(lastEventRev)
		}
		return nil
	}
	if a.inSnapshot {
		a.inSnapshot = false
		if a.snapDoneAt.Load() == 0 {
			a.snapStart = a.streamOpenedAt
			a.snapEndpoints.Store(int64(a.epCount))
			a.snapDoneAt.Store(nanos)
		}
	}
	if revision != 0 {
		a.rev.Store(revision)
	}
	a.holdsAll.Store(a.epCount == a.f.n() && a.clCount == len(a.f.clusters))
	if a.currentAt.Load() == 0 && a.epCount == a.f.n() && a.clCount == len(a.f.clusters) {
		a.currentAt.Store(nanos)
		close(a.linksUp)
	}
	return nil
}

func (a *simAgent) resetState() {
	clear(a.eps)
	clear(a.cls)
	a.epCount, a.clCount, a.policies = 0, 0, 0
}

// applyEvent applies one event; it returns the event's revision.
func (a *simAgent) applyEvent(b []byte, p *probe, now time.Time) (uint64, error) {
	var (
		del  bool
		kind = kindOther
		key  []byte
		rev  uint64
	)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			del = v == uint64(apiv1.Event_DELETE)
		case num == 2 && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			switch string(v) {
			case "cluster":
				kind = kindCluster
			case "endpoint":
				kind = kindEndpoint
			case "policy":
				kind = kindPolicy
			}
		case num == 3 && typ == protowire.BytesType:
			key, n = protowire.ConsumeBytes(b)
		case num == 5 && typ == protowire.VarintType:
			rev, n = protowire.ConsumeVarint(b)
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
		}
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	switch kind {
	case kindEndpoint:
		if i, ok := a.f.epIndex[string(key)]; ok {
			a.epCount += setBit(a.eps, int(i), !del)
		}
	case kindCluster:
		if i, ok := a.f.clIndex[string(key)]; ok {
			a.clCount += setBit(a.cls, int(i), !del)
		}
	case kindPolicy:
		if del {
			a.policies--
		} else {
			a.policies++
		}
	}
	if p != nil && kindName(kind) == p.kind && bytes.Equal(key, p.key) {
		p.recv[a.idx].CompareAndSwap(0, now.UnixNano())
	}
	return rev, nil
}

func kindName(k int) string {
	switch k {
	case kindCluster:
		return "cluster"
	case kindEndpoint:
		return "endpoint"
	case kindPolicy:
		return "policy"
	}
	return ""
}

// setBit sets or clears bit i and returns how the count of set bits changed.
func setBit(set []uint64, i int, on bool) int {
	w, m := i/64, uint64(1)<<(i%64)
	was := set[w]&m != 0
	switch {
	case on && !was:
		set[w] |= m
		return 1
	case !on && was:
		set[w] &^= m
		return -1
	}
	return 0
}

func writeTokenFile(dir, cluster, token string) (string, error) {
	p := filepath.Join(dir, cluster+".token")
	return p, os.WriteFile(p, []byte(token+"\n"), 0o600)
}

// previousFirstRegistrationDelay is the wait before the first registration of cable-agent up to
// 98843a3 (brokerclient.FirstRegistrationDelay then): up to a tenth of the heartbeat interval,
// at most a second, at random. The agent registers at once now; the "delayed" fleet keeps it to
// compare with.
func previousFirstRegistrationDelay(interval time.Duration) time.Duration {
	spread := min(int64(interval)/10, int64(time.Second))
	if spread <= 0 {
		return 0
	}
	return time.Duration(mrand.Int64N(spread + 1))
}
