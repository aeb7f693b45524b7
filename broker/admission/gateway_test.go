package admission

import (
	"errors"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/pki"
)

func TestAdmitClusterInGatewayMode(t *testing.T) {
	gw := &apiv1.Cluster{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}, Uid: "u-east", GatewayMode: true}
	direct := &apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16"}, Uid: "u-west"}
	mesh := []*apiv1.Cluster{gw, direct}
	admit := func(req *apiv1.CreateJoinTokenRequest) (*apiv1.Cluster, bool, error) {
		t.Helper()
		cr, err := ParseClusterRequest(req)
		if err != nil {
			t.Fatalf("parse: %v", err)
		}
		return AdmitCluster(cr, mesh, t0, "new")
	}
	t.Run("a gateway-mode cluster takes a gateway-mode cluster's pod and service CIDRs, and keeps the mode", func(t *testing.T) {
		c, created, err := admit(&apiv1.CreateJoinTokenRequest{Cluster: "north", PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.0.0/16"}, GatewayMode: true})
		if err != nil || !created || !c.GatewayMode || c.Id != 3 {
			t.Fatalf("got %v %v %v", c, created, err)
		}
	})
	t.Run("a direct cluster on a gateway-mode cluster's CIDR is refused with the hint", func(t *testing.T) {
		_, _, err := admit(&apiv1.CreateJoinTokenRequest{Cluster: "north", PodCidrs: []string{"10.1.0.0/16"}})
		wantErr[*OverlapError](t, err, `of cluster "north" overlaps pod CIDR 10.1.0.0/16 of cluster "east"`, `"north" is not`, "--gateway-mode")
	})
	t.Run("a gateway-mode cluster on a direct cluster's CIDR is refused naming the direct one", func(t *testing.T) {
		_, _, err := admit(&apiv1.CreateJoinTokenRequest{Cluster: "north", PodCidrs: []string{"10.2.0.0/16"}, GatewayMode: true})
		wantErr[*OverlapError](t, err, `overlaps pod CIDR 10.2.0.0/16 of cluster "west"`, `"west" is not`)
	})
	t.Run("a token for an existing cluster in the other mode is a conflict on gateway_mode", func(t *testing.T) {
		for _, tt := range []struct {
			req  *apiv1.CreateJoinTokenRequest
			want string
		}{
			{&apiv1.CreateJoinTokenRequest{Cluster: "east"}, `cluster "east" already exists in gateway mode, not direct mode`},
			{&apiv1.CreateJoinTokenRequest{Cluster: "west", GatewayMode: true}, `cluster "west" already exists in direct mode, not gateway mode`},
		} {
			_, _, err := admit(tt.req)
			if e := wantErr[*ConflictError](t, err, tt.want); e.Field != "gateway_mode" {
				t.Fatalf("conflict on %q, want gateway_mode", e.Field)
			}
		}
		if c, created, err := admit(&apiv1.CreateJoinTokenRequest{Cluster: "east", GatewayMode: true}); err != nil || created || c != gw {
			t.Fatalf("east in its own mode: %v %v %v", c, created, err)
		}
	})
}

func TestCheckMeshRange(t *testing.T) {
	r := netip.MustParsePrefix("242.0.0.0/16")
	for _, tt := range []struct {
		name       string
		pods, svcs []string
		want       string // "" = accepted
	}{
		{"CIDRs outside the range are accepted", []string{"10.1.0.0/16"}, []string{"10.96.0.0/12"}, ""},
		{"a pod CIDR inside it is refused", []string{"242.0.1.0/24"}, nil, `pod CIDR 242.0.1.0/24 of cluster "c" overlaps the mesh address range 242.0.0.0/16`},
		{"a service CIDR around it is refused", []string{"10.1.0.0/16"}, []string{"242.0.0.0/8"}, `service CIDR 242.0.0.0/8 of cluster "c" overlaps the mesh address range`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cr, err := ParseClusterRequest(&apiv1.CreateJoinTokenRequest{Cluster: "c", PodCidrs: tt.pods, ServiceCidrs: tt.svcs})
			if err != nil {
				t.Fatal(err)
			}
			err = CheckMeshRange(cr, r)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			wantErr[*InvalidError](t, err, tt.want, "--mesh-address-range")
		})
	}
}

