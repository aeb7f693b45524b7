package admission

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/api/jointoken"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/pki"
)

func TestCheckJoin(t *testing.T) {
	key, otherKey := bytes.Repeat([]byte{1}, 32), bytes.Repeat([]byte{2}, 32)
	ca, otherCA := jointoken.CAHash([]byte("ca")), jointoken.CAHash([]byte("another ca"))
	sign := func(c jointoken.Claims, k []byte) string {
		t.Helper()
		tok, err := jointoken.Sign(c, k)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	claims := jointoken.Claims{Cluster: "east", ClusterUID: "uid-east", Expires: t0.Add(time.Hour), CAHash: ca, Nonce: "n"}
	good := sign(claims, key)
	expired := claims
	expired.Expires = t0.Add(-time.Second)
	foreign := claims
	foreign.CAHash = otherCA

	tests := []struct {
		name  string
		req   *apiv1.JoinRequest
		check func(t *testing.T, err error)
	}{
		{"garbage is not a token", &apiv1.JoinRequest{Token: "hello", Cluster: "east", Node: "gw1"},
			func(t *testing.T, err error) { wantErr[*InvalidError](t, err, "join token: malformed join token") }},
		{"an expired token is refused", &apiv1.JoinRequest{Token: sign(expired, key), Cluster: "east", Node: "gw1"},
			func(t *testing.T, err error) {
				wantErr[*CredentialError](t, err, "join token refused: join token has expired", `cluster "east"`)
			}},
		{"a forged token is refused", &apiv1.JoinRequest{Token: sign(claims, otherKey), Cluster: "east", Node: "gw1"},
			func(t *testing.T, err error) { wantErr[*CredentialError](t, err, "signature is invalid") }},
		{"a request without a cluster is invalid", &apiv1.JoinRequest{Token: good, Node: "gw1"},
			func(t *testing.T, err error) {
				wantErr[*InvalidError](t, err, `join request: cluster is empty (the token is for cluster "east")`)
			}},
		{"a token for another cluster is forbidden", &apiv1.JoinRequest{Token: good, Cluster: "west", Node: "gw1"},
			func(t *testing.T, err error) {
				wantErr[*ForbiddenError](t, err, `join token is for cluster "east", not "west"`)
			}},
		{"a token of another mesh CA is refused", &apiv1.JoinRequest{Token: sign(foreign, key), Cluster: "east", Node: "gw1"},
			func(t *testing.T, err error) {
				wantErr[*CredentialError](t, err, "join token names mesh CA "+otherCA+", but this broker's CA is "+ca)
			}},
		{"a bad node name is invalid", &apiv1.JoinRequest{Token: good, Cluster: "east", Node: "GW_1"},
			func(t *testing.T, err error) {
				if e := wantErr[*InvalidError](t, err, `"GW_1"`); e.Field != "node" {
					t.Fatalf("field %q, want node", e.Field)
				}
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := CheckJoin(tt.req, key, ca, t0)
			tt.check(t, err)
		})
	}
	got, err := CheckJoin(&apiv1.JoinRequest{Token: good, Cluster: "east", Node: "gw1"}, key, ca, t0)
	if err != nil || got.ClusterUID != "uid-east" {
		t.Fatalf("a good join: %+v %v", got, err)
	}
	if err := JoinCluster(got, &apiv1.Cluster{Name: "east", Uid: "uid-east"}); err != nil {
		t.Fatalf("the token's cluster as issued: %v", err)
	}
	for _, c := range []*apiv1.Cluster{nil, {Name: "east", Uid: "uid-2"}} {
		wantErr[*CredentialError](t, JoinCluster(got, c), `join token is for cluster "east" (uid uid-east), which was removed from the mesh after the token was issued; create a new token`)
	}
}

func TestAnAgentCredentialLivesAsLongAsItsCluster(t *testing.T) {
	id := pki.Identity{Cluster: "east", ClusterUID: "uid-east", Node: "gw1"}
	if err := AgentCluster(id, &apiv1.Cluster{Name: "east", Uid: "uid-east"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*apiv1.Cluster{nil, {Name: "east", Uid: "uid-2"}} {
		wantErr[*CredentialError](t, AgentCluster(id, c), `the certificate of agent east/gw1 belongs to cluster "east" (uid uid-east), which was removed from the mesh`)
	}

	upsert := func(name, uid string) *apiv1.Event {
		return &apiv1.Event{Type: apiv1.Event_UPSERT, Kind: "cluster", Key: name, Resource: &apiv1.Resource{Kind: &apiv1.Resource_Cluster{Cluster: &apiv1.Cluster{Name: name, Uid: uid}}}}
	}
	tests := []struct {
		name    string
		evs     []*apiv1.Event
		removed bool
	}{
		{"a change of its own cluster keeps the watch", []*apiv1.Event{upsert("east", "uid-east")}, false},
		{"another cluster's removal keeps the watch", []*apiv1.Event{{Type: apiv1.Event_DELETE, Kind: "cluster", Key: "west"}}, false},
		{"an endpoint named like the cluster keeps the watch", []*apiv1.Event{{Type: apiv1.Event_DELETE, Kind: "endpoint", Key: "east"}}, false},
		{"its cluster's removal ends it", []*apiv1.Event{upsert("west", "x"), {Type: apiv1.Event_DELETE, Kind: "cluster", Key: "east"}}, true},
		{"its cluster recreated under another UID ends it", []*apiv1.Event{upsert("east", "uid-2")}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := WatcherRemoved(id, tt.evs)
			if !tt.removed {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !strings.Contains(wantErr[*CredentialError](t, err).Error(), `cluster "east" was removed from the mesh`) {
				t.Fatalf("message %q", err)
			}
		})
	}
}
