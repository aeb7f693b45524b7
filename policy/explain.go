package policy

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