func TestAssignEndpointMeshAddress(t *testing.T) {
	r := netip.MustParsePrefix("242.0.0.0/29") // .1 to .6
	id := pki.Identity{Cluster: "east", ClusterUID: "u1", Node: "gw1", Serial: "s1"}
	addr := netip.MustParseAddr
	rec := func(a string, revoked bool, uid string) *apiv1.NodeCertificate {
		return &apiv1.NodeCertificate{Cluster: "east", Node: "gw1", ClusterUid: uid, MeshAddress: a, Revoked: revoked}
	}
	now := time.Unix(1e9, 0)
	// Claims held by others: .1 by east/gw2, .2 by west/gw9.
	others := map[string]*apiv1.MeshAddressClaim{
		"242.0.0.1": MeshClaim(addr("242.0.0.1"), "east", "u1", "gw2", now),
		"242.0.0.2": MeshClaim(addr("242.0.0.2"), "west", "u2", "gw9", now),
	}
	mine := func(a string) map[string]*apiv1.MeshAddressClaim {
		return map[string]*apiv1.MeshAddressClaim{a: MeshClaim(addr(a), "east", "u1", "gw1", now)}
	}
	tests := []struct {
		name      string
		rec       *apiv1.NodeCertificate
		old       *apiv1.Endpoint
		claims    map[string]*apiv1.MeshAddressClaim // besides others
		hint      string
		sent      string
		want      string
		wantRec   bool     // the record is to be written with want
		wantClaim bool     // a claim of want is to be written
		release   []string // claims to delete
	}{
		{"a new node gets the first free address, not what it sent", rec("", false, "u1"), nil, nil, "", "242.0.0.5", "242.0.0.3", true, true, nil},
		{"the search starts at the hint", rec("", false, "u1"), nil, nil, "242.0.0.5", "", "242.0.0.5", true, true, nil},
		{"and wraps around past the range's end", rec("", false, "u1"), nil, map[string]*apiv1.MeshAddressClaim{
			"242.0.0.6": MeshClaim(addr("242.0.0.6"), "x", "u", "y", now)}, "242.0.0.6", "", "242.0.0.3", true, true, nil},
		{"a hint outside the range is ignored", rec("", false, "u1"), nil, nil, "10.0.0.1", "", "242.0.0.3", true, true, nil},
		{"a node keeps the address its record and claim hold", rec("242.0.0.4", false, "u1"), nil, mine("242.0.0.4"), "", "242.0.0.5", "242.0.0.4", false, false, nil},
		{"a record's address without a claim is claimed again", rec("242.0.0.4", false, "u1"), nil, nil, "", "", "242.0.0.4", false, true, nil},
		{"an endpoint of a node without a record keeps its address", nil, &apiv1.Endpoint{MeshAddress: "242.0.0.6"}, mine("242.0.0.6"), "", "", "242.0.0.6", false, false, nil},
		{"a stored endpoint's address moves into the record", rec("", false, "u1"), &apiv1.Endpoint{MeshAddress: "242.0.0.6"}, mine("242.0.0.6"), "", "", "242.0.0.6", true, false, nil},
		{"an address another node claims is not kept", rec("242.0.0.1", false, "u1"), nil, nil, "", "", "242.0.0.3", true, true, nil},
		{"an address outside the range is replaced, and its claim released", rec("10.0.0.1", false, "u1"), nil, mine("10.0.0.1"), "", "", "242.0.0.3", true, true,
			[]string{"10.0.0.1"}},
		{"a record of an earlier cluster of the name holds nothing, and is not written", rec("242.0.0.5", false, "u0"), nil, nil, "", "", "242.0.0.3", false, true, nil},
		{"a claim of an earlier cluster of the name is not the node's", rec("242.0.0.4", false, "u1"), nil, map[string]*apiv1.MeshAddressClaim{
			"242.0.0.4": MeshClaim(addr("242.0.0.4"), "east", "u0", "gw1", now)}, "", "", "242.0.0.3", true, true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := &apiv1.Endpoint{Cluster: "east", Node: "gw1", MeshAddress: tt.sent}
			var hint netip.Addr
			if tt.hint != "" {
				hint = addr(tt.hint)
			}
			got, err := AssignEndpointMeshAddress(id, e, tt.rec, tt.old, r, hint, func(a string) (*apiv1.MeshAddressClaim, error) {
				if c, ok := tt.claims[a]; ok {
					return c, nil
				}
				return others[a], nil
			}, now)
			if err != nil {
				t.Fatal(err)
			}
			if got.Address.String() != tt.want || e.MeshAddress != tt.want {
				t.Fatalf("address %s (endpoint %s), want %s", got.Address, e.MeshAddress, tt.want)
			}
			if (got.Node != nil) != tt.wantRec || (got.Node != nil && got.Node.MeshAddress != tt.want) {
				t.Fatalf("record to write %v, want one: %v", got.Node, tt.wantRec)
			}
			if (got.Claim != nil) != tt.wantClaim || (got.Claim != nil && !claimedBy(got.Claim, "east", "u1", "gw1")) ||
				(got.Claim != nil && (got.Claim.Address != tt.want || !got.Claim.Claimed.AsTime().Equal(now))) {
				t.Fatalf("claim to write %v, want one: %v", got.Claim, tt.wantClaim)
			}
			if fmt.Sprint(got.Release) != fmt.Sprint(tt.release) {
				t.Fatalf("release %v, want %v", got.Release, tt.release)
			}
			// Only an address found by searching moves the hint (a kept one may lie anywhere).
			kept := tt.rec != nil && tt.rec.MeshAddress == tt.want || tt.old != nil && tt.old.MeshAddress == tt.want
			if got.Searched == kept {
				t.Fatalf("searched %v for a kept address %v", got.Searched, kept)
			}
		})
	}
	t.Run("an exhausted range is refused naming it", func(t *testing.T) {
		_, err := AssignEndpointMeshAddress(id, &apiv1.Endpoint{Cluster: "east", Node: "gw1"}, nil, nil, r, netip.Addr{}, func(a string) (*apiv1.MeshAddressClaim, error) {
			return &apiv1.MeshAddressClaim{Address: a, Cluster: "west", Node: "x"}, nil
		}, now)
		if e := wantErr[*ExhaustedError](t, err, "node east/gw1", "mesh address range 242.0.0.0/29 is exhausted", "--mesh-address-range"); e.Resource != "mesh address" {
			t.Fatalf("resource %q", e.Resource)
		}
	})
	t.Run("a failed read is returned", func(t *testing.T) {
		boom := errors.New("boom")
		_, err := AssignEndpointMeshAddress(id, &apiv1.Endpoint{Cluster: "east", Node: "gw1"}, nil, nil, r, netip.Addr{}, func(string) (*apiv1.MeshAddressClaim, error) {
			return nil, boom
		}, now)
		if !errors.Is(err, boom) {
			t.Fatalf("got %v", err)
		}
	})
}

