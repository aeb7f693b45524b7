package policy

import (
	"strings"
	"testing"
)

// The isolation scenario of the rules: clusters east and west, the mesh isolates them, east's
// own policy tries to connect them.
var eastWest = []Cluster{
	{Name: "east", Labels: map[string]string{"name": "east"}},
	{Name: "north", Labels: map[string]string{"name": "north"}},
	{Name: "west", Labels: map[string]string{"name": "west"}},
}

func scopedPol(t *testing.T, origin, name string, prio int, left, right, conn, driver string) ClusterConnectionPolicy {
	t.Helper()
	p := pol(t, name, prio, left, right, "", "", conn, driver)
	p.Origin = origin
	return p
}

func finalPol(p ClusterConnectionPolicy) ClusterConnectionPolicy {
	p.Spec.Final = true
	return p
}

// TestClusterPoliciesCannotLiftANo is the table of the rules on cluster-scoped policies: each
// case resolves every pair both ways, with Resolve, ResolveAll and Explain, and checks the
// east-west decision, who decided it, and why the losers lost.
func TestClusterPoliciesCannotLiftANo(t *testing.T) {
	const maxPrio = 2147483647
	isolate := pol(t, "isolate-west", 100, "name=east", "name=west", "", "", NoConnect, "")
	tests := []struct {
		name     string
		policies []ClusterConnectionPolicy
		def      ClusterConnectionPolicy
		connect  bool
		driver   string
		policy   string // the deciding policy
		loser    string // a policy that lost, "" for none
		reason   string // words of the loser's reason
	}{
		{"a mesh no-connect beats a cluster's connect of any priority (the issue's repro)",
			[]ClusterConnectionPolicy{isolate, scopedPol(t, "east", "reconnect", maxPrio, "name=east", "name=west", Connect, "vxlan")},
			DefaultPolicy(""), false, "", "isolate-west", "reconnect", "mesh policy isolate-west says no-connect"},
		{"a mesh no-connect of low priority still beats a cluster's connect",
			[]ClusterConnectionPolicy{pol(t, "isolate-low", -5, "name=east", "name=west", "", "", NoConnect, ""), scopedPol(t, "east", "reconnect", 50, "name=east", "name=west", Connect, "vxlan")},
			DefaultPolicy(""), false, "", "isolate-low", "reconnect", "cannot connect a pair the mesh forbids"},
		{"a mesh no-connect outranked by a mesh connect vetoes nothing",
			[]ClusterConnectionPolicy{isolate, pol(t, "allow", 200, "name=east", "name=west", "", "", Connect, "ipsec"), scopedPol(t, "east", "mine", 300, "name=east", "name=west", Connect, "vxlan")},
			DefaultPolicy(""), true, "vxlan", "mine", "", ""},
		{"the other cluster's no-connect beats a cluster's connect",
			[]ClusterConnectionPolicy{scopedPol(t, "east", "to-west", maxPrio, "name=east", "name=west", Connect, "vxlan"), scopedPol(t, "west", "no-east", 1, "name=west", "name=east", NoConnect, "")},
			DefaultPolicy(""), false, "", "no-east", "to-west", "cluster west's policy no-east says no-connect"},
		{"a cluster's own lower no-connect does not veto its own connect",
			[]ClusterConnectionPolicy{scopedPol(t, "east", "to-west", 10, "name=east", "name=west", Connect, "vxlan"), scopedPol(t, "east", "old-no", 1, "name=east", "name=west", NoConnect, "")},
			DefaultPolicy(""), true, "vxlan", "to-west", "", ""},
		{"the other cluster's connect above its own no-connect lets the pair connect",
			[]ClusterConnectionPolicy{scopedPol(t, "east", "to-west", 10, "name=east", "name=west", Connect, "vxlan"),
				scopedPol(t, "west", "no-east", 1, "name=west", "name=east", NoConnect, ""), scopedPol(t, "west", "yes-east", 5, "name=west", "name=east", Connect, "vxlan")},
			DefaultPolicy(""), true, "vxlan", "to-west", "", ""},
		{"a cluster's connect under a no-connect default still connects when nobody forbids",
			[]ClusterConnectionPolicy{scopedPol(t, "east", "to-west", 10, "name=east", "name=west", Connect, "vxlan")},
			pol(t, "default", 0, "", "", "*", "", NoConnect, ""), true, "vxlan", "to-west", "", ""},
		{"a cluster's no-connect above the mesh's connect still isolates (a cluster may say no)",
			[]ClusterConnectionPolicy{pol(t, "allow", 10, "name=east", "name=west", "", "", Connect, "ipsec"), scopedPol(t, "west", "no-east", 20, "name=west", "name=east", NoConnect, "")},
			DefaultPolicy(""), false, "", "no-east", "", ""},
		{"a final mesh connect beats a cluster's higher no-connect, with its driver",
			[]ClusterConnectionPolicy{finalPol(pol(t, "must", 10, "name=east", "name=west", "", "", Connect, "ipsec")), scopedPol(t, "west", "no-east", maxPrio, "name=west", "name=east", NoConnect, "")},
			DefaultPolicy(""), true, "ipsec", "must", "no-east", "mesh policy must is final"},
		{"a final mesh connect beats a cluster's higher connect's driver",
			[]ClusterConnectionPolicy{finalPol(pol(t, "must", 10, "name=east", "name=west", "", "", Connect, "ipsec")), scopedPol(t, "east", "vx", maxPrio, "name=east", "name=west", Connect, "vxlan")},
			DefaultPolicy(""), true, "ipsec", "must", "vx", "final"},
		{"a final mesh policy leaves agreeing cluster policies alone",
			[]ClusterConnectionPolicy{finalPol(pol(t, "must", 10, "name=east", "name=west", "", "", Connect, "ipsec")), scopedPol(t, "east", "same", maxPrio, "name=east", "name=west", Connect, "ipsec")},
			DefaultPolicy(""), true, "ipsec", "must", "", ""},
		{"final on a cluster's policy is ignored",
			[]ClusterConnectionPolicy{isolate, finalPol(scopedPol(t, "east", "reconnect", maxPrio, "name=east", "name=west", Connect, "vxlan"))},
			DefaultPolicy(""), false, "", "isolate-west", "reconnect", "says no-connect"},
		{"without a mesh or other-cluster no, a cluster's connect decides as before",
			[]ClusterConnectionPolicy{scopedPol(t, "east", "to-west", 5, "name=east", "name=west", Connect, "vxlan")},
			DefaultPolicy(""), true, "vxlan", "to-west", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := NewResolver(tt.policies, tt.def)
			res := r.ResolveAll(eastWest)
			east, west := eastWest[0], eastWest[2]
			ab, ba := r.Resolve(east, west), r.Resolve(west, east)
			if !ab.Equal(ba) {
				t.Fatalf("not symmetric: %+v / %+v", ab, ba)
			}
			if all, _ := res.Get("west", "east"); !all.Equal(ab) {
				t.Fatalf("ResolveAll %+v, Resolve %+v", all, ab)
			}
			if ab.Connect != tt.connect || ab.Driver != tt.driver || ab.Policy != tt.policy {
				t.Fatalf("got connect %v driver %q by %q, want %v %q by %q (%+v)", ab.Connect, ab.Driver, ab.Policy, tt.connect, tt.driver, tt.policy, ab)
			}
			e := r.Explain(west, east)
			if !e.Decision.Equal(ab) {
				t.Fatalf("Explain %+v, Resolve %+v", e.Decision, ab)
			}
			if tt.loser == "" {
				return
			}
			st := res.Status[tt.loser]
			if st.ConflictsLost != 1 || len(st.Conflicts) != 1 || !strings.Contains(st.Conflicts[0].Reason, tt.reason) || st.Conflicts[0].Winner != tt.policy {
				t.Errorf("status of %s: %+v, want one conflict lost to %s saying %q", tt.loser, st, tt.policy, tt.reason)
			}
			found := false
			for _, c := range e.Candidates {
				if c.Policy == tt.loser {
					found = strings.HasPrefix(c.Outcome, outcomeOverruled) && strings.Contains(c.Outcome, tt.reason)
				}
			}
			if !found {
				t.Errorf("Explain does not say why %s lost: %+v", tt.loser, e.Candidates)
			}
			if !strings.Contains(strings.Join(ab.Conflicts, ","), tt.loser) {
				t.Errorf("decision conflicts %v do not name %s", ab.Conflicts, tt.loser)
			}
			// The pairs without west keep their default.
			if d, _ := res.Get("east", "north"); tt.def.Spec.Connects() && !d.Connect {
				t.Errorf("east-north: %+v", d)
			}
		})
	}
}
