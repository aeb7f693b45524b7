package ingress

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/ingressport"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/agent/xds"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/syncloop"
)

// The ingress on gateways: every exported service port gets an ingress port from
// ingress.portRange (agent/ingressport: stable across restarts in stateDir/ingress-ports.json),
// stamped on the exports sent to the broker (ServicePort.ingress_port). With ingress.xds.listen
// set, the agent serves the ingress Envoy's and proxyless gRPC clients' configuration over xDS
// (agent/xds), rebuilt whenever the exports change and when the node's certificate files change
// (the secrets rotate without an Envoy restart); an unchanged state keeps its versions.

// certPollInterval is how often the certificate files are compared with what the snapshot holds:
// they are replaced (renewal, CA rotation) by rename, and a 1 s poll of three small files is
// simpler and as timely as a directory watch.
const certPollInterval = time.Second

// ingressState is the agent's ingress.
type ingressState struct {
	mu       sync.Mutex
	loaded   bool // ports holds the file's allocations
	ports    map[ingressport.Key]uint16
	allocErr string
	buildErr string
	certErr  string // why no ingress certificate is served (ingresscert.go)

	srv     *xds.Server // nil without ingress.xds.listen
	trigger syncloop.Trigger
	certs   *xds.Certs // what the last snapshot was built with
	bind    string     // the address the last snapshot's per-port listeners bind
}

// ingressEnabled: ingress ports are a gateway's, since the ingress runs there.
func (g *Gateway) ingressEnabled() bool { return g.cfg.Gateway }

// Load reads the allocations; a damaged file stops the agent (silently starting over
// would move every service to another port).
func (g *Gateway) Load() error {
	if !g.ingressEnabled() {
		return nil
	}
	ports, err := ingressport.Load(g.cfg.StateDir)
	if err != nil {
		return err
	}
	g.ingress.mu.Lock()
	g.ingress.ports, g.ingress.loaded = ports, true
	g.ingress.mu.Unlock()
	return nil
}

// StampPorts gives every TCP and UDP port of the set its ingress port (the set's exports
// are this node's own copies), allocating and persisting new ones.
func (g *Gateway) StampPorts(set []*apiv1.ServiceExport) {
	if !g.ingressEnabled() {
		return
	}
	x := &g.ingress
	x.mu.Lock()
	defer x.mu.Unlock()
	if !x.loaded {
		return // before Run loaded the file: allocating now could hand out a taken port
	}
	var wanted []ingressport.Key
	for _, e := range set {
		for _, p := range e.GetPorts() {
			wanted = append(wanted, ingressport.Key{Namespace: e.GetNamespace(), Name: e.GetName(), Port: p.GetPort(), Protocol: p.GetProtocol()})
		}
	}
	first, last, _ := config.ParsePortRange(g.cfg.Ingress.PortRange) // validated with the config
	next, err := ingressport.Assign(x.ports, wanted, ingressport.Range{First: first, Last: last})
	x.allocErr = ""
	if err != nil {
		x.allocErr = err.Error()
	}
	if !ingressport.Equal(next, x.ports) {
		if err := ingressport.Save(g.cfg.StateDir, next); err != nil {
			// Without the file the ports would not survive a restart: keep serving the old
			// ones and say so, the next change retries.
			x.allocErr = err.Error()
			g.log.Error("cannot save the ingress ports", "err", err)
		} else {
			x.ports = next
		}
	}
	for _, e := range set {
		for _, p := range e.GetPorts() {
			p.IngressPort = uint32(x.ports[ingressport.Key{Namespace: e.GetNamespace(), Name: e.GetName(), Port: p.GetPort(), Protocol: p.GetProtocol()}])
		}
	}
}

// triggerIngress asks the ingress loop to rebuild the xDS snapshot.
func (g *Gateway) triggerIngress() {
	g.ingress.trigger.Fire()
}

