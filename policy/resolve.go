package policy

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/bits"
	"slices"
	"sort"
)

// Decision is what the resolver says about one pair of clusters. It depends
// only on the unordered pair: Resolve(a, b) and Resolve(b, a) are equal.
type Decision struct {
	// Connect says whether the pair has a tunnel.
	Connect bool `json:"connect"`
	// Driver and Options are the cable for a connected pair. Options is
	// shared with the policy: read it, do not change it.
	Driver  string            `json:"driver,omitempty"`
	Options map[string]string `json:"options,omitempty"`
	// Topology is the deciding policy's effective topology.
	Topology string `json:"topology,omitempty"`
	// Initiator is the cluster that dials first: in client-server, the client
	// (when both ends are servers, or for other topologies, the lexically
	// smaller name).
	Initiator string `json:"initiator,omitempty"`
	// Policy names the policy that decided; empty when no policy covers the
	// pair (then it does not connect).
	Policy string `json:"policy,omitempty"`
	// Default is true when no policy matched and the default policy decided.
	Default bool `json:"default,omitempty"`
	// Conflicts names the policies at the winning priority that disagreed and
	// lost, in name order.
	Conflicts []string `json:"conflicts,omitempty"`
}

// Equal compares two decisions field by field.
func (d Decision) Equal(o Decision) bool {
	return d.Connect == o.Connect && d.Driver == o.Driver && maps.Equal(d.Options, o.Options) &&
		d.Topology == o.Topology && d.Initiator == o.Initiator && d.Policy == o.Policy &&
		d.Default == o.Default && slices.Equal(d.Conflicts, o.Conflicts)
}

// Resolver holds compiled policies. Build it once per change of policies and
// ask it about as many pairs as needed; it is safe for concurrent use.
//
// Rules (DESIGN.md "Policy resolution", seed 004):
//
//   - A policy in the clusterSelector form covers every pair whose two ends
//     it selects. In the left/right form, with L and R the clusters the two
//     selectors match: point-to-point covers the pairs with one end in L and
//     the other in R (either order; a cluster in both may be either end);
//     full-mesh covers every pair inside L ∪ R; client-server covers every
//     pair inside L ∪ R too, connecting those with a server (L) at one end and
//     a client (R) at the other and deciding no-connect for the others (two
//     clients, or two servers neither of which is a client): "never clients
//     with each other" holds even under a connect default.
//   - A connect policy connects the pairs it covers that its topology
//     connects; a no-connect policy decides no-connect for every pair it covers.
//   - A policy with a cluster origin covers only pairs that include that cluster.
//   - At equal priority a mesh policy outranks a cluster's (seed 003): a cluster policy
//     votes on a pair only when no mesh policy of its priority covers it.
//   - The covering policies of the highest priority decide. If they disagree
//     (connect vs no-connect, or different driver or options), no-connect wins,
//     then the lexically smallest name; the others are reported as Conflicts.
//   - No covering policy: the default policy decides, by the same rules; if
//     it does not cover the pair either, the pair does not connect.
//   - Invalid policies cover nothing (their status says why).
//
// A cluster-scoped policy can never lift the mesh's or the other cluster's no (docs/policies.md,
// "Who decides a pair"). When the rules above pick a cluster's policy and it connects the pair:
//
//   - a final mesh policy (spec.final) covering the pair: the mesh policies alone decide it
//     (their top rank, by the same rules), connect or not, driver and options;
//   - else, the mesh policies' own decision for the pair (their top rank, the default left
//     out) is no-connect: the pair does not connect, decided by the mesh's winner;
//   - else, the other cluster's own decision (the top rank of its policies covering the
//     pair) is no-connect: the pair does not connect, decided by that cluster's winner.
//
// The cluster policies overruled so are reported as conflicts lost, with the reason. Every
// input is the unordered pair and the policies, so both ends compute the same decision.
type Resolver struct {
	sorted    []*compiled // valid policies, highest priority first, then by name
	finals    []int       // indexes in sorted of the final mesh policies
	hasOrigin map[string]bool
	invalid   []*compiled
	def       *compiled // nil when the default is invalid
	defName   string
	defStatus string // error of an invalid default
}

