package kube

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"
	mcslisters "sigs.k8s.io/mcs-api/pkg/client/listers/apis/v1alpha1"

	"google.golang.org/protobuf/proto"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/syncloop"
	"github.com/cablemesh/cablemesh/mcs"
)

// Defaults of the Watcher's options.
const (
	// DefaultDebounce is how long the Watcher waits for a burst of changes to end before it hands
	// out the new export set: a rollout of many pods comes to one call.
	DefaultDebounce = 100 * time.Millisecond
	// maxDelayFactor bounds a burst that never ends: the set goes out at the latest this many
	// debounce periods after the burst's first change.
	maxDelayFactor = 10
	// statusRetryMin and statusRetryMax bound the backoff after a failed status update.
	statusRetryMin = time.Second
	statusRetryMax = time.Minute
	// syncLogEvery is how often the Watcher says which caches it still waits for.
	syncLogEvery = 30 * time.Second
)

// Option changes a Watcher's defaults.
type Option func(*Watcher)

// WithDebounce sets how long a burst of changes may go quiet before the export set goes out
// (DefaultDebounce). d <= 0 keeps the default.
func WithDebounce(d time.Duration) Option {
	return func(w *Watcher) {
		if d > 0 {
			w.debounce = d
		}
	}
}

// WithStatusUpdates sets whether the Watcher writes the Valid condition on ServiceExports (the
// default). Where several agents of one cluster watch the same objects, one writer is enough.
func WithStatusUpdates(on bool) Option {
	return func(w *Watcher) { w.writeStatus = on }
}

// Watcher turns the ServiceExports of one Kubernetes cluster, with their Services and
// EndpointSlices, into Cablemesh exports. Create it with New and start it with Run.
type Watcher struct {
	cluster     string
	log         *slog.Logger
	client      Client
	debounce    time.Duration
	writeStatus bool

	exports  cache.SharedIndexInformer
	services cache.SharedIndexInformer
	epSlices cache.SharedIndexInformer
	seLister mcslisters.ServiceExportLister
	svLister corelisters.ServiceLister

	trigger syncloop.Trigger
	running atomic.Bool
	synced  atomic.Bool

	// Owned by Run's goroutine.
	last      []*apiv1.ServiceExport
	delivered bool
	verdicts  map[string]Validity     // last verdict per ServiceExport, to log changes only
	written   map[string]pendingWrite // status writes the cache has not shown yet

	// The broker's conflicts of this cluster's exports, by service (SetConflicts).
	conflictsMu    sync.Mutex
	conflicts      map[string][]statusapi.ServiceConflict
	conflictsKnown bool
}

// pendingWrite is the conditions written on top of the ServiceExport of resourceVersion rv.
type pendingWrite struct {
	rv    string
	conds []metav1.Condition
}

// New returns a Watcher over the ServiceExports (multicluster.x-k8s.io/v1alpha1) of every
// namespace that client reaches, and the Services and EndpointSlices they refer to. cluster is
// the Cablemesh cluster the exports are stamped with.
func New(client Client, cluster string, log *slog.Logger, opts ...Option) *Watcher {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	w := &Watcher{
		cluster:     cluster,
		log:         log,
		client:      client,
		debounce:    DefaultDebounce,
		writeStatus: true,
		verdicts:    map[string]Validity{},
		written:     map[string]pendingWrite{},
	}
	for _, o := range opts {
		o(w)
	}
	w.exports = newServiceExportInformer(client, 0)
	w.services = newServiceInformer(client, 0)
	w.epSlices = newEndpointSliceInformer(client, 0)
	w.svLister = corelisters.NewServiceLister(w.services.GetIndexer())
	w.seLister = mcslisters.NewServiceExportLister(w.exports.GetIndexer())
	return w
}

// HasSynced reports whether the Watcher's caches have synced: from then on onChange has been
// handed, or is being handed, the first complete export set.
func (w *Watcher) HasSynced() bool { return w.synced.Load() }

