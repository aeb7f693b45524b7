package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/btree"
	clientv3 "go.etcd.io/etcd/client/v3"
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
