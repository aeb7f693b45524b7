package policy

import (
	"math/bits"
	"sort"
)

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
