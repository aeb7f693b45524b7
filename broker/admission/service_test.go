package admission

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/pki"
	"github.com/cablemesh/cablemesh/mcs"
)

var (
	eastRec   = &apiv1.Cluster{Name: "east", Id: 1, Uid: "uid-east"}
	v4Range   = []netip.Prefix{netip.MustParsePrefix("241.0.0.0/29")}
	dualStack = []netip.Prefix{netip.MustParsePrefix("241.0.0.0/29"), netip.MustParsePrefix("fd00:241::/120")}
)

// exp is an export as an agent sends it: no cluster, node or created; defaults left to Normalize.
func exp(ns, name string, port uint32) *apiv1.ServiceExport {
	return &apiv1.ServiceExport{Namespace: ns, Name: name,
		Ports:     []*apiv1.ServicePort{{Name: "http", Port: port}},
		Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.5", Ready: true}}}
}

// stored is an export as the broker stored it for cluster/node at age (created t0 + age).
func stored(cluster, node, ns, name string, port uint32, age time.Duration, rev uint64) *apiv1.ServiceExport {
	e := exp(ns, name, port)
	e.Cluster, e.Node = cluster, node
	if err := mcs.Normalize("stored", e); err != nil {
		panic(err)
	}
	e.Created, e.Revision = timestamppb.New(t0.Add(age)), rev
	return e
}

func vip(ns, name string, addrs ...string) *apiv1.ServiceVIP {
	return &apiv1.ServiceVIP{Namespace: ns, Name: name, Vips: addrs, Allocated: timestamppb.New(t0)}
}

func keysOfExports(es []*apiv1.ServiceExport) string {
	var parts []string
	for _, e := range es {
		parts = append(parts, exportKey(e))
	}
	return strings.Join(parts, " ")
}

func TestPlanExports(t *testing.T) {
	now := t0.Add(time.Hour)
	tests := []struct {
		name                 string
		req                  []*apiv1.ServiceExport
		all                  []*apiv1.ServiceExport
		vips                 []*apiv1.ServiceVIP
		wantExports, wantPut string
		wantDelete           string
		wantAlloc, wantFree  string
		wantCreated          map[string]time.Time // export key -> created
		wantEmpty            bool
	}{
		{
			name:        "a first export is stored, created now, and its service gets the lowest VIP",
			req:         []*apiv1.ServiceExport{exp("shop", "web", 80)},
			wantExports: "east/gw1/shop/web", wantPut: "east/gw1/shop/web", wantAlloc: "shop/web=241.0.0.1",
			wantCreated: map[string]time.Time{"east/gw1/shop/web": now},
		},
		{
			name:        "the same exports again write nothing",
			req:         []*apiv1.ServiceExport{exp("shop", "web", 80)},
			all:         []*apiv1.ServiceExport{stored("east", "gw1", "shop", "web", 80, 0, 7)},
			vips:        []*apiv1.ServiceVIP{vip("shop", "web", "241.0.0.1")},
			wantExports: "east/gw1/shop/web", wantEmpty: true,
			wantCreated: map[string]time.Time{"east/gw1/shop/web": t0},
		},
		{
			name:        "a changed export keeps the time it was first exported",
			req:         []*apiv1.ServiceExport{exp("shop", "web", 8080)},
			all:         []*apiv1.ServiceExport{stored("east", "gw1", "shop", "web", 80, 0, 7)},
			vips:        []*apiv1.ServiceVIP{vip("shop", "web", "241.0.0.1")},
			wantExports: "east/gw1/shop/web", wantPut: "east/gw1/shop/web",
			wantCreated: map[string]time.Time{"east/gw1/shop/web": t0},
		},
		{
			name: "an export left out is deleted and the VIP of its service, exported by no one else, released",
			req:  []*apiv1.ServiceExport{exp("shop", "web", 80)},
			all: []*apiv1.ServiceExport{stored("east", "gw1", "shop", "web", 80, 0, 7), stored("east", "gw1", "shop", "db", 5432, 0, 8),
				stored("west", "gw1", "shop", "web", 80, 0, 9)},
			vips:        []*apiv1.ServiceVIP{vip("shop", "web", "241.0.0.1"), vip("shop", "db", "241.0.0.2")},
			wantExports: "east/gw1/shop/web", wantDelete: "east/gw1/shop/db", wantFree: "shop/db=241.0.0.2",
		},
		{
			name:       "a service another node still exports keeps its VIP",
			req:        nil,
			all:        []*apiv1.ServiceExport{stored("east", "gw1", "shop", "web", 80, 0, 7), stored("east", "gw2", "shop", "web", 80, 0, 8)},
			vips:       []*apiv1.ServiceVIP{vip("shop", "web", "241.0.0.1")},
			wantDelete: "east/gw1/shop/web",
		},
		{
			name:        "a service another cluster exported first shares its VIP",
			req:         []*apiv1.ServiceExport{exp("shop", "web", 80)},
			all:         []*apiv1.ServiceExport{stored("west", "gw1", "shop", "web", 80, 0, 7)},
			vips:        []*apiv1.ServiceVIP{vip("shop", "web", "241.0.0.3")},
			wantExports: "east/gw1/shop/web", wantPut: "east/gw1/shop/web",
		},
		{
			name:        "a freed address is the next service's: the lowest free one",
			req:         []*apiv1.ServiceExport{exp("shop", "api", 80)},
			all:         []*apiv1.ServiceExport{stored("west", "gw1", "shop", "db", 80, 0, 7)},
			vips:        []*apiv1.ServiceVIP{vip("shop", "db", "241.0.0.2")},
			wantExports: "east/gw1/shop/api", wantPut: "east/gw1/shop/api", wantAlloc: "shop/api=241.0.0.1",
		},
		{
			name:        "a VIP outside the configured range is kept, not renumbered",
			req:         []*apiv1.ServiceExport{exp("shop", "web", 80), exp("shop", "api", 80)},
			all:         []*apiv1.ServiceExport{stored("east", "gw1", "shop", "web", 80, 0, 7)},
			vips:        []*apiv1.ServiceVIP{vip("shop", "web", "10.255.0.1")},
			wantExports: "east/gw1/shop/api east/gw1/shop/web", wantPut: "east/gw1/shop/api", wantAlloc: "shop/api=241.0.0.1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := PlanExports(eastGW1, eastRec, tt.req, tt.all, tt.vips, v4Range, now)
			if err != nil {
				t.Fatal(err)
			}
			if got := keysOfExports(plan.Exports); got != tt.wantExports {
				t.Errorf("exports %q, want %q", got, tt.wantExports)
			}
			if got := keysOfExports(plan.Put); got != tt.wantPut {
				t.Errorf("put %q, want %q", got, tt.wantPut)
			}
			if got := keysOfExports(plan.Delete); got != tt.wantDelete {
				t.Errorf("delete %q, want %q", got, tt.wantDelete)
			}
			if got := vipList(plan.VIPs.Allocate); got != tt.wantAlloc {
				t.Errorf("allocate %q, want %q", got, tt.wantAlloc)
			}
			if got := vipList(plan.VIPs.Release); got != tt.wantFree {
				t.Errorf("release %q, want %q", got, tt.wantFree)
			}
			if plan.Empty() != tt.wantEmpty {
				t.Errorf("empty %v, want %v", plan.Empty(), tt.wantEmpty)
			}
			for _, e := range plan.Exports {
				if e.Cluster != "east" || e.Node != "gw1" || e.Labels[mcs.LabelExported] != "true" || e.Type != mcs.TypeClusterSetIP {
					t.Errorf("export %v is not east/gw1's, normalized", e)
				}
				if want, ok := tt.wantCreated[exportKey(e)]; ok && !e.Created.AsTime().Equal(want) {
					t.Errorf("%s created %v, want %v", exportKey(e), e.Created.AsTime(), want)
				}
			}
		})
	}
}