// Run watches until ctx ends. Once the caches have synced it calls onChange with the complete,
// sorted export set, then again after every burst of changes that changes the set (debounced);
// never before the caches have synced, since a partial set would withdraw exports at the broker.
// onChange runs on Run's goroutine and owns the slice it is given. Run returns when ctx ends,
// after the informers have stopped: nil once the first set went out, else an error saying that
// the caches never synced. A Watcher runs once.
func (w *Watcher) Run(ctx context.Context, onChange func([]*apiv1.ServiceExport)) error {
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("kube watcher: Run called twice")
	}
	ctx, cancel := context.WithCancel(ctx)
	var informers sync.WaitGroup
	defer informers.Wait() // runs after cancel: waits for the informers to stop
	defer cancel()

	if err := w.addHandlers(); err != nil {
		return err
	}
	for _, c := range w.caches() {
		informers.Go(func() { c.inf.RunWithContext(ctx) })
	}
	if err := w.waitForSync(ctx); err != nil {
		return err
	}

	debounce := newStoppedTimer()
	retry := newStoppedTimer()
	defer debounce.Stop()
	defer retry.Stop()
	backoff := statusRetryMin
	afterPass := func(failed bool) {
		if failed {
			retry.Reset(backoff)
			backoff = min(2*backoff, statusRetryMax)
			return
		}
		retry.Stop()
		backoff = statusRetryMin
	}

	w.synced.Store(true)
	afterPass(w.pass(ctx, onChange))
	w.log.Info("kubernetes service exports synced", "exports", len(w.last))

	var burstStart time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.trigger.C():
			now := time.Now()
			if burstStart.IsZero() {
				burstStart = now
			}
			debounce.Reset(min(w.debounce, burstStart.Add(maxDelayFactor*w.debounce).Sub(now)))
			continue
		case <-debounce.C:
			burstStart = time.Time{}
		case <-retry.C:
		}
		afterPass(w.pass(ctx, onChange))
	}
}

func newStoppedTimer() *time.Timer {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return t
}

// waitForSync waits for every cache, saying now and then which ones it still waits for (a
// ServiceExport cache that never syncs usually means the MCS CRD is not installed, or RBAC lacks
// list/watch).
func (w *Watcher) waitForSync(ctx context.Context) error {
	for {
		wctx, cancel := context.WithTimeout(ctx, syncLogEvery)
		var pending []string
		for _, c := range w.caches() {
			if !cache.WaitForCacheSync(wctx.Done(), c.inf.HasSynced) {
				pending = append(pending, c.kind)
			}
		}
		cancel()
		if len(pending) == 0 {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("kube watcher: caches of %s never synced: %w", strings.Join(pending, ", "), ctx.Err())
		}
		w.log.Warn("waiting for kubernetes caches to sync", "pending", strings.Join(pending, ","))
	}
}

// namedCache is one of the Watcher's informers with the kind of object it holds.
type namedCache struct {
	kind string
	inf  cache.SharedIndexInformer
}

// caches are the Watcher's informers, sorted by kind.
func (w *Watcher) caches() []namedCache {
	return []namedCache{{"EndpointSlice", w.epSlices}, {"Service", w.services}, {"ServiceExport", w.exports}}
}

func (w *Watcher) addHandlers() error {
	for _, h := range []struct {
		inf cache.SharedIndexInformer
		fn  func(any)
	}{
		{w.exports, func(any) { w.poke() }},
		{w.services, w.pokeIfExported},
		{w.epSlices, w.pokeIfExported},
	} {
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    h.fn,
			UpdateFunc: func(_, obj any) { h.fn(obj) },
			DeleteFunc: h.fn,
		}); err != nil {
			return fmt.Errorf("kube watcher: add event handler: %w", err)
		}
	}
	return nil
}

// poke asks Run's loop for a pass; pokes that come while one is pending are one.
func (w *Watcher) poke() {
	w.trigger.Fire()
}

// pokeIfExported pokes for a Service or EndpointSlice event only when a ServiceExport of that
// Service is in the cache: the other Services of the cluster change nothing. A ServiceExport
// that arrives later pokes for itself.
func (w *Watcher) pokeIfExported(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	var key string
	switch o := obj.(type) {
	case *corev1.Service:
		key = mcs.Key(o.Namespace, o.Name)
	case *discoveryv1.EndpointSlice:
		key = mcs.Key(o.Namespace, o.Labels[discoveryv1.LabelServiceName])
	default:
		w.poke()
		return
	}
	if _, exists, err := w.exports.GetIndexer().GetByKey(key); err == nil && !exists {
		return
	}
	w.poke()
}

