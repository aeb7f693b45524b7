package store

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Etcd is the store kept in etcd, so that several broker replicas serve one mesh. It runs the same
// transaction code as Bolt and Memory (txn.go) over a key-value space in etcd:
//
//	<prefix><bucket>/<key>   one key per resource, as in Bolt: clusters/east, endpoints/east/gw1,
//	                         policies/default, serviceExports/c/n/ns/name, serviceVIPs/ns/name
//	<prefix>events/<16 hex>  the event log, one key per store revision (big-endian, so that key
//	                         order is revision order)
//	<prefix>meta/revision    the store's revision; meta/compacted, where the log begins
//	<prefix>meta/deleted/<bucket>  rewritten (empty) by every commit that deletes in the bucket
//	<prefix>meta/committed   rewritten (empty) by every commit: its mod revision is the last one
//
// The store's revision is its own counter, not etcd's: it counts changes to the mesh only, so it
// stays contiguous (a watcher resumes from any revision the log holds), and heartbeats, which
// rewrite an endpoint without a revision, do not move it.
//
// Every replica keeps a mirror of the prefix in memory, loaded once and then fed by one etcd
// watch. Reads (View, the first batch of a Watch, the reads inside Update) come from the mirror,
// after a linearizable read of meta/committed has told how far the mirror must be (so a replica
// never answers from a state older than a write another replica acknowledged, quiet writes such
// as heartbeats and join token records included). Watchers are fed
// by the same etcd watch: every commit's events are written to the log in the commit's etcd
// transaction, so the mirror sees each commit's events together, in etcd's order, which is
// revision order, and hands them to its watchers exactly as Bolt does after a local commit. An
// agent connected to any replica therefore sees every change of every replica.
//
// Update is optimistic: fn runs against the mirror, recording what it read, and its writes are
// committed in one etcd transaction whose conditions say that nothing it read has changed since:
// each key it read has the mod revision it saw; each bucket it listed holds no key newer than the
// mirror and has had no delete since (its meta/deleted key tells); and, for a commit that bumps
// the revision, meta/revision is unchanged, which orders those commits. When another replica
// committed first the conditions fail, the mirror catches up, and fn runs again on the new state:
// so fn may run more than once and must only compute its results from tx (as every Update in the
// broker does), and allocation of cluster IDs, VIPs or anything else read-then-written in one
// Update never hands out one value twice. A replica commits its Updates in groups (one etcd
// transaction for every Update waiting at that moment, see commitGroup): a fleet that registers
// at once would otherwise wait for three round trips to etcd each, in a line.
type Etcd struct {
	cli    *clientv3.Client
	prefix string // "<root>store/"
	opts   Options
	eopts  EtcdOptions
	log    *slog.Logger
	hub    hub

	// reqs takes Updates to the committer (commitLoop), which commits those that wait together
	// in one etcd transaction; unbuffered, so a request is either taken or refused.
	reqs chan *etcdReq
	// maxOps is the most comparisons or operations the committer puts in one transaction:
	// EtcdOptions.MaxTxnOps, lowered when etcd refuses a transaction as too large (learnTxnOps).
	maxOps atomic.Int64

	// fresh's shared linearizable reads: fnext gathers callers until the read in flight
	// (freading) ends.
	fmu      sync.Mutex
	fnext    *freshRead
	freading bool

	cloneMu sync.Mutex // see etcdTxnKV.write

	state    atomic.Pointer[etcdState]
	mu       sync.Mutex
	advanced chan struct{} // closed, and replaced, whenever state moves; guarded by mu
	closed   atomic.Bool

	// The mirror goroutine's own: the tree it applies the watch to, and the store revision of
	// the last event it published.
	working   *btree.BTreeG[etcdItem]
	published uint64

	// cancelWatch ends the mirror's current etcd watch (the health check does, when the watch
	// has stalled); follow then watches again.
	cancelWatch atomic.Pointer[context.CancelFunc]

	stop    context.CancelFunc
	stopped <-chan struct{} // closed by Close: the committer takes no more requests
	done    chan struct{}   // closed when the mirror (and the compactor) have stopped
}

