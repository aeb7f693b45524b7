package cables

import (
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/health"
	"github.com/cablemesh/cablemesh/agent/plan"
	"github.com/cablemesh/cablemesh/agent/routes"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// Gateway failover without the broker. A gateway keeps one connection per remote cluster, to
// that cluster's lexically smallest usable gateway (reconcile.DesiredAt). When that gateway dies,
// the broker withdraws it only at its lease expiry (30s by default); the probes through the
// tunnel (health.DefaultPeriod x DefaultFailureThreshold) see it in 0.9-1.2s. So when a pair's
// probes, which answered before, cross the threshold, this gateway avoids the remote gateway:
// the plan (plan.Inputs.Avoid) connects the pair to the remote cluster's next usable gateway in
// the same order, the one the remote cluster's workers route through as soon as their own probes
// find the dead gateway (routes.Plan): both ends move at about the same time, within 2s.
//
// Only a gateway that is its own cluster's first carrier of the pair fails over (the gateway the
// remote cluster's gateways connect to, routes.Carriers): the other gateways of its cluster keep
// a connection the remote side does not accept (a WireGuard peer has one key), whose probes fail
// all the time and say nothing about the remote gateway's health.
//
// A gateway this node avoids is probed over the underlay (an ICMP echo to the address its cable
// goes to), as its tunnel is no longer set up from here. It is used again once it has answered
// for health.DefaultRecoveryHold without a failure, the hold the remote cluster's workers apply
// before they route through it again: both ends move back together. A gateway avoided again
// soon after it was used again (its underlay answers but its tunnel does not: a hung agent with
// a userspace datapath, a blocked tunnel port) waits longer each time (reavoidBackoff), so a
// pair does not flap every few seconds until the broker withdraws it. The broker withdrawing it
// ends its avoidance.

// reavoidWindow is how soon after its return a gateway avoided again counts as a repeat; each
// repeat doubles the extra wait before the next return, from reavoidBackoffBase up to
// reavoidBackoffMax.
const (
	reavoidWindow      = time.Minute
	reavoidBackoffBase = 10 * time.Second
	reavoidBackoffMax  = 5 * time.Minute
)

// avoided is one remote gateway this node's probes found dead.
type avoided struct {
	key, node string
	addr      netip.Addr
	since     time.Time
	// notBefore is the earliest it may be used again (since plus the backoff of its repeats).
	notBefore time.Time
}

// failover is the set of remote gateways this gateway avoids and their underlay probes. mu
// guards the fields below it; no other lock is taken under it but the probe manager's (Sync).
type failover struct {
	log     *slog.Logger
	trigger func()
	now     func() time.Time

	// plan is the last plan the cables reconciled, for the decisions made on a probe's
	// goroutine.
	plan atomic.Pointer[plan.Plan]

	mu       sync.Mutex
	underlay *health.Manager
	avoid    map[string]*avoided
	// returned and strikes remember, per endpoint key, when it was last used again and how many
	// times in a row it was avoided again within reavoidWindow of that.
	returned map[string]time.Time
	strikes  map[string]int
}

// newFailover returns the failover of a gateway: trigger asks for a pass, newPinger opens the
// underlay probes (underlayPinger), settings time them (their RecoveryHold is the hold).
func newFailover(log *slog.Logger, newPinger health.NewPinger, trigger func(), settings health.Settings) *failover {
	f := &failover{log: log, trigger: trigger, now: time.Now, avoid: map[string]*avoided{}, returned: map[string]time.Time{}, strikes: map[string]int{}}
	f.underlay = health.NewManager(settings, newPinger, nil, log)
	f.underlay.SetSubject("avoided remote gateway (underlay)")
	f.underlay.OnChange(f.underlayChanged)
	return f
}

// underlaySettings time the probes of avoided gateways: the pair probes' period and threshold,
// and the recovery hold that the remote cluster's workers apply too.
var underlaySettings = health.Settings{RecoveryHold: health.DefaultRecoveryHold}

// underlayPinger probes an avoided gateway from the address the kernel picks towards it (the
// target has no source: it is reached over the underlay, not through a cable).
func underlayPinger(newPinger health.NewPinger) health.NewPinger {
	return func(t health.Target) (health.Pinger, error) {
		if !t.Source.IsValid() {
			src, err := health.RouteSource(t.Destination)
			if err != nil {
				return nil, err
			}
			t.Source = src
		}
		return newPinger(t)
	}
}

// Close stops the underlay probes.
func (f *failover) Close() { f.underlay.Close() }

// Avoided are the endpoint keys this gateway avoids, sorted (plan.Inputs.Avoid).
func (f *failover) Avoided() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.avoid) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(f.avoid))
}

