package plan

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerclient"
	"github.com/cablemesh/cablemesh/agent/reconcile"
)

// resolveTimeout bounds the one resolution of the broker's host names at start.
const resolveTimeout = 5 * time.Second

// GuardSources are where BuildGuard looks.
type GuardSources struct {
	Broker    string     // the config's broker list
	Advertise netip.Addr // this node's advertise address (invalid: none yet)
	Log       *slog.Logger
	// LookupHost resolves the broker's host names; default the system resolver. Underlay is
	// the network of the link that holds an address; default from the interface addresses.
	LookupHost func(context.Context, string) ([]netip.Addr, error)
	Underlay   func(netip.Addr) (netip.Prefix, error)
}

// BuildGuard finds, at start and again when the Node's InternalIP changes, what
// no cable route may cover (reconcile.Guard): every address of the broker list (host names
// resolved now), this node's advertise address and the network of the link that holds it. What
// cannot be found is logged and left out; the gateways' addresses come from the broker state at
// every pass.
func BuildGuard(ctx context.Context, src GuardSources) reconcile.Guard {
	if src.LookupHost == nil {
		src.LookupHost = lookupHost
	}
	if src.Underlay == nil {
		src.Underlay = InterfaceNetwork
	}
	var g reconcile.Guard
	addrs, _ := brokerclient.SplitAddresses(src.Broker) // validated with the config
	for _, hp := range addrs {
		host, _, _ := net.SplitHostPort(hp)
		if ip, err := netip.ParseAddr(host); err == nil {
			g.Protected = append(g.Protected, reconcile.ProtectAddr(ip, "the broker's address "+ip.Unmap().String()))
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
		ips, err := src.LookupHost(rctx, host)
		cancel()
		if err != nil || len(ips) == 0 {
			src.Log.Warn("cannot resolve the broker's host name: cable routes are not checked against its addresses", "broker", hp, "err", err)
			continue
		}
		for _, ip := range ips {
			g.Protected = append(g.Protected, reconcile.ProtectAddr(ip, fmt.Sprintf("the broker's address %s (%s)", ip.Unmap(), host)))
		}
	}
	if adv := src.Advertise; adv.IsValid() {
		g.Protected = append(g.Protected, reconcile.ProtectAddr(adv, "this node's advertise address "+adv.String()))
		switch p, err := src.Underlay(adv); {
		case err != nil:
			src.Log.Warn("cannot find the network of the advertise address's link: cable routes are not checked against it", "advertiseAddress", adv.String(), "err", err)
		case p.IsValid() && !p.IsSingleIP():
			g.Protected = append(g.Protected, reconcile.Protected{Prefix: p.Masked(), What: fmt.Sprintf("this node's underlay network %s (the link of its advertise address)", p.Masked())})
		}
	}
	var what []string
	for _, p := range g.Protected {
		what = append(what, p.Prefix.String())
	}
	src.Log.Info("no cable route may cover the broker, this node's underlay or a gateway", "protected", strings.Join(what, ","))
	return g
}

// InterfaceNetwork is the connected network of the interface address equal to addr (e.g.
// 10.0.0.11/24 for 10.0.0.11), or an invalid prefix when no interface holds addr.
func InterfaceNetwork(addr netip.Addr) (netip.Prefix, error) {
	ifas, err := net.InterfaceAddrs()
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("list interface addresses: %w", err)
	}
	return networkOf(addr, ifas), nil
}

// networkOf is the network of the address in ifas equal to addr.
func networkOf(addr netip.Addr, ifas []net.Addr) netip.Prefix {
	for _, ifa := range ifas {
		n, ok := ifa.(*net.IPNet)
		if !ok {
			continue
		}
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || ip.Unmap() != addr.Unmap() {
			continue
		}
		ones, _ := n.Mask.Size()
		return netip.PrefixFrom(ip.Unmap(), ones).Masked()
	}
	return netip.Prefix{}
}

// lookupHost resolves a host name to its IP addresses.
func lookupHost(ctx context.Context, host string) ([]netip.Addr, error) {
	return net.DefaultResolver.LookupNetIP(ctx, "ip", host)
}

// Guards is the guard in force: built at start (Build), built again when this node's address
// moved (Build again). mu guards cur; no other lock is taken under it.
type Guards struct {
	sources func() GuardSources
	mu      sync.Mutex
	cur     reconcile.Guard
}

// NewGuards returns the guards built from what sources says at each Build.
func NewGuards(sources func() GuardSources) *Guards { return &Guards{sources: sources} }

// Build finds the guard now (BuildGuard) and puts it in force.
func (g *Guards) Build(ctx context.Context) {
	next := BuildGuard(ctx, g.sources())
	g.mu.Lock()
	g.cur = next
	g.mu.Unlock()
}

// Current is the guard in force (none before the first Build).
func (g *Guards) Current() reconcile.Guard {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cur
}