func TestPlanExportsRefusals(t *testing.T) {
	tests := []struct {
		name    string
		id      pki.Identity
		cluster *apiv1.Cluster
		req     []*apiv1.ServiceExport
		vips    []*apiv1.ServiceVIP
		check   func(*testing.T, error)
	}{
		{"an export for another cluster is forbidden, naming it", eastGW1, eastRec,
			[]*apiv1.ServiceExport{exp("shop", "web", 80), func() *apiv1.ServiceExport { e := exp("shop", "db", 80); e.Cluster = "west"; return e }()},
			nil, func(t *testing.T, err error) {
				f := wantErr[*ForbiddenError](t, err, "exports[1]", "agent east/gw1 may export only as its own cluster and node east/gw1, not as west/gw1")
				if f.Target != "west/gw1" {
					t.Errorf("target %q", f.Target)
				}
			}},
		{"an export for another node of the same cluster is forbidden", eastGW1, eastRec,
			[]*apiv1.ServiceExport{func() *apiv1.ServiceExport { e := exp("shop", "db", 80); e.Node = "gw2"; return e }()},
			nil, func(t *testing.T, err error) { wantErr[*ForbiddenError](t, err, "exports[0]", "not as east/gw2") }},
		{"an invalid export is refused with Normalize's message", eastGW1, eastRec,
			[]*apiv1.ServiceExport{exp("shop", "web", 80), exp("shop", "Web_1", 80)},
			nil, func(t *testing.T, err error) {
				i := wantErr[*InvalidError](t, err, `exports[1].name: name "Web_1" is not a DNS label`)
				if i.Field != "exports[1]" {
					t.Errorf("field %q", i.Field)
				}
			}},
		{"a service listed twice is refused", eastGW1, eastRec,
			[]*apiv1.ServiceExport{exp("shop", "web", 80), exp("shop", "web", 81)},
			nil, func(t *testing.T, err error) {
				wantErr[*InvalidError](t, err, "exports[1]: service shop/web is listed twice (also exports[0])")
			}},
		{"an empty export is refused", eastGW1, eastRec, []*apiv1.ServiceExport{nil},
			nil, func(t *testing.T, err error) { wantErr[*InvalidError](t, err, "exports[0]: is empty") }},
		{"a cluster removed since the certificate was issued is refused", eastGW1, nil,
			[]*apiv1.ServiceExport{exp("shop", "web", 80)},
			nil, func(t *testing.T, err error) { wantErr[*CredentialError](t, err, `cluster "east" was removed`) }},
		{"a cluster recreated since is refused", eastGW1, &apiv1.Cluster{Name: "east", Uid: "uid-2"},
			[]*apiv1.ServiceExport{exp("shop", "web", 80)},
			nil, func(t *testing.T, err error) { wantErr[*CredentialError](t, err, `cluster "east" was removed`) }},
		{"a full VIP range refuses the new service", eastGW1, eastRec,
			[]*apiv1.ServiceExport{exp("shop", "web", 80)},
			[]*apiv1.ServiceVIP{vip("a", "a", "241.0.0.1"), vip("a", "b", "241.0.0.2"), vip("a", "c", "241.0.0.3"), vip("a", "d", "241.0.0.4"),
				vip("a", "e", "241.0.0.5"), vip("a", "f", "241.0.0.6")},
			func(t *testing.T, err error) {
				wantErr[*ExhaustedError](t, err, "cannot allocate a VIP for service shop/web", "241.0.0.0/29 is exhausted")
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The VIP records' services are exported by west, so none is released.
			var all []*apiv1.ServiceExport
			for _, v := range tt.vips {
				all = append(all, stored("west", "gw1", v.Namespace, v.Name, 80, 0, 1))
			}
			_, err := PlanExports(tt.id, tt.cluster, tt.req, all, tt.vips, v4Range, t0)
			tt.check(t, err)
		})
	}
}