// pass recomputes every export from the caches, hands the set to onChange when it differs from
// the last one handed out (or none was), and brings the Valid conditions up to date. It reports
// whether a status update failed and should be retried.
func (w *Watcher) pass(ctx context.Context, onChange func([]*apiv1.ServiceExport)) (retry bool) {
	ses, err := w.seLister.List(labels.Everything())
	if err != nil { // a cache lister does not fail; keep the last set if it ever does
		w.log.Error("list service exports from cache", "err", err)
		return true
	}
	slices.SortFunc(ses, func(a, b *mcsv1a1.ServiceExport) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	type verdict struct {
		se *mcsv1a1.ServiceExport
		v  Validity
	}
	var (
		out      []*apiv1.ServiceExport
		verdicts []verdict
		seen     = map[string]bool{}
	)
	for _, se := range ses {
		if se.DeletionTimestamp != nil {
			continue // on its way out: neither exported nor worth a status
		}
		key := mcs.Key(se.Namespace, se.Name)
		seen[key] = true
		e, v := Export(w.cluster, se, w.service(se.Namespace, se.Name), w.slicesOf(key))
		w.logVerdict(key, v)
		if e != nil {
			out = append(out, e)
		}
		verdicts = append(verdicts, verdict{se, v})
	}
	for key := range w.verdicts {
		if !seen[key] {
			delete(w.verdicts, key)
			delete(w.written, key)
		}
	}

	if !w.delivered || !equalExports(out, w.last) {
		w.last = out
		w.delivered = true
		given := make([]*apiv1.ServiceExport, len(out))
		for i, e := range out {
			given[i] = proto.Clone(e).(*apiv1.ServiceExport)
		}
		onChange(given)
	}

	if !w.writeStatus {
		return false
	}
	for _, vd := range verdicts {
		if err := w.updateStatus(ctx, vd.se, vd.v); err != nil {
			if ctx.Err() != nil {
				return false
			}
			w.log.Warn("update service export status", "service", mcs.Key(vd.se.Namespace, vd.se.Name), "err", err)
			retry = true
		}
	}
	return retry
}

func (w *Watcher) service(namespace, name string) *corev1.Service {
	svc, err := w.svLister.Services(namespace).Get(name)
	if err != nil {
		return nil // the only error a cache lister returns is NotFound
	}
	return svc
}

func (w *Watcher) slicesOf(key string) []*discoveryv1.EndpointSlice {
	objs, err := w.epSlices.GetIndexer().ByIndex(serviceIndex, key)
	if err != nil {
		return nil // only for an unknown index name
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(objs))
	for _, o := range objs {
		if s, ok := o.(*discoveryv1.EndpointSlice); ok {
			out = append(out, s)
		}
	}
	return out
}

// logVerdict logs a ServiceExport's verdict when it differs from the last one logged.
func (w *Watcher) logVerdict(key string, v Validity) {
	last, known := w.verdicts[key]
	if known && last == v {
		return
	}
	w.verdicts[key] = v
	switch {
	case !v.Valid:
		w.log.Warn("service export not exported", "service", key, "reason", v.Reason, "message", v.Message)
	case known:
		w.log.Info("service export valid again", "service", key)
	}
}

// updateStatus writes v as se's Valid condition and, for a valid export once the broker has
// answered, its Conflict condition, unless se carries them already or the cache has not yet shown
// the Watcher's own write of them.
func (w *Watcher) updateStatus(ctx context.Context, se *mcsv1a1.ServiceExport, v Validity) error {
	key := mcs.Key(se.Namespace, se.Name)
	want := []metav1.Condition{validCondition(v, se.Generation)}
	if c, known := w.conflictCondition(key, se.Generation); known && v.Valid {
		want = append(want, c)
	}
	if hasConditions(se, want) {
		delete(w.written, key)
		return nil
	}
	if p, ok := w.written[key]; ok && p.rv == se.ResourceVersion && reflect.DeepEqual(p.conds, want) {
		return nil
	}
	err := w.client.UpdateServiceExportStatus(ctx, withConditions(se, want))
	switch {
	case err == nil:
		w.written[key] = pendingWrite{rv: se.ResourceVersion, conds: want}
		return nil
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		return nil // deleted or changed meanwhile: its event brings another pass
	default:
		return fmt.Errorf("update status of ServiceExport %s: %w", key, err)
	}
}

func equalExports(a, b []*apiv1.ServiceExport) bool {
	return slices.EqualFunc(a, b, func(x, y *apiv1.ServiceExport) bool { return proto.Equal(x, y) })
}
