package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// The suite's checks of the quiet records (written without a revision or an event, or revisioned
// and touched quietly): join tokens, node certificates, mesh address claims.

// joinTokensAreQuietAndSurviveReopen: a join token record is written in a transaction like any
// resource, but bumps no revision and emits no event; it survives a reopen; deleting it is quiet
// too.
func joinTokensAreQuietAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	putCluster(t, s, "east", 1)
	rec := &apiv1.JoinTokenRecord{Nonce: "n1", Cluster: "east", ClusterUid: "u1", MaxNodes: 2, Nodes: []string{"gw1"}, Expires: timestamppb.New(time.Unix(2e9, 0))}
	c, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.PutJoinToken(rec) })
	if err != nil || c.Revision != 1 || len(c.Events) != 0 {
		t.Fatalf("put join token: commit %+v err %v; want revision 1 still and no event", c, err)
	}
	_, err = s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutJoinToken(&apiv1.JoinTokenRecord{Nonce: "n0", Cluster: "east"}); err != nil {
			return err
		}
		return errors.New("abort")
	})
	if err == nil {
		t.Fatal("aborted update succeeded")
	}
	check := func(s store.Store) {
		t.Helper()
		err := s.View(context.Background(), func(tx store.ReadTx) error {
			got, err := tx.JoinToken("n1")
			if err != nil || !proto.Equal(got, rec) {
				t.Errorf("join token n1 = %v, %v; want %v", got, err, rec)
			}
			if got, err := tx.JoinToken("n0"); got != nil || err != nil {
				t.Errorf("a token of an aborted transaction was stored: %v %v", got, err)
			}
			all, err := tx.JoinTokens()
			if err != nil || len(all) != 1 {
				t.Errorf("join tokens %v %v, want n1 only", all, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check(s)
	if reopen != nil {
		s = reopen()
		check(s)
	}
	c, err = s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteJoinToken("n1") })
	if err != nil || len(c.Events) != 0 {
		t.Fatalf("delete join token: %+v %v", c, err)
	}
	_ = s.View(context.Background(), func(tx store.ReadTx) error {
		if got, _ := tx.JoinToken("n1"); got != nil {
			t.Errorf("deleted join token is still there: %v", got)
		}
		return nil
	})
	if _, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.PutJoinToken(&apiv1.JoinTokenRecord{}) }); err == nil {
		t.Error("a join token without a nonce was stored")
	}
}

// nodeCertificatesAreRevisionedTouchedQuietlyAndSurviveReopen: a node certificate record is a
// resource with revisions and events (watchers learn of revocations from them); a touch rewrites it
// without either.
func nodeCertificatesAreRevisionedTouchedQuietlyAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	putCluster(t, s, "east", 1)
	w, err := s.Watch(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C() // nothing after revision 1 yet
	n := &apiv1.NodeCertificate{Cluster: "east", Node: "gw1", ClusterUid: "u1", Certificates: []*apiv1.IssuedCertificate{{Serial: "ab"}}}
	c, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.PutNodeCertificate(n) })
	if err != nil || c.Revision != 2 || len(c.Events) != 1 || c.Events[0].Kind != store.KindNodeCertificate || c.Events[0].Key != "east/gw1" ||
		c.Events[0].GetResource().GetNodeCertificate().GetRevision() != 2 {
		t.Fatalf("put node certificate: %+v %v", c, err)
	}
	if b := <-w.C(); b.Revision != 2 || keysOf(b.Events) != "nodecert:east/gw1" {
		t.Fatalf("watcher got %s at %d", keysOf(b.Events), b.Revision)
	}
	n.Certificates[0].Used = true
	c, err = s.Update(context.Background(), func(tx store.Tx) error { return tx.TouchNodeCertificate(n) })
	if err != nil || c.Revision != 2 || len(c.Events) != 0 {
		t.Fatalf("touch node certificate: %+v %v; want no revision and no event", c, err)
	}
	if _, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.TouchNodeCertificate(&apiv1.NodeCertificate{Cluster: "east", Node: "nope"})
	}); err == nil {
		t.Error("touching an absent node certificate succeeded")
	}
	if reopen != nil {
		s = reopen()
	}
	err = s.View(context.Background(), func(tx store.ReadTx) error {
		got, err := tx.NodeCertificate("east", "gw1")
		if err != nil || got == nil || got.Revision != 2 || !got.Certificates[0].Used {
			t.Errorf("node certificate %v %v: want revision 2, used", got, err)
		}
		all, err := tx.NodeCertificates()
		if err != nil || len(all) != 1 {
			t.Errorf("node certificates %v %v", all, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err = s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); keysOf(b.Events) != "cluster:east nodecert:east/gw1" {
		t.Fatalf("snapshot holds %s", keysOf(b.Events))
	}
	c, err = s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteNodeCertificate("east", "gw1") })
	if err != nil || len(c.Events) != 1 || c.Events[0].Type != apiv1.Event_DELETE {
		t.Fatalf("delete node certificate: %+v %v", c, err)
	}
}