// ErrUnavailable ends the watches of a replica that has lost etcd (it cannot read it, or its
// watch of it no longer follows): the watchers reconnect, to another replica if they can, and
// resume from their revisions.
var ErrUnavailable = errors.New("this broker replica has lost etcd; reconnect with since_revision")

// EtcdOptions tune an Etcd store; zero values take the defaults.
type EtcdOptions struct {
	// CompactInterval is how often etcd's history is compacted to the revision seen one interval
	// earlier (as the Kubernetes API server does). Only one replica compacts per interval
	// (a compare-and-swap on <root>compact decides which). Default 5 minutes; negative disables
	// it, for an etcd whose operator compacts it (--auto-compaction-retention).
	CompactInterval time.Duration
	// AttemptTimeout bounds one etcd request of an Update or a read (default 10s); an Update
	// retries a failed attempt until its context ends.
	AttemptTimeout time.Duration
	// HealthInterval is how often the replica checks that it can read etcd and that its mirror
	// keeps up (default 2s); after two failed checks in a row it disconnects its watchers
	// (ErrUnavailable) and watches etcd again. Negative disables the check.
	HealthInterval time.Duration
	// MaxTxnOps bounds the comparisons, and the operations, of one etcd transaction of a group
	// of Updates (default 1024); an Update that needs more alone is still sent alone. An etcd
	// whose --max-txn-ops is lower (its default is 128) refuses the first larger transaction,
	// and the store then sends at most half of that, and so on down to what etcd takes: larger
	// groups mean fewer round trips to etcd when many agents write at once.
	MaxTxnOps int
	// MaxTxnBytes bounds the keys and values a group of Updates writes in one transaction
	// (default 1 MiB, under etcd's --max-request-bytes default of 1.5 MiB).
	MaxTxnBytes int
	Logger      *slog.Logger
}

// DefaultEtcdMaxTxnOps is EtcdOptions.MaxTxnOps's default.
const DefaultEtcdMaxTxnOps = 1024

// txnOps is the most comparisons or operations of one transaction (maxOps).
func (s *Etcd) txnOps() int { return int(s.maxOps.Load()) }

// learnTxnOps lowers maxOps after etcd refused a transaction whose largest count was tried.
func (s *Etcd) learnTxnOps(tried int) {
	next := int64(max(1, tried/2))
	for {
		cur := s.maxOps.Load()
		if next >= cur {
			return
		}
		if s.maxOps.CompareAndSwap(cur, next) {
			s.log.Info("etcd refused a transaction as too large (its --max-txn-ops is lower than this store's): transactions now hold at most half as much; raise etcd's --max-txn-ops to commit larger groups",
				"refusedOps", tried, "maxOps", next)
			return
		}
	}
}

// etcdState is the mirror as of etcd revision rev: every key of the prefix, immutable.
type etcdState struct {
	tree *btree.BTreeG[etcdItem]
	rev  int64
}

// etcdItem is one key of the prefix: its full etcd key, its value and mod revision (-1 for a key
// an Update wrote and has not committed yet).
type etcdItem struct {
	key   string
	value []byte
	mod   int64
}

func itemLess(a, b etcdItem) bool { return a.key < b.key }

// EtcdPrefix is the prefix of the store's keys below root (e.g. "/cablemesh/").
func EtcdPrefix(root string) string { return root + "store/" }

