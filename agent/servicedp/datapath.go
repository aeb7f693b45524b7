package servicedp

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cablemesh/cablemesh/internal/nldump"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vishvananda/netlink"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/dns"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	"github.com/cablemesh/cablemesh/agent/services"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/bpf"
	"github.com/cablemesh/cablemesh/internal/syncloop"
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

// Deps are what the services datapath takes from the rest of the agent.
type Deps struct {
	Log      *slog.Logger
	Registry prometheus.Registerer
	// Live is the live config in force (dns.upstream, dns.ttl and dns.allowClients follow a
	// reload).
	Live func() config.Live
	// LocalCluster is this node's cluster record (its CIDRs are DNS clients); nil until known.
	LocalCluster func() *apiv1.Cluster
	// InterfaceAddrs lists this node's addresses (DNS clients too).
	InterfaceAddrs func() []netip.Addr
	OpenLB         func(context.Context, bpf.Options) (LoadBalancer, error)
	OpenCounters   func(context.Context, bpf.Options) (TrafficCounters, error)
	ListLinks      func() (map[string]int, error)
	// Plan is the plan in force. Observe, on gateways, adds what the devices and the probes say
	// of each wanted connection to what the plan says of every remote cluster (PlannedPairs).
	Plan    func() *plan.Plan
	Observe func(context.Context, *plan.Plan, map[string]services.Pair)
	// TunnelLinks are the cable links the counters attach to (names or '*' patterns).
	TunnelLinks func() []string
}

// Datapath is the services datapath. Its fields are guarded by mu, except the components
// themselves, which Start sets once before the loop starts.
type Datapath struct {
	cfg     config.Static // dns.listen, the pin dir, the map sizes, gateway
	deps    Deps
	log     *slog.Logger
	trigger syncloop.Trigger

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

// New returns the services datapath of cfg; Start opens it.
func New(cfg config.Static, deps Deps) *Datapath {
	if deps.OpenLB == nil {
		deps.OpenLB = openLB
	}
	if deps.OpenCounters == nil {
		deps.OpenCounters = openCounters
	}
	if deps.ListLinks == nil {
		deps.ListLinks = linkIndexes
	}
	return &Datapath{cfg: cfg, deps: deps, log: deps.Log, attached: map[string]int{}, firstPlanned: map[string]uint64{}, refused: map[string]string{}}
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
	links, err := nldump.Retry(func() ([]netlink.Link, error) { return netlink.LinkList() })
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
func (d *Datapath) Start(ctx context.Context) error {
	// dnsErr is set by applyServices (under d.mu) when an update leaves records out.
	if d.cfg.DNS.Listen != "" {
		live := d.deps.Live().DNS
		s, err := dns.NewServer(dns.Config{
			Listen: d.cfg.DNS.Listen, Upstreams: live.Upstream, TTL: time.Duration(live.TTL) * time.Second,
			Clients: d.dnsClients(live), LocalAddrs: d.nodeAddrs, Logger: d.log, Registerer: d.deps.Registry,
		})
		if err == nil {
			err = s.Start()
		}
		if err != nil {
			return fmt.Errorf("dns: %w", err)
		}
		d.dns = s
	}
	cg, err := CgroupPath(d.cfg.CgroupPath)
	opts := bpf.Options{PinDir: d.cfg.BPFPinDir, CgroupPath: cg, Log: d.log.With("component", "bpf"),
		ServiceMapEntries: d.cfg.LoadBalancer.ServiceMapEntries, BackendMapEntries: d.cfg.LoadBalancer.BackendMapEntries}
	if err == nil {
		d.cgroup = cg
		d.lb, err = d.deps.OpenLB(ctx, opts)
	}
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		d.lbErr = err.Error()
		d.log.Error("SERVICES LOAD BALANCER UNAVAILABLE: service VIPs are not translated on this node", "cgroupPath", d.cfg.CgroupPath, "bpfPinDir", d.cfg.BPFPinDir, "err", err)
	} else {
		d.log.Info("services load balancer ready", "cgroupPath", cg, "bpfPinDir", d.cfg.BPFPinDir)
	}
	if d.cfg.Gateway && d.lb != nil {
		if d.counters, err = d.deps.OpenCounters(ctx, opts); err != nil {
			d.counterErr = err.Error()
			d.log.Warn("traffic counters unavailable", "bpfPinDir", d.cfg.BPFPinDir, "err", err)
		}
	}
	return nil
}

// stopDatapath closes what startDatapath opened; with remove (--cleanup-on-exit) it also
// detaches and unpins the load balancer and the counters.
func (d *Datapath) Stop(remove bool) {
	if d.dns != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := d.dns.Shutdown(ctx); err != nil {
			d.log.Warn("dns server did not stop cleanly", "err", err)
		}
		cancel()
	}
	for _, c := range []interface {
		Close() error
		Remove() error
	}{d.lb, d.counters} {
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
			d.log.Error("services datapath did not close cleanly", "remove", remove, "err", err)
		}
	}
}

