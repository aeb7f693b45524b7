package mcsimport

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	mcsv1a1 "sigs.k8s.io/mcs-api/pkg/apis/v1alpha1"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Resync is how often the leader reconciles without a change of the imports: it restores
// objects someone edited or deleted.
const Resync = 30 * time.Second

// Deps wire a Writer.
type Deps struct {
	API API
	// Identity is this node's name: the lease's holderIdentity.
	Identity string
	// Namespace is the agent's namespace, where the Lease lives.
	Namespace string
	// Imports are the broker's imports for this cluster; ok is false until the broker sent a
	// set (the writer then changes nothing, rather than deleting every import). Follow sets it
	// from the agent's broker link.
	Imports func() (imps []*apiv1.ServiceImport, ok bool)
	Log     *slog.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Status is what the writer reports.
type Status struct {
	// Leader tells whether this node holds the writer's lease.
	Leader bool `json:"leader"`
	// SkippedNamespaces are imports' namespaces that do not exist in this cluster: their
	// services have no ServiceImport here.
	SkippedNamespaces []string `json:"skippedNamespaces,omitempty"`
	// Foreign are objects named as an import's that are not Cablemesh's: left alone.
	Foreign   []string `json:"foreign,omitempty"`
	LastError string   `json:"lastError,omitempty"`
}

// Writer keeps the cluster's ServiceImports and EndpointSlices equal to the broker's imports
// while this node holds the lease.
type Writer struct {
	deps     Deps
	election election
	trigger  chan struct{}

	mu     sync.Mutex
	status Status
}

// New builds a Writer; it does nothing until Run.
func New(d Deps) *Writer {
	if d.Log == nil {
		d.Log = slog.Default()
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	return &Writer{deps: d, trigger: make(chan struct{}, 1),
		election: election{api: d.API, namespace: d.Namespace, identity: d.Identity, now: d.Now}}
}

// StateReader is the agent's cached broker state (brokerlink.Link).
type StateReader interface {
	Read(f func(st *brokerstate.State, join *apiv1.Cluster))
}

// Follow takes the imports from src, the agent's broker link. A nil Writer (no writer on this
// node) ignores it, as it ignores Trigger and Run, so the agent wires it without a condition.
func (w *Writer) Follow(src StateReader) {
	if w == nil {
		return
	}
	w.deps.Imports = func() (imps []*apiv1.ServiceImport, ok bool) {
		src.Read(func(st *brokerstate.State, _ *apiv1.Cluster) { imps, ok = st.Imports, st.HasImports })
		return imps, ok
	}
}

// Trigger asks for a reconcile (the broker's imports changed).
func (w *Writer) Trigger() {
	if w == nil {
		return
	}
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// Status is a copy of the writer's status.
func (w *Writer) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.status
	s.SkippedNamespaces = slices.Clone(s.SkippedNamespaces)
	s.Foreign = slices.Clone(s.Foreign)
	return s
}

// Run seeks or renews the lease every RenewInterval and, while it holds it, reconciles on
// every Trigger, on becoming the leader and every Resync, until ctx ends.
func (w *Writer) Run(ctx context.Context) {
	if w == nil {
		return
	}
	renew := time.NewTicker(RenewInterval)
	defer renew.Stop()
	var lastSync time.Time
	dirty := true
	for {
		wasLeader := w.election.leading()
		leader := w.step(ctx)
		if leader && !wasLeader {
			w.deps.Log.Info("service imports: this node is the cluster's writer", "lease", w.deps.Namespace+"/"+LeaseName)
			dirty = true
		} else if !leader && wasLeader {
			w.deps.Log.Info("service imports: this node is no longer the cluster's writer")
		}
		if leader && (dirty || w.deps.Now().Sub(lastSync) >= Resync) {
			w.reconcileLogged(ctx)
			lastSync, dirty = w.deps.Now(), false
		}
		select {
		case <-ctx.Done():
			return
		case <-renew.C:
		case <-w.trigger:
			if w.election.leading() {
				w.reconcileLogged(ctx)
				lastSync = w.deps.Now()
			} else {
				dirty = true
			}
			continue
		}
	}
}

// step renews or seeks the lease once.
func (w *Writer) step(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, RenewInterval)
	defer cancel()
	leader, err := w.election.tryAcquireOrRenew(ctx)
	if err != nil {
		w.deps.Log.Warn("service imports: lease", "err", err)
	}
	w.mu.Lock()
	w.status.Leader = leader
	w.mu.Unlock()
	return leader
}

func (w *Writer) reconcileLogged(ctx context.Context) {
	err := w.Reconcile(ctx)
	w.mu.Lock()
	w.status.LastError = ""
	if err != nil {
		w.status.LastError = err.Error()
	}
	w.mu.Unlock()
	if err != nil {
		w.deps.Log.Warn("service imports: reconcile", "err", err)
	}
}

// Reconcile makes the cluster's Cablemesh-labelled ServiceImports and EndpointSlices those of
// the broker's imports: creates the missing, updates the changed, deletes the stale. It never
// touches an object without Cablemesh's label. The caller must hold the lease (Run does).
func (w *Writer) Reconcile(ctx context.Context) error {
	if w.deps.Imports == nil {
		return nil
	}
	imps, ok := w.deps.Imports()
	if !ok {
		return nil
	}
	want := buildDesired(imps)
	r := &pass{missing: map[string]bool{}}
	errImports := w.reconcileImports(ctx, want, r)
	errSlices := w.reconcileSlices(ctx, want, r)
	slices.Sort(r.foreign)
	w.noteSkipped(slices.Sorted(maps.Keys(r.missing)))
	w.mu.Lock()
	w.status.Foreign = r.foreign
	w.mu.Unlock()
	return errors.Join(errImports, errSlices)
}

// pass is what one reconcile learns: the objects named as ours that are not (left alone), and
// the namespaces that do not exist here (their imports skipped).
type pass struct {
	foreign []string
	missing map[string]bool
}

// namespaceMissing tells whether err is a create refused because its namespace does not exist
// (rather than, say, the ServiceImport CRD missing).
func namespaceMissing(err error) bool {
	var st apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &st) {
		return false
	}
	d := st.Status().Details
	return d != nil && d.Kind == "namespaces"
}