func TestPlanExportsDoesNotChangeTheRequest(t *testing.T) {
	req := []*apiv1.ServiceExport{exp("shop", "web", 80)}
	req[0].Created = timestamppb.New(t0.Add(-time.Hour)) // an agent's claim to be older does not count
	before := proto.Clone(req[0])
	plan, err := PlanExports(eastGW1, eastRec, req, nil, nil, v4Range, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(req[0], before) {
		t.Fatalf("the request changed: %v", req[0])
	}
	if !plan.Put[0].Created.AsTime().Equal(t0) {
		t.Fatalf("created %v: want the broker's time, not the request's", plan.Put[0].Created.AsTime())
	}
}

func TestAllocateVIPs(t *testing.T) {
	exports := []*apiv1.ServiceExport{stored("east", "gw1", "shop", "web", 80, 0, 1), stored("west", "gw1", "shop", "web", 80, 0, 2),
		stored("east", "gw1", "app", "api", 80, 0, 3), stored("east", "gw1", "shop", "db", 80, 0, 4)}
	tests := []struct {
		name   string
		vips   []*apiv1.ServiceVIP
		ranges []netip.Prefix
		want   string
	}{
		{"one address per service in key order, a service exported twice once", nil, v4Range,
			"app/api=241.0.0.1 shop/db=241.0.0.2 shop/web=241.0.0.3"},
		{"services with a VIP keep it; the others take the lowest free", []*apiv1.ServiceVIP{vip("shop", "web", "241.0.0.1")}, v4Range,
			"app/api=241.0.0.2 shop/db=241.0.0.3"},
		{"a dual-stack range gives one address of each family", []*apiv1.ServiceVIP{vip("shop", "web", "241.0.0.1", "fd00:241::1"), vip("shop", "db", "241.0.0.2", "fd00:241::2")}, dualStack,
			"app/api=241.0.0.3,fd00:241::3"},
		{"an IPv6 range configured since adds an IPv6 address to the services that have an IPv4 one", []*apiv1.ServiceVIP{vip("shop", "web", "241.0.0.1"), vip("shop", "db", "241.0.0.2"), vip("app", "api", "241.0.0.3")}, dualStack,
			"app/api=241.0.0.3,fd00:241::1 shop/db=241.0.0.2,fd00:241::2 shop/web=241.0.0.1,fd00:241::3"},
		{"an address of a stored record outside the range is not handed out again, and its family counts", []*apiv1.ServiceVIP{vip("shop", "web", "10.0.0.1"), vip("shop", "db", "241.0.0.1")}, v4Range,
			"app/api=241.0.0.2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := AllocateVIPs(exports, tt.vips, tt.ranges, t0)
			if err != nil {
				t.Fatal(err)
			}
			if vipList(got) != tt.want {
				t.Fatalf("allocated %q, want %q", vipList(got), tt.want)
			}
		})
	}
}

