package admission

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/pki"
)

func TestAdmitJoin(t *testing.T) {
	now := time.Unix(1e9, 0)
	claims := jointoken.Claims{Cluster: "east", ClusterUID: "u1", Nonce: "n1", Expires: now.Add(time.Hour)}
	issued := &apiv1.IssuedCertificate{Serial: "new", NotAfter: timestamppb.New(now.Add(time.Hour)), JoinToken: "n1"}
	cert := func(serial, token string, used bool, until time.Duration) *apiv1.IssuedCertificate {
		return &apiv1.IssuedCertificate{Serial: serial, JoinToken: token, Used: used, NotAfter: timestamppb.New(now.Add(until))}
	}
	rec := func(revoked bool, uid string, cs ...*apiv1.IssuedCertificate) *apiv1.NodeCertificate {
		return &apiv1.NodeCertificate{Cluster: "east", Node: "gw1", ClusterUid: uid, Revoked: revoked, Certificates: cs}
	}
	tok := func(max uint32, nodes ...string) *apiv1.JoinTokenRecord {
		return &apiv1.JoinTokenRecord{Nonce: "n1", Cluster: "east", ClusterUid: "u1", MaxNodes: max, Nodes: nodes}
	}
	var conflict *ConflictError
	var credential *CredentialError
	tests := []struct {
		name      string
		tok       *apiv1.JoinTokenRecord
		rec       *apiv1.NodeCertificate
		want      any // nil: admitted
		wantNodes []string
	}{
		{"a new node with a fresh token joins", tok(1), nil, nil, []string{"gw1"}},
		{"a token of an older broker serves one node", nil, nil, nil, []string{"gw1"}},
		{"a used token is refused for another node", tok(1, "gw9"), nil, &credential, nil},
		{"a token of 3 nodes takes a third", tok(3, "a", "b"), nil, nil, []string{"a", "b", "gw1"}},
		{"a node the token joined before joins again", tok(1, "gw1"), rec(true, "u1", cert("old", "n1", true, time.Hour)), nil, []string{"gw1"}},
		{"a node with a live certificate is refused", tok(5), rec(false, "u1", cert("old", "n0", true, time.Hour)), &conflict, nil},
		{"even with the token that joined it", tok(1, "gw1"), rec(false, "u1", cert("old", "n1", true, time.Hour)), &conflict, nil},
		{"an unused certificate of the same token is replaced (a lost answer)", tok(1, "gw1"), rec(false, "u1", cert("old", "n1", false, time.Hour)), nil, []string{"gw1"}},
		{"an unused certificate of another token is not", tok(2), rec(false, "u1", cert("old", "n0", false, time.Hour)), &conflict, nil},
		{"an expired certificate frees the name", tok(1), rec(false, "u1", cert("old", "n0", true, -time.Minute)), nil, []string{"gw1"}},
		{"a revoked node's name is free", tok(1), rec(true, "u1", cert("old", "n0", true, time.Hour)), nil, []string{"gw1"}},
		{"a record of an earlier cluster of the name does not count", tok(1), rec(false, "u0", cert("old", "n0", true, time.Hour)), nil, []string{"gw1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plan, err := AdmitJoin(claims, "gw1", tt.tok, tt.rec, issued, now)
			switch w := tt.want.(type) {
			case nil:
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if got := plan.Token.Nodes; len(got) != len(tt.wantNodes) || got[len(got)-1] != tt.wantNodes[len(tt.wantNodes)-1] {
					t.Fatalf("token nodes %v, want %v", got, tt.wantNodes)
				}
				if len(plan.Node.Certificates) != 1 || plan.Node.Certificates[0].Serial != "new" || plan.Node.Revoked {
					t.Fatalf("node record %v", plan.Node)
				}
			default:
				if err == nil || !errors.As(err, w) {
					t.Fatalf("got %v, want %T", err, w)
				}
			}
		})
	}
}

func TestAgentCertificateAndBinding(t *testing.T) {
	now := time.Unix(1e9, 0)
	id := pki.Identity{Cluster: "east", ClusterUID: "u1", Node: "gw1", Serial: "a1", NotAfter: now.Add(time.Hour)}
	rec := &apiv1.NodeCertificate{Cluster: "east", Node: "gw1", ClusterUid: "u1", Certificates: []*apiv1.IssuedCertificate{{Serial: "a2"}, {Serial: "a1", Used: true}}}

	if up, err := AgentCertificate(id, rec, "", now); err != nil || up != nil {
		t.Fatalf("a listed, used certificate: %v %v", up, err)
	}
	if up, err := AgentCertificate(pki.Identity{Cluster: "east", ClusterUID: "u1", Node: "gw1", Serial: "a2"}, rec, "", now); err != nil || up == nil || !up.Certificates[0].Used {
		t.Fatalf("the first use of a2: %v %v; want it marked", up, err)
	}
	if up, err := AgentCertificate(id, nil, "sha256:x", now); err != nil || up == nil || up.Certificates[0].Serial != "a1" {
		t.Fatalf("a certificate from before node records: %v %v; want it adopted", up, err)
	}
	var credential *CredentialError
	if _, err := AgentCertificate(pki.Identity{Cluster: "east", ClusterUID: "u1", Node: "gw1", Serial: "zz"}, rec, "", now); !errors.As(err, &credential) {
		t.Fatalf("an unlisted certificate: %v", err)
	}
	revoked := &apiv1.NodeCertificate{Cluster: "east", Node: "gw1", ClusterUid: "u1", Revoked: true, RevokedAt: timestamppb.New(now), Certificates: rec.Certificates}
	if _, err := AgentCertificate(id, revoked, "", now); !errors.As(err, &credential) {
		t.Fatalf("a revoked node: %v", err)
	}

	var forbidden *ForbiddenError
	for _, tt := range []struct {
		name  string
		bound string
		rec   *apiv1.NodeCertificate
		ok    bool
	}{
		{"the same certificate", "a1", rec, true},
		{"an unbound endpoint (registered before bindings)", "", rec, true},
		{"another good certificate of the node (a renewal)", "a2", rec, true},
		{"a certificate the node no longer has", "old", rec, false},
		{"a certificate of a revoked lineage", "a2", revoked, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckBinding(id, &apiv1.Endpoint{Cluster: "east", Node: "gw1", CertificateSerial: tt.bound}, tt.rec)
			if tt.ok != (err == nil) || (err != nil && !errors.As(err, &forbidden)) {
				t.Fatalf("got %v, want ok=%v (else *ForbiddenError)", err, tt.ok)
			}
		})
	}
}