// startIngress opens the xDS server when ingress.xds.listen is set; the returned stop ends it
// and its goroutines and removes its socket.
func (g *Gateway) startIngress(ctx context.Context) (stop func(), err error) {
	if g.cfg.Ingress.XDS.Listen == "" {
		return func() {}, nil
	}
	srv := xds.NewServer(g.log)
	lis, err := srv.ListenWith(g.cfg.Ingress.XDS.Listen, xds.Access{UID: uint32(g.cfg.Ingress.XDS.AllowUID), GID: uint32(g.cfg.Ingress.XDS.AllowGID)})
	if err != nil {
		return nil, err
	}
	g.ingress.mu.Lock()
	g.ingress.srv = srv
	g.ingress.mu.Unlock()
	g.updateXDS(ctx) // the first snapshot before any client can ask
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := srv.Serve(lis); err != nil {
			g.log.Error("xDS server stopped", "err", err)
		}
	})
	wg.Go(func() { g.ingressLoop(ctx) })
	g.log.Info("xDS server listening", "listen", g.cfg.Ingress.XDS.Listen, "mode", g.cfg.Ingress.Mode)
	return func() {
		cancel()
		srv.Close()
		wg.Wait()
	}, nil
}

// ingressLoop rebuilds the snapshot on every export change and certificate change.
func (g *Gateway) ingressLoop(ctx context.Context) {
	t := time.NewTicker(certPollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-g.ingress.trigger.C():
		case <-t.C:
			// A rebuild costs ~0.1 s of CPU at 1,000 services: only when the files changed.
			cur := readCerts(g.cfg.StateDir)
			g.ingress.mu.Lock()
			same := sameCerts(g.ingress.certs, cur)
			g.ingress.mu.Unlock()
			if same {
				continue
			}
			g.log.Info("ingress certificate files changed; serving them over SDS")
		}
		g.updateXDS(ctx)
	}
}

// xdsState is the xDS snapshot's input from the agent's state.
func (g *Gateway) xdsState() xds.State {
	set := g.deps.Exports()
	st := xds.State{
		Cluster: g.cfg.Cluster, MeshDomain: g.cfg.Ingress.MeshDomain,
		SNIPort: uint32(g.cfg.Ingress.SNIPort), HTTPPort: uint32(g.cfg.Ingress.HTTPPort),
		Certs: readCerts(g.cfg.StateDir),
	}
	// The per-port listeners bind the mesh address only once cbl-mesh0 holds it: Envoy cannot
	// bind an address the node does not have (meshOnce triggers a rebuild when it changes).
	g.mesh.mu.Lock()
	if g.mesh.linkAddr.IsValid() {
		st.MeshAddress = g.mesh.linkAddr.String()
	}
	g.mesh.mu.Unlock()
	for _, e := range set {
		svc := xds.Service{Namespace: e.GetNamespace(), Name: e.GetName()}
		for _, p := range e.GetPorts() {
			svc.Ports = append(svc.Ports, xds.Port{Name: p.GetName(), Port: p.GetPort(), TargetPort: p.GetTargetPort(), Protocol: p.GetProtocol(), IngressPort: p.GetIngressPort()})
		}
		for _, ep := range e.GetEndpoints() {
			svc.Endpoints = append(svc.Endpoints, xds.Endpoint{IP: ep.GetIp(), Ready: ep.GetReady()})
		}
		st.Services = append(st.Services, svc)
	}
	return st
}

// sameCerts reports whether two certificate sets hold the same bytes.
func sameCerts(a, b *xds.Certs) bool {
	if a == nil || b == nil {
		return a == b
	}
	return bytes.Equal(a.CertPEM, b.CertPEM) && bytes.Equal(a.KeyPEM, b.KeyPEM) && bytes.Equal(a.CAPEM, b.CAPEM)
}

// updateXDS serves the snapshot of the current state (nothing when its versions are unchanged).
func (g *Gateway) updateXDS(ctx context.Context) {
	g.ingress.mu.Lock()
	srv := g.ingress.srv
	g.ingress.mu.Unlock()
	if srv == nil {
		return
	}
	st := g.xdsState()
	changed, err := srv.Update(ctx, st)
	g.ingress.mu.Lock()
	g.ingress.certs = st.Certs
	if err == nil {
		g.ingress.bind = xds.IngressPortAddress(st)
	}
	prev := g.ingress.buildErr
	g.ingress.buildErr = ""
	if err != nil {
		g.ingress.buildErr = err.Error()
	}
	g.ingress.mu.Unlock()
	switch {
	case err != nil && err.Error() != prev:
		g.log.Error("xDS snapshot not built; the last one stays", "err", err)
	case changed:
		g.log.Debug("xDS snapshot updated", "versions", srv.Versions())
	}
}

