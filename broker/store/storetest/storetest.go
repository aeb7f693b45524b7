// Package storetest is the conformance suite of store.Store: every implementation (Bolt, Memory,
// Etcd) runs Run, so they cannot drift apart in what the broker relies on:
// revisions, events, the resumable event log, watches and their slow-watcher disconnect,
// TouchEndpoint, and every resource kind (clusters, endpoints, policies, service exports, service
// VIPs, node certificates), the join token records and the mesh address claims.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// Open returns a new, empty store with opts, closed when t ends. reopen, nil for a store that
// does not persist (Memory), closes it and opens the same data again (also closed when t ends);
// the suite's durability checks run only where it is given.
type Open func(t *testing.T, opts store.Options) (s store.Store, reopen func() store.Store)

// Run runs the suite against the stores open returns.
func Run(t *testing.T, open Open) {
	tests := []struct {
		name string
		fn   func(*testing.T, Open)
	}{
		{"EveryChangeBumpsTheRevisionAndStampsTheResource", everyChangeBumpsTheRevisionAndStampsTheResource},
		{"TouchEndpointKeepsTheRevisionAndEmitsNothing", touchEndpointKeepsTheRevisionAndEmitsNothing},
		{"TouchingAnAbsentEndpointFails", touchingAnAbsentEndpointFails},
		{"StateSurvivesCloseAndReopen", stateSurvivesCloseAndReopen},
		{"WatchResumesFromTheLogOrFallsBackToASnapshot", watchResumesFromTheLogOrFallsBackToASnapshot},
		{"TheLogKeepsAtMostLogBytes", theLogKeepsAtMostLogBytes},
		{"WatchDeliversLaterCommitsInOrder", watchDeliversLaterCommitsInOrder},
		{"ASlowWatcherIsDroppedWithoutBlockingWriters", aSlowWatcherIsDroppedWithoutBlockingWriters},
		{"AWatcherThatLagsByWatchBufferBytesIsDropped", aWatcherThatLagsByWatchBufferBytesIsDropped},
		{"AWatchEndsWithItsContextAndWithTheStore", aWatchEndsWithItsContextAndWithTheStore},
		{"AClosedStoreRefusesWritesAndWatches", aClosedStoreRefusesWritesAndWatches},
		{"PoliciesAreRevisionedWatchedAndSurviveReopen", policiesAreRevisionedWatchedAndSurviveReopen},
		{"ServiceExportsAndVIPsAreRevisionedWatchedAndSurviveReopen", serviceExportsAndVIPsAreRevisionedWatchedAndSurviveReopen},
		{"AServiceExportOrVIPWithoutItsKeyIsRefused", aServiceExportOrVIPWithoutItsKeyIsRefused},
		{"AWatchThatOmitsResourcesGetsTheirEventsBare", aWatchThatOmitsResourcesGetsTheirEventsBare},
		{"APairPSKIsNeverStored", aPairPSKIsNeverStored},
		{"ReadsAreCopiesAndListsAreInKeyOrder", readsAreCopiesAndListsAreInKeyOrder},
		{"ConcurrentWritersAndWatchersSeeEveryRevisionOnceInOrder", concurrentWritersAndWatchersSeeEveryRevisionOnceInOrder},
		{"JoinTokensAreQuietAndSurviveReopen", joinTokensAreQuietAndSurviveReopen},
		{"NodeCertificatesAreRevisionedTouchedQuietlyAndSurviveReopen", nodeCertificatesAreRevisionedTouchedQuietlyAndSurviveReopen},
		{"MeshAddressClaimsAreQuietKeyedByAddressAndSurviveReopen", meshAddressClaimsAreQuietKeyedByAddressAndSurviveReopen},
		{"TheClustersDigestChangesWithTheClustersOnly", theClustersDigestChangesWithTheClustersOnly},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, open) })
	}
}