// noteSkipped logs each namespace once when it starts being skipped.
func (w *Writer) noteSkipped(skipped []string) {
	w.mu.Lock()
	before := w.status.SkippedNamespaces
	w.status.SkippedNamespaces = skipped
	w.mu.Unlock()
	for _, ns := range skipped {
		if !slices.Contains(before, ns) {
			w.deps.Log.Info("service imports: namespace does not exist in this cluster, its imports are skipped", "namespace", ns)
		}
	}
}

func (w *Writer) reconcileImports(ctx context.Context, want desired, r *pass) error {
	have, err := w.deps.API.ListServiceImports(ctx, managedSelector)
	if err != nil {
		return fmt.Errorf("list ServiceImports: %w", err)
	}
	var errs []error
	existing := map[string]*mcsv1a1.ServiceImport{}
	for i := range have {
		si := &have[i]
		k := key(si.Namespace, si.Name)
		if _, ok := want.imports[k]; !ok {
			if err := w.deps.API.DeleteServiceImport(ctx, si.Namespace, si.Name); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("delete ServiceImport %s: %w", k, err))
			} else {
				w.deps.Log.Info("service imports: deleted", "serviceImport", k)
			}
			continue
		}
		existing[k] = si
	}
	for _, k := range slices.Sorted(maps.Keys(want.imports)) {
		d := want.imports[k]
		cur := existing[k]
		if cur == nil {
			created, err := w.deps.API.CreateServiceImport(ctx, d)
			if apierrors.IsAlreadyExists(err) {
				r.foreign = append(r.foreign, "ServiceImport "+k)
				continue
			}
			if namespaceMissing(err) {
				r.missing[d.Namespace] = true
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("create ServiceImport %s: %w", k, err))
				continue
			}
			w.deps.Log.Info("service imports: created", "serviceImport", k, "ips", d.Spec.IPs)
			cur = created
		} else if !sameJSON(cur.Spec, d.Spec) || !hasLabels(cur.Labels, d.Labels) {
			next := cur.DeepCopy()
			next.Spec = d.Spec
			next.Labels = mergeLabels(cur.Labels, d.Labels)
			updated, err := w.deps.API.UpdateServiceImport(ctx, next)
			if err != nil {
				errs = append(errs, fmt.Errorf("update ServiceImport %s: %w", k, err))
				continue
			}
			cur = updated
		}
		if !sameJSON(cur.Status.Clusters, d.Status.Clusters) {
			next := cur.DeepCopy()
			next.Status.Clusters = d.Status.Clusters
			if err := w.deps.API.UpdateServiceImportStatus(ctx, next); err != nil {
				errs = append(errs, fmt.Errorf("update ServiceImport %s status: %w", k, err))
			}
		}
	}
	return errors.Join(errs...)
}

