package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/dns"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/services"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/bpf"
	"github.com/cablemesh/cablemesh/cable"
)

// The services datapath: the clusterset.local DNS server, the eBPF socket load balancer and the
// per-cluster traffic counters on the cable links. services.Compute decides; this file applies:
// dns.Update, LB.Sync, then LB.DestroySockets of the backends that went, so that clients of a
// removed backend fail at once instead of waiting for a timeout.

// LoadBalancer is the eBPF socket load balancer (*bpf.LB); tests fake it.
type LoadBalancer interface {
	Sync(services []bpf.Service) error
	// SyncFit syncs the groups of services that fit in the maps, in order, and refuses the
	// others, each alone (see services.FitOrder for the order).
	SyncFit(groups [][]bpf.Service) ([]bpf.Refusal, error)
	// Capacity is the number of entries of the service map and of the backend map.
	Capacity() (svc, backends int)
	Services() ([]bpf.Service, error)
	DestroySockets(ctx context.Context, gone []bpf.Endpoint) (int, error)
	Close() error
	Remove() error
}

// TrafficCounters are the tcx counters on the cable links (*bpf.Counters); tests fake them.
type TrafficCounters interface {
	Attach(ifname string) error
	Detach(ifname string) error
	SetSubnets(subnets map[netip.Prefix]uint32) error
	Read() (map[uint32]bpf.ClusterCounters, error)
	Close() error
	Remove() error
}

// servicesResync bounds how stale a connection state read from the devices (not from the
// probes) can be in the service maps, and how soon a new cable link gets its counters.
const servicesResync = 2 * time.Second

// datapath is the services datapath's running state. Its fields are guarded by mu, except the
// components themselves, which are set once before the loop starts.
type datapath struct {
	dns      *dns.Server
	lb       LoadBalancer
	counters TrafficCounters
	cgroup   string
	lbErr    string // why the load balancer does not run

	mu           sync.Mutex
	dnsErr       string
	lastDNS      []dns.Service
	dnsUpdated   bool
	plan         services.Plan
	planned      bool
	syncErr      string
	lastProblems string
	destroyed    uint64
	attached     map[string]int // counter links by name → ifindex
	subnets      map[netip.Prefix]uint32
	counterErr   string
	// firstPlanned ranks the load-balanced imports in the order this agent first planned them
	// (services.FitOrder); refused is why the maps do not hold an import, by namespace/name.
	firstPlanned map[string]uint64
	nextRank     uint64
	refused      map[string]string
}

// openLB and openCounters default to the bpf package.
func openLB(ctx context.Context, o bpf.Options) (LoadBalancer, error) {
	lb, err := bpf.Open(ctx, o)
	if err != nil {
		return nil, err // not a nil *LB inside a non-nil interface
	}
	return lb, nil
}

func openCounters(ctx context.Context, o bpf.Options) (TrafficCounters, error) {
	c, err := bpf.OpenCounters(ctx, o)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// linkIndexes lists this network namespace's links by name.
func linkIndexes() (map[string]int, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(links))
	for _, l := range links {
		out[l.Attrs().Name] = l.Attrs().Index
	}
	return out, nil
}