// OpenEtcd loads the store kept under root in etcd (creating nothing until the first write) and
// starts following it. The caller owns cli and closes it after Close.
func OpenEtcd(ctx context.Context, cli *clientv3.Client, root string, opts Options, eopts EtcdOptions) (*Etcd, error) {
	if !strings.HasSuffix(root, "/") {
		return nil, fmt.Errorf("etcd root %q must end with /", root)
	}
	opts = opts.withDefaults()
	if eopts.CompactInterval == 0 {
		eopts.CompactInterval = 5 * time.Minute
	}
	if eopts.AttemptTimeout <= 0 {
		eopts.AttemptTimeout = 10 * time.Second
	}
	if eopts.Logger == nil {
		eopts.Logger = slog.Default()
	}
	if eopts.HealthInterval == 0 {
		eopts.HealthInterval = 2 * time.Second
	}
	if eopts.MaxTxnOps <= 0 {
		eopts.MaxTxnOps = DefaultEtcdMaxTxnOps
	}
	if eopts.MaxTxnBytes <= 0 {
		eopts.MaxTxnBytes = 1 << 20
	}
	s := &Etcd{
		cli: cli, prefix: EtcdPrefix(root), opts: opts, eopts: eopts, log: eopts.Logger,
		hub: newHub(opts), reqs: make(chan *etcdReq), advanced: make(chan struct{}), done: make(chan struct{}),
	}
	s.maxOps.Store(int64(eopts.MaxTxnOps))
	st, err := s.load(ctx)
	if err != nil {
		return nil, fmt.Errorf("load store from etcd %s: %w", s.prefix, err)
	}
	s.working = st.tree
	s.state.Store(&etcdState{tree: st.tree.Clone(), rev: st.rev})
	s.published = getU64(s.readKV(s.state.Load()), keyRevision)

	runCtx, stop := context.WithCancel(context.Background())
	s.stop, s.stopped = stop, runCtx.Done()
	var wg sync.WaitGroup
	wg.Go(func() { s.follow(runCtx, st.rev) })
	wg.Go(func() { s.commitLoop(runCtx) })
	if eopts.CompactInterval > 0 {
		wg.Go(func() { s.compactLoop(runCtx, root+"compact", eopts.CompactInterval) })
	}
	if eopts.HealthInterval > 0 {
		wg.Go(func() { s.healthLoop(runCtx, eopts.HealthInterval) })
	}
	go func() {
		wg.Wait()
		close(s.done)
	}()
	return s, nil
}