// Trigger asks for a services pass soon; triggers coalesce.
func (d *Datapath) Trigger() {
	d.trigger.Fire()
}

// Run runs a services pass on every trigger (imports or endpoints changed, a health
// transition, a reconcile that changed a connection) and every servicesResync.
func (d *Datapath) Run(ctx context.Context) {
	t := time.NewTicker(servicesResync)
	defer t.Stop()
	for {
		d.Once(ctx)
		select {
		case <-ctx.Done():
			return
		case <-d.trigger.C():
		case <-t.C:
		}
	}
}

// Once is one observe → plan → apply pass of the services datapath.
func (d *Datapath) Once(ctx context.Context) {
	p := d.deps.Plan()
	st, wants := p.State, p.Wants
	if d.cfg.Gateway {
		d.countersPass(wants)
	}
	if !st.HasImports {
		// Never had imports: the DNS server answers SERVFAIL and the maps (perhaps adopted from
		// an earlier run) stay as they are until the broker says what is imported.
		return
	}
	pairs := PlannedPairs(p)
	if d.cfg.Gateway && d.deps.Observe != nil {
		d.deps.Observe(ctx, p, pairs)
	}
	reach := services.Reachability(d.cfg.Cluster, d.cfg.Gateway, pairs)
	imports, outOfScope := services.InScope(st.Imports, st.Clusters, st.Endpoints)
	plan := services.Compute(imports, d.cfg.Cluster, reach)
	plan.Problems = append(outOfScope, plan.Problems...)
	d.applyServices(ctx, plan)
}

// nodeAddrs are this node's addresses, for the DNS server's clients.
func (d *Datapath) nodeAddrs() ([]netip.Addr, error) { return d.deps.InterfaceAddrs(), nil }