// startDatapath starts the DNS server (when dns.listen is set) and opens the load balancer and,
// on gateways, the counters. A DNS server that cannot listen ends the agent (its address is
// configuration); a load balancer that cannot load (no cgroup2, no bpffs, an old kernel) is
// logged loudly and reported in status, and the node runs without it.
func (a *Agent) startDatapath(ctx context.Context) error {
	dp := &datapath{attached: map[string]int{}, firstPlanned: map[string]uint64{}, refused: map[string]string{}}
	// dnsErr is set by applyServices (under dp.mu) when an update leaves records out.
	if a.cfg.DNS.Listen != "" {
		s, err := dns.NewServer(dns.Config{
			Listen: a.cfg.DNS.Listen, Upstreams: a.cfg.DNS.Upstream, TTL: time.Duration(a.cfg.DNS.TTL) * time.Second,
			Clients: a.dnsClients(a.cfg), LocalAddrs: a.nodeAddrs, Logger: a.log, Registerer: a.registry,
		})
		if err == nil {
			err = s.Start()
		}
		if err != nil {
			return fmt.Errorf("dns: %w", err)
		}
		dp.dns = s
	}
	cg, err := CgroupPath(a.cfg.CgroupPath)
	opts := bpf.Options{PinDir: a.cfg.BPFPinDir, CgroupPath: cg, Log: a.log.With("component", "bpf"),
		ServiceMapEntries: a.cfg.LoadBalancer.ServiceMapEntries, BackendMapEntries: a.cfg.LoadBalancer.BackendMapEntries}
	if err == nil {
		dp.cgroup = cg
		dp.lb, err = a.opts.OpenLB(ctx, opts)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		dp.lbErr = err.Error()
		a.log.Error("SERVICES LOAD BALANCER UNAVAILABLE: service VIPs are not translated on this node", "cgroupPath", a.cfg.CgroupPath, "bpfPinDir", a.cfg.BPFPinDir, "err", err)
	} else {
		a.log.Info("services load balancer ready", "cgroupPath", cg, "bpfPinDir", a.cfg.BPFPinDir)
	}
	if a.cfg.Gateway && dp.lb != nil {
		if dp.counters, err = a.opts.OpenCounters(ctx, opts); err != nil {
			dp.counterErr = err.Error()
			a.log.Warn("traffic counters unavailable", "bpfPinDir", a.cfg.BPFPinDir, "err", err)
		}
	}
	a.mu.Lock()
	a.dp = dp
	a.mu.Unlock()
	return nil
}

// stopDatapath closes what startDatapath opened; with remove (--cleanup-on-exit) it also
// detaches and unpins the load balancer and the counters.
func (a *Agent) stopDatapath(remove bool) {
	a.mu.Lock()
	dp := a.dp
	a.mu.Unlock()
	if dp == nil {
		return
	}
	if dp.dns != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := dp.dns.Shutdown(ctx); err != nil {
			a.log.Warn("dns server did not stop cleanly", "err", err)
		}
		cancel()
	}
	for _, c := range []interface {
		Close() error
		Remove() error
	}{dp.lb, dp.counters} {
		if c == nil || reflect.ValueOf(c).IsNil() {
			continue
		}
		var err error
		if remove {
			err = c.Remove()
		} else {
			err = c.Close()
		}
		if err != nil {
			a.log.Error("services datapath did not close cleanly", "remove", remove, "err", err)
		}
	}
}

func (a *Agent) datapath() *datapath {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.dp
}

// TriggerServices asks for a services pass soon; triggers coalesce.
func (a *Agent) TriggerServices() {
	a.svcTrigger.Fire()
}

// servicesLoop runs a services pass on every trigger (imports or endpoints changed, a health
// transition, a reconcile that changed a connection) and every servicesResync.
func (a *Agent) servicesLoop(ctx context.Context) {
	t := time.NewTicker(servicesResync)
	defer t.Stop()
	for {
		a.servicesOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-a.svcTrigger.C():
		case <-t.C:
		}
	}
}

// servicesOnce is one observe → plan → apply pass of the services datapath.
func (a *Agent) servicesOnce(ctx context.Context) {
	dp := a.datapath()
	if dp == nil {
		return
	}
	p := a.plan()
	st, wants := p.State, p.Wants
	if a.cfg.Gateway {
		a.countersPass(dp, wants)
	}
	if !st.HasImports {
		// Never had imports: the DNS server answers SERVFAIL and the maps (perhaps adopted from
		// an earlier run) stay as they are until the broker says what is imported.
		return
	}
	reach := services.Reachability(a.cfg.Cluster, a.cfg.Gateway, a.pairs(ctx, p))
	imports, outOfScope := services.InScope(st.Imports, st.Clusters, st.Endpoints)
	plan := services.Compute(imports, a.cfg.Cluster, reach)
	plan.Problems = append(outOfScope, plan.Problems...)
	a.applyServices(ctx, dp, plan)
}

