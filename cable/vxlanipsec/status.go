package vxlanipsec

import (
	"fmt"
	"strings"

	"github.com/cablemesh/cablemesh/cable"
)

// combine judges each pair from its VXLAN connection (vs), its IPsec connection (ss) and its guard
// policies (guards: cluster -> "out"/"in" -> present). Pure.
//
// The pair is connected only when the VXLAN entries are in place and the transport-mode CHILD_SA
// is up: VXLAN alone would be the unencrypted cable the policy did not ask for. Missing guards
// are an error even then: the next time charon's SA goes (a rekey gone wrong, a charon restart)
// the VXLAN packets would cross in the clear. The counters and MTU are the VXLAN link's (what
// the pair carries), the endpoint and handshake IPsec's (the IKE port is what the node
// publishes, so the agent compares that). An IPsec connection without a VXLAN one (after a
// restart, before the agent's Connect) is reported as an error of that cluster.
func combine(vs, ss []cable.ConnectionStatus, guards map[string]map[string]bool) []cable.ConnectionStatus {
	sec := map[string]cable.ConnectionStatus{}
	for _, s := range ss {
		sec[s.Cluster] = s
	}
	seen := map[string]bool{}
	out := make([]cable.ConnectionStatus, 0, len(vs))
	for _, v := range vs {
		c := v
		seen[v.Cluster] = true
		s, ok := sec[v.Cluster]
		if ok {
			c.Endpoint = s.Endpoint
			c.LastHandshake = s.LastHandshake
		}
		var problems, notes []string
		state := cable.StateConnected
		worse := func(st cable.State) {
			if st == cable.StateError || state == cable.StateConnected {
				state = st
			}
		}
		switch {
		case v.State != cable.StateConnected:
			worse(v.State)
			problems = append(problems, "VXLAN: "+v.Message)
		case v.Message != "":
			notes = append(notes, "VXLAN: "+v.Message)
		}
		switch {
		case v.Cluster == "":
			// An FDB entry no cluster owns: the VXLAN half says so already.
		case !ok:
			worse(cable.StateError)
			problems = append(problems, "IPsec: charon holds no transport-mode connection for the pair (its VXLAN packets are dropped)")
		case s.State != cable.StateConnected:
			worse(s.State)
			problems = append(problems, fmt.Sprintf("IPsec %s: %s", s.State, s.Message))
		case s.Message != "":
			notes = append(notes, "IPsec: "+s.Message)
		}
		if v.Cluster != "" {
			var missing []string
			for _, dir := range []string{"out", "in"} {
				if !guards[v.Cluster][dir] {
					missing = append(missing, dir)
				}
			}
			if len(missing) > 0 {
				worse(cable.StateError)
				problems = append(problems, fmt.Sprintf("guard policy %s missing: without charon's SA the pair's VXLAN packets would cross unencrypted", strings.Join(missing, ", ")))
			}
		}
		c.State = state
		c.Message = strings.Join(append(problems, notes...), "; ")
		out = append(out, c)
	}
	for _, s := range ss {
		if seen[s.Cluster] {
			continue
		}
		c := s
		c.State = cable.StateError
		c.Message = "IPsec connection without its VXLAN connection"
		if s.Message != "" {
			c.Message += " (IPsec: " + s.Message + ")"
		}
		out = append(out, c)
	}
	cable.SortConnections(out)
	return out
}
