package policy

import (
	"fmt"
	"slices"
)

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
