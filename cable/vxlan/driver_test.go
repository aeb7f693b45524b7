package vxlan

import (
	"context"
	"errors"
	"testing"

	"github.com/cablemesh/cablemesh/cable"
)

func TestCallsBeforeInitOrAfterCloseAreNotInitialised(t *testing.T) {
	d, err := NewDriver(cable.LocalNode{Cluster: "a", Node: "gw", StateDir: t.TempDir(), AdvertiseAddress: addr("10.252.0.1")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	remote := cable.RemoteEndpoint{Cluster: "b", Node: "gw", Address: addr("10.252.0.2"), Port: 4789, Subnets: pfx("10.253.2.0/24")}
	for _, when := range []string{"before Init", "after Close"} {
		if when == "after Close" {
			// Init is not run here (it needs the host); Close must leave the driver unusable
			// whatever state it was in.
			d.initialised = true
			if err := d.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.Connect(ctx, remote, nil); !errors.Is(err, cable.ErrNotInitialised) {
			t.Errorf("Connect %s: %v, want ErrNotInitialised", when, err)
		}
		if err := d.Disconnect(ctx, "b"); !errors.Is(err, cable.ErrNotInitialised) {
			t.Errorf("Disconnect %s: %v, want ErrNotInitialised", when, err)
		}
		if _, err := d.Connections(ctx); !errors.Is(err, cable.ErrNotInitialised) {
			t.Errorf("Connections %s: %v, want ErrNotInitialised", when, err)
		}
	}
	if st := d.Stats(); st.Total() != 0 {
		t.Errorf("calls on an uninitialised driver changed the host: %+v", st)
	}
}
