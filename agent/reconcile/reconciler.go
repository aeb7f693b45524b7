package reconcile

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"github.com/cablemesh/cablemesh/cable"
)

// Reconciler applies plans through one driver. It is safe for concurrent use; passes are
// serialised.
type Reconciler struct {
	driver cable.Driver
	log    *slog.Logger

	mu      sync.Mutex
	applied map[string]cable.RemoteEndpoint // what this process last connected, by cluster
}

// NewReconciler returns a reconciler for driver.
func NewReconciler(driver cable.Driver, log *slog.Logger) *Reconciler {
	return &Reconciler{driver: driver, log: log, applied: map[string]cable.RemoteEndpoint{}}
}

// Reconcile observes the driver's connections, plans against desired and applies the plan. If
// the driver cannot be observed it changes nothing. It returns the actions it attempted and the
// joined errors of those that failed; a failed action is retried on the next pass.
func (r *Reconciler) Reconcile(ctx context.Context, desired []cable.RemoteEndpoint) ([]Action, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	observed, err := r.driver.Connections(ctx)
	if err != nil {
		return nil, fmt.Errorf("observe %s connections: %w", r.driver.Name(), err)
	}
	actions := Plan(desired, observed, r.applied)
	// Forget what was applied but is neither desired nor on the device any more.
	want := map[string]bool{}
	for _, d := range desired {
		want[d.Cluster] = true
	}
	for name := range r.applied {
		if !want[name] {
			delete(r.applied, name)
		}
	}
	var errs []error
	for _, a := range actions {
		switch a.Kind {
		case Disconnect:
			if err := r.driver.Disconnect(ctx, a.Cluster); err != nil {
				r.log.Error("disconnect failed", "cluster", a.Cluster, "driver", r.driver.Name(), "err", err)
				errs = append(errs, fmt.Errorf("disconnect %s: %w", a.Cluster, err))
				continue
			}
			delete(r.applied, a.Cluster)
			r.log.Info("disconnected", "cluster", a.Cluster, "driver", r.driver.Name(), "reason", a.Reason)
		case Connect:
			d := a.Remote
			if err := r.driver.Connect(ctx, d, nil); err != nil {
				r.log.Error("connect failed", "cluster", d.Cluster, "node", d.Node, "driver", r.driver.Name(), "peer", EndpointString(d), "err", err)
				delete(r.applied, d.Cluster)
				errs = append(errs, fmt.Errorf("connect %s: %w", d.Cluster, err))
				continue
			}
			r.applied[d.Cluster] = d
			r.log.Info("connected", "cluster", d.Cluster, "node", d.Node, "driver", r.driver.Name(), "peer", EndpointString(d),
				"subnets", fmt.Sprint(d.Subnets), "reason", a.Reason)
		}
	}
	return actions, errors.Join(errs...)
}
