package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/broker/store"
)

// The suite's checks of the resource kinds beside clusters and endpoints: policies, service
// exports and service VIPs.

func policiesAreRevisionedWatchedAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	putCluster(t, s, "east", 1)
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.PutPolicy(&apiv1.Policy{Name: "default", Json: []byte(`{"a":1}`), IsDefault: true, StatusJson: []byte(`{"x":1}`)}); err != nil {
			return err
		}
		return tx.PutPolicy(&apiv1.Policy{Name: "on-prem", Json: []byte(`{"b":2}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Revision != 3 || len(c.Events) != 2 || c.Events[0].Kind != store.KindPolicy || c.Events[0].Key != "default" || c.Events[1].GetResource().GetPolicy().GetRevision() != 3 {
		t.Fatalf("commit %+v: want two policy events at 2 and 3, the second stamped 3", c)
	}
	var got []*apiv1.Policy
	err = s.View(context.Background(), func(tx store.ReadTx) error {
		var err error
		got, err = tx.Policies()
		return err
	})
	if err != nil || len(got) != 2 || got[0].Name != "default" || !got[0].IsDefault || got[0].Revision != 2 || got[0].StatusJson != nil {
		t.Fatalf("policies %v, %v: want default (is_default, revision 2, no stored status) then on-prem", got, err)
	}

	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); keysOf(b.Events) != "cluster:east policy:default policy:on-prem" {
		t.Fatalf("snapshot holds %s, want the cluster then both policies", keysOf(b.Events))
	}
	// Deleting an absent policy is no change; deleting a present one is an event with its last value.
	c, err = s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.DeletePolicy("nope"); err != nil {
			return err
		}
		return tx.DeletePolicy("on-prem")
	})
	if err != nil || c.Revision != 4 || len(c.Events) != 1 || c.Events[0].Type != apiv1.Event_DELETE || string(c.Events[0].GetResource().GetPolicy().GetJson()) != `{"b":2}` {
		t.Fatalf("delete: commit %+v err %v; want one DELETE of on-prem at 4 with its last value", c, err)
	}
	if b := <-w.C(); b.Revision != 4 || keysOf(b.Events) != "policy:on-prem" {
		t.Fatalf("watcher got %s at %d, want the on-prem delete at 4", keysOf(b.Events), b.Revision)
	}
	if reopen == nil {
		return // the rest is about durability
	}

	s2 := reopen()
	err = s2.View(context.Background(), func(tx store.ReadTx) error {
		p, err := tx.Policy("default")
		if err != nil || p == nil || string(p.Json) != `{"a":1}` || tx.Revision() != 4 {
			t.Errorf("after reopen: default %v err %v revision %d", p, err, tx.Revision())
		}
		if p, err := tx.Policy("on-prem"); p != nil || err != nil {
			t.Errorf("deleted policy came back: %v %v", p, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func serviceExportsAndVIPsAreRevisionedWatchedAndSurviveReopen(t *testing.T, open Open) {
	s, reopen := open(t, store.Options{})
	created := timestamppb.New(time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC))
	web := func(cluster, node string) *apiv1.ServiceExport {
		return &apiv1.ServiceExport{Cluster: cluster, Node: node, Namespace: "shop", Name: "web", Type: "ClusterSetIP",
			Ports:     []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
			Labels:    map[string]string{"cablemesh.io/exported": "true"},
			Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.1.0.5", Ready: true}}, Affinity: "local", Created: created}
	}
	c, err := s.Update(context.Background(), func(tx store.Tx) error {
		// Put out of key order: lists come back in key order.
		for _, e := range []*apiv1.ServiceExport{web("west", "gw1"), web("east", "gw2"), web("east", "gw1")} {
			if err := tx.PutServiceExport(e); err != nil {
				return err
			}
		}
		return tx.PutServiceVIP(&apiv1.ServiceVIP{Namespace: "shop", Name: "web", Vips: []string{"241.0.0.1"}, Allocated: created})
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Revision != 4 || keysOf(c.Events) != "serviceexport:west/gw1/shop/web serviceexport:east/gw2/shop/web serviceexport:east/gw1/shop/web servicevip:shop/web" ||
		c.Events[3].GetResource().GetServiceVip().GetRevision() != 4 || c.Events[0].GetResource().GetServiceExport().GetRevision() != 1 {
		t.Fatalf("commit at %d with %s: want three export events and a VIP event, stamped 1..4", c.Revision, keysOf(c.Events))
	}
	read := func(s store.Store) ([]*apiv1.ServiceExport, []*apiv1.ServiceVIP, uint64) {
		t.Helper()
		var (
			xs  []*apiv1.ServiceExport
			vs  []*apiv1.ServiceVIP
			rev uint64
		)
		err := s.View(context.Background(), func(tx store.ReadTx) error {
			var err error
			if xs, err = tx.ServiceExports(); err != nil {
				return err
			}
			vs, err = tx.ServiceVIPs()
			rev = tx.Revision()
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return xs, vs, rev
	}
	xs, vs, _ := read(s)
	var order []string
	for _, x := range xs {
		order = append(order, store.ServiceExportKey(x.Cluster, x.Node, x.Namespace, x.Name))
	}
	if want := []string{"east/gw1/shop/web", "east/gw2/shop/web", "west/gw1/shop/web"}; !slices.Equal(order, want) {
		t.Fatalf("exports listed %v, want %v", order, want)
	}
	if !proto.Equal(xs[2], func() *apiv1.ServiceExport { e := web("west", "gw1"); e.Revision = 1; return e }()) {
		t.Fatalf("stored export %v differs from what was put", xs[2])
	}
	if len(vs) != 1 || vs[0].Vips[0] != "241.0.0.1" || vs[0].Revision != 4 || !vs[0].Allocated.AsTime().Equal(created.AsTime()) {
		t.Fatalf("VIPs %v", vs)
	}
	err = s.View(context.Background(), func(tx store.ReadTx) error {
		x, err := tx.ServiceExport("east", "gw2", "shop", "web")
		if err != nil || x == nil || x.Revision != 2 {
			t.Errorf("ServiceExport(east, gw2, shop, web) = %v, %v", x, err)
		}
		if x, err := tx.ServiceExport("east", "gw3", "shop", "web"); x != nil || err != nil {
			t.Errorf("an absent export: %v, %v; want nil, nil", x, err)
		}
		if v, err := tx.ServiceVIP("shop", "db"); v != nil || err != nil {
			t.Errorf("an absent VIP: %v, %v; want nil, nil", v, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	w, err := s.Watch(t.Context(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if b := <-w.C(); keysOf(b.Events) != "serviceexport:east/gw1/shop/web serviceexport:east/gw2/shop/web serviceexport:west/gw1/shop/web servicevip:shop/web" {
		t.Fatalf("snapshot holds %s, want the three exports and the VIP", keysOf(b.Events))
	}
	// Deleting what is absent is no change; deleting what is present is an event with its last value.
	c, err = s.Update(context.Background(), func(tx store.Tx) error {
		if err := tx.DeleteServiceExport("north", "gw1", "shop", "web"); err != nil {
			return err
		}
		if err := tx.DeleteServiceVIP("shop", "db"); err != nil {
			return err
		}
		if err := tx.DeleteServiceExport("west", "gw1", "shop", "web"); err != nil {
			return err
		}
		return tx.DeleteServiceVIP("shop", "web")
	})
	if err != nil || c.Revision != 6 || keysOf(c.Events) != "serviceexport:west/gw1/shop/web servicevip:shop/web" ||
		c.Events[0].Type != apiv1.Event_DELETE || c.Events[0].GetResource().GetServiceExport().GetEndpoints()[0].GetIp() != "10.1.0.5" ||
		c.Events[1].GetResource().GetServiceVip().GetVips()[0] != "241.0.0.1" {
		t.Fatalf("deletes: commit %+v err %v; want two DELETEs at 5 and 6 with their last values", c, err)
	}
	if b := <-w.C(); b.Revision != 6 || keysOf(b.Events) != "serviceexport:west/gw1/shop/web servicevip:shop/web" {
		t.Fatalf("watcher got %s at %d, want both deletes at 6", keysOf(b.Events), b.Revision)
	}
	if reopen == nil {
		return
	}
	before, _, rev := read(s)
	s2 := reopen()
	after, vs2, rev2 := read(s2)
	if rev2 != rev || len(after) != len(before) || len(vs2) != 0 {
		t.Fatalf("after reopen: revision %d, %d exports, %d VIPs; before: %d, %d, 0", rev2, len(after), len(vs2), rev, len(before))
	}
	for i := range before {
		if !proto.Equal(before[i], after[i]) {
			t.Fatalf("export changed across reopen: %v vs %v", before[i], after[i])
		}
	}
}

func aServiceExportOrVIPWithoutItsKeyIsRefused(t *testing.T, open Open) {
	s, _ := open(t, store.Options{})
	for _, put := range []func(store.Tx) error{
		func(tx store.Tx) error {
			return tx.PutServiceExport(&apiv1.ServiceExport{Cluster: "east", Namespace: "shop", Name: "web"})
		},
		func(tx store.Tx) error {
			return tx.PutServiceExport(&apiv1.ServiceExport{Cluster: "east", Node: "gw1", Name: "web"})
		},
		func(tx store.Tx) error { return tx.PutServiceVIP(&apiv1.ServiceVIP{Namespace: "shop"}) },
	} {
		if _, err := s.Update(context.Background(), put); err == nil {
			t.Fatal("a record without its whole key was stored")
		}
	}
	var n int
	err := s.View(context.Background(), func(tx store.ReadTx) error {
		xs, err := tx.ServiceExports()
		vs, _ := tx.ServiceVIPs()
		n = len(xs) + len(vs)
		return err
	})
	if err != nil || n != 0 {
		t.Fatalf("after refused puts: %d records, %v", n, err)
	}
}