// IngressPorts are the ingress ports allocated to this node's exported service ports (a copy;
// empty on non-gateways): what both ingress data planes serve.
func (g *Gateway) IngressPorts() map[ingressport.Key]uint16 {
	g.ingress.mu.Lock()
	defer g.ingress.mu.Unlock()
	return maps.Clone(g.ingress.ports)
}

// ingressStatus is the status's ingress section (gateways, and nodes serving xDS).
func (g *Gateway) ingressStatus() *statusapi.Ingress {
	x := &g.ingress
	x.mu.Lock()
	if !g.ingressEnabled() && x.srv == nil {
		x.mu.Unlock()
		return nil
	}
	out := &statusapi.Ingress{Mode: g.cfg.Ingress.Mode, Ports: []statusapi.IngressPort{}, Error: joinMsgs(x.allocErr, x.buildErr, x.certErr)}
	for _, k := range slices.SortedFunc(maps.Keys(x.ports), func(p, q ingressport.Key) int { return int(x.ports[p]) - int(x.ports[q]) }) {
		out.Ports = append(out.Ports, statusapi.IngressPort{Namespace: k.Namespace, Name: k.Name, Port: k.Port, Protocol: k.Protocol, IngressPort: uint32(x.ports[k])})
	}
	srv := x.srv
	x.mu.Unlock()
	if srv == nil {
		return out
	}
	x.mu.Lock()
	xs := &statusapi.XDSStatus{Listen: g.cfg.Ingress.XDS.Listen, Versions: map[string]string{}, Nodes: []statusapi.XDSNode{}, IngressPortsBind: x.bind,
		MaxNodes: xds.DefaultMaxNodes, NodeTTL: xds.DefaultNodeTTL.String(), AllowUID: uint32(g.cfg.Ingress.XDS.AllowUID), AllowGID: uint32(g.cfg.Ingress.XDS.AllowGID),
		IngressCertificate: ingressCertStatus(x.certs, x.certErr)}
	x.mu.Unlock()
	xs.RefusedConnections, xs.LastRefused = srv.Refused()
	if xs.IngressPortsBind == "0.0.0.0" {
		xs.IngressPortsBindNote = "no mesh address on " + MeshLinkName + " (not in gateway mode, or not allocated yet): the ingress-port listeners bind every address"
	}
	for url, v := range srv.Versions() {
		xs.Versions[xds.ShortType(url)] = v
	}
	streams := srv.NodeStreams()
	for _, n := range srv.Status() {
		node := statusapi.XDSNode{Node: n.Node, Streams: streams[n.Node], Types: []statusapi.XDSType{}}
		for _, t := range n.Types {
			u := t.Updated.UTC()
			node.Types = append(node.Types, statusapi.XDSType{Type: t.Type, Sent: t.Sent, Acked: t.Acked, NackError: t.NackError, NackVersion: t.NackVersion, Updated: &u})
		}
		xs.Nodes = append(xs.Nodes, node)
	}
	out.XDS = xs
	return out
}

// joinMsgs joins the non-empty messages with "; ".
func joinMsgs(msgs ...string) string {
	return strings.Join(slices.DeleteFunc(msgs, func(m string) bool { return m == "" }), "; ")
}

// ingressProblems are the xDS NACKs: a client (Envoy) refused the agent's configuration and
// runs an older one, with Envoy's own reason.
func ingressProblems(in *statusapi.Ingress) []statusapi.Problem {
	if in == nil || in.XDS == nil {
		return nil
	}
	var out []statusapi.Problem
	for _, n := range in.XDS.Nodes {
		for _, t := range n.Types {
			if t.NackError != "" {
				out = append(out, statusapi.Problem{Message: fmt.Sprintf("xDS client %s refused %s version %s: %s", n.Node, t.Type, t.NackVersion, t.NackError)})
			}
		}
	}
	return out
}
