// Package kubestatus is the cluster's status in its Kubernetes API: a ClusterLink per remote
// cluster (cablemesh.io/v1alpha1, cluster-scoped, named after that cluster: kubectl get
// clusterlinks) and the status of each ClusterConnectionPolicy applied in the cluster (the
// pairs it decides, those it loses and to which policy, observedGeneration). One gateway of the
// cluster writes them: the holder of the service-imports writer's Lease (agent/mcsimport), so a
// cluster has one writer for everything Cablemesh puts in its API.
//
// It reads, never recomputes: the links are the writer's gateway's status document (its
// connection rows and imports) and its plan's pair decisions; the policies' figures are the
// policy package's resolution with the plan's resolver over the broker's clusters.
//
// Writes are rate-limited, so that a flapping link cannot flood the API server: an object is
// written at most once per MinInterval (a change within it is written, as it is then, when the
// interval ends), a change of latency alone at most once per LatencyInterval, and a pass writes
// at most MaxWritesPerPass objects (the rest wait for the next pass).
package kubestatus

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/policy"
)

// Defaults of the writer's timing.
const (
	DefaultPeriod          = 5 * time.Second
	DefaultMinInterval     = 5 * time.Second
	DefaultLatencyInterval = 30 * time.Second
	// DefaultResync is how often the writer lists what is in the API again (someone may have
	// edited or deleted an object) and recomputes the policies' status without a new plan.
	DefaultResync    = 60 * time.Second
	MaxWritesPerPass = 20
)

// Labels on the ClusterLinks the writer owns: it lists, updates and deletes only those.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "cablemesh.io"
	managedSel     = LabelManagedBy + "=" + ManagedBy
)

// View is what the writer reads of the agent: its status document and its published plan.
type View interface {
	Status(ctx context.Context) statusapi.Status
	Plan() *plan.Plan
}

// Deps wire a Writer.
type Deps struct {
	API API
	// Cluster is this cluster's name, Node this gateway's.
	Cluster, Node string
	// Leader tells whether this node is the cluster's writer now (mcsimport's Lease).
	Leader func() bool
	Log    *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Zero values take the defaults above.
	Period, MinInterval, LatencyInterval, Resync time.Duration
}

// Writer keeps the ClusterLinks and the ClusterConnectionPolicies' status while its node leads.
type Writer struct {
	deps Deps
	view View

	mu sync.Mutex // guards the fields below; Pass holds it
	// links are the managed ClusterLinks as last listed or written, by name.
	links    map[string]*unstructured.Unstructured
	listedAt time.Time
	// writtenAt is when each object ("link/NAME", "policy/NAME") was last written.
	writtenAt map[string]time.Time
	// policiesAt and policiesRev are when and at which plan the policies' status was last done.
	policiesAt  time.Time
	policiesRev *plan.Plan
	resolution  *policy.Result
	leading     bool
	lastErr     string
}

// New builds a Writer; it does nothing until Follow and Run.
func New(d Deps) *Writer {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Period <= 0 {
		d.Period = DefaultPeriod
	}
	if d.MinInterval <= 0 {
		d.MinInterval = DefaultMinInterval
	}
	if d.LatencyInterval <= 0 {
		d.LatencyInterval = DefaultLatencyInterval
	}
	if d.Resync <= 0 {
		d.Resync = DefaultResync
	}
	return &Writer{deps: d, writtenAt: map[string]time.Time{}}
}

// Follow sets the agent the writer reads. A nil Writer (none on this node) ignores it, as it
// ignores Run, so the caller wires it without a condition.
func (w *Writer) Follow(v View) {
	if w == nil {
		return
	}
	w.view = v
}

