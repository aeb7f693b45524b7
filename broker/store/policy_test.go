package store

import (
	"context"
	"path/filepath"
	"testing"

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func TestPoliciesAreRevisionedWatchedAndSurviveReopen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "b.db")
	s, err := OpenBolt(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	putCluster(t, s, "east", 1)
	c, err := s.Update(context.Background(), func(tx Tx) error {
		if err := tx.PutPolicy(&apiv1.Policy{Name: "default", Json: []byte(`{"a":1}`), IsDefault: true, StatusJson: []byte(`{"x":1}`)}); err != nil {
			return err
		}
		return tx.PutPolicy(&apiv1.Policy{Name: "on-prem", Json: []byte(`{"b":2}`)})
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.Revision != 3 || len(c.Events) != 2 || c.Events[0].Kind != KindPolicy || c.Events[0].Key != "default" || c.Events[1].GetResource().GetPolicy().GetRevision() != 3 {
		t.Fatalf("commit %+v: want two policy events at 2 and 3, the second stamped 3", c)
	}
	var got []*apiv1.Policy
	err = s.View(context.Background(), func(tx ReadTx) error {
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
	c, err = s.Update(context.Background(), func(tx Tx) error {
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
	s.Close()

	s2 := open(t, path, Options{})
	err = s2.View(context.Background(), func(tx ReadTx) error {
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

func TestAPairPSKIsNeverStored(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "b.db"), Options{})
	_, err := s.Update(context.Background(), func(tx Tx) error {
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

func keysOf(evs []*apiv1.Event) string {
	out := ""
	for i, e := range evs {
		if i > 0 {
			out += " "
		}
		out += e.Kind + ":" + e.Key
	}
	return out
}