// pairs is what this node knows of every remote cluster with a live gateway endpoint, for
// services.Reachability.
func (a *Agent) pairs(ctx context.Context, p *plan.Plan) map[string]services.Pair {
	wants, problems, decisions := p.Wants, p.Problems, p.Decisions
	out := map[string]services.Pair{}
	for _, d := range decisions {
		out[d.Cluster] = services.Pair{Connect: d.Connect, Policy: d.Policy, GatewayMode: d.Mode == reconcile.ModeGateway}
	}
	for _, w := range wants {
		pr := out[w.Remote.Cluster]
		pr.RemoteNode = w.Remote.Node
		out[w.Remote.Cluster] = pr
	}
	for _, p := range problems {
		if p.Cluster == "" || p.Partial {
			continue // a subnet left out: the pair is connected all the same
		}
		pr := out[p.Cluster]
		pr.Problem = p.Message
		out[p.Cluster] = pr
	}
	if !a.cfg.Gateway {
		return out
	}
	a.mu.Lock()
	r := a.reconciler
	a.mu.Unlock()
	var observed map[string][]cable.ConnectionStatus
	var obsErrs map[string]error
	var applied map[string]reconcile.Applied
	if r != nil {
		octx, cancel := context.WithTimeout(ctx, 2*time.Second)
		observed, obsErrs = r.Observe(octx)
		cancel()
		applied = r.Applied()
	}
	m := a.healthManager()
	for _, w := range wants {
		c := w.Remote.Cluster
		pr := out[c]
		if m != nil {
			if res, ok := m.Result(c); ok && res.Target.Node == w.Remote.Node {
				th := m.Settings().FailureThreshold
				pr.Probe = &services.Probe{Healthy: res.Healthy(th), ConsecutiveFailures: res.ConsecutiveFailures, LastError: res.LastError}
			}
		}
		// The device judges a pair only once the reconciler has applied what is wanted now: a pair
		// being connected or moved to another driver is not on its new device yet, and its
		// clients must not lose their connections for that (the probes still judge it).
		if ap, ok := applied[c]; ok && reconcile.EqualWant(ap.Want, w) && obsErrs[w.Driver] == nil {
			pr.Device = services.DeviceMissing
			for _, o := range observed[w.Driver] {
				if o.Cluster == c {
					pr.Device, pr.DeviceMessage = string(o.State), o.Message
				}
			}
		}
		out[c] = pr
	}
	return out
}

// nodeAddrs are this node's addresses, for the DNS server's clients.
func (a *Agent) nodeAddrs() ([]netip.Addr, error) { return a.opts.InterfaceAddrs(), nil }

// dnsClients are the prefixes the DNS server answers besides loopback and the node's own
// addresses: the cluster's pod and service CIDRs (the config's and the broker's record both:
// the config's may name this node's share only) and dns.allowClients, sorted and unique.
func (a *Agent) dnsClients(cfg *config.Config) []netip.Prefix {
	cidrs := slices.Concat(cfg.PodCIDRs, cfg.ServiceCIDRs, cfg.DNS.AllowClients)
	if c := a.localCluster(); c != nil {
		cidrs = slices.Concat(cidrs, c.GetPodCidrs(), c.GetServiceCidrs())
	}
	out := config.Prefixes(cidrs)
	slices.SortFunc(out, func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	})
	return slices.Compact(out)
}

// applyServices applies a plan: the DNS zone (when it changed), the load balancer's maps
// (always: Sync writes only differences, and repairs drift), then the destruction of sockets
// whose backend left the maps.
func (a *Agent) applyServices(ctx context.Context, dp *datapath, plan services.Plan) {
	if joined := strings.Join(plan.Problems, "\n"); joined != dp.lastProblemsLocked() {
		for _, p := range plan.Problems {
			a.log.Warn("service import left out", "reason", p)
		}
		dp.mu.Lock()
		dp.lastProblems = joined
		dp.mu.Unlock()
	}
	if dp.dns != nil {
		// The cluster's CIDRs may have arrived with this state (first join, a CIDR change).
		if clients := a.dnsClients(a.liveConfig()); !slices.Equal(clients, dp.dns.Clients()) {
			dp.dns.SetClients(clients)
			a.log.Info("dns clients changed", "clients", clients)
		}
		dp.mu.Lock()
		changed := !dp.dnsUpdated || !reflect.DeepEqual(dp.lastDNS, plan.DNS)
		dp.mu.Unlock()
		if changed {
			msg := ""
			if err := dp.dns.Update(plan.DNS); err != nil {
				msg = "some records left out: " + err.Error()
				a.log.Warn("dns: some service records left out", "err", err)
			}
			dp.mu.Lock()
			dp.lastDNS, dp.dnsUpdated, dp.dnsErr = plan.DNS, true, msg
			dp.mu.Unlock()
		}
	}
	var syncErr string
	if dp.lb != nil {
		before, err := dp.lb.Services()
		var held []bpf.Service
		if err == nil {
			held, err = a.syncFit(dp, plan, before)
		}
		if err != nil {
			syncErr = err.Error()
		} else {
			a.logBackendChanges(before, held)
			if gone := bpf.Gone(before, held); len(gone) > 0 {
				n, err := dp.lb.DestroySockets(ctx, gone)
				if err != nil && ctx.Err() == nil {
					a.log.Warn("could not destroy every socket of the backends that left", "backends", len(gone), "destroyed", n, "err", err)
				}
				dp.mu.Lock()
				dp.destroyed += uint64(n)
				dp.mu.Unlock()
			}
		}
	}
	dp.mu.Lock()
	if syncErr != dp.syncErr && syncErr != "" {
		a.log.Error("service load balancer not synced; keeping what the maps hold", "err", syncErr)
	}
	dp.syncErr = syncErr
	dp.plan, dp.planned = plan, true
	dp.mu.Unlock()
}

