// Package uninstall tells, as a cable-agent on Kubernetes stops, an uninstall from a restart.
//
// A restart (kubectl rollout restart, a new image, a node drain, the pod evicted) must leave the
// tunnels, routes and eBPF pins in place, so that the next pod takes them over and no connection
// through the node breaks. An uninstall (`cablectl uninstall kubernetes | kubectl delete -f -`,
// `kubectl delete namespace cablemesh`) must leave the node clean, as --cleanup-on-exit does. The
// pod cannot tell the two apart from its SIGTERM; the API server can: on an uninstall the pod's
// DaemonSet is gone or has a deletionTimestamp, or its namespace is terminating.
//
// The uninstall deletes the agent's ServiceAccount and roles within milliseconds of the
// DaemonSet, usually before the pods get their SIGTERM, so a question asked only then would be
// refused. The Detector therefore watches its DaemonSet and namespace (by name: the RBAC grants
// nothing else of their kinds) for the agent's whole life, and at SIGTERM asks once more: a fresh
// answer wins (a DaemonSet deleted and re-created quickly is a reinstall, not an uninstall); a
// refused question (401 or 403) after the DaemonSet was read before means the agent's grants were
// withdrawn, which only an uninstall does; without any answer, what the watch saw decides. When
// nothing is known the agent keeps its state: an agent that wrongly keeps it leaves routes behind,
// one that wrongly removes it breaks every connection through its node.
package uninstall

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Environment variables the DaemonSets set: the pod's namespace (downward API) and the name of
// the DaemonSet that runs it.
const (
	NamespaceEnv = "POD_NAMESPACE"
	DaemonSetEnv = "CABLEMESH_DAEMONSET"
)

// Resource lists and watches one kind of object (with the options an informer gives).
type Resource struct {
	List  func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error)
	Watch func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
}

// Client reads the agent's own DaemonSet and namespace.
type Client interface {
	DaemonSets(namespace string) Resource
	Namespaces() Resource
	GetDaemonSet(ctx context.Context, namespace, name string) (*appsv1.DaemonSet, error)
	GetNamespace(ctx context.Context, name string) (*corev1.Namespace, error)
}

// Detector follows one DaemonSet and its namespace and answers, as the agent stops, whether they
// are going away.
type Detector struct {
	Client    Client
	Namespace string
	DaemonSet string
	Log       *slog.Logger

	mu     sync.Mutex
	seen   bool   // the DaemonSet was read at least once: the agent's grants existed
	reason string // why the watch believes the install is going away; empty: it does not
}

// Verdict is the Detector's answer.
type Verdict struct {
	Uninstall bool
	// Reason says what the answer rests on, for the log.
	Reason string
}

// Run watches the DaemonSet and the namespace until ctx ends.
func (d *Detector) Run(ctx context.Context) {
	ds := informer(d.Client, d.Client.DaemonSets(d.Namespace), &appsv1.DaemonSet{}, d.DaemonSet)
	ns := informer(d.Client, d.Client.Namespaces(), &corev1.Namespace{}, d.Namespace)
	handlers := func(observe func(obj any, deleted bool)) cache.ResourceEventHandlerFuncs {
		return cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { observe(o, false) },
			UpdateFunc: func(_, o any) { observe(o, false) },
			DeleteFunc: func(o any) { observe(o, true) },
		}
	}
	if _, err := ds.AddEventHandler(handlers(d.observeDaemonSet)); err != nil {
		d.log().Error("uninstall check: DaemonSet informer", "err", err)
		return
	}
	if _, err := ns.AddEventHandler(handlers(d.observeNamespace)); err != nil {
		d.log().Error("uninstall check: namespace informer", "err", err)
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { ds.RunWithContext(ctx) })
	wg.Go(func() { ns.RunWithContext(ctx) })
	wg.Wait()
}

// informer follows the one object named name.
func informer(c Client, r Resource, obj runtime.Object, name string) cache.SharedIndexInformer {
	only := func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", name).String()
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			only(&opts)
			return r.List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			only(&opts)
			return r.Watch(ctx, opts)
		},
	}
	return cache.NewSharedIndexInformer(cache.ToListWatcherWithWatchListSemantics(lw, c), obj, 0, cache.Indexers{})
}

func (d *Detector) log() *slog.Logger {
	if d.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Log
}

// unwrap returns the object of an informer's delete notice as well.
func unwrap(o any) any {
	if t, ok := o.(cache.DeletedFinalStateUnknown); ok {
		return t.Obj
	}
	return o
}