// load reads every key of the prefix at one etcd revision.
func (s *Etcd) load(ctx context.Context) (*etcdState, error) {
	resp, err := s.cli.Get(ctx, s.prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	tree := btree.NewG(32, itemLess)
	for _, kv := range resp.Kvs {
		tree.ReplaceOrInsert(etcdItem{key: string(kv.Key), value: kv.Value, mod: kv.ModRevision})
	}
	return &etcdState{tree: tree, rev: resp.Header.Revision}, nil
}

// Close ends every watch and stops following etcd. It does not close the etcd client.
func (s *Etcd) Close() error {
	s.hub.mu.Lock()
	first := s.hub.closeLocked()
	s.closed.Store(true)
	s.hub.mu.Unlock()
	if first {
		s.stop()
		<-s.done
	}
	return nil
}

// View implements Store.
func (s *Etcd) View(ctx context.Context, fn func(ReadTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	st, err := s.fresh(ctx)
	if err != nil {
		return err
	}
	return fn(newTxn(s.readKV(st), false))
}

// ViewLocal implements LocalViewer: fn reads the mirror as it is, without the linearizable read
// of View (a round trip to etcd's leader, the longest wait of a busy replica's calls).
func (s *Etcd) ViewLocal(ctx context.Context, fn func(ReadTx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if s.closed.Load() {
		return ErrClosed
	}
	return fn(newTxn(s.readKV(s.state.Load()), false))
}

// Watch implements Store.
func (s *Etcd) Watch(ctx context.Context, since uint64, opts ...WatchOption) (Watch, error) {
	o := watchOpts(opts)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, ErrClosed
	}
	// A watcher that resumes from a revision another replica gave it must not get an older
	// snapshot: catch up with etcd first.
	if _, err := s.fresh(ctx); err != nil {
		return nil, err
	}
	w, err := s.hub.subscribe(ctx, since, o, func() (Batch, error) { return newTxn(s.readKV(s.state.Load()), false).firstBatch(since, o) })
	if errors.Is(err, ErrClosed) {
		return nil, ErrClosed
	}
	if err != nil {
		return nil, fmt.Errorf("start watch from revision %d: %w", since, err)
	}
	return w, nil
}

// transient reports whether err from etcd may pass by itself: unavailable members, a leader
// election, a timeout of one attempt.
func transient(err error) bool {
	if errors.Is(err, ErrClosed) || errors.Is(err, context.Canceled) {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Aborted, codes.ResourceExhausted:
		return true
	}
	for _, e := range []error{rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader, rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail,
		rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrTooManyRequests, rpctypes.ErrNotCapable} {
		if errors.Is(err, e) || err.Error() == e.Error() {
			return true
		}
	}
	return false
}

// fresh returns the mirror once it holds every commit etcd had acknowledged when fresh was
// called: a linearizable read of meta/committed gives the etcd revision of the last one. Callers that arrive while such a read is in flight share the next one, which starts
// after they arrived (so it is linearizable for each of them): under load one read serves many.
func (s *Etcd) fresh(ctx context.Context) (*etcdState, error) {
	s.fmu.Lock()
	b := s.fnext
	if b == nil {
		b = &freshRead{done: make(chan struct{})}
		s.fnext = b
	}
	if !s.freading {
		s.freading = true
		s.fnext = nil
		go s.readRevisions(b)
	}
	s.fmu.Unlock()
	select {
	case <-b.done:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if b.err != nil {
		return nil, fmt.Errorf("read the store revision from etcd: %w", b.err)
	}
	if err := s.waitFor(ctx, b.target); err != nil {
		return nil, err
	}
	return s.state.Load(), nil
}

// freshRead is one linearizable read of meta/committed, shared by the callers of fresh that
// arrived before it started.
type freshRead struct {
	done   chan struct{}
	target int64
	err    error
}

// readRevisions does b, then every batch that gathered meanwhile, until none is waiting. A read
// that fails for a reason that passes (a leader election) is tried again within AttemptTimeout,
// so that readers ride out an election instead of failing.
func (s *Etcd) readRevisions(b *freshRead) {
	for b != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.eopts.AttemptTimeout)
		var (
			resp *clientv3.GetResponse
			err  error
		)
		for delay := 20 * time.Millisecond; ; delay = min(2*delay, 500*time.Millisecond) {
			resp, err = s.cli.Get(ctx, s.key(bucketMeta, keyCommitted), clientv3.WithKeysOnly())
			if err == nil || !transient(err) || s.closed.Load() {
				break
			}
			select {
			case <-time.After(delay):
				continue
			case <-ctx.Done():
			}
			break
		}
		cancel()
		if err != nil {
			b.err = err
		} else if len(resp.Kvs) > 0 {
			b.target = resp.Kvs[0].ModRevision
		}
		close(b.done)
		s.fmu.Lock()
		b = s.fnext
		s.fnext = nil
		if b == nil {
			s.freading = false
		}
		s.fmu.Unlock()
	}
}

// waitFor waits until the mirror has applied etcd revision rev.
func (s *Etcd) waitFor(ctx context.Context, rev int64) error {
	for {
		s.mu.Lock()
		st, ch := s.state.Load(), s.advanced
		s.mu.Unlock()
		if st.rev >= rev {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return ErrClosed
		}
	}
}

// key is the etcd key of a bucket's key: event keys are hex, the others are text already.
func (s *Etcd) key(bucket, key []byte) string {
	if string(bucket) == string(bucketEvents) {
		return s.prefix + string(bucket) + "/" + hex.EncodeToString(key)
	}
	return s.prefix + string(bucket) + "/" + string(key)
}

// bucketRange is [start, end) of a bucket's keys.
func (s *Etcd) bucketRange(bucket []byte) (string, string) {
	start := s.prefix + string(bucket) + "/"
	return start, s.prefix + string(bucket) + "0" // '0' follows '/'
}

// bucketKey turns an etcd key of bucket back into the bucket's key.
func (s *Etcd) bucketKey(bucket []byte, full string) []byte {
	k := strings.TrimPrefix(full, s.prefix+string(bucket)+"/")
	if string(bucket) == string(bucketEvents) {
		b, err := hex.DecodeString(k)
		if err == nil {
			return b
		}
	}
	return []byte(k)
}

func (s *Etcd) readKV(st *etcdState) *etcdTxnKV {
	return &etcdTxnKV{s: s, base: st, tree: st.tree}
}

// follow applies etcd's watch of the prefix to the mirror from revision after+1 until ctx ends,
// re-watching after errors and reloading everything after a compaction.
func (s *Etcd) follow(ctx context.Context, after int64) {
	delay := 100 * time.Millisecond
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
		s.cancelWatch.Store(&cancel)
		wch := s.cli.Watch(wctx, s.prefix, clientv3.WithPrefix(), clientv3.WithRev(after+1))
		compacted := false
		for resp := range wch {
			if err := resp.Err(); err != nil {
				if resp.CompactRevision > 0 || errors.Is(err, rpctypes.ErrCompacted) {
					compacted = true
				} else if ctx.Err() == nil {
					s.log.Warn("etcd watch of the store ended; watching again", "after", after, "err", err)
				}
				break
			}
			if len(resp.Events) > 0 {
				s.apply(resp.Events)
				after = s.state.Load().rev
				delay = 100 * time.Millisecond
			}
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if compacted {
			s.log.Warn("etcd compacted the history the store's watch needed; reloading the store", "after", after)
			if err := s.reload(ctx); err != nil {
				s.log.Error("reload the store from etcd", "err", err)
			} else {
				after = s.state.Load().rev
				continue
			}
		}
		select {
		case <-time.After(delay):
		case <-ctx.Done():
			return
		}
		delay = min(delay*2, 2*time.Second)
	}
}

// apply applies watch events (whole etcd revisions, in order) to the mirror and publishes each
// commit's store events as one batch.
func (s *Etcd) apply(evs []*clientv3.Event) {
	eventsPrefix, _ := s.bucketRange(bucketEvents)
	var batches []Batch
	last := int64(0)
	for i := 0; i < len(evs); {
		rev := evs[i].Kv.ModRevision
		var out []*apiv1.Event
		for ; i < len(evs) && evs[i].Kv.ModRevision == rev; i++ {
			e := evs[i]
			key := string(e.Kv.Key)
			if e.Type == clientv3.EventTypeDelete {
				s.working.Delete(etcdItem{key: key})
				continue
			}
			s.working.ReplaceOrInsert(etcdItem{key: key, value: e.Kv.Value, mod: rev})
			if strings.HasPrefix(key, eventsPrefix) {
				ev := &apiv1.Event{}
				if err := proto.Unmarshal(e.Kv.Value, ev); err != nil {
					s.log.Error("decode a logged event from etcd; watchers resume from the log", "key", key, "err", err)
					continue
				}
				out = append(out, ev)
			}
		}
		last = rev
		if len(out) > 0 {
			sort.Slice(out, func(a, b int) bool { return out[a].Revision < out[b].Revision })
			batches = append(batches, Batch{Events: out, Revision: out[len(out)-1].Revision})
		}
	}
	if last == 0 {
		return
	}
	snap := s.working.Clone()
	s.hub.mu.Lock()
	s.setState(&etcdState{tree: snap, rev: last})
	for _, b := range batches {
		if b.Events[0].Revision != s.published+1 {
			// Not expected (commits are serialized on meta/revision); a watcher that missed
			// revisions must not go on as if it had them.
			s.log.Error("store events out of sequence in etcd's watch; disconnecting watchers so they resume from the log",
				"after", s.published, "got", b.Events[0].Revision)
			s.dropWatchersLocked(ErrWatcherTooSlow)
		} else {
			s.hub.publishLocked(b)
		}
		s.published = b.Revision
	}
	s.hub.mu.Unlock()
}

// reload replaces the mirror with a fresh read of etcd after a compaction cut the watch off, and
// publishes the events the log holds beyond what watchers have (or, when the log no longer holds
// them, disconnects the watchers, which resume from the log or get a snapshot).
func (s *Etcd) reload(ctx context.Context) error {
	st, err := s.load(ctx)
	if err != nil {
		return err
	}
	s.working = st.tree
	snap := &etcdState{tree: st.tree.Clone(), rev: st.rev}
	kv := s.readKV(snap)
	rev := getU64(kv, keyRevision)
	var missed []*apiv1.Event
	complete := getU64(kv, keyCompacted) <= s.published
	if complete && rev > s.published {
		err := kv.scan(bucketEvents, u64Key(s.published+1), func(k, v []byte) error {
			ev := &apiv1.Event{}
			if err := proto.Unmarshal(v, ev); err != nil {
				return fmt.Errorf("decode event %d: %w", binaryRev(k), err)
			}
			missed = append(missed, ev)
			return nil
		})
		if err != nil {
			return err
		}
		complete = len(missed) > 0 && missed[0].Revision == s.published+1 && uint64(len(missed)) == rev-s.published
	}
	s.hub.mu.Lock()
	defer s.hub.mu.Unlock()
	s.setState(snap)
	switch {
	case rev == s.published:
	case complete && rev > s.published:
		s.hub.publishLocked(Batch{Events: missed, Revision: rev})
	default:
		s.dropWatchersLocked(ErrWatcherTooSlow)
	}
	s.published = rev
	return nil
}

func (s *Etcd) setState(st *etcdState) {
	s.mu.Lock()
	s.state.Store(st)
	close(s.advanced)
	s.advanced = make(chan struct{})
	s.mu.Unlock()
}

func (s *Etcd) dropWatchersLocked(err error) {
	// The published sequence has a gap (or ends here): later watchers read afresh.
	s.hub.forgetLocked()
	for w := range s.hub.subs {
		s.hub.dropLocked(w, err)
	}
}

// healthLoop checks every interval that a linearizable read of etcd succeeds and that the mirror
// reaches what it returned within the interval. A replica cut off from etcd (partitioned, or
// its members gone) would otherwise keep its watchers on a stream that never moves again; after
// two failed checks in a row it disconnects them, so that agents go to a replica that works, and
// it restarts its etcd watch in case that is what stalled. A check that timed out while the
// mirror moved on since the last one is not a failure: the replica follows etcd, late (at 5,100
// agents starting at once, etcd and the mirror lagged past the interval, and the replica
// disconnected every agent of a mesh it was serving).
func (s *Etcd) healthLoop(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	failed := 0
	last := s.state.Load().rev
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		cctx, cancel := context.WithTimeout(ctx, interval)
		_, err := s.fresh(cctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		rev := s.state.Load().rev
		moved := rev > last
		last = rev
		if err == nil || moved {
			failed = 0
			continue
		}
		failed++
		if failed < 2 {
			continue
		}
		s.log.Warn("this replica cannot follow etcd; disconnecting its watchers so they go to another replica", "err", err)
		s.hub.mu.Lock()
		s.dropWatchersLocked(ErrUnavailable)
		s.hub.mu.Unlock()
		if c := s.cancelWatch.Load(); c != nil {
			(*c)()
		}
		failed = 0
	}
}

// compactLoop compacts etcd's history every interval to the revision it saw one interval
// earlier, so that heartbeats (which rewrite endpoints) do not grow etcd without bound. A
// compare-and-swap on key makes one replica do it per interval.
func (s *Etcd) compactLoop(ctx context.Context, key string, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	var version, pending int64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.Version(key), "=", version)).
			Then(clientv3.OpPut(key, "")).Else(clientv3.OpGet(key)).Commit()
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("etcd compaction: claim this interval", "err", err)
			}
			continue
		}
		if !resp.Succeeded {
			// Another replica compacted in this interval; follow its count.
			if kvs := resp.Responses[0].GetResponseRange().GetKvs(); len(kvs) > 0 {
				version = kvs[0].Version
			}
			pending = 0
			continue
		}
		version++
		if pending > 0 {
			if _, err := s.cli.Compact(ctx, pending); err != nil && !errors.Is(err, rpctypes.ErrCompacted) && ctx.Err() == nil {
				s.log.Warn("etcd compaction", "revision", pending, "err", err)
			} else if err == nil {
				s.log.Debug("compacted etcd", "revision", pending)
			}
		}
		pending = resp.Header.Revision
	}
}