// Run makes a pass every Period until ctx ends.
func (w *Writer) Run(ctx context.Context) {
	if w == nil || w.view == nil {
		return
	}
	t := time.NewTicker(w.deps.Period)
	defer t.Stop()
	for {
		if err := w.Pass(ctx); err != nil && ctx.Err() == nil {
			w.deps.Log.Warn("kubernetes status", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Pass writes what changed, within the rate limits, if this node leads; a node that does not
// forgets what it knew of the API (it lists again once it leads).
func (w *Writer) Pass(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	leading := w.deps.Leader != nil && w.deps.Leader()
	if leading != w.leading {
		w.deps.Log.Info("kubernetes status: writer", "leader", leading)
		w.leading = leading
	}
	if !leading || w.view == nil {
		w.links, w.policiesRev = nil, nil
		return nil
	}
	p := w.view.Plan()
	if p == nil || p.State == nil {
		return nil
	}
	budget := MaxWritesPerPass
	errLinks := w.passLinks(ctx, p, &budget)
	errPolicies := w.passPolicies(ctx, p, &budget)
	err := errors.Join(errLinks, errPolicies)
	w.lastErr = ""
	if err != nil {
		w.lastErr = err.Error()
	}
	return err
}

// allowed tells whether object key may be written now: its last write is at least MinInterval
// ago, LatencyInterval for a change of latency alone.
func (w *Writer) allowed(key string, latencyOnly bool, now time.Time) bool {
	last, ok := w.writtenAt[key]
	if !ok {
		return true
	}
	gap := w.deps.MinInterval
	if latencyOnly {
		gap = w.deps.LatencyInterval
	}
	return now.Sub(last) >= gap
}

func (w *Writer) passLinks(ctx context.Context, p *plan.Plan, budget *int) error {
	now := w.deps.Now()
	if w.links == nil || now.Sub(w.listedAt) >= w.deps.Resync {
		items, err := w.deps.API.ListClusterLinks(ctx, managedSel)
		if err != nil {
			return fmt.Errorf("list ClusterLinks: %w", err)
		}
		w.links = map[string]*unstructured.Unstructured{}
		for i := range items {
			w.links[items[i].GetName()] = &items[i]
		}
		w.listedAt = now
	}
	want := DesiredLinks(w.view.Status(ctx), p.Decisions, w.deps.Node)
	var errs []error
	for _, name := range sortedNames(w.links) {
		if _, ok := want[name]; ok {
			continue
		}
		if err := w.deps.API.DeleteClusterLink(ctx, name); err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete ClusterLink %s: %w", name, err))
			continue
		}
		w.deps.Log.Info("kubernetes status: ClusterLink deleted", "clusterLink", name)
		delete(w.links, name)
		delete(w.writtenAt, "link/"+name)
	}
	for _, name := range sortedNames(want) {
		if *budget == 0 {
			break
		}
		if err := w.writeLink(ctx, name, want[name], now, budget); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeLink creates or updates the ClusterLink name to carry ls, if the rate limits allow.
func (w *Writer) writeLink(ctx context.Context, name string, ls LinkStatus, now time.Time, budget *int) error {
	key := "link/" + name
	cur := w.links[name]
	if cur != nil {
		have, err := linkStatusOf(cur)
		if err == nil && have == ls {
			return nil
		}
		if !w.allowed(key, err == nil && have.sameButLatency(ls), now) {
			return nil
		}
	}
	status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&ls)
	if err != nil {
		return fmt.Errorf("ClusterLink %s: encode status: %w", name, err)
	}
	*budget--
	w.writtenAt[key] = now
	if cur == nil {
		obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": ClusterLinkGVR.GroupVersion().String(), "kind": ClusterLinkKind}}
		obj.SetName(name)
		obj.SetLabels(map[string]string{LabelManagedBy: ManagedBy})
		obj.Object["status"] = status
		created, err := w.deps.API.CreateClusterLink(ctx, obj)
		if err != nil {
			w.links = nil // list again: it may exist already, unlabelled or made by another writer
			return fmt.Errorf("create ClusterLink %s: %w", name, err)
		}
		w.links[name] = created
		return nil
	}
	next := cur.DeepCopy()
	next.Object["status"] = status
	updated, err := w.deps.API.UpdateClusterLink(ctx, next)
	if err != nil {
		w.links = nil // conflict or gone: list again next pass
		return fmt.Errorf("update ClusterLink %s: %w", name, err)
	}
	w.links[name] = updated
	return nil
}

// linkStatusOf decodes a ClusterLink's status.
func linkStatusOf(u *unstructured.Unstructured) (LinkStatus, error) {
	var ls LinkStatus
	m, ok := u.Object["status"].(map[string]any)
	if !ok {
		return ls, fmt.Errorf("ClusterLink %s has no status", u.GetName())
	}
	err := runtime.DefaultUnstructuredConverter.FromUnstructured(m, &ls)
	return ls, err
}

// passPolicies writes the ClusterConnectionPolicies' status when the plan changed or every
// Resync.
func (w *Writer) passPolicies(ctx context.Context, p *plan.Plan, budget *int) error {
	now := w.deps.Now()
	if p == w.policiesRev && now.Sub(w.policiesAt) < w.deps.Resync {
		return nil
	}
	objs, err := w.deps.API.ListPolicies(ctx)
	if err != nil {
		return fmt.Errorf("list ClusterConnectionPolicies: %w", err)
	}
	if p != w.policiesRev || w.resolution == nil {
		w.resolution = Resolution(p.State, p.Resolver)
	}
	var errs []error
	done := true
	for i := range objs {
		obj := &objs[i]
		want, ok := DesiredPolicyStatus(w.deps.Cluster, obj, p.State, w.resolution)
		if !ok {
			done = false // the broker has not got its spec yet: look again next pass
			continue
		}
		have, _ := obj.Object["status"].(map[string]any)
		status, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&want)
		if err != nil {
			errs = append(errs, fmt.Errorf("ClusterConnectionPolicy %s: encode status: %w", obj.GetName(), err))
			continue
		}
		if sameJSON(have, status) {
			continue
		}
		key := "policy/" + obj.GetName()
		if *budget == 0 || !w.allowed(key, false, now) {
			done = false
			continue
		}
		*budget--
		w.writtenAt[key] = now
		next := obj.DeepCopy()
		next.Object["status"] = status
		if _, err := w.deps.API.UpdatePolicyStatus(ctx, next); err != nil && !apierrors.IsNotFound(err) {
			done = false
			errs = append(errs, fmt.Errorf("update status of ClusterConnectionPolicy %s: %w", obj.GetName(), err))
		}
	}
	if done {
		w.policiesRev, w.policiesAt = p, now
	}
	return errors.Join(errs...)
}

// Status is what the writer reports: whether it leads and its last error.
type Status struct {
	Leader    bool   `json:"leader"`
	LastError string `json:"lastError,omitempty"`
}

// Status is a copy of the writer's status.
func (w *Writer) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	return Status{Leader: w.leading, LastError: w.lastErr}
}