func putCluster(t *testing.T, s store.Store, name string, id uint32) store.Commit {
	t.Helper()
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.PutCluster(&apiv1.Cluster{Name: name, Id: id, PodCidrs: []string{fmt.Sprintf("10.%d.0.0/16", id)}})
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func state(t *testing.T, s store.Store) (uint64, []*apiv1.Cluster, []*apiv1.Endpoint) {
	t.Helper()
	var (
		rev uint64
		cs  []*apiv1.Cluster
		es  []*apiv1.Endpoint
	)
	err := s.View(context.Background(), func(tx store.ReadTx) error {
		var err error
		rev = tx.Revision()
		if cs, err = tx.Clusters(); err != nil {
			return err
		}
		es, err = tx.Endpoints()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return rev, cs, es
}

func everyChangeBumpsTheRevisionAndStampsTheResource(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	c1 := putCluster(t, s, "east", 1)
	c2, err := s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutCluster(&apiv1.Cluster{Name: "west", Id: 2}); err != nil {
			return err
		}
		return tx.PutEndpoint(&apiv1.Endpoint{Cluster: "west", Node: "gw1", PrivateIp: "10.0.0.1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	if c1.Revision != 1 || c2.Revision != 3 || len(c2.Events) != 2 || c2.Events[0].Revision != 2 || c2.Events[1].Revision != 3 {
		t.Fatalf("revisions: first commit %d, second %d with events %v; want 1, then 3 with events at 2 and 3", c1.Revision, c2.Revision, c2.Events)
	}
	rev, cs, es := state(t, s)
	if rev != 3 || cs[0].Revision != 1 || cs[1].Revision != 2 || es[0].Revision != 3 {
		t.Fatalf("stored revisions: store %d, clusters %d %d, endpoint %d; want 3, 1 2, 3", rev, cs[0].Revision, cs[1].Revision, es[0].Revision)
	}
	// Deleting something absent changes nothing; a failing transaction changes nothing.
	c3, err := s.Update(context.Background(), func(tx store.Tx) error { return tx.DeleteCluster("nope") })
	if err != nil || c3.Revision != 3 || len(c3.Events) != 0 {
		t.Fatalf("delete of an absent cluster: commit %+v err %v; want revision 3 and no events", c3, err)
	}
	boom := errors.New("boom")
	_, err = s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutCluster(&apiv1.Cluster{Name: "north", Id: 3}); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("failing transaction returned %v, want boom", err)
	}
	if rev, cs, _ := state(t, s); rev != 3 || len(cs) != 2 {
		t.Fatalf("after a failed transaction: revision %d with %d clusters, want 3 and 2", rev, len(cs))
	}
}

func touchEndpointKeepsTheRevisionAndEmitsNothing(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	_, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", PrivateIp: "10.0.0.1"})
	})
	if err != nil {
		t.Fatal(err)
	}
	w, err := s.Watch(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	<-w.C()
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.TouchEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", LastHeartbeat: timestamppb.Now(), PrivateIp: "ignored"})
	})
	if err != nil || c.Revision != 1 || len(c.Events) != 0 {
		t.Fatalf("touch: commit %+v, err %v; want revision 1, no events", c, err)
	}
	_, _, es := state(t, s)
	if es[0].LastHeartbeat == nil || es[0].PrivateIp != "10.0.0.1" || es[0].Revision != 1 {
		t.Fatalf("touched endpoint %v: want heartbeat set, private IP and revision unchanged", es[0])
	}
	select {
	case b := <-w.C():
		t.Fatalf("a touch reached a watcher: %v", b)
	case <-time.After(50 * time.Millisecond):
	}
}

func touchingAnAbsentEndpointFails(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	_, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.TouchEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", LastHeartbeat: timestamppb.Now()})
	})
	if err == nil {
		t.Fatal("touching an endpoint that was never put succeeded")
	}
	if _, _, es := state(t, s); len(es) != 0 {
		t.Fatalf("a failed touch stored %v", es)
	}
}

func stateSurvivesCloseAndReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	if reopen == nil {
		t.Skip("this store does not persist")
	}
	putCluster(t, s, "east", 1)
	putCluster(t, s, "west", 2)
	_, err := s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", PrivateIp: "10.0.0.1", CablePorts: map[string]uint32{"wireguard": 51820}}); err != nil {
			return err
		}
		return tx.DeleteCluster("west")
	})
	if err != nil {
		t.Fatal(err)
	}
	rev1, cs1, es1 := state(t, s)
	s2 := reopen()
	rev2, cs2, es2 := state(t, s2)
	if rev1 != rev2 || len(cs1) != len(cs2) || len(es1) != len(es2) {
		t.Fatalf("after reopen: revision %d, %d clusters, %d endpoints; before: %d, %d, %d", rev2, len(cs2), len(es2), rev1, len(cs1), len(es1))
	}
	for i := range cs1 {
		if !proto.Equal(cs1[i], cs2[i]) {
			t.Fatalf("cluster %d changed across reopen: %v vs %v", i, cs1[i], cs2[i])
		}
	}
	for i := range es1 {
		if !proto.Equal(es1[i], es2[i]) {
			t.Fatalf("endpoint %d changed across reopen: %v vs %v", i, es1[i], es2[i])
		}
	}
	// The event log survives too: a watcher resumes across the restart.
	w, err := s2.Watch(t.Context(), 1)
	if err != nil {
		t.Fatal(err)
	}
	b := <-w.C()
	if b.Snapshot || len(b.Events) != 3 || b.Revision != 4 {
		t.Fatalf("resume from 1 after reopen: snapshot=%v, %d events, revision %d; want 3 deltas to revision 4", b.Snapshot, len(b.Events), b.Revision)
	}
	// Revisions continue from where they were.
	if c := putCluster(t, s2, "north", 3); c.Revision != rev1+1 {
		t.Fatalf("first commit after reopen has revision %d, want %d", c.Revision, rev1+1)
	}
}

