package policy

import (
	"encoding/json"
	"maps"
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
// Rules (DESIGN.md "Policy resolution"):
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
//   - At equal priority a mesh policy outranks a cluster's: a cluster policy
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
		// At equal priority the mesh's policies come first and outrank a cluster's:
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

// Resolve decides the pair {a, b}. A cluster is never connected to itself.
func (r *Resolver) Resolve(a, b Cluster) Decision {
	d, _ := r.explain(a, b, false)
	return d
}

// Resolve decides the pair {a, b} under policies and the mesh default policy.
// To resolve many pairs, build a Resolver once, or use ResolveAll.
func Resolve(policies []ClusterConnectionPolicy, defaultPolicy ClusterConnectionPolicy, a, b Cluster) Decision {
	return NewResolver(policies, defaultPolicy).Resolve(a, b)
}