// etcdTxnKV is the kv of one transaction over a mirror state. A writable one records what it
// read (for the commit's conditions) and what it wrote (the commit's operations); its first
// write clones the tree (lazily: copy on write), so the state others read never changes.
type etcdTxnKV struct {
	s      *Etcd
	base   *etcdState
	tree   *btree.BTreeG[etcdItem]
	track  bool
	cloned bool
	reads  map[string]int64   // etcd key -> mod revision seen (0: absent)
	scans  map[string]string  // bucket range start -> end, for buckets listed
	writes map[string]*[]byte // etcd key -> value, nil for a delete
}

func (k *etcdTxnKV) get(bucket, key []byte) []byte {
	full := k.s.key(bucket, key)
	it, ok := k.tree.Get(etcdItem{key: full})
	if k.track {
		if _, wrote := k.writes[full]; !wrote {
			if _, seen := k.reads[full]; !seen {
				if k.reads == nil {
					k.reads = map[string]int64{}
				}
				k.reads[full] = it.mod // 0 when absent
			}
		}
	}
	if !ok {
		return nil
	}
	return it.value
}

// peek reads key as get does, but records no read: the transaction's commit does not compare it.
func (k *etcdTxnKV) peek(bucket, key []byte) []byte {
	it, ok := k.tree.Get(etcdItem{key: k.s.key(bucket, key)})
	if !ok {
		return nil
	}
	return it.value
}