func TestReleaseVIPsAndOutOfRange(t *testing.T) {
	exports := []*apiv1.ServiceExport{stored("east", "gw1", "shop", "web", 80, 0, 1)}
	vips := []*apiv1.ServiceVIP{vip("shop", "web", "241.0.0.1"), vip("shop", "db", "241.0.0.2"), vip("app", "api", "10.0.0.9", "fd00::1")}
	if got := vipList(ReleaseVIPs(exports, vips)); got != "app/api=10.0.0.9,fd00::1 shop/db=241.0.0.2" {
		t.Fatalf("released %q, want app/api and shop/db, in key order", got)
	}
	if got := ReleaseVIPs(ExportsWithout(exports, "west"), vips[:1]); len(got) != 0 {
		t.Fatalf("removing another cluster released %v", got)
	}
	if got := ReleaseVIPs(ExportsWithout(exports, "east"), vips[:1]); vipList(got) != "shop/web=241.0.0.1" {
		t.Fatalf("removing the only exporting cluster released %q", vipList(got))
	}
	if got := fmt.Sprint(VIPsOutsideRanges(vips, v4Range)); got != "[app/api 10.0.0.9 app/api fd00::1]" {
		t.Fatalf("outside the ranges: %s", got)
	}
}

// vipList is VIP records as "namespace/name=vip,vip", space-separated.
func vipList(vs []*apiv1.ServiceVIP) string {
	parts := make([]string, len(vs))
	for i, v := range vs {
		parts[i] = mcs.Key(v.GetNamespace(), v.GetName()) + "=" + strings.Join(v.GetVips(), ",")
	}
	return strings.Join(parts, " ")
}