func (w *Writer) reconcileSlices(ctx context.Context, want desired, r *pass) error {
	have, err := w.deps.API.ListEndpointSlices(ctx, managedSelector)
	if err != nil {
		return fmt.Errorf("list EndpointSlices: %w", err)
	}
	var errs []error
	existing := map[string]*discoveryv1.EndpointSlice{}
	for i := range have {
		es := &have[i]
		k := key(es.Namespace, es.Name)
		if _, ok := want.slices[k]; !ok {
			if err := w.deps.API.DeleteEndpointSlice(ctx, es.Namespace, es.Name); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("delete EndpointSlice %s: %w", k, err))
			}
			continue
		}
		existing[k] = es
	}
	for _, k := range slices.Sorted(maps.Keys(want.slices)) {
		d := want.slices[k]
		cur := existing[k]
		if cur == nil {
			if r.missing[d.Namespace] {
				continue
			}
			err := w.deps.API.CreateEndpointSlice(ctx, d)
			if apierrors.IsAlreadyExists(err) {
				r.foreign = append(r.foreign, "EndpointSlice "+k)
				continue
			}
			if namespaceMissing(err) {
				r.missing[d.Namespace] = true
				continue
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("create EndpointSlice %s: %w", k, err))
			}
			continue
		}
		if cur.AddressType == d.AddressType && sameJSON(cur.Endpoints, d.Endpoints) && sameJSON(cur.Ports, d.Ports) && hasLabels(cur.Labels, d.Labels) {
			continue
		}
		next := cur.DeepCopy()
		next.Endpoints, next.Ports = d.Endpoints, d.Ports
		next.Labels = mergeLabels(cur.Labels, d.Labels)
		if cur.AddressType != d.AddressType {
			// addressType is immutable: replace the slice.
			if err := w.deps.API.DeleteEndpointSlice(ctx, cur.Namespace, cur.Name); err != nil && !isNotFound(err) {
				errs = append(errs, fmt.Errorf("replace EndpointSlice %s: %w", k, err))
				continue
			}
			if err := w.deps.API.CreateEndpointSlice(ctx, d); err != nil {
				errs = append(errs, fmt.Errorf("replace EndpointSlice %s: %w", k, err))
			}
			continue
		}
		if err := w.deps.API.UpdateEndpointSlice(ctx, next); err != nil {
			errs = append(errs, fmt.Errorf("update EndpointSlice %s: %w", k, err))
		}
	}
	return errors.Join(errs...)
}

// sameJSON compares two values as the API server stores them (nil and empty alike where the
// field is omitted when empty).
func sameJSON(a, b any) bool {
	ja, errA := json.Marshal(a)
	jb, errB := json.Marshal(b)
	return errA == nil && errB == nil && string(ja) == string(jb)
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func mergeLabels(have, want map[string]string) map[string]string {
	out := maps.Clone(have)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, want)
	return out
}