func (k *etcdTxnKV) write(full string, v *[]byte) {
	if !k.cloned {
		// Clone marks the shared nodes read-only in the tree it clones: two transactions on
		// one state must not do it at once (reads of that state are not affected).
		k.s.cloneMu.Lock()
		k.tree = k.tree.Clone()
		k.s.cloneMu.Unlock()
		k.cloned = true
	}
	if k.writes == nil {
		k.writes = map[string]*[]byte{}
	}
	k.writes[full] = v
}

func (k *etcdTxnKV) put(bucket, key, value []byte) error {
	if !k.track {
		return errReadOnly
	}
	full := k.s.key(bucket, key)
	k.write(full, &value)
	k.tree.ReplaceOrInsert(etcdItem{key: full, value: value, mod: -1})
	return nil
}

func (k *etcdTxnKV) delete(bucket, key []byte) error {
	if !k.track {
		return errReadOnly
	}
	full := k.s.key(bucket, key)
	if _, ok := k.tree.Get(etcdItem{key: full}); !ok {
		if _, wrote := k.writes[full]; !wrote {
			return nil
		}
	}
	k.write(full, nil)
	k.tree.Delete(etcdItem{key: full})
	return nil
}

func (k *etcdTxnKV) scan(bucket, from []byte, fn func(k, v []byte) error) error {
	start, end := k.s.bucketRange(bucket)
	if k.track {
		if k.scans == nil {
			k.scans = map[string]string{}
		}
		k.scans[start] = end
	}
	if from != nil {
		start = k.s.key(bucket, from)
	}
	var err error
	k.tree.AscendRange(etcdItem{key: start}, etcdItem{key: end}, func(it etcdItem) bool {
		err = fn(k.s.bucketKey(bucket, it.key), it.value)
		return err == nil
	})
	return err
}