// meshAddressClaimsAreQuietKeyedByAddressAndSurviveReopen: a mesh address claim is bookkeeping
// like a join token record (no revision, no event, in no watch), stored under its address, which
// must be an address's canonical text; claims are apart from join tokens (neither lists the
// other); they survive a reopen and an aborted transaction writes none.
func meshAddressClaimsAreQuietKeyedByAddressAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	putCluster(t, s, "east", 1)
	w, err := s.Watch(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C() // nothing after revision 1 yet
	claimed := timestamppb.New(time.Unix(2e9, 0))
	c1 := &apiv1.MeshAddressClaim{Address: "242.0.0.10", Cluster: "east", ClusterUid: "u1", Node: "gw1", Claimed: claimed}
	c2 := &apiv1.MeshAddressClaim{Address: "242.0.0.9", Cluster: "east", ClusterUid: "u1", Node: "gw2", Claimed: claimed}
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutMeshAddressClaim(c1); err != nil {
			return err
		}
		if err := tx.PutMeshAddressClaim(c2); err != nil {
			return err
		}
		return tx.PutJoinToken(&apiv1.JoinTokenRecord{Nonce: "n1", Cluster: "east"})
	})
	if err != nil || c.Revision != 1 || len(c.Events) != 0 {
		t.Fatalf("put mesh address claims: commit %+v err %v; want revision 1 still and no event", c, err)
	}
	_, err = s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutMeshAddressClaim(&apiv1.MeshAddressClaim{Address: "242.0.0.11", Cluster: "east", Node: "gw3"}); err != nil {
			return err
		}
		return errors.New("abort")
	})
	if err == nil {
		t.Fatal("aborted update succeeded")
	}
	// A quiet write wakes no watcher: the next batch is the cluster put below, nothing before it.
	putCluster(t, s, "west", 2)
	if b := <-w.C(); b.Revision != 2 || keysOf(b.Events) != "cluster:west" {
		t.Fatalf("watcher got %s at %d; want only cluster:west at 2", keysOf(b.Events), b.Revision)
	}
	check := func(s store.Store) {
		t.Helper()
		err := s.View(context.Background(), func(tx store.ReadTx) error {
			if got, err := tx.MeshAddressClaim("242.0.0.10"); err != nil || !proto.Equal(got, c1) {
				t.Errorf("claim of 242.0.0.10 = %v, %v; want %v", got, err, c1)
			}
			if got, err := tx.MeshAddressClaim("242.0.0.11"); got != nil || err != nil {
				t.Errorf("a claim of an aborted transaction was stored: %v %v", got, err)
			}
			if got, err := tx.MeshAddressClaim("242.0.0.1"); got != nil || err != nil {
				t.Errorf("claim of an unclaimed address: %v %v; want nil, nil", got, err)
			}
			all, err := tx.MeshAddressClaims()
			var addrs []string
			for _, c := range all {
				addrs = append(addrs, c.Address)
			}
			// Key order is the text's byte order: .10 before .9.
			if err != nil || fmt.Sprint(addrs) != "[242.0.0.10 242.0.0.9]" {
				t.Errorf("claims %v %v; want [242.0.0.10 242.0.0.9]", addrs, err)
			}
			if toks, err := tx.JoinTokens(); err != nil || len(toks) != 1 || toks[0].Nonce != "n1" {
				t.Errorf("join tokens %v %v; want n1 only (claims are not tokens)", toks, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	check(s)
	if reopen != nil {
		s = reopen()
		check(s)
	}
	w, err = s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); keysOf(b.Events) != "cluster:east cluster:west" {
		t.Fatalf("snapshot holds %s; want the clusters only", keysOf(b.Events))
	}
	c, err = s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteMeshAddressClaim("242.0.0.10") })
	if err != nil || c.Revision != 2 || len(c.Events) != 0 {
		t.Fatalf("delete mesh address claim: %+v %v; want revision 2 still and no event", c, err)
	}
	// Deleting an absent claim is no error (as a delete of any absent key).
	if _, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteMeshAddressClaim("242.0.0.200") }); err != nil {
		t.Fatalf("delete an absent claim: %v", err)
	}
	_ = s.View(context.Background(), func(tx store.ReadTx) error {
		if got, _ := tx.MeshAddressClaim("242.0.0.10"); got != nil {
			t.Errorf("deleted claim is still there: %v", got)
		}
		if got, _ := tx.MeshAddressClaim("242.0.0.9"); got == nil {
			t.Error("deleting one claim deleted another")
		}
		return nil
	})
	for _, bad := range []struct{ addr, want string }{
		{"", `address "" is not an IP address`},
		{"242.0.0.x", `address "242.0.0.x" is not an IP address`},
		{"2001:db8:0:0::1", `address "2001:db8:0:0::1" is not in canonical form`},
		{"2001:DB8::1", `address "2001:DB8::1" is not in canonical form (2001:db8::1)`},
		{"fe80::1%eth0", `address "fe80::1%eth0" has a zone`},
	} {
		_, err := s.Update(context.Background(), func(tx store.Tx) error {
			return tx.PutMeshAddressClaim(&apiv1.MeshAddressClaim{Address: bad.addr, Cluster: "east", Node: "gw1"})
		})
		if err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("claim of %q: %v; want an error saying %s", bad.addr, err, bad.want)
		}
	}
}
