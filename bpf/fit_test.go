package bpf

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// svcN is a service of VIP 241.0.<g>.<i> with n backends.
func svcN(g, i, n int) Service {
	s := svc(fmt.Sprintf("241.0.%d.%d", g, i), 80, TCP)
	for b := range n {
		s.Backends = append(s.Backends, be(fmt.Sprintf("10.%d.%d.%d", g, i, b+1), 8080, uint32(g+1)))
	}
	return s
}

func refusedGroups(r []Refusal) []int {
	out := []int{}
	for _, x := range r {
		out = append(out, x.Group)
	}
	return out
}

func TestFitGroupsTakesWhatFitsInOrderAndRefusesEachOtherGroupAlone(t *testing.T) {
	tests := []struct {
		name    string
		cur     []Service
		groups  [][]Service
		capa    capacity
		refused []int
	}{
		{
			name:    "everything fits",
			groups:  [][]Service{{svcN(0, 1, 2)}, {svcN(1, 1, 3)}},
			capa:    capacity{svc: 7, backends: 5},
			refused: []int{},
		},
		{
			name:    "the first group that does not fit is refused, a later one that fits is taken",
			groups:  [][]Service{{svcN(0, 1, 2)}, {svcN(1, 1, 10)}, {svcN(2, 1, 1)}},
			capa:    capacity{svc: 6, backends: 100},
			refused: []int{1},
		},
		{
			name:    "a group is taken or refused whole (two ports of one import)",
			groups:  [][]Service{{svcN(0, 1, 1)}, {svcN(1, 1, 1), svcN(1, 2, 1)}},
			capa:    capacity{svc: 5, backends: 100},
			refused: []int{1},
		},
		{
			name:    "the backend map bounds too",
			groups:  [][]Service{{svcN(0, 1, 3)}, {svcN(1, 1, 3)}},
			capa:    capacity{svc: 100, backends: 5},
			refused: []int{1},
		},
		{
			name:    "an invalid group is refused, the others are taken",
			groups:  [][]Service{{svc("241.0.0.1", 0, TCP)}, {svcN(1, 1, 1)}},
			capa:    bigCapacity,
			refused: []int{0},
		},
		{
			name:    "a service of a group taken before refuses the later group",
			groups:  [][]Service{{svcN(0, 1, 1)}, {svcN(0, 1, 2)}},
			capa:    bigCapacity,
			refused: []int{1},
		},
		{
			name: "a service that goes frees its room for another first",
			cur:  []Service{svcN(0, 1, 4)},
			// 5 entries held by a service that goes; the new one needs 5.
			groups:  [][]Service{{svcN(1, 1, 4)}},
			capa:    capacity{svc: 5, backends: 4},
			refused: []int{},
		},
		{
			name:    "a held service that shrinks needs no more room than it has",
			cur:     []Service{svcN(0, 1, 4), svcN(1, 1, 1)},
			groups:  [][]Service{{svcN(0, 1, 2)}, {svcN(1, 1, 1)}},
			capa:    capacity{svc: 7, backends: 5},
			refused: []int{},
		},
		{
			name: "a held service whose backends are all replaced needs old and new at once",
			cur:  []Service{svcN(0, 1, 2)},
			groups: [][]Service{{func() Service {
				s := svcN(0, 1, 0)
				s.Backends = []Backend{be("10.9.0.1", 80, 1), be("10.9.0.2", 80, 1)}
				return s
			}()}},
			capa:    capacity{svc: 3, backends: 3},
			refused: []int{0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cur, _ := synced(t, newTables(), tt.cur...)
			ops, refused, err := planFit(cur, tt.groups, tt.capa)
			if err != nil {
				t.Fatal(err)
			}
			if got := refusedGroups(refused); !slices.Equal(got, tt.refused) {
				t.Fatalf("refused %v (%v), want %v", got, refused, tt.refused)
			}
			var want []Service
			for g, group := range tt.groups {
				if !slices.Contains(tt.refused, g) {
					want = append(want, group...)
				}
			}
			svcPeak, bePeak := peakEntries(cur, ops)
			if svcPeak > tt.capa.svc || bePeak > tt.capa.backends {
				t.Fatalf("the writes need %d and %d entries, the maps hold %d and %d", svcPeak, bePeak, tt.capa.svc, tt.capa.backends)
			}
			for _, o := range ops {
				cur.apply(o)
			}
			if got := cur.services(); !sameServices(got, want) {
				t.Fatalf("maps hold %v, want %v", got, want)
			}
			for _, r := range refused {
				if r.Reason == "" {
					t.Errorf("refusal of group %d says no reason", r.Group)
				}
			}
		})
	}
}

func TestFitRefusalSaysWhatItNeedsAndWhatIsLeft(t *testing.T) {
	_, refused, err := planFit(newTables(), [][]Service{{svcN(0, 1, 2)}, {svcN(1, 1, 3)}}, capacity{svc: 5, backends: 100})
	if err != nil || len(refused) != 1 {
		t.Fatalf("refused %v, err %v", refused, err)
	}
	for _, want := range []string{"full", "needs 4 service map", "2 and 98 are left of 5 and 100"} {
		if !strings.Contains(refused[0].Reason, want) {
			t.Errorf("reason %q does not say %q", refused[0].Reason, want)
		}
	}
}

// Over random histories, the writes of planFit never need more room than the maps have, and
// once written a second planFit of the same groups writes nothing and refuses the same ones.
func TestPlanFitNeverOverflowsAndSettles(t *testing.T) {
	capa := capacity{svc: 18, backends: 14}
	cur := newTables()
	refusing := 0
	for round := range 200 {
		var groups [][]Service
		for g := range 6 {
			n := (round*7 + g*3) % 9
			if (round+g)%5 == 0 {
				continue
			}
			groups = append(groups, []Service{svcN(g, 1+round%2, n)})
		}
		ops, refused, err := planFit(cur, groups, capa)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if s, b := peakEntries(cur, ops); s > capa.svc || b > capa.backends {
			t.Fatalf("round %d: writes need %d/%d entries, maps hold %d/%d", round, s, b, capa.svc, capa.backends)
		}
		for _, o := range ops {
			cur.apply(o)
		}
		if err := consistent(cur); err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if len(refused) > 0 {
			refusing++
		}
		again, refusedAgain, err := planFit(cur, groups, capa)
		if err != nil || len(again) != 0 || !slices.Equal(refusedGroups(refusedAgain), refusedGroups(refused)) {
			t.Fatalf("round %d: second planFit writes %v, refuses %v (first %v), err %v", round, opStrings(again), refusedAgain, refused, err)
		}
	}
	if refusing == 0 || refusing == 200 {
		t.Errorf("%d of 200 rounds refused a group: the test does not exercise both", refusing)
	}
}