// syncFit syncs the load balancer with what of plan fits in its maps (services.FitOrder decides
// the order), records the imports refused for the status, logs each refusal once, and returns
// the services the maps now hold.
func (a *Agent) syncFit(dp *datapath, plan services.Plan, before []bpf.Service) ([]bpf.Service, error) {
	programmed := make(map[string]bool, len(before))
	for _, s := range before {
		programmed[s.String()] = true
	}
	dp.mu.Lock()
	for _, key := range plan.LBImports {
		if _, ok := dp.firstPlanned[key]; !ok {
			dp.firstPlanned[key] = dp.nextRank
			dp.nextRank++
		}
	}
	order := services.FitOrder(plan, a.cfg.Cluster, programmed, dp.firstPlanned)
	dp.mu.Unlock()
	groups := make([][]bpf.Service, len(order))
	for i, g := range order {
		groups[i] = g.Services
	}
	refusals, err := dp.lb.SyncFit(groups)
	if err != nil {
		return nil, err
	}
	refused := make(map[string]string, len(refusals))
	out := map[int]bool{}
	for _, r := range refusals {
		refused[order[r.Group].Import] = r.Reason
		out[r.Group] = true
	}
	var held []bpf.Service
	for i, g := range order {
		if !out[i] {
			held = append(held, g.Services...)
		}
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	for _, i := range slices.Sorted(maps.Keys(out)) {
		g := order[i]
		if _, had := dp.refused[g.Import]; !had {
			a.log.Warn("service import refused by the load balancer: its maps are too full for it; the others are applied",
				"service", g.Import, "countsAgainst", g.Owner, "reason", refused[g.Import])
		}
	}
	for key := range dp.refused {
		if _, still := refused[key]; !still {
			a.log.Info("service import taken by the load balancer after a refusal", "service", key)
		}
	}
	dp.refused = refused
	// Forget the ranks of imports gone, so the table does not grow with churn.
	planned := make(map[string]bool, len(plan.LBImports))
	for _, key := range plan.LBImports {
		planned[key] = true
	}
	maps.DeleteFunc(dp.firstPlanned, func(key string, _ uint64) bool { return !planned[key] })
	return held, nil
}

func (dp *datapath) lastProblemsLocked() string {
	dp.mu.Lock()
	defer dp.mu.Unlock()
	return dp.lastProblems
}

// logBackendChanges logs every service whose backends changed between two syncs.
func (a *Agent) logBackendChanges(before, after []bpf.Service) {
	old := map[string][]bpf.Backend{}
	for _, s := range before {
		old[s.String()] = s.Backends
	}
	for _, s := range after {
		prev, had := old[s.String()]
		delete(old, s.String())
		if had && slices.Equal(sortedBackends(prev), sortedBackends(s.Backends)) {
			continue
		}
		list := make([]string, 0, len(s.Backends))
		for _, b := range s.Backends {
			list = append(list, b.String())
		}
		a.log.Info("service backends", "service", s.String(), "backends", strings.Join(list, ","), "count", len(s.Backends))
	}
	for k := range old {
		a.log.Info("service removed from the load balancer", "service", k)
	}
}

func sortedBackends(in []bpf.Backend) []bpf.Backend {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b bpf.Backend) int {
		if c := a.Addr.Compare(b.Addr); c != 0 {
			return c
		}
		return int(a.Port) - int(b.Port)
	})
	return out
}

