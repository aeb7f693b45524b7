package reconcile

import (
	"maps"

	"github.com/cablemesh/cablemesh/cable"
)

// A running agent rebuilds one cable driver when its settings change in the config file
// (agent/reload_drivers.go). The pairs over the other drivers must not notice: their connections
// stay as applied, so the reconciler that replaces this one keeps what this one applied for
// them, and forgets only the rebuilt drivers' pairs (the new driver has none of them yet, so the
// next pass connects them again).

// Retire makes every later Reconcile of r a no-op, after waiting for a pass in flight: a pass
// that read r before the agent swapped it out must not touch a driver being torn down.
func (r *Reconciler) Retire() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.retired = true
}

// Successor returns a reconciler over r's drivers with changed applied: a name mapped to a
// driver adds or replaces it, a name mapped to nil removes it. What r applied and what failed
// over the drivers that stay is carried over; the changed drivers' pairs start afresh. A field
// added to Reconciler must be carried over here too.
func (r *Reconciler) Successor(changed map[string]cable.Driver) *Reconciler {
	r.mu.Lock()
	defer r.mu.Unlock()
	drivers := maps.Clone(r.drivers)
	for name, d := range changed {
		if d == nil {
			delete(drivers, name)
		} else {
			drivers[name] = d
		}
	}
	next := &Reconciler{drivers: drivers, log: r.log, now: r.now, applied: map[string]Applied{}, failed: map[string]Failure{}}
	for cluster, a := range r.applied {
		if _, gone := changed[a.Want.Driver]; !gone {
			next.applied[cluster] = a
		}
	}
	for cluster, f := range r.failed {
		if _, gone := changed[f.Want.Driver]; !gone {
			next.failed[cluster] = f
		}
	}
	return next
}
