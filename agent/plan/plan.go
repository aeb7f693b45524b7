// Package plan computes, once per set of inputs, what this node wants connected: the broker
// state (its revision, the Join answer's cluster record and the registration's mesh address
// standing in until the watch brings them), the cable drivers that run here and the guard (what
// no cable route may cover). The result, a Plan, is immutable and published behind an atomic
// pointer; the cables, the services datapath, the mesh ingress and the status read it instead of
// each cloning the state and resolving the policies again:
//
//	watch -> state -> plan -> consumers -> status
//
// A Planner computes lazily: Get returns the published plan while its inputs are unchanged and
// computes a new one (and tells the subscribers) when they changed.
package plan

import (
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/internal/syncloop"
	"github.com/cablemesh/cablemesh/policy"
)

// Key identifies the broker-side inputs of a plan without copying them: the state value held
// (the cache replaces it on every watch message, it never edits one in place but for its
// revision), its revision, the Join answer's cluster record and the mesh address of the last
// registration.
type Key struct {
	State      *brokerstate.State
	Revision   uint64
	Join       *apiv1.Cluster
	Registered netip.Addr
}

// Inputs are what a plan is computed from besides the broker state.
type Inputs struct {
	// Cluster is this node's cluster; Node its name on a gateway, "" elsewhere (a non-gateway
	// node routes what its gateway connects and needs no mesh address of its own).
	Cluster, Node string
	// Drivers are this gateway's cable drivers, nil or why each does not run; nil on other
	// nodes (no driver check).
	Drivers reconcile.Drivers
	Guard   reconcile.Guard
	// StandInNode is this node's name, whose endpoint takes the registration's mesh address
	// until the watch brings it.
	StandInNode string
	// Avoid are remote gateway endpoints (brokerstate.EndpointKey, sorted) that this gateway's
	// own probes found dead while the broker still lists them: each pair is connected to its
	// cluster's next usable gateway instead (see avoiding). Nil on other nodes.
	Avoid []string
}

// Plan is the decision for one set of inputs. It and everything it points to are read-only.
type Plan struct {
	// State is the broker state the plan was computed from, with the stand-ins of Key applied.
	State     *brokerstate.State
	Resolver  *policy.Resolver
	Wants     []reconcile.Want
	Problems  []reconcile.Problem
	Decisions []reconcile.PairDecision

	key Key
	in  Inputs
}

// Guard is what no cable route may cover, as the plan applied it.
func (p *Plan) Guard() reconcile.Guard { return p.in.Guard }

// Revision is the broker revision the plan was computed at.
func (p *Plan) Revision() uint64 { return p.State.Revision }

// Planner computes and publishes plans. Its zero value is not ready: use New.
type Planner struct {
	log *slog.Logger

	// mu serialises computing (one plan per input change, however many readers ask at once) and
	// guards the resolver cache and subs. It is never held while calling out, but for the
	// snapshot function, which takes the state cache's own lock (order: Planner.mu, then the
	// cache's).
	mu     sync.Mutex
	res    *policy.Resolver
	resKey string
	subs   []*syncloop.Trigger

	cur atomic.Pointer[Plan]
}

// New returns a Planner that logs the policies it loads to log.
func New(log *slog.Logger) *Planner { return &Planner{log: log} }

// Current is the last published plan; nil before the first Get.
func (p *Planner) Current() *Plan { return p.cur.Load() }

// Subscribe returns a trigger fired whenever a new plan is published.
func (p *Planner) Subscribe() *syncloop.Trigger {
	t := &syncloop.Trigger{}
	p.mu.Lock()
	p.subs = append(p.subs, t)
	p.mu.Unlock()
	return t
}