// dnsClients are the prefixes the DNS server answers besides loopback and the node's own
// addresses: the cluster's pod and service CIDRs (the config's and the broker's record both:
// the config's may name this node's share only) and live's dns.allowClients, sorted and unique.
func (d *Datapath) dnsClients(live config.LiveDNS) []netip.Prefix {
	cidrs := slices.Concat(d.cfg.PodCIDRs, d.cfg.ServiceCIDRs, live.AllowClients)
	if c := d.deps.LocalCluster(); c != nil {
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
func (d *Datapath) applyServices(ctx context.Context, plan services.Plan) {
	if joined := strings.Join(plan.Problems, "\n"); joined != d.lastProblemsLocked() {
		for _, p := range plan.Problems {
			d.log.Warn("service import left out", "reason", p)
		}
		d.mu.Lock()
		d.lastProblems = joined
		d.mu.Unlock()
	}
	if d.dns != nil {
		// The cluster's CIDRs may have arrived with this state (first join, a CIDR change).
		if clients := d.dnsClients(d.deps.Live().DNS); !slices.Equal(clients, d.dns.Clients()) {
			d.dns.SetClients(clients)
			d.log.Info("dns clients changed", "clients", clients)
		}
		d.mu.Lock()
		changed := !d.dnsUpdated || !reflect.DeepEqual(d.lastDNS, plan.DNS)
		d.mu.Unlock()
		if changed {
			msg := ""
			if err := d.dns.Update(plan.DNS); err != nil {
				msg = "some records left out: " + err.Error()
				d.log.Warn("dns: some service records left out", "err", err)
			}
			d.mu.Lock()
			d.lastDNS, d.dnsUpdated, d.dnsErr = plan.DNS, true, msg
			d.mu.Unlock()
		}
	}
	var syncErr string
	if d.lb != nil {
		before, err := d.lb.Services()
		var held []bpf.Service
		if err == nil {
			held, err = d.syncFit(plan, before)
		}
		if err != nil {
			syncErr = err.Error()
		} else {
			d.logBackendChanges(before, held)
			if gone := bpf.Gone(before, held); len(gone) > 0 {
				n, err := d.lb.DestroySockets(ctx, gone)
				if err != nil && ctx.Err() == nil {
					d.log.Warn("could not destroy every socket of the backends that left", "backends", len(gone), "destroyed", n, "err", err)
				}
				d.mu.Lock()
				d.destroyed += uint64(n)
				d.mu.Unlock()
			}
		}
	}
	d.mu.Lock()
	if syncErr != d.syncErr && syncErr != "" {
		d.log.Error("service load balancer not synced; keeping what the maps hold", "err", syncErr)
	}
	d.syncErr = syncErr
	d.plan, d.planned = plan, true
	d.mu.Unlock()
}

// syncFit syncs the load balancer with what of plan fits in its maps (services.FitOrder decides
// the order), records the imports refused for the status, logs each refusal once, and returns
// the services the maps now hold.
func (d *Datapath) syncFit(plan services.Plan, before []bpf.Service) ([]bpf.Service, error) {
	programmed := make(map[string]bool, len(before))
	for _, s := range before {
		programmed[s.String()] = true
	}
	d.mu.Lock()
	for _, key := range plan.LBImports {
		if _, ok := d.firstPlanned[key]; !ok {
			d.firstPlanned[key] = d.nextRank
			d.nextRank++
		}
	}
	order := services.FitOrder(plan, d.cfg.Cluster, programmed, d.firstPlanned)
	d.mu.Unlock()
	groups := make([][]bpf.Service, len(order))
	for i, g := range order {
		groups[i] = g.Services
	}
	refusals, err := d.lb.SyncFit(groups)
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
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, i := range slices.Sorted(maps.Keys(out)) {
		g := order[i]
		if _, had := d.refused[g.Import]; !had {
			d.log.Warn("service import refused by the load balancer: its maps are too full for it; the others are applied",
				"service", g.Import, "countsAgainst", g.Owner, "reason", refused[g.Import])
		}
	}
	for key := range d.refused {
		if _, still := refused[key]; !still {
			d.log.Info("service import taken by the load balancer after a refusal", "service", key)
		}
	}
	d.refused = refused
	// Forget the ranks of imports gone, so the table does not grow with churn.
	planned := make(map[string]bool, len(plan.LBImports))
	for _, key := range plan.LBImports {
		planned[key] = true
	}
	maps.DeleteFunc(d.firstPlanned, func(key string, _ uint64) bool { return !planned[key] })
	return held, nil
}

func (d *Datapath) lastProblemsLocked() string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastProblems
}

// logBackendChanges logs every service whose backends changed between two syncs.
func (d *Datapath) logBackendChanges(before, after []bpf.Service) {
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
		d.log.Info("service backends", "service", s.String(), "backends", strings.Join(list, ","), "count", len(s.Backends))
	}
	for k := range old {
		d.log.Info("service removed from the load balancer", "service", k)
	}
}

func sortedBackends(in []bpf.Backend) []bpf.Backend {
	out := slices.Clone(in)
	slices.SortFunc(out, func(x, y bpf.Backend) int {
		if c := x.Addr.Compare(y.Addr); c != 0 {
			return c
		}
		return int(x.Port) - int(y.Port)
	})
	return out
}

