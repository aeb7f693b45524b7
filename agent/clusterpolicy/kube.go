package clusterpolicy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	"github.com/cablemesh/cablemesh/internal/syncloop"
	"github.com/cablemesh/cablemesh/policy"
)

// GVR is the ClusterConnectionPolicy resource (deploy/crds: cluster-scoped, cablemesh.io/v1alpha1).
var GVR = schema.GroupVersionResource{Group: "cablemesh.io", Version: "v1alpha1", Resource: "clusterconnectionpolicies"}

// KubeSource watches the cluster's ClusterConnectionPolicy objects with a client-go informer
// (through the dynamic client: the objects' selectors take the seed's shorthand, which no typed
// Go struct holds) and hands out their Set after every burst of changes.
type KubeSource struct {
	Client   dynamic.Interface
	Cluster  string
	Log      *slog.Logger
	Debounce time.Duration // default DefaultDebounce
	Resync   time.Duration // the informer's resync; default none
}

// Run starts the informer, hands out the Set once its cache has synced and again after every
// burst of adds, updates and deletes, until ctx ends.
func (k *KubeSource) Run(ctx context.Context, onChange func(Set)) error {
	log := k.Log
	if log == nil {
		log = slog.Default()
	}
	debounce := k.Debounce
	if debounce <= 0 {
		debounce = DefaultDebounce
	}
	inf := newInformer(k.Client, k.Resync)
	var changed syncloop.Trigger
	poke := func(any) {
		changed.Fire()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    poke,
		UpdateFunc: func(_, n any) { poke(n) },
		DeleteFunc: poke,
	}); err != nil {
		return fmt.Errorf("ClusterConnectionPolicy informer: %w", err)
	}
	// The informer stops with ctx; Run returns only after it has.
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { inf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	var last *Set
	emit := func() {
		set := Build(k.Cluster, ObjectItems(inf.GetStore().List()))
		if last != nil && last.Equal(set) {
			return
		}
		last = &set
		onChange(set)
	}
	emit()
	log.Info("ClusterConnectionPolicy objects synced", "objects", len(inf.GetStore().List()))
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed.C():
			if timer == nil {
				timer = time.After(debounce)
			}
		case <-timer:
			timer = nil
			emit()
		}
	}
}

// newInformer is an informer over the ClusterConnectionPolicy objects, built as
// dynamicinformer.NewFilteredDynamicInformer builds its own (that package links the informers of
// every API group into the agent).
func newInformer(client dynamic.Interface, resync time.Duration) cache.SharedIndexInformer {
	res := client.Resource(GVR)
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			return res.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			return res.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, client),
		&unstructured.Unstructured{},
		cache.SharedIndexInformerOptions{ResyncPeriod: resync, Indexers: cache.Indexers{}, ObjectDescription: GVR.String()})
}

// ObjectItems turns informer objects into Items, sorted by name.
func ObjectItems(objs []any) []Item {
	var items []Item
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		items = append(items, ObjectItem(u))
	}
	slices.SortFunc(items, func(a, b Item) int { return strings.Compare(a.Source, b.Source) })
	return items
}

// ObjectItem reads one ClusterConnectionPolicy object: its name, labels and spec, decoded with
// the same strict decoder as a file (policy.DecodeYAML); the rest of its metadata (uid,
// resourceVersion, managedFields, annotations) and its status are the API server's.
func ObjectItem(u *unstructured.Unstructured) Item {
	src := "kubernetes ClusterConnectionPolicy " + u.GetName()
	doc := map[string]any{
		"apiVersion": u.GetAPIVersion(),
		"kind":       u.GetKind(),
		"metadata":   map[string]any{"name": u.GetName()},
	}
	if l := u.GetLabels(); len(l) > 0 {
		doc["metadata"].(map[string]any)["labels"] = l
	}
	if spec, ok := u.Object["spec"]; ok {
		doc["spec"] = spec
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return Item{Source: src, Err: fmt.Errorf("encode the object: %w", err)}
	}
	ps, err := policy.DecodeYAML(b)
	if err != nil {
		return Item{Source: src, Err: err}
	}
	if len(ps) != 1 {
		return Item{Source: src, Err: fmt.Errorf("the object decodes to %d policies", len(ps))}
	}
	return Item{Source: src, Policy: ps[0]}
}