// countersPass keeps the counters on every cable link (the drivers' Links, '*' patterns
// expanded against the links that exist), attaching to links that appeared or were recreated,
// and their subnets equal to the wanted connections' remote CIDRs.
func (a *Agent) countersPass(dp *datapath, wants []reconcile.Want) {
	if dp.counters == nil {
		return
	}
	var errs []string
	links, err := a.opts.ListLinks()
	if err != nil {
		errs = append(errs, "list links: "+err.Error())
	}
	want := map[string]int{}
	for _, pattern := range tunnelLinks(a.runningDrivers()) {
		for name, idx := range links {
			if prefix, ok := strings.CutSuffix(pattern, "*"); ok && strings.HasPrefix(name, prefix) || name == pattern {
				want[name] = idx
			}
		}
	}
	dp.mu.Lock()
	defer dp.mu.Unlock()
	for name, idx := range want {
		if dp.attached[name] == idx {
			continue
		}
		if err := dp.counters.Attach(name); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		dp.attached[name] = idx
	}
	for name := range dp.attached {
		if _, ok := want[name]; !ok {
			if err := dp.counters.Detach(name); err != nil {
				errs = append(errs, err.Error())
			}
			delete(dp.attached, name)
		}
	}
	subnets := map[netip.Prefix]uint32{}
	for _, w := range wants {
		if w.Remote.ClusterID == 0 {
			continue
		}
		for _, p := range w.Remote.Subnets {
			subnets[p] = w.Remote.ClusterID
		}
	}
	if !reflect.DeepEqual(subnets, dp.subnets) {
		if err := dp.counters.SetSubnets(subnets); err != nil {
			errs = append(errs, err.Error())
		} else {
			dp.subnets = subnets
		}
	}
	msg := strings.Join(errs, "; ")
	if msg != dp.counterErr && msg != "" {
		a.log.Warn("traffic counters incomplete", "err", msg)
	}
	dp.counterErr = msg
}

// traffic reads the counters by cluster ID; nil without them.
func (a *Agent) traffic() map[uint32]bpf.ClusterCounters {
	dp := a.datapath()
	if dp == nil || dp.counters == nil {
		return nil
	}
	m, err := dp.counters.Read()
	if err != nil {
		a.log.Debug("read traffic counters", "err", err)
		return nil
	}
	return m
}

// servicesStatus is the services section of the status document.
func (a *Agent) servicesStatus() *statusapi.Services {
	st := a.plan().State
	out := &statusapi.Services{
		ImportSelector: a.importSelector(),
		ImportsKnown:   st.HasImports,
		Imports:        []statusapi.ServiceImport{},
	}
	out.Exports, out.Sync = a.exportsStatus()
	dp := a.datapath()
	if dp == nil {
		return out
	}
	out.LoadBalancer = statusapi.LoadBalancer{Running: dp.lb != nil, CgroupPath: dp.cgroup, PinDir: a.cfg.BPFPinDir, Error: dp.lbErr}
	dp.mu.Lock()
	out.DNS = statusapi.DNSStatus{Enabled: dp.dns != nil, Listen: a.cfg.DNS.Listen, Upstreams: a.liveConfig().DNS.Upstream, Error: dp.dnsErr}
	if dp.dns != nil {
		out.DNS.Warnings = dp.dns.Warnings()
		for _, p := range dp.dns.Clients() {
			out.DNS.Clients = append(out.DNS.Clients, p.String())
		}
	}
	plan, planned := dp.plan, dp.planned
	if dp.syncErr != "" {
		out.LoadBalancer.Error = dp.syncErr
	}
	out.LoadBalancer.SocketsDestroyed = dp.destroyed
	refused := maps.Clone(dp.refused)
	dp.mu.Unlock()
	out.LoadBalancer.Refused = len(refused)
	if dp.lb != nil {
		out.LoadBalancer.ServiceMapEntries, out.LoadBalancer.BackendMapEntries = dp.lb.Capacity()
	}
	if planned {
		out.Imports = slices.Clone(plan.Imports)
		for i := range out.Imports {
			out.Imports[i].Clusters = slices.Clone(out.Imports[i].Clusters)
		}
		out.Problems = plan.Problems
	}
	held := map[string]map[uint32][]string{}
	if dp.lb != nil {
		if svcs, err := dp.lb.Services(); err == nil {
			out.LoadBalancer.Services = len(svcs)
			held = services.Backends(svcs)
		} else {
			out.LoadBalancer.Error = "read the maps: " + err.Error()
		}
	}
	services.AnnotateBackends(out.Imports, held)
	services.MarkRefused(out.Imports, refused)
	return out
}