func TestPlanMeshAddresses(t *testing.T) {
	r := netip.MustParsePrefix("242.0.0.0/24")
	uids := map[string]string{"east": "u1", "west": "u2"}
	ep := func(c, n, a string) *apiv1.Endpoint { return &apiv1.Endpoint{Cluster: c, Node: n, MeshAddress: a} }
	nrec := func(c, n, a string) *apiv1.NodeCertificate {
		return &apiv1.NodeCertificate{Cluster: c, Node: n, ClusterUid: uids[c], MeshAddress: a}
	}
	now := time.Unix(1e9, 0)
	claim := func(a, c, n string) *apiv1.MeshAddressClaim {
		return MeshClaim(netip.MustParseAddr(a), c, uids[c], n, now)
	}
	plan, err := PlanMeshAddresses(r,
		[]*apiv1.Endpoint{ep("east", "gw1", "242.0.0.1"), ep("east", "gw2", ""), ep("west", "gw1", "10.9.0.1"), ep("west", "gw2", "242.0.0.1")},
		[]*apiv1.NodeCertificate{nrec("east", "gw1", "242.0.0.1"), nrec("east", "gw2", ""), nrec("east", "gw3", "242.0.0.7"), nrec("west", "gw1", "10.9.0.1"), nrec("west", "gw2", "")},
		[]*apiv1.MeshAddressClaim{claim("242.0.0.1", "east", "gw1"), claim("242.0.0.9", "east", "gone"), claim("10.9.0.1", "west", "gw1")},
		uids, now)
	if err != nil {
		t.Fatal(err)
	}
	var eps, nodes, claims []string
	for _, e := range plan.Endpoints {
		eps = append(eps, e.Cluster+"/"+e.Node+"="+e.MeshAddress)
	}
	for _, n := range plan.Nodes {
		nodes = append(nodes, n.Cluster+"/"+n.Node+"="+n.MeshAddress)
	}
	for _, c := range plan.Claims {
		claims = append(claims, c.Address+"@"+c.Cluster+"/"+c.Node)
	}
	// east/gw1 keeps .1 (its record's); east/gw3 (no endpoint) keeps .7; east/gw2, west/gw1 (out of
	// range) and west/gw2 (whose .1 is east/gw1's) get the lowest free: .2, .3, .4.
	for _, c := range []struct{ what, got, want string }{
		{"endpoints", fmt.Sprint(eps), "[east/gw2=242.0.0.2 west/gw1=242.0.0.3 west/gw2=242.0.0.4]"},
		{"records", fmt.Sprint(nodes), "[east/gw2=242.0.0.2 west/gw1=242.0.0.3 west/gw2=242.0.0.4]"},
		{"claims", fmt.Sprint(claims), "[242.0.0.2@east/gw2 242.0.0.7@east/gw3 242.0.0.3@west/gw1 242.0.0.4@west/gw2]"},
		{"released", fmt.Sprint(plan.Release), "[10.9.0.1 242.0.0.9]"},
	} {
		if c.got != c.want {
			t.Errorf("%s %s, want %s", c.what, c.got, c.want)
		}
	}
	t.Run("planning again over the planned state changes nothing", func(t *testing.T) {
		eps := []*apiv1.Endpoint{ep("east", "gw1", "242.0.0.1"), ep("east", "gw2", "")}
		recs := []*apiv1.NodeCertificate{nrec("east", "gw1", "242.0.0.1"), nrec("east", "gw2", "")}
		p1, err := PlanMeshAddresses(r, eps, recs, nil, uids, now)
		if err != nil {
			t.Fatal(err)
		}
		// Apply it: endpoints and records rewritten, claims stored.
		eps, recs = []*apiv1.Endpoint{eps[0], p1.Endpoints[0]}, []*apiv1.NodeCertificate{recs[0], p1.Nodes[0]}
		p2, err := PlanMeshAddresses(r, eps, recs, p1.Claims, uids, now)
		if err != nil || len(p2.Endpoints)+len(p2.Nodes)+len(p2.Claims)+len(p2.Release) != 0 {
			t.Fatalf("second plan %+v %v; want nothing to do", p2, err)
		}
	})
	t.Run("a range too small for every endpoint is refused naming it", func(t *testing.T) {
		_, err := PlanMeshAddresses(netip.MustParsePrefix("242.0.0.0/30"), []*apiv1.Endpoint{ep("east", "a", ""), ep("east", "b", ""), ep("east", "c", "")}, nil, nil, uids, now)
		wantErr[*ExhaustedError](t, err, "242.0.0.0/30 is exhausted")
	})
}

