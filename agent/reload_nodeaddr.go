package agent

import (
	"context"
	"net/netip"
	"slices"
	"sync"

	"github.com/cablemesh/cablemesh/agent/kube"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/syncloop"
)

// On Kubernetes (kubernetes.enabled) a gateway's addresses come from its Node object, as
// Submariner's gateway takes them: the endpoint's private IP is the Node's InternalIP unless the
// config sets advertiseAddress, its public IP the Node's ExternalIP. The Node is followed for the
// agent's life (kube.NodeWatcher): when its addresses change, the drivers are rebuilt on the new
// private address (their tunnels use it as their local end) and the endpoint is registered
// again, so the broker publishes the new addresses. Like a config reload, it touches only what
// depends on what changed.

// NodeAddressSource hands out this node's addresses whenever they change, until ctx ends
// (kube.NodeWatcher).
type NodeAddressSource interface {
	Run(ctx context.Context, onChange func(kube.NodeAddresses)) error
}

// nodeAddrState is the Node's latest addresses.
type nodeAddrState struct {
	mu      sync.Mutex
	addrs   kube.NodeAddresses
	known   bool
	first   chan struct{}     // closed at the first addresses with an InternalIP
	changed *syncloop.Trigger // a change after the first, for nodeAddressLoop
	// guard replaces Agent.guard (built at start) once the Node's InternalIP changed: the
	// guard protects the address the node has now (currentGuard).
	guard *reconcile.Guard
}

// currentGuard is what no cable route may cover now: the guard built at start, or the one
// rebuilt for the Node's new InternalIP.
func (a *Agent) currentGuard() reconcile.Guard {
	a.nodeAddr.mu.Lock()
	defer a.nodeAddr.mu.Unlock()
	if a.nodeAddr.guard != nil {
		return *a.nodeAddr.guard
	}
	return a.guard
}

// advertiseAddr is this node's private address: the config's advertiseAddress, else (on
// Kubernetes) its Node's InternalIP.
func (a *Agent) advertiseAddr() netip.Addr {
	if adv := a.cfg.AdvertiseAddr(); adv.IsValid() {
		return adv
	}
	a.nodeAddr.mu.Lock()
	defer a.nodeAddr.mu.Unlock()
	return a.nodeAddr.addrs.Private
}

// publicAddr is the Node's ExternalIP on Kubernetes (invalid elsewhere, or when it has none).
func (a *Agent) publicAddr() netip.Addr {
	a.nodeAddr.mu.Lock()
	defer a.nodeAddr.mu.Unlock()
	return a.nodeAddr.addrs.Public
}

// endpointAddrs are the endpoint's private and public IP, "" when absent.
func (a *Agent) endpointAddrs() (private, public string) {
	if p := a.advertiseAddr(); p.IsValid() {
		private = p.String()
	}
	if p := a.publicAddr(); p.IsValid() {
		public = p.String()
	}
	return private, public
}

// startNodeAddresses follows the Node on a Kubernetes gateway (Options.NodeAddresses) and, when
// the config sets no advertiseAddress, waits for its first InternalIP: the drivers and the guard
// need the node's address before they start. stop ends the watch and waits for it.
func (a *Agent) startNodeAddresses(ctx context.Context) (stop func(), err error) {
	src := a.opts.NodeAddresses
	if src == nil || !a.cfg.Gateway {
		return func() {}, nil
	}
	a.nodeAddr.first = make(chan struct{})
	a.nodeAddr.changed = &syncloop.Trigger{}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := src.Run(wctx, a.onNodeAddresses); err != nil && wctx.Err() == nil {
			a.log.Error("NODE ADDRESSES NOT FOLLOWED: the endpoint keeps its addresses", "err", err)
		}
	}()
	stop = func() { cancel(); <-done }
	if a.cfg.AdvertiseAddress != "" {
		return stop, nil
	}
	a.log.Info("waiting for this node's InternalIP (advertiseAddress is not set)", "node", a.cfg.Node)
	select {
	case <-a.nodeAddr.first:
		a.log.Info("node addresses from the Node object", "private", a.advertiseAddr().String(), "public", a.publicAddr().String())
		return stop, nil
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
}

// onNodeAddresses records the Node's addresses; a change after the first is handed to
// nodeAddressLoop.
func (a *Agent) onNodeAddresses(n kube.NodeAddresses) {
	a.nodeAddr.mu.Lock()
	defer a.nodeAddr.mu.Unlock()
	was, known := a.nodeAddr.addrs, a.nodeAddr.known
	if known && was == n {
		return
	}
	if !n.Private.IsValid() && was.Private.IsValid() {
		// A Node whose InternalIP went missing (status being rewritten) keeps its last one: an
		// endpoint without a private IP reaches no one.
		n.Private = was.Private
	}
	a.nodeAddr.addrs, a.nodeAddr.known = n, true
	// Without advertiseAddress the Node's addresses count once they hold an InternalIP.
	if n.Private.IsValid() || a.cfg.AdvertiseAddress != "" {
		select {
		case <-a.nodeAddr.first:
			a.nodeAddr.changed.Fire()
		default:
			close(a.nodeAddr.first)
			if a.cfg.AdvertiseAddress != "" {
				// The agent did not wait for these: it may have registered without the public IP.
				a.nodeAddr.changed.Fire()
			}
		}
	}
}

// nodeAddressLoop applies the Node's address changes until ctx ends: a new private address
// (when the config sets none) rebuilds the running drivers on it; any change registers the
// endpoint again.
func (a *Agent) nodeAddressLoop(ctx context.Context, client apiv1.AgentClient) {
	if a.nodeAddr.changed == nil {
		return
	}
	registered, _ := a.endpointAddrs()
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.nodeAddr.changed.C():
		}
		private, public := a.endpointAddrs()
		a.log.Info("node addresses changed", "private", private, "public", public)
		if private != registered && a.cfg.AdvertiseAddress == "" {
			// Serialised with config reloads: both rebuild drivers.
			a.reload.Lock()
			var names []string
			for _, d := range a.cables.Running() {
				names = append(names, d.Name())
			}
			slices.Sort(names)
			if len(names) > 0 {
				a.cables.Rebuild(ctx, a.liveConfig(), names)
				a.cables.ClampMSS()
			}
			a.reload.Unlock()
			// The old address is no longer this node's: the guard protects the new one (and
			// its link's network), so no cable route may cover the node's own underlay.
			g := a.buildGuard(ctx)
			a.nodeAddr.mu.Lock()
			a.nodeAddr.guard = &g
			a.nodeAddr.mu.Unlock()
			a.log.Info("drivers rebuilt on the node's new address; the guard against cable routes protects it", "private", private)
			a.Trigger()
		}
		registered = private
		a.reregister(ctx, client)
	}
}