type compiled struct {
	name     string
	prio     int
	topo     string
	connect  bool
	closed   bool // client-server: decides no-connect for covered, unconnected pairs
	set      bool // clusterSelector form: right is left
	pairwise bool // point-to-point in the left/right form
	left     matcher
	right    matcher
	origin   string // "" for mesh
	final    bool   // a mesh policy whose pairs the clusters' policies cannot decide
	driver   string
	options  map[string]string
	action   string // driver and options, to tell agreement from conflict
	key      string // total order among equal names
	err      string
}

// NewResolver compiles policies and the mesh default policy. A policy with
// the default's name in policies is the default itself and is not counted
// twice. A zero default (no name) is DefaultPolicy(DefaultDriver).
func NewResolver(policies []ClusterConnectionPolicy, defaultPolicy ClusterConnectionPolicy) *Resolver {
	if defaultPolicy.Metadata.Name == "" {
		defaultPolicy = DefaultPolicy(DefaultDriver)
	}
	r := &Resolver{defName: defaultPolicy.Metadata.Name}
	defDriver, defOptions := DefaultDriver, map[string]string(nil)
	if cd := defaultPolicy.Spec.CableDriver; cd != nil && cd.Name != "" && defaultPolicy.Spec.Connects() {
		defDriver, defOptions = cd.Name, cd.Options
	}
	def := compile(&defaultPolicy, defDriver, defOptions)
	if def.err != "" {
		r.defStatus = def.err
	} else {
		r.def = def
	}
	for i := range policies {
		p := &policies[i]
		if p.Metadata.Name == r.defName {
			continue
		}
		c := compile(p, defDriver, defOptions)
		if c.err != "" {
			r.invalid = append(r.invalid, c)
			continue
		}
		r.sorted = append(r.sorted, c)
	}
	sort.SliceStable(r.sorted, func(i, j int) bool {
		a, b := r.sorted[i], r.sorted[j]
		if a.prio != b.prio {
			return a.prio > b.prio
		}
		// At equal priority the mesh's policies come first and outrank a cluster's (seed 003):
		// the scan stops below the first rank that covers a pair (see outranks).
		if (a.origin == "") != (b.origin == "") {
			return a.origin == ""
		}
		if a.name != b.name {
			return a.name < b.name
		}
		return a.key < b.key
	})
	r.hasOrigin = map[string]bool{}
	for p, c := range r.sorted {
		if c.final {
			r.finals = append(r.finals, p)
		}
		if c.origin != "" {
			r.hasOrigin[c.origin] = true
		}
	}
	return r
}

func compile(p *ClusterConnectionPolicy, defDriver string, defOptions map[string]string) *compiled {
	c := &compiled{name: p.Metadata.Name, prio: p.EffectivePriority(), topo: p.Spec.EffectiveTopology(), connect: p.Spec.Connects()}
	if err := p.Validate(); err != nil {
		c.err = err.Error()
		return c
	}
	var err error
	if p.Spec.UsesLeftRight() {
		if c.left, err = compileSelector(p.Spec.LeftClusterSelector); err == nil {
			c.right, err = compileSelector(p.Spec.RightClusterSelector)
		}
		c.pairwise = c.topo == TopologyPointToPoint
		c.closed = c.topo == TopologyClientServer
	} else {
		c.left, err = compileSelector(p.Spec.ClusterSelector)
		c.right, c.set = c.left, true
	}
	if err != nil {
		c.err = err.Error()
		return c
	}
	if p.Origin != OriginMesh {
		c.origin = p.Origin
	}
	c.final = p.Spec.Final && c.origin == ""
	if c.connect {
		c.driver, c.options = defDriver, defOptions
		if cd := p.Spec.CableDriver; cd != nil {
			c.driver, c.options = cd.Name, cd.Options
		}
		c.action = c.driver
		for _, k := range sortedKeys(c.options) {
			c.action += "\x00" + k + "=" + c.options[k]
		}
	}
	key, _ := json.Marshal(struct {
		S Spec
		O string
	}{p.Spec, p.Origin})
	c.key = string(key)
	return c
}