// maxPointCompares is how many keys of one bucket the conditions compare one by one; beyond it
// the whole bucket is compared (etcd limits a transaction to --max-txn-ops comparisons).
const maxPointCompares = 16

// conditions are the comparisons a commit needs for what the transaction read to be unchanged,
// and the reads that, when they fail, tell how far the mirror must catch up before a retry.
func (k *etcdTxnKV) conditions(bumpsRevision bool) (cmps []clientv3.Cmp, failure []clientv3.Op) {
	metaKey := k.s.key(bucketMeta, keyRevision)
	scans := map[string]string{}
	for start, end := range k.scans {
		scans[start] = end
	}
	// Keys read one by one, per bucket range, unless their bucket was listed anyway.
	perBucket := map[string][]string{}
	for full := range k.reads {
		if full == metaKey {
			continue
		}
		start := k.rangeOf(full)
		if _, listed := scans[start]; listed {
			continue
		}
		perBucket[start] = append(perBucket[start], full)
	}
	for start, keys := range perBucket {
		if len(keys) > maxPointCompares {
			scans[start] = start[:len(start)-1] + "0"
			continue
		}
		for _, full := range keys {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(full), "=", k.reads[full]))
			failure = append(failure, clientv3.OpGet(full, clientv3.WithKeysOnly()))
		}
	}
	// A listed bucket: no key in it is newer than the mirror (a put), and its delete marker is
	// as the mirror has it (a range comparison cannot see a key that is gone).
	for start, end := range scans {
		marker := k.s.deletedMarker(start)
		it, _ := k.base.tree.Get(etcdItem{key: marker})
		cmps = append(cmps,
			clientv3.Compare(clientv3.ModRevision(start).WithRange(end), "<", k.base.rev+1),
			clientv3.Compare(clientv3.ModRevision(marker), "=", it.mod))
		failure = append(failure,
			clientv3.OpGet(start, clientv3.WithRange(end), clientv3.WithKeysOnly(),
				clientv3.WithSort(clientv3.SortByModRevision, clientv3.SortDescend), clientv3.WithLimit(1)),
			clientv3.OpGet(marker, clientv3.WithKeysOnly()))
	}
	// Every commit that bumps the revision writes meta/revision: comparing it orders them (and
	// so allocates every revision once). A quiet write (a heartbeat) needs no such order.
	if bumpsRevision {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(metaKey), "=", k.reads[metaKey]))
	}
	failure = append(failure, clientv3.OpGet(metaKey, clientv3.WithKeysOnly()))
	return cmps, failure
}