func (d *Detector) observeDaemonSet(o any, deleted bool) {
	ds, ok := unwrap(o).(*appsv1.DaemonSet)
	if !ok || ds.Name != d.DaemonSet {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	d.seen = true
	switch {
	case deleted:
		d.set(fmt.Sprintf("DaemonSet %s/%s was deleted", d.Namespace, d.DaemonSet))
	case ds.DeletionTimestamp != nil:
		d.set(fmt.Sprintf("DaemonSet %s/%s is being deleted", d.Namespace, d.DaemonSet))
	default:
		d.reason = "" // present (again): a reinstall, or it never went
	}
}

func (d *Detector) observeNamespace(o any, deleted bool) {
	ns, ok := unwrap(o).(*corev1.Namespace)
	if !ok || ns.Name != d.Namespace {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case deleted:
		d.set(fmt.Sprintf("namespace %s was deleted", d.Namespace))
	case terminating(ns):
		d.set(fmt.Sprintf("namespace %s is terminating", d.Namespace))
	}
}

// set records the first reason; d.mu is held.
func (d *Detector) set(reason string) {
	if d.reason == "" {
		d.log().Info("the agent's install is going away: it cleans its node when it stops", "reason", reason)
		d.reason = reason
	}
}

func terminating(ns *corev1.Namespace) bool {
	return ns.DeletionTimestamp != nil || ns.Status.Phase == corev1.NamespaceTerminating
}

// Check answers whether the install is going away: the API server's fresh answer when it gives
// one, else what the watch saw. ctx bounds the questions (the pod's grace period is short).
func (d *Detector) Check(ctx context.Context) Verdict {
	ds, err := d.Client.GetDaemonSet(ctx, d.Namespace, d.DaemonSet)
	d.mu.Lock()
	seen, watched := d.seen, d.reason
	if err == nil {
		d.seen = true
	}
	d.mu.Unlock()
	name := d.Namespace + "/" + d.DaemonSet
	switch {
	case err == nil && ds.DeletionTimestamp != nil:
		return Verdict{true, "DaemonSet " + name + " is being deleted"}
	case err == nil:
		ns, err := d.Client.GetNamespace(ctx, d.Namespace)
		switch {
		case err == nil && terminating(ns):
			return Verdict{true, "namespace " + d.Namespace + " is terminating"}
		case apierrors.IsNotFound(err):
			return Verdict{true, "namespace " + d.Namespace + " is gone"}
		}
		return Verdict{false, "DaemonSet " + name + " is in place: a restart"}
	case apierrors.IsNotFound(err):
		return Verdict{true, "DaemonSet " + name + " is gone"}
	case (apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err)) && seen:
		return Verdict{true, fmt.Sprintf("the agent may no longer read DaemonSet %s, which it read before: its service account or role was deleted (%v)", name, err)}
	case watched != "":
		return Verdict{true, watched + fmt.Sprintf(" (the fresh question failed: %v)", err)}
	}
	return Verdict{false, fmt.Sprintf("no answer about DaemonSet %s (%v) and nothing seen going away: keeping the node's state", name, err)}
}

// CheckTimeout bounds Check at SIGTERM: the pod's grace period (30 s) must also hold the cleanup.
const CheckTimeout = 5 * time.Second

// FromEnvironment is the Detector of the pod this process runs in: its DaemonSet and namespace
// from DaemonSetEnv and NamespaceEnv, the API server and credentials in-cluster. Nil without
// those variables (a Universal host, a test): the agent then never cleans up on its own.
func FromEnvironment(getenv func(string) string, log *slog.Logger) (*Detector, error) {
	ns, ds := getenv(NamespaceEnv), getenv(DaemonSetEnv)
	if ns == "" || ds == "" {
		return nil, nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("uninstall check of DaemonSet %s/%s: in-cluster Kubernetes config: %w", ns, ds, err)
	}
	c, err := NewClient(rc)
	if err != nil {
		return nil, err
	}
	return &Detector{Client: c, Namespace: ns, DaemonSet: ds, Log: log}, nil
}

// ClearDir removes everything in dir but dir itself: on Kubernetes the state dir is a hostPath
// mount point, which the pod cannot remove (and the kubelet made).
func ClearDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("clear %s: %w", dir, err)
	}
	var errs []error
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("clear %s: %w", dir, err)
	}
	return nil
}