// verdict says whether c covers a pair whose ends have the given roles (la:
// end a matches the left or set selector, ra: end a matches the right or set
// selector, likewise for b), and whether it connects it.
func (c *compiled) verdict(la, ra, lb, rb bool) (covers, connect bool) {
	cross := (la && rb) || (lb && ra)
	if c.pairwise {
		return cross, cross && c.connect
	}
	covers = (la || ra) && (lb || rb)
	if c.closed {
		return covers, covers && cross && c.connect
	}
	return covers, covers && c.connect
}

// vote is one covering policy's verdict on a pair.
type vote struct {
	c       *compiled
	connect bool
	la, lb  bool
	p       int // index in Resolver.sorted
	ci      int // index in the candidates (Explain only)
}

// tally collects, in policy order, the votes on one pair {a, b} (a < b) the rules need: top,
// the first covering rank (a mesh policy outranking a cluster's at equal priority); mesh, the
// first covering rank of mesh policies; own[0] and own[1], the first covering rank of a's and
// of b's cluster-scoped policies.
type tally struct {
	a, b string
	top  []vote
	mesh []vote
	own  [2][]vote
	// needOwn says whether a and b have cluster-scoped policies at all: without any, the scan
	// need not wait for their rank.
	needOwn [2]bool
	last    *compiled // the last policy seen, to tell when a rank is complete
}

func newTally(a, b string, hasOrigin map[string]bool) tally {
	return tally{a: a, b: b, needOwn: [2]bool{hasOrigin[a], hasOrigin[b]}}
}

// reset empties t for the pair {a, b}, keeping its buffers (ResolveAll reuses one tally).
func (t *tally) reset(a, b string, needA, needB bool) {
	t.a, t.b, t.needOwn, t.last = a, b, [2]bool{needA, needB}, nil
	t.top, t.mesh, t.own[0], t.own[1] = t.top[:0], t.mesh[:0], t.own[0][:0], t.own[1][:0]
}

// see records that the scan reached c (covering the pair or not); it must be called for
// every policy in order before add, so done knows which ranks are complete.
func (t *tally) see(c *compiled) { t.last = c }

// add records a covering vote.
func (t *tally) add(v vote) {
	if len(t.top) == 0 || !t.top[0].c.outranks(v.c) {
		t.top = append(t.top, v)
	}
	rank := func(votes []vote) []vote {
		if len(votes) == 0 || votes[0].c.prio == v.c.prio {
			return append(votes, v)
		}
		return votes
	}
	switch v.c.origin {
	case "":
		t.mesh = rank(t.mesh)
	case t.a:
		t.own[0] = rank(t.own[0])
	case t.b:
		t.own[1] = rank(t.own[1])
	}
}

// complete reports whether no policy from the last one seen on can join the rank of votes
// (policies come in rank order).
func (t *tally) complete(votes []vote) bool {
	return len(votes) > 0 && t.last != nil && votes[0].c.outranks(t.last)
}

// done reports whether the rest of the policies can change nothing: the top rank is complete
// and, when a cluster's policy is in it, so are the mesh's and the clusters' own ranks.
func (t *tally) done() bool {
	if !t.complete(t.top) {
		return false
	}
	if t.top[0].c.origin == "" {
		return true
	}
	if !t.complete(t.mesh) {
		return false
	}
	for k := range 2 {
		if t.needOwn[k] && !t.complete(t.own[k]) {
			return false
		}
	}
	return true
}

// overrule is a cluster-scoped policy's vote that lost to a rule of this file's doc, and why.
type overrule struct {
	v      vote
	reason string
}

// Reasons a cluster-scoped policy lost, for Conflict.Reason and Candidate.Outcome.
const (
	reasonFinal      = "mesh policy %s is final for this pair"
	reasonMeshNo     = "mesh policy %s says no-connect for this pair; a cluster's policy cannot connect a pair the mesh forbids"
	reasonOtherNo    = "cluster %s's policy %s says no-connect for this pair; a cluster's policy connects a pair only if the other cluster's policies agree"
	outcomeOverruled = "overruled: "
)