// tunnelChanged is the pair probes' OnChange: a pair whose probes, aimed at node and answered
// before, crossed the threshold makes this gateway avoid node when failoverWanted says so.
func (f *failover) tunnelChanged(own, self string, r health.Result, healthy bool) {
	if healthy {
		return
	}
	p := f.plan.Load()
	if p == nil {
		return
	}
	key := brokerstate.EndpointKey(r.Target.Cluster, r.Target.Node)
	why, ok := failoverWanted(p.State, p, own, self, r)
	if !ok {
		f.log.Debug("pair probes fail; not failing over", "cluster", r.Target.Cluster, "node", r.Target.Node, "reason", why)
		return
	}
	addr := cableAddress(p.State.Endpoints[key])
	if !addr.IsValid() {
		return
	}
	f.mu.Lock()
	if _, dup := f.avoid[key]; dup {
		f.mu.Unlock()
		return
	}
	now := f.now()
	a := &avoided{key: key, node: r.Target.Node, addr: addr, since: now, notBefore: now}
	if at, ok := f.returned[key]; ok && now.Sub(at) < reavoidWindow {
		f.strikes[key]++
		a.notBefore = now.Add(reavoidBackoff(f.strikes[key]))
	} else {
		delete(f.strikes, key)
	}
	f.avoid[key] = a
	f.syncUnderlayLocked()
	f.mu.Unlock()
	f.log.Warn("remote gateway failed the pair's probes: moving the pair to its cluster's next gateway", "cluster", r.Target.Cluster, "node", r.Target.Node,
		"failures", r.ConsecutiveFailures, "lastSuccess", r.LastSuccess, "recoveryHold", health.DefaultRecoveryHold, "extraWait", a.notBefore.Sub(now))
	f.trigger()
}

// reavoidBackoff is the extra wait before a gateway avoided again for the n-th time in a row
// (n >= 1) may be used again.
func reavoidBackoff(n int) time.Duration {
	d := reavoidBackoffBase
	for i := 1; i < n && d < reavoidBackoffMax; i++ {
		d *= 2
	}
	return min(d, reavoidBackoffMax)
}

// failoverWanted says whether this gateway (self, of cluster own) should stop using the remote
// gateway r aims at, whose probes just crossed the failure threshold, and if not why. It is pure.
func failoverWanted(st *brokerstate.State, p *plan.Plan, own, self string, r health.Result) (string, bool) {
	cluster, node := r.Target.Cluster, r.Target.Node
	if r.LastSuccess.IsZero() {
		return "its probes never answered: a connection that did not come up, not a gateway that died", false
	}
	if st.Endpoints[brokerstate.EndpointKey(cluster, node)] == nil {
		return "the broker no longer lists it", false
	}
	others := 0
	for _, e := range st.Endpoints {
		if e.GetCluster() == cluster && e.GetNode() != node {
			others++
		}
	}
	if others == 0 {
		return "its cluster has no other gateway", false
	}
	carriers := routes.Carriers(st, own, cluster, p.Resolver)
	if len(carriers) == 0 || carriers[0] != self {
		return "this gateway is not the one " + cluster + "'s gateways connect to (its probes fail while the remote side uses another)", false
	}
	return "", true
}

// cableAddress is where a cable to e goes (its private IP, else its public one), as the planner
// picks it.
func cableAddress(e *apiv1.Endpoint) netip.Addr {
	for _, raw := range []string{e.GetPrivateIp(), e.GetPublicIp()} {
		if a, err := netip.ParseAddr(raw); err == nil {
			return a.Unmap()
		}
	}
	return netip.Addr{}
}

// observe keeps the plan for the probes' decisions and forgets the avoided gateways the broker
// no longer lists (their lease ran out: no plan names them any more).
func (f *failover) observe(p *plan.Plan) {
	f.plan.Store(p)
	f.mu.Lock()
	defer f.mu.Unlock()
	changed := false
	for k := range f.avoid {
		if p.State.Endpoints[k] == nil {
			delete(f.avoid, k)
			changed = true
			f.log.Info("avoided remote gateway withdrawn by the broker; no longer probed", "endpoint", k)
		}
	}
	if changed {
		f.syncUnderlayLocked()
	}
	for k, at := range f.returned {
		if f.now().Sub(at) >= reavoidWindow {
			delete(f.returned, k)
			delete(f.strikes, k)
		}
	}
}

func (f *failover) syncUnderlayLocked() {
	targets := make([]health.Target, 0, len(f.avoid))
	for _, k := range slices.Sorted(maps.Keys(f.avoid)) {
		a := f.avoid[k]
		targets = append(targets, health.Target{Cluster: k, Node: a.node, Destination: a.addr, StartDown: true})
	}
	f.underlay.Sync(targets)
}

// underlayChanged is the underlay probes' OnChange: an avoided gateway that answered for the
// recovery hold is used again (after its backoff, if it has one).
func (f *failover) underlayChanged(key string, usable bool) {
	if !usable {
		return
	}
	f.mu.Lock()
	a, ok := f.avoid[key]
	var wait time.Duration
	if ok {
		wait = a.notBefore.Sub(f.now())
	}
	f.mu.Unlock()
	if !ok {
		return
	}
	if wait > 0 {
		time.AfterFunc(wait, func() { f.returnIfUsable(key) })
		return
	}
	f.returnIfUsable(key)
}

// returnIfUsable stops avoiding key when its underlay probes still find it usable.
func (f *failover) returnIfUsable(key string) {
	r, ok := f.underlay.Result(key)
	s := f.underlay.Settings()
	if !ok || !r.Usable(s.FailureThreshold, s.RecoveryHold, f.now()) {
		return
	}
	f.mu.Lock()
	a, avoiding := f.avoid[key]
	if !avoiding || f.now().Before(a.notBefore) {
		f.mu.Unlock()
		return
	}
	delete(f.avoid, key)
	f.returned[key] = f.now()
	f.syncUnderlayLocked()
	f.mu.Unlock()
	f.log.Info("avoided remote gateway answered for its recovery hold: the pair moves back to it", "endpoint", key, "avoidedFor", f.now().Sub(a.since).Round(time.Millisecond))
	f.trigger()
}
