package admission

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// wantErr checks that err is (or wraps) an E and that its message contains every fragment, and
// returns the E.
func wantErr[E error](t *testing.T, err error, fragments ...string) E {
	t.Helper()
	var target E
	if err == nil {
		t.Fatalf("no error, want a %T", target)
	}
	if !errors.As(err, &target) {
		t.Fatalf("error %q (%T) is not a %T", err, err, target)
	}
	for _, f := range fragments {
		if !strings.Contains(err.Error(), f) {
			t.Fatalf("error %q does not contain %q", err, f)
		}
	}
	return target
}

func mustParse(t *testing.T, req *apiv1.CreateJoinTokenRequest) ClusterRequest {
	t.Helper()
	r, err := ParseClusterRequest(req)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseClusterRequestRefusesBadFieldsNamingThem(t *testing.T) {
	tests := []struct {
		name      string
		req       *apiv1.CreateJoinTokenRequest
		field     string
		fragments []string
	}{
		{"a bad name", &apiv1.CreateJoinTokenRequest{Cluster: "West_1"}, "cluster", []string{`cluster name "West_1"`}},
		{"a CIDR with host bits", &apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{"10.2.0.1/16"}}, "pod_cidrs", []string{`pod CIDR "10.2.0.1/16" has host bits set`}},
		{"a service CIDR that is no CIDR", &apiv1.CreateJoinTokenRequest{Cluster: "west", ServiceCidrs: []string{"x"}}, "service_cidrs", []string{`service CIDR "x"`}},
		{"pod CIDRs overlapping each other", &apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{"10.0.0.0/8", "10.1.0.0/16"}}, "pod_cidrs", []string{"given in the same request"}},
		{"a bad label value", &apiv1.CreateJoinTokenRequest{Cluster: "west", Labels: map[string]string{"env": "a b"}}, "labels", []string{`label "env": value "a b"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			_, err := ParseClusterRequest(tt.req)
			if e := wantErr[*InvalidError](t, err, tt.fragments...); e.Field != tt.field {
				t.Fatalf("field %q, want %q", e.Field, tt.field)
			}
		})
	}
	r, err := ParseClusterRequest(&apiv1.CreateJoinTokenRequest{Cluster: "west", PodCidrs: []string{"10.2.0.0/16,10.3.0.0/16"}})
	if err != nil || len(r.PodCIDRs) != 2 || r.Name != "west" {
		t.Fatalf("a comma list of CIDRs: %+v, %v", r, err)
	}
}

func TestTokenValidity(t *testing.T) {
	const def, max = 24 * time.Hour, 365 * 24 * time.Hour
	tests := []struct {
		name    string
		seconds int64
		want    time.Duration
		wantErr string
	}{
		{"zero takes the default", 0, def, ""},
		{"a minute is a minute", 60, time.Minute, ""},
		{"the maximum is allowed", int64(max / time.Second), max, ""},
		{"a negative validity is refused", -1, 0, "valid_for_seconds -1 is negative"},
		{"more than the maximum is refused", int64(max/time.Second) + 1, 0, "is more than the maximum 8760h0m0s"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := TokenValidity(tt.seconds, def, max)
			if tt.wantErr != "" {
				wantErr[*InvalidError](t, err, tt.wantErr)
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("got %v, %v; want %v", got, err, tt.want)
			}
		})
	}
}

func clusters(n int) []*apiv1.Cluster {
	var out []*apiv1.Cluster
	for i := 1; i <= n; i++ {
		out = append(out, &apiv1.Cluster{Name: fmt.Sprintf("c%d", i), Id: uint32(i), PodCidrs: []string{fmt.Sprintf("10.%d.0.0/16", i)}, Uid: fmt.Sprintf("uid-%d", i)})
	}
	return out
}

func TestAdmitCluster(t *testing.T) {
	east := &apiv1.Cluster{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}, Labels: map[string]string{"env": "prod"}, Uid: "uid-east"}
	west := &apiv1.Cluster{Name: "west", Id: 3, PodCidrs: []string{"10.3.0.0/16"}, Uid: "uid-west"}
	mesh := []*apiv1.Cluster{east, west}
	type check func(t *testing.T, c *apiv1.Cluster, created bool, err error)
	refused := func(field string, fragments ...string) check {
		return func(t *testing.T, c *apiv1.Cluster, created bool, err error) {
			t.Helper()
			switch field {
			case "overlap":
				wantErr[*OverlapError](t, err, fragments...)
			case "invalid":
				wantErr[*InvalidError](t, err, fragments...)
			default:
				if e := wantErr[*ConflictError](t, err, fragments...); e.Field != field || e.Name != "east" {
					t.Fatalf("conflict on %s/%s, want east/%s", e.Name, e.Field, field)
				}
			}
			if c != nil || created {
				t.Fatalf("a refusal returned cluster %v (created %v)", c, created)
			}
		}
	}
	tests := []struct {
		name     string
		req      *apiv1.CreateJoinTokenRequest
		existing []*apiv1.Cluster
		check    check
	}{
		{"a new cluster gets the lowest free ID, its CIDRs, labels, the time and the uid",
			&apiv1.CreateJoinTokenRequest{Cluster: "north", PodCidrs: []string{"10.2.0.0/16"}, ServiceCidrs: []string{"10.97.0.0/16"}, Labels: map[string]string{"a": "b"}}, mesh,
			func(t *testing.T, c *apiv1.Cluster, created bool, err error) {
				want := &apiv1.Cluster{Name: "north", Id: 2, PodCidrs: []string{"10.2.0.0/16"}, ServiceCidrs: []string{"10.97.0.0/16"}, Labels: map[string]string{"a": "b"}, Uid: "new-uid"}
				if err != nil || !created || c.JoinedAt.AsTime() != t0 {
					t.Fatalf("got %v created=%v err=%v", c, created, err)
				}
				c.JoinedAt = nil
				if !proto.Equal(c, want) {
					t.Fatalf("got %v, want %v", c, want)
				}
			}},
		{"the same cluster again with no CIDRs is the stored one",
			&apiv1.CreateJoinTokenRequest{Cluster: "east"}, mesh,
			func(t *testing.T, c *apiv1.Cluster, created bool, err error) {
				if err != nil || created || c != east {
					t.Fatalf("got %v created=%v err=%v, want east as stored", c, created, err)
				}
			}},
		{"the same cluster again with the same CIDRs in another order and a label it has is the stored one",
			&apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}, Labels: map[string]string{"env": "prod"}}, mesh,
			func(t *testing.T, c *apiv1.Cluster, created bool, err error) {
				if err != nil || created || c != east {
					t.Fatalf("got %v created=%v err=%v, want east as stored", c, created, err)
				}
			}},
		{"the same name with other pod CIDRs is a conflict",
			&apiv1.CreateJoinTokenRequest{Cluster: "east", PodCidrs: []string{"10.2.0.0/16"}}, mesh,
			refused("pod_cidrs", `cluster "east" already exists with pod CIDRs [10.1.0.0/16], not [10.2.0.0/16]`)},
		{"the same name with other service CIDRs is a conflict",
			&apiv1.CreateJoinTokenRequest{Cluster: "east", ServiceCidrs: []string{"10.97.0.0/16"}}, mesh,
			refused("service_cidrs", "service CIDRs [10.96.0.0/16], not [10.97.0.0/16]")},
		{"the same name with another label value is a conflict",
			&apiv1.CreateJoinTokenRequest{Cluster: "east", Labels: map[string]string{"env": "dev"}}, mesh,
			refused("labels", `label "env" is "prod", not "dev"`)},
		{"the same name with a label it lacks is a conflict",
			&apiv1.CreateJoinTokenRequest{Cluster: "east", Labels: map[string]string{"tier": "1"}}, mesh,
			refused("labels", `already exists without label "tier" (asked for "tier"="1")`)},
		{"a new cluster without pod CIDRs is invalid",
			&apiv1.CreateJoinTokenRequest{Cluster: "north"}, mesh,
			refused("invalid", `cluster "north" does not exist yet: its pod CIDRs are required to create it (--pod-cidr)`)},
		{"a pod CIDR overlapping another cluster's is refused naming both",
			&apiv1.CreateJoinTokenRequest{Cluster: "north", PodCidrs: []string{"10.1.128.0/17"}}, mesh,
			refused("overlap", `pod CIDR 10.1.128.0/17 of cluster "north" overlaps pod CIDR 10.1.0.0/16 of cluster "east"`)},
		{"a service CIDR overlapping another cluster's is refused",
			&apiv1.CreateJoinTokenRequest{Cluster: "north", PodCidrs: []string{"10.2.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/12"}}, mesh,
			refused("overlap", "service CIDR 10.96.0.0/12", "service CIDR 10.96.0.0/16")},
		{"the 256th cluster is refused: the mesh is full",
			&apiv1.CreateJoinTokenRequest{Cluster: "c256", PodCidrs: []string{"11.0.0.0/16"}}, clusters(255),
			func(t *testing.T, c *apiv1.Cluster, created bool, err error) {
				if !errors.Is(err, ErrMeshFull) || !strings.HasPrefix(err.Error(), `cannot add cluster "c256": mesh is full: `) {
					t.Fatalf("got %v, %v; want ErrMeshFull naming c256", c, err)
				}
			}},
		{"a cluster of a full mesh still gets tokens",
			&apiv1.CreateJoinTokenRequest{Cluster: "c7"}, clusters(255),
			func(t *testing.T, c *apiv1.Cluster, created bool, err error) {
				if err != nil || created || c.Id != 7 {
					t.Fatalf("got %v created=%v err=%v, want c7 as stored", c, created, err)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, created, err := AdmitCluster(mustParse(t, tt.req), tt.existing, t0, "new-uid")
			tt.check(t, c, created, err)
		})
	}
}

func TestLabelChanges(t *testing.T) {
	east := &apiv1.Cluster{Name: "east", Id: 1, Labels: map[string]string{"env": "prod", "tier": "1"}, Revision: 7}
	tests := []struct {
		name        string
		req         *apiv1.LabelClusterRequest
		c           *apiv1.Cluster
		wantLabels  map[string]string
		wantChanged bool
	}{
		{"setting a new label changes the cluster", &apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"zone": "a"}}, east,
			map[string]string{"env": "prod", "tier": "1", "zone": "a"}, true},
		{"removing a label changes the cluster", &apiv1.LabelClusterRequest{Name: "east", Remove: []string{"tier"}}, east,
			map[string]string{"env": "prod"}, true},
		{"setting a label to the value it has changes nothing", &apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"env": "prod"}}, east,
			map[string]string{"env": "prod", "tier": "1"}, false},
		{"removing a label it lacks changes nothing", &apiv1.LabelClusterRequest{Name: "east", Remove: []string{"nope"}}, east,
			map[string]string{"env": "prod", "tier": "1"}, false},
		{"removing nothing from no labels changes nothing", &apiv1.LabelClusterRequest{Name: "west"}, &apiv1.Cluster{Name: "west"},
			nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ch, err := ParseLabelChange(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			before := proto.Clone(tt.c)
			out, changed, err := Relabel(tt.c, ch)
			if err != nil || changed != tt.wantChanged || len(out.Labels) != len(tt.wantLabels) {
				t.Fatalf("got %v changed=%v err=%v; want labels %v changed=%v", out, changed, err, tt.wantLabels, tt.wantChanged)
			}
			for k, v := range tt.wantLabels {
				if out.Labels[k] != v {
					t.Fatalf("labels %v, want %v", out.Labels, tt.wantLabels)
				}
			}
			if !proto.Equal(tt.c, before) {
				t.Fatalf("Relabel modified the stored cluster: %v", tt.c)
			}
		})
	}
	refusals := []struct {
		name     string
		req      *apiv1.LabelClusterRequest
		field    string
		fragment string
	}{
		{"a bad key", &apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"bad key": "x"}}, "set", `label key "bad key"`},
		{"a bad key to remove", &apiv1.LabelClusterRequest{Name: "east", Remove: []string{"/x"}}, "remove", `label key "/x"`},
		{"a key both set and removed", &apiv1.LabelClusterRequest{Name: "east", Set: map[string]string{"a": "b"}, Remove: []string{"a"}}, "remove", `label "a" is both set and removed`},
		{"a bad cluster name", &apiv1.LabelClusterRequest{Name: "East"}, "name", `cluster name "East"`},
	}
	for _, tt := range refusals {
		t.Run(tt.name+" is refused", func(t *testing.T) {
			_, err := ParseLabelChange(tt.req)
			if e := wantErr[*InvalidError](t, err, tt.fragment); e.Field != tt.field {
				t.Fatalf("field %q, want %q", e.Field, tt.field)
			}
		})
	}
	t.Run("an absent cluster is not found", func(t *testing.T) {
		_, _, err := Relabel(nil, LabelChange{Name: "nope"})
		if e := wantErr[*NotFoundError](t, err, `cluster "nope" not found`); e.Kind != "cluster" || e.Names[0] != "nope" {
			t.Fatalf("not found %+v", e)
		}
	})
}

func TestRemovingAClusterWithdrawsItsEndpointsAndExportsOnly(t *testing.T) {
	eps := []*apiv1.Endpoint{{Cluster: "east", Node: "gw1"}, {Cluster: "west", Node: "gw1"}, {Cluster: "east", Node: "gw2"}}
	exports := []*apiv1.ServiceExport{
		{Cluster: "east", Node: "gw1", Namespace: "shop", Name: "web"},
		{Cluster: "west", Node: "gw1", Namespace: "shop", Name: "web"},
		{Cluster: "east", Node: "n7", Namespace: "shop", Name: "db"},
	}
	got, err := RemoveCluster("east", &apiv1.Cluster{Name: "east"}, eps, exports)
	if err != nil || len(got.Endpoints) != 2 || got.Endpoints[0].Node != "gw1" || got.Endpoints[1].Node != "gw2" || got.Endpoints[0].Cluster != "east" || got.Endpoints[1].Cluster != "east" {
		t.Fatalf("withdraw %v, %v; want east/gw1 and east/gw2", got.Endpoints, err)
	}
	if len(got.Exports) != 2 || got.Exports[0].Name != "web" || got.Exports[1].Name != "db" || got.Exports[1].Cluster != "east" {
		t.Fatalf("exports deleted %v; want east's web and db, not west's web", got.Exports)
	}
	_, err = RemoveCluster("nope", nil, eps, exports)
	wantErr[*NotFoundError](t, err, `cluster "nope" not found`)
}

func TestMeshRangeOverlapsNamesEveryClusterCIDRInTheRange(t *testing.T) {
	mesh := netip.MustParsePrefix("242.0.0.0/16")
	clusters := []*apiv1.Cluster{
		{Name: "east", PodCidrs: []string{"10.1.0.0/16", "242.0.1.0/24"}, ServiceCidrs: []string{"242.0.0.0/8"}},
		{Name: "west", PodCidrs: []string{"10.3.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}},
	}
	got := MeshRangeOverlaps(clusters, mesh)
	want := []MeshOverlap{{"east", netip.MustParsePrefix("242.0.1.0/24")}, {"east", netip.MustParsePrefix("242.0.0.0/8")}}
	if !slices.Equal(got, want) {
		t.Fatalf("overlaps %v, want %v", got, want)
	}
	if got := MeshRangeOverlaps(clusters[1:], mesh); len(got) != 0 {
		t.Fatalf("overlaps %v for clusters outside the range, want none", got)
	}
}