// resolveTally decides the pair from its tally. final reports whether a final mesh policy
// covers the pair. It returns the decision, the winning vote, the conflicts lost at the
// winning rank (indexes in the returned votes) and the cluster policies overruled.
func resolveTally(t *tally, final bool) (d Decision, votes []vote, w int, losers []int, over []overrule) {
	d, w, losers = decide(t.a, t.b, t.top, false)
	votes = t.top
	if t.top[w].c.origin == "" || (!d.Connect && !final) {
		return d, votes, w, losers, nil
	}
	var reason string
	var by []vote
	switch {
	case final && len(t.mesh) > 0:
		by = t.mesh
	case d.Connect && len(t.mesh) > 0:
		if md, mw, _ := decide(t.a, t.b, t.mesh, false); !md.Connect {
			by, reason = t.mesh, fmt.Sprintf(reasonMeshNo, t.mesh[mw].c.name)
		}
	}
	if by == nil && d.Connect {
		// The other cluster's word: the end that is not the winner's origin.
		other := 1
		if t.top[w].c.origin == t.b {
			other = 0
		}
		if own := t.own[other]; len(own) > 0 {
			if od, ow, _ := decide(t.a, t.b, own, false); !od.Connect {
				by, reason = own, fmt.Sprintf(reasonOtherNo, own[ow].c.origin, own[ow].c.name)
			}
		}
	}
	if by == nil {
		return d, votes, w, losers, nil
	}
	nd, nw, nlosers := decide(t.a, t.b, by, false)
	if final {
		reason = fmt.Sprintf(reasonFinal, by[nw].c.name)
	}
	for _, v := range t.top {
		if v.connect != nd.Connect || (nd.Connect && v.c.action != by[nw].c.action) {
			over = append(over, overrule{v: v, reason: reason})
			nd.Conflicts = append(nd.Conflicts, v.c.name)
		}
	}
	slices.Sort(nd.Conflicts)
	nd.Conflicts = slices.Compact(nd.Conflicts)
	return nd, by, nw, nlosers, over
}

// decide turns the votes of the top priority (in policy order) into a
// decision; a and b are in name order.
func decide(a, b string, votes []vote, isDefault bool) (Decision, int, []int) {
	w := 0
	for i, v := range votes {
		if !v.connect {
			w = i
			break
		}
	}
	win := votes[w]
	d := Decision{Connect: win.connect, Policy: win.c.name, Topology: win.c.topo, Default: isDefault}
	var losers []int
	for i, v := range votes {
		if i != w && (v.connect != win.connect || (win.connect && v.c.action != win.c.action)) {
			losers = append(losers, i)
			d.Conflicts = append(d.Conflicts, v.c.name)
		}
	}
	if d.Connect {
		d.Driver, d.Options = win.c.driver, win.c.options
		// The client dials: in a connected client-server pair where only a
		// is a server, b is the client. Otherwise the smaller name, a.
		d.Initiator = a
		if win.c.closed && win.la && !win.lb {
			d.Initiator = b
		}
	}
	return d, w, losers
}

// outranks reports whether v ranks above c: a higher priority, or the same priority with v a
// mesh policy and c a cluster's. Only the policies of the top rank that covers a pair vote on it,
// so at equal priority a mesh policy beats a cluster-scoped one outright, whatever they say.
func (v *compiled) outranks(c *compiled) bool {
	return c.prio < v.prio || (c.prio == v.prio && v.origin == "" && c.origin != "")
}

func (c *compiled) coversOrigin(a, b string) bool {
	return c.origin == "" || c.origin == a || c.origin == b
}

// Resolve decides the pair {a, b}. A cluster is never connected to itself.
func (r *Resolver) Resolve(a, b Cluster) Decision {
	d, _ := r.explain(a, b, false)
	return d
}