// countersPass keeps the counters on every cable link (the drivers' Links, '*' patterns
// expanded against the links that exist), attaching to links that appeared or were recreated,
// and their subnets equal to the wanted connections' remote CIDRs.
func (d *Datapath) countersPass(wants []reconcile.Want) {
	if d.counters == nil {
		return
	}
	var errs []string
	links, err := d.deps.ListLinks()
	if err != nil {
		errs = append(errs, "list links: "+err.Error())
	}
	want := map[string]int{}
	for _, pattern := range d.deps.TunnelLinks() {
		for name, idx := range links {
			if prefix, ok := strings.CutSuffix(pattern, "*"); ok && strings.HasPrefix(name, prefix) || name == pattern {
				want[name] = idx
			}
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for name, idx := range want {
		if d.attached[name] == idx {
			continue
		}
		if err := d.counters.Attach(name); err != nil {
			errs = append(errs, err.Error())
			continue
		}
		d.attached[name] = idx
	}
	for name := range d.attached {
		if _, ok := want[name]; !ok {
			if err := d.counters.Detach(name); err != nil {
				errs = append(errs, err.Error())
			}
			delete(d.attached, name)
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
	if !reflect.DeepEqual(subnets, d.subnets) {
		if err := d.counters.SetSubnets(subnets); err != nil {
			errs = append(errs, err.Error())
		} else {
			d.subnets = subnets
		}
	}
	msg := strings.Join(errs, "; ")
	if msg != d.counterErr && msg != "" {
		d.log.Warn("traffic counters incomplete", "err", msg)
	}
	d.counterErr = msg
}

// Traffic reads the counters by cluster ID; nil without them.
func (d *Datapath) Traffic() map[uint32]bpf.ClusterCounters {
	if d == nil || d.counters == nil {
		return nil
	}
	m, err := d.counters.Read()
	if err != nil {
		d.log.Debug("read traffic counters", "err", err)
		return nil
	}
	return m
}

// Status fills in the datapath's part of the services section of the status document: the DNS
// server, the load balancer and the imports as planned and as the maps hold them. A nil
// Datapath (not started) adds nothing.
func (d *Datapath) Status(out *statusapi.Services) {
	if d == nil {
		return
	}
	out.LoadBalancer = statusapi.LoadBalancer{Running: d.lb != nil, CgroupPath: d.cgroup, PinDir: d.cfg.BPFPinDir, Error: d.lbErr}
	d.mu.Lock()
	out.DNS = statusapi.DNSStatus{Enabled: d.dns != nil, Listen: d.cfg.DNS.Listen, Upstreams: d.deps.Live().DNS.Upstream, Error: d.dnsErr}
	if d.dns != nil {
		out.DNS.Warnings = d.dns.Warnings()
		for _, p := range d.dns.Clients() {
			out.DNS.Clients = append(out.DNS.Clients, p.String())
		}
	}
	plan, planned := d.plan, d.planned
	if d.syncErr != "" {
		out.LoadBalancer.Error = d.syncErr
	}
	out.LoadBalancer.SocketsDestroyed = d.destroyed
	refused := maps.Clone(d.refused)
	d.mu.Unlock()
	out.LoadBalancer.Refused = len(refused)
	if d.lb != nil {
		out.LoadBalancer.ServiceMapEntries, out.LoadBalancer.BackendMapEntries = d.lb.Capacity()
	}
	if planned {
		out.Imports = slices.Clone(plan.Imports)
		for i := range out.Imports {
			out.Imports[i].Clusters = slices.Clone(out.Imports[i].Clusters)
		}
		out.Problems = plan.Problems
	}
	held := map[string]map[uint32][]string{}
	if d.lb != nil {
		if svcs, err := d.lb.Services(); err == nil {
			out.LoadBalancer.Services = len(svcs)
			held = services.Backends(svcs)
		} else {
			out.LoadBalancer.Error = "read the maps: " + err.Error()
		}
	}
	services.AnnotateBackends(out.Imports, held)
	services.MarkRefused(out.Imports, refused)
}
