package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// Applied is what this process last connected for one pair, and at which broker revision.
type Applied struct {
	Want     Want
	Revision uint64
	At       time.Time
}

// Failure is a pair whose last Connect failed: what was wanted, and the driver's error.
type Failure struct {
	Want Want
	Err  error
	At   time.Time
}

// Reconciler applies plans through the node's drivers. It is safe for concurrent use; passes
// are serialised.
type Reconciler struct {
	drivers map[string]cable.Driver
	log     *slog.Logger
	now     func() time.Time

	mu      sync.Mutex
	retired bool               // replaced by its Successor: Reconcile does nothing
	applied map[string]Applied // what this process last connected, by cluster
	failed  map[string]Failure // pairs whose last Connect failed, by cluster
}

// NewReconciler returns a reconciler over drivers (the ones that initialised).
func NewReconciler(drivers []cable.Driver, log *slog.Logger) *Reconciler {
	m := map[string]cable.Driver{}
	for _, d := range drivers {
		m[d.Name()] = d
	}
	return &Reconciler{drivers: m, log: log, now: time.Now, applied: map[string]Applied{}, failed: map[string]Failure{}}
}

// Failures returns a copy of the pairs whose last Connect failed, by cluster: a pair is there from
// the failed attempt until one succeeds or the pair is no longer wanted. Its status is the
// driver's error (the device cannot show why a connection it never got is missing).
func (r *Reconciler) Failures() map[string]Failure {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.failed)
}

// Applied returns a copy of what this process last connected, by cluster.
func (r *Reconciler) Applied() map[string]Applied {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.applied)
}

// Observe reads every driver's connections. observed has an entry for each driver that answered;
// errs for each that did not.
func (r *Reconciler) Observe(ctx context.Context) (observed map[string][]cable.ConnectionStatus, errs map[string]error) {
	observed = map[string][]cable.ConnectionStatus{}
	errs = map[string]error{}
	for _, name := range slices.Sorted(maps.Keys(r.drivers)) {
		conns, err := r.drivers[name].Connections(ctx)
		if err != nil {
			errs[name] = err
			continue
		}
		observed[name] = conns
	}
	return observed, errs
}

// Reconcile observes the drivers, plans against desired and applies the plan; revision is the
// broker revision desired was computed from (recorded per connection applied). A driver that
// cannot be observed is left alone, and so are the pairs that involve it. A pair moving between
// drivers is disconnected from the old one first, and connected on the new one only if that
// succeeded, in the same pass. It returns the actions it attempted and the joined errors of
// those that failed (and of unobservable drivers); a failed action is retried on the next pass.
func (r *Reconciler) Reconcile(ctx context.Context, desired []Want, revision uint64, repair map[string]string) ([]Action, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.retired {
		return nil, nil
	}
	observed, obsErrs := r.Observe(ctx)
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(obsErrs)) {
		errs = append(errs, fmt.Errorf("observe %s connections: %w", name, obsErrs[name]))
	}
	appliedWants := make(map[string]Want, len(r.applied))
	for k, v := range r.applied {
		appliedWants[k] = v.Want
	}
	actions := Plan(desired, observed, appliedWants, repair)
	// Forget what was applied but is no longer desired, unless its driver could not be observed
	// (then it may still be on the device and the next pass must know to move it).
	want := map[string]bool{}
	for _, d := range desired {
		want[d.Remote.Cluster] = true
	}
	for name, f := range r.failed {
		if !want[name] || !slices.ContainsFunc(desired, func(d Want) bool { return EqualWant(d, f.Want) }) {
			delete(r.failed, name) // no longer wanted as it failed: the next attempt decides
		}
	}
	for name, a := range r.applied {
		if _, seen := observed[a.Want.Driver]; !want[name] && seen {
			delete(r.applied, name)
		}
	}
	movedAt := map[string]time.Time{} // pairs whose old connection went in this pass
	failed := map[string]bool{}       // pairs whose old connection could not be removed
	for _, a := range actions {
		switch a.Kind {
		case Disconnect:
			start := r.now()
			if err := r.drivers[a.Driver].Disconnect(ctx, a.Cluster); err != nil {
				r.log.Error("disconnect failed", "cluster", a.Cluster, "driver", a.Driver, "err", err)
				errs = append(errs, fmt.Errorf("disconnect %s from %s: %w", a.Cluster, a.Driver, err))
				failed[a.Cluster] = true
				continue
			}
			if prev, ok := r.applied[a.Cluster]; ok && prev.Want.Driver == a.Driver {
				delete(r.applied, a.Cluster)
			}
			if a.MovesTo != "" {
				movedAt[a.Cluster] = start
			}
			r.log.Info("disconnected", "cluster", a.Cluster, "driver", a.Driver, "reason", a.Reason)
		case Connect:
			d := a.Want
			if failed[a.Cluster] {
				// Connecting now would put two cables' routes on the same subnets.
				err := fmt.Errorf("connect %s over %s: skipped, the old connection could not be removed", a.Cluster, a.Driver)
				errs = append(errs, err)
				r.failed[a.Cluster] = Failure{Want: d, Err: err, At: r.now()}
				continue
			}
			start := r.now()
			if err := r.drivers[a.Driver].Connect(ctx, d.Remote, d.Options); err != nil {
				r.log.Error("connect failed", "cluster", a.Cluster, "node", d.Remote.Node, "driver", a.Driver, "peer", EndpointString(d.Remote), "err", err)
				delete(r.applied, a.Cluster)
				r.failed[a.Cluster] = Failure{Want: d, Err: err, At: r.now()}
				errs = append(errs, fmt.Errorf("connect %s over %s: %w", a.Cluster, a.Driver, err))
				continue
			}
			end := r.now()
			r.applied[a.Cluster] = Applied{Want: d, Revision: revision, At: end}
			delete(r.failed, a.Cluster)
			r.log.Info("connected", "cluster", a.Cluster, "node", d.Remote.Node, "driver", a.Driver, "peer", EndpointString(d.Remote),
				"subnets", fmt.Sprint(d.Remote.Subnets), "policy", d.Policy, "revision", revision, "reason", a.Reason)
			from := a.MovesFrom
			if t, ok := movedAt[a.Cluster]; ok {
				start = t
				if from == "" {
					// A restart: the old connection was found on the device, not in memory.
					for _, x := range actions {
						if x.Kind == Disconnect && x.Cluster == a.Cluster && x.MovesTo == a.Driver {
							from = x.Driver
						}
					}
				}
			}
			if from != "" && from != a.Driver {
				r.log.Info("pair moved", "cluster", a.Cluster, "from", from, "to", a.Driver, "policy", d.Policy,
					"duration", end.Sub(start).String(), "durationMs", float64(end.Sub(start).Microseconds())/1000, "revision", revision)
			}
		}
	}
	return actions, errors.Join(errs...)
}