// Candidate is one policy that covers a pair, for Explain.
type Candidate struct {
	Policy   string `json:"policy"`
	Priority int    `json:"priority"`
	Connect  bool   `json:"connect"`
	Driver   string `json:"driver,omitempty"`
	// Outcome is "decided", "agrees" (same verdict as the winner at the same
	// priority), "lost conflict", "lower priority" or, for a cluster's policy
	// outranked by a mesh policy of its priority, "mesh policy of equal priority wins".
	Outcome string `json:"outcome"`
}

// Explanation is a decision with every policy that covered the pair.
type Explanation struct {
	A          string      `json:"a"`
	B          string      `json:"b"`
	Decision   Decision    `json:"decision"`
	Candidates []Candidate `json:"candidates"`
	// Invalid lists policies ignored because they are invalid, with why.
	Invalid map[string]string `json:"invalid,omitempty"`
}

// Explain is Resolve with its reasons: the covering policies in the order
// they were considered, for `cablectl connection-policy explain`.
func (r *Resolver) Explain(a, b Cluster) Explanation {
	d, cands := r.explain(a, b, true)
	if a.Name > b.Name {
		a, b = b, a
	}
	e := Explanation{A: a.Name, B: b.Name, Decision: d, Candidates: cands}
	for _, c := range r.invalid {
		if e.Invalid == nil {
			e.Invalid = map[string]string{}
		}
		e.Invalid[c.name] = c.err
	}
	return e
}

func (r *Resolver) explain(a, b Cluster, all bool) (Decision, []Candidate) {
	if a.Name == b.Name {
		return Decision{}, nil
	}
	if a.Name > b.Name {
		a, b = b, a
	}
	var cands []Candidate
	t := newTally(a.Name, b.Name, r.hasOrigin)
	for p, c := range r.sorted {
		t.see(c)
		if !all && t.done() {
			break
		}
		if !c.coversOrigin(a.Name, b.Name) {
			continue
		}
		la, ra := c.left.matches(a.Labels), c.right.matches(a.Labels)
		lb, rb := c.left.matches(b.Labels), c.right.matches(b.Labels)
		covers, connect := c.verdict(la, ra, lb, rb)
		if !covers {
			continue
		}
		t.add(vote{c: c, connect: connect, la: la, lb: lb, p: p, ci: len(cands)})
		if all {
			outcome := "lower priority"
			if c.prio == t.top[0].c.prio && t.top[0].c.outranks(c) {
				outcome = "mesh policy of equal priority wins"
			}
			cands = append(cands, Candidate{Policy: c.name, Priority: c.prio, Connect: connect, Driver: driverIf(connect, c.driver), Outcome: outcome})
		}
	}
	if len(t.top) == 0 {
		return r.decideByDefault(a, b, all, cands)
	}
	final := false
	if len(t.own[0])+len(t.own[1]) > 0 {
		for _, p := range r.finals {
			c := r.sorted[p]
			covers, _ := c.verdict(c.left.matches(a.Labels), c.right.matches(a.Labels), c.left.matches(b.Labels), c.right.matches(b.Labels))
			if covers {
				final = true
				break
			}
		}
	}
	d, votes, w, losers, over := resolveTally(&t, final)
	if all {
		for _, v := range t.top {
			cands[v.ci].Outcome = "agrees"
		}
		for _, v := range votes {
			cands[v.ci].Outcome = "agrees"
		}
		cands[votes[w].ci].Outcome = "decided"
		for _, l := range losers {
			cands[votes[l].ci].Outcome = "lost conflict"
		}
		for _, o := range over {
			cands[o.v.ci].Outcome = outcomeOverruled + o.reason
		}
	}
	return d, cands
}