func TestTheMeshAddressSurvivesARejoinAndGoesWithARevocation(t *testing.T) {
	now := time.Unix(1e9, 0)
	claims := jointoken.Claims{Cluster: "east", ClusterUID: "u1", Nonce: "n2", Expires: now.Add(time.Hour)}
	issued := &apiv1.IssuedCertificate{Serial: "new", NotAfter: timestamppb.New(now.Add(time.Hour)), JoinToken: "n2"}
	expired := &apiv1.IssuedCertificate{Serial: "old", Used: true, NotAfter: timestamppb.New(now.Add(-time.Minute))}
	rec := &apiv1.NodeCertificate{Cluster: "east", Node: "gw1", ClusterUid: "u1", MeshAddress: "242.0.0.7", Certificates: []*apiv1.IssuedCertificate{expired}}
	plan, err := AdmitJoin(claims, "gw1", nil, rec, issued, now)
	if err != nil || plan.Node.MeshAddress != "242.0.0.7" {
		t.Fatalf("rejoin after expiry: %v %v; want the address kept", plan.Node, err)
	}
	c := &apiv1.Cluster{Name: "east", Uid: "u1"}
	rev, err := RevokeNode("east", "gw1", c, rec, nil, nil, now)
	if err != nil || rev.Node.MeshAddress != "" || !rev.Node.Revoked {
		t.Fatalf("revoke: %v %v; want the address released", rev.Node, err)
	}
	if rec.MeshAddress != "242.0.0.7" {
		t.Fatalf("RevokeNode changed the stored record it was given")
	}
	rev.Node.Certificates = nil
	plan, err = AdmitJoin(claims, "gw1", nil, rev.Node, issued, now)
	if err != nil || plan.Node.MeshAddress != "" {
		t.Fatalf("join after revocation: %v %v; want no address (a new one at registration)", plan.Node, err)
	}
	other := jointoken.Claims{Cluster: "east", ClusterUID: "u9", Nonce: "n3", Expires: now.Add(time.Hour)}
	if plan, err := AdmitJoin(other, "gw1", nil, rec, issued, now); err != nil || plan.Node.MeshAddress != "" {
		t.Fatalf("join into a new cluster of the name: %v %v; want no address", plan.Node, err)
	}
}
