package kube

import (
	"context"
	"log/slog"
	"net/netip"
	"sync"

	"github.com/cablemesh/cablemesh/internal/syncloop"
)

// AddressSource follows this node's Node object (NodeWatcher).
type AddressSource interface {
	Run(ctx context.Context, onChange func(NodeAddresses)) error
}

// Addresses are this node's addresses as its endpoint publishes them: the config's
// advertiseAddress, else the Node's InternalIP; the Node's ExternalIP. mu guards the fields
// below it; no other lock is taken under it.
type Addresses struct {
	src        AddressSource // nil: the config's address only
	configured netip.Addr    // advertiseAddress (invalid: none)
	node       string
	log        *slog.Logger

	mu      sync.Mutex
	addrs   NodeAddresses
	known   bool
	first   chan struct{}     // closed at the first addresses with an InternalIP
	changed *syncloop.Trigger // a change after the first, for Run
}

// NewAddresses returns the addresses of node, with the config's advertiseAddress configured
// (invalid: none) and src the Node's (nil: none).
func NewAddresses(src AddressSource, configured netip.Addr, node string, log *slog.Logger) *Addresses {
	return &Addresses{src: src, configured: configured, node: node, log: log}
}

// Private is this node's private address: the config's advertiseAddress, else (on Kubernetes)
// its Node's InternalIP.
func (x *Addresses) Private() netip.Addr {
	if x.configured.IsValid() {
		return x.configured
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.addrs.Private
}

// Public is the Node's ExternalIP on Kubernetes (invalid elsewhere, or when it has none).
func (x *Addresses) Public() netip.Addr {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.addrs.Public
}

// Endpoint are the addresses the endpoint publishes, as strings ("" for none).
func (x *Addresses) Endpoint() (private, public string) {
	if p := x.Private(); p.IsValid() {
		private = p.String()
	}
	if p := x.Public(); p.IsValid() {
		public = p.String()
	}
	return private, public
}

// Start follows the Node (on gateways, with a source) and, when the config sets no
// advertiseAddress, waits for its first InternalIP: a gateway cannot build its drivers nor
// register without an address. The returned stop ends the watch.
func (x *Addresses) Start(ctx context.Context) (stop func(), err error) {
	if x.src == nil {
		return func() {}, nil
	}
	x.first = make(chan struct{})
	x.changed = &syncloop.Trigger{}
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := x.src.Run(wctx, x.set); err != nil && wctx.Err() == nil {
			x.log.Error("NODE ADDRESSES NOT FOLLOWED: the endpoint keeps its addresses", "err", err)
		}
	}()
	stop = func() { cancel(); <-done }
	if x.configured.IsValid() {
		return stop, nil
	}
	x.log.Info("waiting for this node's InternalIP (advertiseAddress is not set)", "node", x.node)
	select {
	case <-x.first:
		x.log.Info("node addresses from the Node object", "private", x.Private().String(), "public", x.Public().String())
		return stop, nil
	case <-ctx.Done():
		stop()
		return nil, ctx.Err()
	}
}

func (x *Addresses) set(n NodeAddresses) {
	x.mu.Lock()
	defer x.mu.Unlock()
	was, known := x.addrs, x.known
	if known && was == n {
		return
	}
	if !n.Private.IsValid() && was.Private.IsValid() {
		// A Node whose InternalIP went missing (status being rewritten) keeps its last one: an
		// endpoint without a private IP reaches no one.
		n.Private = was.Private
	}
	x.addrs, x.known = n, true
	// Without advertiseAddress the Node's addresses count once they hold an InternalIP.
	if n.Private.IsValid() || x.configured.IsValid() {
		select {
		case <-x.first:
			x.changed.Fire()
		default:
			close(x.first)
			if x.configured.IsValid() {
				// The agent did not wait for these: it may have registered without the public IP.
				x.changed.Fire()
			}
		}
	}
}

// Run calls onChange after every change of the addresses after the first, until ctx ends;
// privateMoved says the private address is not the one of the previous call (or of the start).
// Without a source it returns at once.
func (x *Addresses) Run(ctx context.Context, onChange func(ctx context.Context, privateMoved bool)) {
	if x.changed == nil {
		return
	}
	registered, _ := x.Endpoint()
	for {
		select {
		case <-ctx.Done():
			return
		case <-x.changed.C():
		}
		private, public := x.Endpoint()
		x.log.Info("node addresses changed", "private", private, "public", public)
		onChange(ctx, private != registered && !x.configured.IsValid())
		registered = private
	}
}