// decideByDefault decides a pair no policy covers: the default policy, if it covers it.
func (r *Resolver) decideByDefault(a, b Cluster, all bool, cands []Candidate) (Decision, []Candidate) {
	if r.def == nil || !r.def.coversOrigin(a.Name, b.Name) {
		return Decision{}, cands
	}
	c := r.def
	la, ra := c.left.matches(a.Labels), c.right.matches(a.Labels)
	lb, rb := c.left.matches(b.Labels), c.right.matches(b.Labels)
	covers, connect := c.verdict(la, ra, lb, rb)
	if !covers {
		return Decision{}, cands
	}
	d, _, _ := decide(a.Name, b.Name, []vote{{c: c, connect: connect, la: la, lb: lb}}, true)
	if all {
		cands = append(cands, Candidate{Policy: c.name, Priority: c.prio, Connect: connect, Driver: driverIf(connect, c.driver), Outcome: "decided"})
	}
	return d, cands
}

func driverIf(connect bool, driver string) string {
	if connect {
		return driver
	}
	return ""
}

// Resolve decides the pair {a, b} under policies and the mesh default policy.
// To resolve many pairs, build a Resolver once, or use ResolveAll.
func Resolve(policies []ClusterConnectionPolicy, defaultPolicy ClusterConnectionPolicy, a, b Cluster) Decision {
	return NewResolver(policies, defaultPolicy).Resolve(a, b)
}

// PairDecision is the decision for clusters A and B, A < B.
type PairDecision struct {
	A        string   `json:"a"`
	B        string   `json:"b"`
	Decision Decision `json:"decision"`
}

// Result is the decision for every pair of a set of clusters, and each
// policy's status.
type Result struct {
	// Pairs holds every pair once, A < B, sorted by A then B.
	Pairs []PairDecision
	// Status is keyed by policy name; every policy given (the default too)
	// has one.
	Status map[string]Status
	index  map[[2]string]int
}

// Get returns the decision for {a, b} in either order.
func (res *Result) Get(a, b string) (Decision, bool) {
	if a > b {
		a, b = b, a
	}
	i, ok := res.index[[2]string{a, b}]
	if !ok {
		return Decision{}, false
	}
	return res.Pairs[i].Decision, true
}

// ResolveAll decides every pair of clusters (a cluster name given twice is
// taken once, first labels win) and computes each policy's status.
func ResolveAll(policies []ClusterConnectionPolicy, defaultPolicy ClusterConnectionPolicy, clusters []Cluster) *Result {
	return NewResolver(policies, defaultPolicy).ResolveAll(clusters)
}

