package plan

import (
	"errors"
	"log/slog"
	"net/netip"
	"testing"

	"github.com/cablemesh/cablemesh/agent/brokerstate"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

type source struct {
	st     *brokerstate.State
	copies int
}

func (s *source) key() Key { return Key{State: s.st, Revision: s.st.Revision} }

func (s *source) snapshot() (Key, *brokerstate.State) {
	s.copies++
	return s.key(), s.st.Clone()
}

func TestOnePlanPerInputs(t *testing.T) {
	src := &source{st: brokerstate.New()}
	src.st.Revision = 7
	p := New(slog.New(slog.DiscardHandler))
	sub := p.Subscribe()
	in := Inputs{Cluster: "east", Node: "gw1", Drivers: reconcile.Drivers{"wireguard": nil}}
	first := p.Get(src.key(), in, src.snapshot)
	if again := p.Get(src.key(), in, src.snapshot); again != first || src.copies != 1 {
		t.Fatalf("unchanged inputs: got a new plan (same %v) after %d copies of the state, want the published one after 1", again == first, src.copies)
	}
	if first.Revision() != 7 || p.Current() != first {
		t.Fatalf("revision %d, current is first %v", first.Revision(), p.Current() == first)
	}
	select {
	case <-sub.C():
	default:
		t.Fatal("the first plan did not notify the subscriber")
	}
	in.Drivers = reconcile.Drivers{"wireguard": errors.New("no module")}
	if p.Get(src.key(), in, src.snapshot) == first {
		t.Fatal("a driver that stopped running did not make a new plan")
	}
	next := brokerstate.New()
	next.Revision = 8
	src.st = next
	if got := p.Get(src.key(), in, src.snapshot); got.Revision() != 8 || src.copies != 3 {
		t.Fatalf("new state: revision %d after %d copies, want 8 after 3", got.Revision(), src.copies)
	}
	select {
	case <-sub.C():
	default:
		t.Fatal("a new plan did not notify the subscriber")
	}
}

func TestStandInsFillWhatTheWatchHasNotBrought(t *testing.T) {
	st := brokerstate.New()
	st.Endpoints[brokerstate.EndpointKey("east", "gw1")] = &apiv1.Endpoint{Cluster: "east", Node: "gw1"}
	join := &apiv1.Cluster{Name: "east", Id: 1}
	k := Key{State: st, Join: join, Registered: netip.MustParseAddr("100.64.0.1")}
	p := New(slog.New(slog.DiscardHandler))
	got := p.Get(k, Inputs{Cluster: "east", StandInNode: "gw1"}, func() (Key, *brokerstate.State) { return k, st.Clone() })
	if got.State.Clusters["east"].GetId() != 1 {
		t.Error("the Join answer's cluster record does not stand in for the missing one")
	}
	if m := got.State.Endpoints[brokerstate.EndpointKey("east", "gw1")].GetMeshAddress(); m != "100.64.0.1" {
		t.Errorf("own endpoint's mesh address = %q, want the registration's 100.64.0.1", m)
	}
	if st.Endpoints[brokerstate.EndpointKey("east", "gw1")].GetMeshAddress() != "" || st.Clusters["east"] != nil {
		t.Error("the stand-ins changed the cache's state, not the plan's copy")
	}
}