func aPairPSKIsNeverStored(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	_, err := s.Update(context.Background(), func(tx store.Tx) error {
		return tx.PutCluster(&apiv1.Cluster{Name: "east", Id: 1, PairPsk: []byte("secret")})
	})
	if err != nil {
		t.Fatal(err)
	}
	_, cs, _ := state(t, s)
	if len(cs) != 1 || cs[0].PairPsk != nil {
		t.Fatalf("stored cluster %v carries a PSK", cs)
	}
}

func readsAreCopiesAndListsAreInKeyOrder(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	in := &apiv1.Cluster{Name: "west", Id: 2, Labels: map[string]string{"env": "prod"}}
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutCluster(in); err != nil {
			return err
		}
		for _, n := range []string{"west/gw2", "east/gw1", "west/gw1"} {
			cl, node, _ := strings.Cut(n, "/")
			if err := tx.PutEndpoint(&apiv1.Endpoint{Cluster: cl, Node: node, PrivateIp: "10.0.0.1"}); err != nil {
				return err
			}
		}
		return tx.PutCluster(&apiv1.Cluster{Name: "east", Id: 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	// What the caller gave, what it read and what the commit reported are its own.
	in.Labels["env"] = "dev"
	c.Events[0].GetResource().GetCluster().Labels["env"] = "test"
	_, cs, es := state(t, s)
	cs[1].Labels["env"] = "staging"
	_, cs, _ = state(t, s)
	if in.Revision != 0 || cs[1].Name != "west" || cs[1].Labels["env"] != "prod" {
		t.Fatalf("stored west %v (given %v): want env=prod, and the caller's message not stamped", cs[1], in)
	}
	var names []string
	for _, c := range cs {
		names = append(names, c.Name)
	}
	for _, e := range es {
		names = append(names, store.EndpointKey(e.Cluster, e.Node))
	}
	if want := []string{"east", "west", "east/gw1", "west/gw1", "west/gw2"}; !slices.Equal(names, want) {
		t.Fatalf("listed %v, want %v", names, want)
	}
}

func theClustersDigestChangesWithTheClustersOnly(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	digest := func() uint64 {
		t.Helper()
		var d uint64
		if err := s.View(context.Background(), func(tx store.ReadTx) error {
			var err error
			d, err = tx.ClustersDigest()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return d
	}
	update := func(fn func(store.Tx) error) {
		t.Helper()
		if _, err := s.Update(context.Background(), fn); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[uint64]string{digest(): "no cluster"}
	changed := func(what string) {
		t.Helper()
		d := digest()
		if prev, ok := seen[d]; ok {
			t.Fatalf("after %s the clusters digest is the one of %s", what, prev)
		}
		seen[d] = what
	}
	putCluster(t, s, "east", 1)
	changed("east created")
	eastOnly := digest()
	putCluster(t, s, "west", 2)
	changed("west created")
	d := digest()
	update(func(tx store.Tx) error {
		return tx.PutEndpoint(&apiv1.Endpoint{Cluster: "east", Node: "gw1", PrivateIp: "192.0.2.1"})
	})
	update(func(tx store.Tx) error {
		return tx.PutPolicy(&apiv1.Policy{Name: "p"})
	})
	if digest() != d {
		t.Fatal("an endpoint and a policy changed the clusters digest")
	}
	update(func(tx store.Tx) error {
		return tx.PutCluster(&apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.9.0.0/16"}})
	})
	changed("west's pod CIDR changed")
	update(func(tx store.Tx) error { return tx.DeleteCluster("west") })
	if digest() != eastOnly {
		t.Fatal("with west removed the clusters digest is not the one of east alone")
	}
}
