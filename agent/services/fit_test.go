package services

import (
	"slices"
	"strings"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/bpf"
)

// planOf is a plan with one load-balanced service per import "owner:ns/name".
func planOf(imports ...string) Plan {
	var p Plan
	for i, s := range imports {
		owner, key, _ := strings.Cut(s, ":")
		p.LB = append(p.LB, bpf.Service{Port: uint16(1000 + i)})
		p.LBImports = append(p.LBImports, key)
		p.LBOwners = append(p.LBOwners, owner)
	}
	return p
}

func TestFitOrder(t *testing.T) {
	tests := []struct {
		name       string
		imports    []string
		programmed []int // indexes of the imports whose service the maps hold
		first      map[string]uint64
		want       []string
	}{
		{
			name:    "one import of each cluster per round, the local cluster first, then by name",
			imports: []string{"west:a/w1", "east:a/e1", "east:a/e2", "east:a/e3", "north:a/n1", "west:a/w2"},
			want:    []string{"a/n1", "a/e1", "a/w1", "a/e2", "a/w2", "a/e3"},
		},
		{
			name:       "within a cluster, what the maps hold comes first",
			imports:    []string{"east:a/e1", "east:a/e2", "east:a/e3"},
			programmed: []int{2},
			want:       []string{"a/e3", "a/e1", "a/e2"},
		},
		{
			name:    "then the order this node first planned them",
			imports: []string{"east:a/e1", "east:a/e2", "east:a/e3"},
			first:   map[string]uint64{"a/e3": 0, "a/e2": 1},
			want:    []string{"a/e3", "a/e2", "a/e1"},
		},
		{
			name:       "a new import of a small cluster comes before a held import of a large one's second round",
			imports:    []string{"east:a/e1", "east:a/e2", "west:a/w1", "west:a/w2"},
			programmed: []int{0, 1, 2},
			first:      map[string]uint64{"a/e1": 0, "a/e2": 1, "a/w1": 2},
			want:       []string{"a/e1", "a/w1", "a/e2", "a/w2"},
		},
		{
			name:       "a newcomer of a cluster never passes that cluster's held imports",
			imports:    []string{"east:a/e0", "east:a/e1", "east:a/e2"},
			programmed: []int{1, 2},
			want:       []string{"a/e1", "a/e2", "a/e0"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := planOf(tt.imports...)
			held := map[string]bool{}
			for _, i := range tt.programmed {
				held[p.LB[i].String()] = true
			}
			var got []string
			for _, g := range FitOrder(p, "north", held, tt.first) {
				got = append(got, g.Import)
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("order %v, want %v", got, tt.want)
			}
		})
	}
}

func TestFitOrderGroupsTheServicesOfOneImport(t *testing.T) {
	p := planOf("east:a/web", "east:a/web", "east:a/db")
	groups := FitOrder(p, "north", nil, nil)
	if len(groups) != 2 || groups[0].Import != "a/db" || len(groups[1].Services) != 2 || groups[1].Owner != "east" {
		t.Fatalf("groups %+v", groups)
	}
}

func TestOwnerOfAnImport(t *testing.T) {
	imp := func(clusters map[string]int) *apiv1.ServiceImport {
		out := &apiv1.ServiceImport{}
		for c, n := range clusters {
			ic := &apiv1.ImportedCluster{Cluster: c}
			for range n {
				ic.Endpoints = append(ic.Endpoints, &apiv1.ServiceEndpoint{})
			}
			out.Clusters = append(out.Clusters, ic)
		}
		return out
	}
	for _, tt := range []struct {
		clusters map[string]int
		want     string
	}{
		{map[string]int{"east": 5, "north": 1}, "north"},
		{map[string]int{"east": 5, "west": 1}, "east"},
		{map[string]int{"west": 2, "east": 2}, "east"},
		{map[string]int{}, ""},
	} {
		if got := owner(imp(tt.clusters), "north"); got != tt.want {
			t.Errorf("owner of %v = %q, want %q", tt.clusters, got, tt.want)
		}
	}
}
