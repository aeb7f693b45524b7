package ingress

import (
	"cmp"
	"context"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/syncloop"
	"github.com/cablemesh/cablemesh/mcs"
)

// Gateway mode on a gateway node: the broker allocates the node a mesh address (its
// Endpoint.mesh_address, in the RegisterEndpoint answer and the watch); the agent puts it on
// the cbl-mesh0 link and programs the ingress data plane (agent/ingress/nftables): SNAT of
// traffic to the remote gateways of its gateway-mode pairs to its own mesh address, and in
// kernel mode the DNAT of "mesh address : ingress port" to each exported service's ready local
// endpoints. In envoy mode Envoy, configured over xDS, serves the TCP ingress ports, and the
// data plane does the SNAT and the UDP ports (Envoy's ingress is a TCP and HTTP proxy: without
// this an exported UDP port would get an ingress port with nothing behind it).
//
// The data plane is applied from meshLoop: a change of exports, endpoints, pairs or the mesh
// address triggers it (debounced by meshDebounce); every resync re-applies (Apply is idempotent,
// an atomic replace), which also repairs drift.

// meshDebounce coalesces bursts of changes (an export with many endpoints arriving, a reconcile
// pass that touches several pairs) into one Apply.
const meshDebounce = 100 * time.Millisecond

// cleanupTimeout bounds the removal of the table and cbl-mesh0 with CleanupOnExit.
const cleanupTimeout = 30 * time.Second

// MeshLink puts the mesh address on the node; default EnsureMeshLink/RemoveMeshLink.
type MeshLink interface {
	Ensure(netip.Addr) error
	Remove() error
}

type kernelMeshLink struct{}

func (kernelMeshLink) Ensure(a netip.Addr) error { return EnsureMeshLink(a) }
func (kernelMeshLink) Remove() error             { return RemoveMeshLink() }

// meshState is the gateway's mesh address and ingress data plane.
type meshState struct {
	mu         sync.Mutex
	registered netip.Addr // from the last RegisterEndpoint answer
	dp         Dataplane
	openErr    string
	linkErr    string
	linkAddr   netip.Addr // what cbl-mesh0 holds (as last ensured)
	applyErr   string
	applied    *Config // last Config the data plane accepted
	trigger    syncloop.Trigger
}

// TriggerMesh asks meshLoop for an Apply soon (the plan changed); triggers coalesce.
func (g *Gateway) TriggerMesh() { g.triggerMesh() }

func (g *Gateway) triggerMesh() {
	g.mesh.trigger.Fire()
}

// ObserveRegistered records the mesh address the broker gave this node at registration.
func (g *Gateway) ObserveRegistered(ep *apiv1.Endpoint) {
	addr := reconcile.MeshAddress(ep)
	g.mesh.mu.Lock()
	changed := addr != g.mesh.registered
	g.mesh.registered = addr
	g.mesh.mu.Unlock()
	if changed {
		if addr.IsValid() {
			g.log.Info("mesh address allocated by the broker", "meshAddress", addr)
		}
		g.deps.OnRegistered()
		g.triggerMesh()
	}
}

// meshAddress is this node's mesh address: its endpoint's in the broker state, else the one of
// the last registration answer; invalid when it has none (not a gateway, or an older broker).
func meshAddressOf(st *brokerstate.State, cluster, node string, registered netip.Addr) netip.Addr {
	if a := reconcile.MeshAddress(st.Endpoints[brokerstate.EndpointKey(cluster, node)]); a.IsValid() {
		return a
	}
	return registered
}

// MeshAddress is this node's mesh address (invalid when none).
func (g *Gateway) MeshAddress() netip.Addr {
	return meshAddressOf(g.deps.Plan().State, g.cfg.Cluster, g.cfg.Node, g.Registered())
}

// Registered is the mesh address of the last registration answer (invalid: none yet).
func (g *Gateway) Registered() netip.Addr {
	g.mesh.mu.Lock()
	defer g.mesh.mu.Unlock()
	return g.mesh.registered
}

