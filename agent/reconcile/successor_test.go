package reconcile

import (
	"context"
	"log/slog"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

// namedDriver is a driver that only has a name: Successor and Retire never call a driver.
type namedDriver struct {
	cable.Driver
	name string
}

func (d namedDriver) Name() string { return d.name }

func TestSuccessorKeepsOtherDriversPairsAndForgetsTheRebuiltOnes(t *testing.T) {
	wg, vx := namedDriver{name: "wireguard"}, namedDriver{name: "vxlan"}
	r := NewReconciler([]cable.Driver{wg, vx}, slog.New(slog.DiscardHandler))
	r.applied["z"] = Applied{Want: Want{Driver: "wireguard"}, Revision: 7}
	r.applied["y"] = Applied{Want: Want{Driver: "vxlan"}, Revision: 7}
	r.failed["w"] = Failure{Want: Want{Driver: "vxlan"}}

	vx2 := namedDriver{name: "vxlan"}
	next := r.Successor(map[string]cable.Driver{"vxlan": vx2})
	if a, ok := next.Applied()["z"]; !ok || a.Revision != 7 {
		t.Errorf("the wireguard pair was not carried over: %+v", next.Applied())
	}
	if _, ok := next.Applied()["y"]; ok {
		t.Error("the rebuilt vxlan driver's pair is still applied: the next pass would not reconnect it")
	}
	if len(next.Failures()) != 0 {
		t.Errorf("failures of the rebuilt driver carried over: %v", next.Failures())
	}
	if next.drivers["vxlan"] != cable.Driver(vx2) || next.drivers["wireguard"] != cable.Driver(wg) {
		t.Errorf("drivers %v", next.drivers)
	}
	gone := next.Successor(map[string]cable.Driver{"vxlan": nil})
	if _, ok := gone.drivers["vxlan"]; ok {
		t.Error("a removed driver is still in the reconciler")
	}

	r.Retire()
	// A retired reconciler plans and applies nothing (its drivers would panic if called).
	if actions, err := r.Reconcile(context.Background(), []Want{{Driver: "vxlan", Remote: cable.RemoteEndpoint{Cluster: "y"}}}, 8, nil); actions != nil || err != nil {
		t.Errorf("retired Reconcile = %v, %v", actions, err)
	}
}
