package kube

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/tools/cache"

	"github.com/cablemesh/cablemesh/internal/syncloop"
)

// NodeAddresses are the addresses a gateway's endpoint publishes, from its Node object: the
// private address other gateways of a private network dial (InternalIP) and the public one
// (ExternalIP), as Submariner's gateway takes them. A zero address is absent.
type NodeAddresses struct {
	Private netip.Addr
	Public  netip.Addr
}

// AddressesOf picks a Node's addresses: the first parseable InternalIP and ExternalIP of its
// status, IPv4 before IPv6 (the cables' underlay is IPv4 first). It is pure; an address that does
// not parse is skipped, since the Node's status is outside input.
func AddressesOf(n *corev1.Node) NodeAddresses {
	pick := func(t corev1.NodeAddressType) netip.Addr {
		var v6 netip.Addr
		for _, a := range n.Status.Addresses {
			if a.Type != t {
				continue
			}
			ip, err := netip.ParseAddr(a.Address)
			if err != nil || ip.Zone() != "" {
				continue
			}
			ip = ip.Unmap()
			if ip.Is4() {
				return ip
			}
			if !v6.IsValid() {
				v6 = ip
			}
		}
		return v6
	}
	return NodeAddresses{Private: pick(corev1.NodeInternalIP), Public: pick(corev1.NodeExternalIP)}
}

// NodeWatcher follows one Node (the agent's own, by name) with an informer filtered to it and
// hands out its addresses whenever they change, for the gateway's endpoint.
type NodeWatcher struct {
	Client Client
	Node   string
	Log    *slog.Logger
	// Resync is the informer's resync period; default none.
	Resync time.Duration
}

// Run calls onChange with the Node's addresses once its cache has synced and the Node exists,
// and again whenever they change, until ctx ends. A deleted Node hands out nothing: the endpoint
// keeps its last addresses rather than going to none.
func (w *NodeWatcher) Run(ctx context.Context, onChange func(NodeAddresses)) error {
	if w.Node == "" {
		return fmt.Errorf("node addresses: no node name")
	}
	log := w.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	inf := newInformer(w.Client, w.Client.Nodes(), &corev1.Node{}, w.Resync, namespaceIndexers(),
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", w.Node).String()
		})
	var changed syncloop.Trigger
	poke := func(any) {
		changed.Fire()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: poke, UpdateFunc: func(_, n any) { poke(n) }}); err != nil {
		return fmt.Errorf("node informer: %w", err)
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { inf.RunWithContext(ctx) })
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return nil
	}
	var last NodeAddresses
	sent := false
	emit := func() {
		obj, ok, err := inf.GetStore().GetByKey(w.Node)
		if err != nil || !ok {
			return
		}
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		a := AddressesOf(n)
		if sent && a == last {
			return
		}
		if !a.Private.IsValid() {
			log.Warn("node has no InternalIP address", "node", w.Node)
		}
		last, sent = a, true
		onChange(a)
	}
	emit()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-changed.C():
			emit()
		}
	}
}