// startMeshIngress opens the ingress data plane on gateways and runs meshLoop; the returned stop
// ends the loop and, with CleanupOnExit, removes the table and cbl-mesh0 (else leaves them, so a
// restart breaks no flow).
func (g *Gateway) startMeshIngress(ctx context.Context) (stop func()) {
	if !g.cfg.Gateway {
		return func() {}
	}
	dp, err := g.deps.OpenDataplane(g.log)
	g.mesh.mu.Lock()
	if err != nil {
		g.mesh.openErr = err.Error()
		g.log.Error("ingress data plane not available: gateway-mode pairs carry no traffic", "err", err)
	}
	g.mesh.dp = dp
	g.mesh.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { g.meshLoop(ctx) })
	return func() {
		cancel()
		wg.Wait()
		if g.deps.CleanupOnExit || (g.deps.CleanupDecision != nil && g.deps.CleanupDecision()) {
			cctx, ccancel := context.WithTimeout(context.Background(), cleanupTimeout)
			defer ccancel()
			if dp != nil {
				if err := dp.Cleanup(cctx); err != nil {
					g.log.Error("ingress data plane cleanup failed", "err", err)
				}
			}
			if err := g.deps.MeshLink.Remove(); err != nil {
				g.log.Error("mesh link cleanup failed", "link", MeshLinkName, "err", err)
			}
		}
		if dp != nil {
			if err := dp.Close(); err != nil {
				g.log.Error("ingress data plane did not close cleanly", "err", err)
			}
		}
	}
}

// meshLoop applies the ingress on every trigger (debounced) and every resync.
func (g *Gateway) meshLoop(ctx context.Context) {
	t := time.NewTicker(g.cfg.ResyncInterval)
	defer t.Stop()
	force := true
	for {
		g.meshOnce(ctx, force)
		force = false
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			force = true // re-applied as it is: repairs drift (someone flushed the table)
		case <-g.mesh.trigger.C():
			select {
			case <-ctx.Done():
				return
			case <-time.After(meshDebounce):
			}
			// What arrived during the wait is part of this pass.
			g.mesh.trigger.Drain()
		}
	}
}

// meshOnce is one observe → compute → apply pass: the mesh address on cbl-mesh0, then the data
// plane's Config, applied when it changed (or force).
func (g *Gateway) meshOnce(ctx context.Context, force bool) {
	g.mesh.mu.Lock()
	reg, dp := g.mesh.registered, g.mesh.dp
	g.mesh.mu.Unlock()
	p := g.deps.Plan()
	own := meshAddressOf(p.State, g.cfg.Cluster, g.cfg.Node, reg)
	gatewayMode := gatewayModeUsed(p.State.Clusters[g.cfg.Cluster], p.Wants)
	// The broker gives every gateway a mesh address, but only a gateway of a gateway-mode
	// cluster, or with a gateway-mode pair, uses it: a mesh of direct pairs sees no mesh link and
	// an empty table.
	if !gatewayMode {
		own = netip.Addr{}
	}
	linkErr := ""
	if own.IsValid() {
		if err := g.deps.MeshLink.Ensure(own); err != nil {
			linkErr = err.Error()
		}
	} else if err := g.deps.MeshLink.Remove(); err != nil {
		linkErr = err.Error()
	}
	g.mesh.mu.Lock()
	if linkErr != g.mesh.linkErr && linkErr != "" {
		g.log.Error("mesh link not as wanted", "link", MeshLinkName, "meshAddress", own, "err", linkErr)
	}
	g.mesh.linkErr = linkErr
	linkMoved := false
	if linkErr == "" {
		linkMoved = g.mesh.linkAddr != own
		g.mesh.linkAddr = own
	}
	g.mesh.mu.Unlock()
	if linkMoved {
		// The xDS ingress-port listeners bind the address cbl-mesh0 holds (agent/ingress.go).
		g.triggerIngress()
	}
	if dp == nil {
		return
	}
	set := g.deps.Exports()
	cfg := ingressConfig(own, remoteMeshAddresses(p.Wants), set, g.cfg.Ingress.Mode)
	g.mesh.mu.Lock()
	same := g.mesh.applied != nil && reflect.DeepEqual(*g.mesh.applied, cfg)
	g.mesh.mu.Unlock()
	if same && !force {
		return
	}
	err := dp.Apply(ctx, cfg)
	g.mesh.mu.Lock()
	prev := g.mesh.applyErr
	g.mesh.applyErr = ""
	g.mesh.applied = nil
	if err != nil {
		g.mesh.applyErr = err.Error()
	} else {
		g.mesh.applied = &cfg
	}
	g.mesh.mu.Unlock()
	if err != nil && err.Error() != prev && ctx.Err() == nil {
		g.log.Error("ingress data plane not applied; the previous rules stay", "err", err)
	}
}