// Get returns the plan for key and in: the published one while they are those it was computed
// from, else a new one computed from snapshot's state (a copy the plan keeps; snapshot returns the
// key of what it copied), published.
func (p *Planner) Get(key Key, in Inputs, snapshot func() (Key, *brokerstate.State)) *Plan {
	if cur := p.cur.Load(); cur != nil && cur.matches(key, in) {
		return cur
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if cur := p.cur.Load(); cur != nil && cur.matches(key, in) {
		return cur // computed while we waited
	}
	k, st := snapshot()
	withStandIns(st, k, in.Cluster, in.StandInNode)
	res := p.resolverLocked(st)
	wants, problems, decisions := reconcile.DesiredAt(st, in.Cluster, in.Node, res, in.Drivers, in.Guard)
	wants = avoiding(wants, st, in, res)
	next := &Plan{State: st, Resolver: res, Wants: wants, Problems: problems, Decisions: decisions, key: k,
		in: Inputs{Cluster: in.Cluster, Node: in.Node, StandInNode: in.StandInNode, Drivers: maps.Clone(in.Drivers), Guard: reconcile.Guard{Protected: slices.Clone(in.Guard.Protected)},
			Avoid: slices.Clone(in.Avoid)}}
	p.cur.Store(next)
	for _, t := range p.subs {
		t.Fire()
	}
	return next
}

func (pl *Plan) matches(key Key, in Inputs) bool {
	return pl.key == key && pl.in.Cluster == in.Cluster && pl.in.Node == in.Node && pl.in.StandInNode == in.StandInNode &&
		sameDrivers(pl.in.Drivers, in.Drivers) && slices.Equal(pl.in.Guard.Protected, in.Guard.Protected) &&
		slices.Equal(pl.in.Avoid, in.Avoid)
}

// avoiding replaces, in wants (DesiredAt's on st), every connection to an endpoint in in.Avoid
// by the one DesiredAt picks with the avoided endpoints left out: the next gateway of that
// cluster in the same order (lexically smallest usable node), so the decision stays the pure
// function of the broker state and of which gateways are avoided that the remote cluster's
// workers follow too (routes.Plan). A pair whose every usable gateway is avoided keeps the
// connection DesiredAt chose (no gateway is better than another then). The problems and
// decisions stay DesiredAt's on the full state: avoiding changes which gateway carries a pair,
// never whether it connects.
func avoiding(wants []reconcile.Want, st *brokerstate.State, in Inputs, res *policy.Resolver) []reconcile.Want {
	if len(in.Avoid) == 0 {
		return wants
	}
	hit := false
	for _, w := range wants {
		if slices.Contains(in.Avoid, brokerstate.EndpointKey(w.Remote.Cluster, w.Remote.Node)) {
			hit = true
			break
		}
	}
	if !hit {
		return wants
	}
	view := *st
	view.Endpoints = maps.Clone(st.Endpoints)
	guard := reconcile.Guard{Protected: slices.Clone(in.Guard.Protected)}
	for _, k := range in.Avoid {
		if e := view.Endpoints[k]; e != nil {
			// Its addresses stay protected from cable routes, as on the full state.
			for _, raw := range []string{e.GetPrivateIp(), e.GetPublicIp()} {
				if a, err := netip.ParseAddr(raw); err == nil {
					guard.Protected = append(guard.Protected, reconcile.ProtectAddr(a, "the address "+a.Unmap().String()+" of gateway "+k))
				}
			}
			delete(view.Endpoints, k)
		}
	}
	alt, _, _ := reconcile.DesiredAt(&view, in.Cluster, in.Node, res, in.Drivers, guard)
	byCluster := map[string]reconcile.Want{}
	for _, w := range alt {
		byCluster[w.Remote.Cluster] = w
	}
	out := make([]reconcile.Want, 0, len(wants))
	for _, w := range wants {
		if a, ok := byCluster[w.Remote.Cluster]; ok && slices.Contains(in.Avoid, brokerstate.EndpointKey(w.Remote.Cluster, w.Remote.Node)) {
			w = a
		}
		out = append(out, w)
	}
	return out
}

// sameDrivers compares two driver sets; the errors by their text.
func sameDrivers(a, b reconcile.Drivers) bool {
	if (a == nil) != (b == nil) || len(a) != len(b) {
		return false
	}
	for n, err := range a {
		if other, ok := b[n]; !ok || errText(other) != errText(err) {
			return false
		}
	}
	return true
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// resolverLocked returns the policy resolver for st's policies, rebuilt only when they changed.
func (p *Planner) resolverLocked(st *brokerstate.State) *policy.Resolver {
	key := reconcile.PolicyKey(st)
	if p.res != nil && p.resKey == key {
		return p.res
	}
	r, problems := reconcile.Resolver(st)
	for _, pr := range problems {
		p.log.Warn("ignoring connection policy", "policy", pr.Policy, "reason", pr.Message)
	}
	p.log.Info("connection policies loaded", "policies", len(st.Policies), "revision", st.Revision)
	p.res, p.resKey = r, key
	return r
}

// withStandIns fills in, on st (a copy), what the watch has not brought yet: until our own
// cluster record comes, the Join answer's (its labels matter to the policies); until our own
// endpoint carries its mesh address, the registration answer's (gateway-mode pairs need it).
func withStandIns(st *brokerstate.State, k Key, cluster, node string) {
	if st.Clusters[cluster] == nil && k.Join != nil {
		st.Clusters[cluster] = proto.Clone(k.Join).(*apiv1.Cluster)
	}
	key := brokerstate.EndpointKey(cluster, node)
	if own := st.Endpoints[key]; k.Registered.IsValid() && own != nil && !reconcile.MeshAddress(own).IsValid() {
		e := proto.Clone(own).(*apiv1.Endpoint)
		e.MeshAddress = k.Registered.String()
		st.Endpoints[key] = e
	}
}