// deletedMarker is the key every commit that deletes in the bucket of range start rewrites.
func (s *Etcd) deletedMarker(start string) string {
	b := strings.TrimSuffix(strings.TrimPrefix(start, s.prefix), "/")
	return s.prefix + string(bucketMeta) + "/deleted/" + b
}

// rangeOf is the start of the bucket range an etcd key of the prefix lies in.
func (k *etcdTxnKV) rangeOf(full string) string {
	rest := strings.TrimPrefix(full, k.s.prefix)
	b, _, _ := strings.Cut(rest, "/")
	return k.s.prefix + b + "/"
}

// ops are the commit's writes: puts, deletes, and consecutive deletes of the event log (the log
// trimmed) as one range.
func (k *etcdTxnKV) ops() []clientv3.Op {
	keys := make([]string, 0, len(k.writes))
	for full := range k.writes {
		keys = append(keys, full)
	}
	sort.Strings(keys)
	var (
		ops          []clientv3.Op
		runStart     string
		runEnd       uint64
		runLen       int
		eventsPrefix = k.s.prefix + string(bucketEvents) + "/"
	)
	flush := func() {
		if runLen == 0 {
			return
		}
		if runLen == 1 {
			ops = append(ops, clientv3.OpDelete(runStart))
		} else {
			ops = append(ops, clientv3.OpDelete(runStart, clientv3.WithRange(k.s.key(bucketEvents, u64Key(runEnd+1)))))
		}
		runLen = 0
	}
	deleted := map[string]bool{}
	for _, full := range keys {
		v := k.writes[full]
		if v == nil {
			deleted[k.rangeOf(full)] = true
		}
		if v == nil && strings.HasPrefix(full, eventsPrefix) {
			r := binaryRev(k.s.bucketKey(bucketEvents, full))
			if runLen > 0 && r == runEnd+1 {
				runEnd, runLen = r, runLen+1
				continue
			}
			flush()
			runStart, runEnd, runLen = full, r, 1
			continue
		}
		flush()
		if v == nil {
			ops = append(ops, clientv3.OpDelete(full))
		} else {
			ops = append(ops, clientv3.OpPut(full, string(*v)))
		}
	}
	flush()
	for start := range deleted {
		ops = append(ops, clientv3.OpPut(k.s.deletedMarker(start), ""))
	}
	return append(ops, clientv3.OpPut(k.s.key(bucketMeta, keyCommitted), ""))
}

// keyCommitted is the meta key every commit rewrites (see Etcd).
var keyCommitted = []byte("committed")

func binaryRev(b []byte) uint64 {
	if len(b) != 8 {
		return 0
	}
	var r uint64
	for _, c := range b {
		r = r<<8 | uint64(c)
	}
	return r
}