// gatewayModeUsed says whether this gateway takes part in gateway mode: its cluster joined in
// gateway mode, or one of its wanted connections is a gateway-mode pair.
func gatewayModeUsed(local *apiv1.Cluster, wants []reconcile.Want) bool {
	if local.GetGatewayMode() {
		return true
	}
	for _, w := range wants {
		if w.GatewayMode {
			return true
		}
	}
	return false
}

// remoteMeshAddresses are the remote mesh addresses of the gateway-mode pairs among wants,
// sorted, without duplicates; nil when there are none.
func remoteMeshAddresses(wants []reconcile.Want) []netip.Addr {
	var out []netip.Addr
	for _, w := range wants {
		if w.GatewayMode && w.RemoteMesh.IsValid() {
			out = append(out, w.RemoteMesh)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// ingressConfig is the data plane's Config (pure): own mesh address; remote, the remote mesh
// addresses of the gateway-mode pairs (remoteMeshAddresses); every exported port with an
// ingress port that the data plane serves (kernel mode: TCP and UDP; envoy mode: UDP only,
// Envoy serves TCP) and its ready local endpoints (ip:targetPort). Sorted, so equal inputs give
// equal configs.
func ingressConfig(own netip.Addr, remote []netip.Addr, exports []*apiv1.ServiceExport, mode string) Config {
	cfg := Config{MeshAddress: own}
	if !own.IsValid() {
		return cfg // no mesh address yet: nothing is served or translated
	}
	// A copy: the Config is kept as the applied one, and remote is shared with later passes.
	cfg.RemoteMeshAddresses = slices.Clone(remote)
	for _, e := range exports {
		svc := Service{Namespace: e.GetNamespace(), Name: e.GetName()}
		for _, p := range e.GetPorts() {
			proto := strings.ToUpper(cmp.Or(p.GetProtocol(), "TCP"))
			if p.GetIngressPort() == 0 || p.GetIngressPort() > 65535 || (proto != "TCP" && proto != "UDP") {
				continue // not allocated yet, or a protocol the ingress does not serve (SCTP)
			}
			if mode == config.IngressEnvoy && proto == "TCP" {
				continue // Envoy's listener serves it
			}
			port := Port{Name: p.GetName(), Protocol: proto, IngressPort: uint16(p.GetIngressPort()), Backends: []netip.AddrPort{}}
			for _, ep := range e.GetEndpoints() {
				ip, err := netip.ParseAddr(ep.GetIp())
				if !ep.GetReady() || err != nil || !ip.Unmap().Is4() {
					continue // the kernel ingress is IPv4 only
				}
				port.Backends = append(port.Backends, netip.AddrPortFrom(ip.Unmap(), mcs.BackendPort(p)))
			}
			slices.SortFunc(port.Backends, netip.AddrPort.Compare)
			port.Backends = slices.Compact(port.Backends)
			svc.Ports = append(svc.Ports, port)
		}
		if len(svc.Ports) > 0 {
			cfg.Services = append(cfg.Services, svc)
		}
	}
	slices.SortFunc(cfg.Services, func(x, y Service) int {
		return cmp.Or(cmp.Compare(x.Namespace, y.Namespace), cmp.Compare(x.Name, y.Name))
	})
	return cfg
}

// meshStatus is the status's gateway-mode part: the mesh address and the data plane's state.
func (g *Gateway) meshStatus() (string, *statusapi.IngressDataplane) {
	own := g.MeshAddress()
	addr := ""
	if own.IsValid() {
		addr = own.String()
	}
	if !g.cfg.Gateway {
		return addr, nil
	}
	g.mesh.mu.Lock()
	dp := g.mesh.dp
	out := &statusapi.IngressDataplane{Kind: "nftables", Error: joinMsgs(g.mesh.openErr, g.mesh.linkErr, g.mesh.applyErr)}
	if g.mesh.linkAddr.IsValid() {
		out.MeshLink = MeshLinkName
	}
	g.mesh.mu.Unlock()
	if dp != nil {
		s := dp.Status()
		out.Programmed = s.Programmed
		out.RemoteMeshAddresses = s.RemoteMeshAddresses
		out.Ports = s.Ports
		out.PortsWithoutBackends = s.PortsWithoutBackends
		out.Backends = s.Backends
		out.Rules = s.Rules
		if !s.LastApply.IsZero() {
			u := s.LastApply.UTC()
			out.LastApply = &u
		}
		if s.LastError != "" && !strings.Contains(out.Error, s.LastError) {
			out.Error = joinMsgs(out.Error, s.LastError)
		}
	}
	return addr, out
}
