package cables

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/cable"
)

func TestTunnelLinks(t *testing.T) {
	named := func(name string, links ...string) cable.Driver {
		d := fakedriver.NewNamed(name, 1)
		d.LinkNames = append([]string{}, links...) // none, not the default
		return d
	}
	tests := []struct {
		name    string
		drivers []cable.Driver
		want    []string
	}{
		{"no drivers have no links", nil, nil},
		{"a driver's exact link is clamped by name", []cable.Driver{named("wireguard", "wg-east")}, []string{"wg-east"}},
		{"the links of every driver are merged and sorted", []cable.Driver{named("wireguard", "wg-east"), named("vxlan", "cbl-vx*"), named("ipsec", "ipsec0")},
			[]string{"cbl-vx*", "ipsec0", "wg-east"}},
		{"a link two drivers share is listed once", []cable.Driver{named("a", "cbl-x*", "t0"), named("b", "t0")}, []string{"cbl-x*", "t0"}},
		{"a driver without a link of its own adds none", []cable.Driver{named("ipsec"), named("wireguard", "cbl-wg0")}, []string{"cbl-wg0"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := TunnelLinks(tt.drivers); !slices.Equal(got, tt.want) {
				t.Errorf("TunnelLinks = %q, want %q", got, tt.want)
			}
		})
	}
}

// rendezvousDriver's Init returns only once every driver of its group has entered Init: one at
// a time, the first would wait out its deadline.
type rendezvousDriver struct {
	*fakedriver.Driver
	arrived *sync.WaitGroup
	err     error
}

func (d rendezvousDriver) Init(ctx context.Context) error {
	d.arrived.Done()
	all := make(chan struct{})
	go func() { d.arrived.Wait(); close(all) }()
	select {
	case <-all:
		return d.err
	case <-time.After(2 * time.Second):
		return errors.New("the other drivers never entered Init: initialised one at a time")
	}
}

func TestDriversInitialiseAtOnceAndKeepTheirErrorsInOrder(t *testing.T) {
	var arrived sync.WaitGroup
	arrived.Add(3)
	bad := errors.New("no charon")
	drivers := []cable.Driver{
		rendezvousDriver{Driver: fakedriver.NewNamed("wireguard", 51820), arrived: &arrived},
		rendezvousDriver{Driver: fakedriver.NewNamed("ipsec", 500), arrived: &arrived, err: bad},
		rendezvousDriver{Driver: fakedriver.NewNamed("vxlan", 4789), arrived: &arrived},
	}
	errs := initDrivers(context.Background(), drivers)
	if len(errs) != 3 || errs[0] != nil || !errors.Is(errs[1], bad) || errs[2] != nil {
		t.Fatalf("initDrivers = %v, want [nil %v nil]", errs, bad)
	}
}