// ResolveAll decides every pair of clusters. It matches each selector
// against each cluster once, keeps per cluster a bitset of the policies that
// select it, and for each pair walks only the policies selecting both ends,
// in priority order, stopping below the first priority that covers the pair.
func (r *Resolver) ResolveAll(clusters []Cluster) *Result {
	seen := map[string]bool{}
	var cl []Cluster
	for _, c := range clusters {
		if !seen[c.Name] {
			seen[c.Name] = true
			cl = append(cl, c)
		}
	}
	sort.Slice(cl, func(i, j int) bool { return cl[i].Name < cl[j].Name })
	n, m := len(cl), len(r.sorted)
	words := (m + 63) / 64
	pos := make(map[string]int, n)
	for i, c := range cl {
		pos[c.Name] = i
	}

	// One backing array: scope | left | right, each n x words.
	bitsArr := make([]uint64, 3*n*words)
	scope := func(i int) []uint64 { return bitsArr[i*words : (i+1)*words] }
	left := func(i int) []uint64 { return bitsArr[(n+i)*words : (n+i+1)*words] }
	right := func(i int) []uint64 { return bitsArr[(2*n+i)*words : (2*n+i+1)*words] }
	origin := make([]int, m) // -1 mesh, else cluster index
	for p, c := range r.sorted {
		origin[p] = -1
		if c.origin != "" {
			o, ok := pos[c.origin]
			if !ok {
				continue // covers nothing: its cluster is not here
			}
			origin[p] = o
		}
		w, bit := p/64, uint64(1)<<(p%64)
		for i := range cl {
			l := c.left.matches(cl[i].Labels)
			rr := l
			if !c.set {
				rr = c.right.matches(cl[i].Labels)
			}
			if l {
				left(i)[w] |= bit
			}
			if rr {
				right(i)[w] |= bit
			}
			if l || rr {
				scope(i)[w] |= bit
			}
		}
	}
	type roles struct{ l, r bool }
	defRoles := make([]roles, n)
	if r.def != nil {
		for i := range cl {
			defRoles[i] = roles{r.def.left.matches(cl[i].Labels), r.def.right.matches(cl[i].Labels)}
		}
	}

	res := &Result{
		Pairs:  make([]PairDecision, 0, n*(n-1)/2),
		Status: make(map[string]Status, m+len(r.invalid)+1),
		index:  make(map[[2]string]int, n*(n-1)/2),
	}
	stats := make([]Status, m+1) // last: the default
	var t tally
	hasOrigin := make([]bool, n)
	for i := range cl {
		hasOrigin[i] = r.hasOrigin[cl[i].Name]
	}
	has := func(b []uint64, p int) bool { return b[p/64]&(1<<(p%64)) != 0 }
	for i := 0; i < n; i++ {
		si, li, ri := scope(i), left(i), right(i)
		for j := i + 1; j < n; j++ {
			sj, lj, rj := scope(j), left(j), right(j)
			t.reset(cl[i].Name, cl[j].Name, hasOrigin[i], hasOrigin[j])
		scan:
			for w := 0; w < words; w++ {
				x := si[w] & sj[w]
				for x != 0 {
					p := w*64 + bits.TrailingZeros64(x)
					x &= x - 1
					c := r.sorted[p]
					t.see(c)
					if t.done() {
						break scan
					}
					if o := origin[p]; o >= 0 && o != i && o != j {
						continue
					}
					la, ra, lb, rb := has(li, p), has(ri, p), has(lj, p), has(rj, p)
					covers, connect := c.verdict(la, ra, lb, rb)
					if !covers {
						continue
					}
					t.add(vote{c: c, connect: connect, la: la, lb: lb, p: p})
				}
			}
			var d Decision
			switch {
			case len(t.top) > 0:
				final := false
				if len(t.own[0])+len(t.own[1]) > 0 {
					for _, p := range r.finals {
						if has(si, p) && has(sj, p) {
							if covers, _ := r.sorted[p].verdict(has(li, p), has(ri, p), has(lj, p), has(rj, p)); covers {
								final = true
								break
							}
						}
					}
				}
				var votes []vote
				var w int
				var losers []int
				var over []overrule
				d, votes, w, losers, over = resolveTally(&t, final)
				st := &stats[votes[w].p]
				st.PairsDecided++
				if d.Connect {
					st.PairsConnected++
				}
				lose := func(p int, reason string) {
					ls := &stats[p]
					ls.ConflictsLost++
					if len(ls.Conflicts) < MaxStatusConflicts {
						ls.Conflicts = append(ls.Conflicts, Conflict{ClusterA: cl[i].Name, ClusterB: cl[j].Name, Winner: d.Policy, Reason: reason})
					}
				}
				for _, l := range losers {
					lose(votes[l].p, "")
				}
				for _, o := range over {
					lose(o.v.p, o.reason)
				}
			case r.def != nil && r.def.coversOrigin(cl[i].Name, cl[j].Name):
				a, b := defRoles[i], defRoles[j]
				if covers, connect := r.def.verdict(a.l, a.r, b.l, b.r); covers {
					d, _, _ = decide(cl[i].Name, cl[j].Name, []vote{{c: r.def, connect: connect, la: a.l, lb: b.l}}, true)
					stats[m].PairsDecided++
					if d.Connect {
						stats[m].PairsConnected++
					}
				}
			}
			res.index[[2]string{cl[i].Name, cl[j].Name}] = len(res.Pairs)
			res.Pairs = append(res.Pairs, PairDecision{A: cl[i].Name, B: cl[j].Name, Decision: d})
		}
	}
	for p, c := range r.sorted {
		res.Status[c.name] = stats[p]
	}
	for _, c := range r.invalid {
		res.Status[c.name] = Status{Error: c.err}
	}
	res.Status[r.defName] = Status{
		PairsDecided:   stats[m].PairsDecided,
		PairsConnected: stats[m].PairsConnected,
		Error:          r.defStatus,
	}
	return res
}
