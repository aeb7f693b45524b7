package agent

import (
	"errors"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/routes"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/cable"
)

// fakeMSS records what the agent asks of the MSS clamp.
type fakeMSS struct {
	mu      sync.Mutex
	ensured [][]string
	removed int
}

func (f *fakeMSS) Ensure(links []string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.ensured = append(f.ensured, slices.Clone(links))
	return nil
}

func (f *fakeMSS) Remove() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed++
	return nil
}

func (f *fakeMSS) calls() ([][]string, int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.ensured), f.removed
}

// recorder is a driver registered under its own name for these tests: it records what the
// agent built it with, so they can check the agent goes through the registry.
const recorderName = "agent-test-recorder"

var recorder struct {
	once     sync.Once
	mu       sync.Mutex
	node     cable.LocalNode
	settings cable.Settings
	built    *fakedriver.Driver
}

func registerRecorder() {
	recorder.once.Do(func() {
		cable.Register(cable.Registration{Name: recorderName, New: func(node cable.LocalNode, s cable.Settings) (cable.Driver, error) {
			recorder.mu.Lock()
			defer recorder.mu.Unlock()
			recorder.node, recorder.settings = node, maps.Clone(s)
			recorder.built = fakedriver.NewNamed(recorderName, 4242)
			recorder.built.LinkNames = []string{"rec0"}
			return recorder.built, nil
		}})
	})
}

func TestTheAgentBuildsItsDriversThroughTheRegistryWithTheirSettings(t *testing.T) {
	registerRecorder()
	b := newBroker(t)
	// The broker admits the subnets of east's CIDRs only: east has a service CIDR here.
	b.UpsertCluster(&apiv1.Cluster{Name: "east", Id: 1, PodCidrs: []string{"10.1.0.0/16"}, ServiceCidrs: []string{"10.96.1.0/24"}})
	cfg := testConfig(t, b, true)
	cfg.CableDrivers = []string{recorderName}
	cfg.ServiceCIDRs = []string{"10.96.1.0/24"}
	cfg.Drivers = map[string]cable.Settings{recorderName: {"colour": "blue"}, "vxlan": {"vni": "7"}}
	mss := &fakeMSS{}
	r := startAgentWith(t, cfg, nil, func(o *Options) {
		o.Host.NewDriver = nil // the default: cable.New
		o.Host.MSS = mss
	})
	select {
	case <-r.ready:
	case <-time.After(10 * time.Second):
		t.Fatal("agent not ready")
	}
	recorder.mu.Lock()
	node, settings, built := recorder.node, recorder.settings, recorder.built
	recorder.mu.Unlock()
	if node.Cluster != "east" || node.Node != "east-gw1" || node.StateDir != cfg.StateDir ||
		node.AdvertiseAddress != netip.MustParseAddr("127.0.0.11") ||
		!slices.Equal(node.LocalSubnets, []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("10.96.1.0/24")}) {
		t.Errorf("the driver was built for node %+v", node)
	}
	if node.Log == nil {
		t.Error("the driver was given no logger")
	}
	if !maps.Equal(settings, cable.Settings{"colour": "blue"}) {
		t.Errorf("the driver was built with settings %v, want its own block", settings)
	}
	eventually(t, "the endpoint publishes the recorder", func() bool {
		ep := b.Endpoint("east", "east-gw1")
		return ep != nil && ep.GetCablePorts()[recorderName] == 4242
	})
	if ensured, _ := mss.calls(); len(ensured) != 1 || !slices.Equal(ensured[0], []string{"rec0"}) {
		t.Errorf("MSS clamp ensured for %v, want once for the driver's link rec0", ensured)
	}
	r.stop()
	if ops := ops(built.Calls()); !slices.Equal(ops, []string{"init ", "close "}) {
		t.Errorf("driver calls = %q, want init then close", ops)
	}
}

func TestTheMSSClampCoversTheLinksOfTheRunningDrivers(t *testing.T) {
	b := multiBroker(t)
	cfg := testConfig(t, b, true)
	f := newFleet("wireguard", "vxlan", "ipsec")
	f["wireguard"].LinkNames = []string{"wg-east"}
	f["vxlan"].LinkNames = []string{"cbl-vx*"}
	f["ipsec"].LinkNames = []string{"ipsec0"}
	f["ipsec"].InitErr = errors.New("charon: no such file")
	mss := &fakeMSS{}
	r := startFleet(t, cfg, f, nil, func(o *Options) { o.Host.MSS = mss })
	ensured, removed := mss.calls()
	if len(ensured) != 1 || !slices.Equal(ensured[0], []string{"cbl-vx*", "wg-east"}) || removed != 0 {
		t.Errorf("MSS clamp: ensured %q, removed %d times; want once for [cbl-vx* wg-east] (ipsec does not run)", ensured, removed)
	}
	r.stop()
	if _, removed := mss.calls(); removed != 0 {
		t.Errorf("the clamp was removed at exit without cleanup-on-exit")
	}
}

func TestWhenRunEndsEveryDriverIsClosedAndCleanedUpOnlyWhenAsked(t *testing.T) {
	tests := []struct {
		name          string
		cleanup       bool
		wantCleanup   bool
		wantMSSRemove int
	}{
		{name: "without cleanup-on-exit the drivers are closed and the host is left as it is", cleanup: false},
		{name: "with cleanup-on-exit every driver is cleaned up, then closed, and the clamp removed", cleanup: true, wantCleanup: true, wantMSSRemove: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := multiBroker(t)
			cfg := testConfig(t, b, true)
			f := newFleet("wireguard", "ipsec")
			f["ipsec"].InitErr = errors.New("charon: no such file")
			mss := &fakeMSS{}
			r := startFleet(t, cfg, f, nil, func(o *Options) {
				o.Host.MSS = mss
				o.CleanupOnExit = tt.cleanup
			})
			eventually(t, "north and west connected", func() bool { return connectedClusters(f["wireguard"]) == "north,west" })
			r.stop()
			for name, d := range f {
				var got []string
				for _, c := range d.Calls() {
					if c.Op == "cleanup" || c.Op == "close" {
						got = append(got, c.Op)
					}
				}
				want := []string{"close"}
				if tt.wantCleanup {
					want = []string{"cleanup", "close"}
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: calls at exit %q, want %q", name, got, want)
				}
			}
			if _, removed := mss.calls(); removed != tt.wantMSSRemove {
				t.Errorf("MSS clamp removed %d times, want %d", removed, tt.wantMSSRemove)
			}
		})
	}
}

func TestANonGatewayRemovesItsRoutesAtExitOnlyWhenAsked(t *testing.T) {
	for _, cleanup := range []bool{false, true} {
		name := "without cleanup-on-exit its routes stay"
		if cleanup {
			name = "with cleanup-on-exit its routes are removed"
		}
		t.Run(name, func(t *testing.T) {
			b := newBroker(t)
			b.UpsertEndpoint(remoteEndpoint("east", "east-gw1", "127.0.0.11", "RUFTVC1rZXk="))
			cfg := testConfig(t, b, false)
			var mu sync.Mutex
			var applied [][]routes.Route
			mss := &fakeMSS{}
			r := startAgentWith(t, cfg, fakedriver.New(), func(o *Options) {
				o.CleanupOnExit = cleanup
				o.Host.MSS = mss
				o.Host.ApplyRoutes = func(rs []routes.Route) error {
					mu.Lock()
					defer mu.Unlock()
					applied = append(applied, rs)
					return nil
				}
			})
			eventually(t, "routes applied", func() bool {
				mu.Lock()
				defer mu.Unlock()
				return len(applied) > 0 && len(applied[len(applied)-1]) == 3
			})
			r.stop()
			mu.Lock()
			last := applied[len(applied)-1]
			mu.Unlock()
			if cleared := len(last) == 0; cleared != cleanup {
				t.Errorf("last routes applied = %v; cleanup-on-exit %v", last, cleanup)
			}
			if ensured, removed := mss.calls(); len(ensured) != 0 || removed != 0 {
				t.Errorf("a non-gateway touched the MSS clamp: ensured %v, removed %d", ensured, removed)
			}
		})
	}
}

func TestADriverThatCannotBeBuiltStopsTheAgentAndTheOthersAreClosed(t *testing.T) {
	b := multiBroker(t)
	cfg := testConfig(t, b, true)
	cfg.CableDrivers = []string{"wireguard", "vxlan"}
	wg := fakedriver.New()
	r := startAgentWith(t, cfg, wg, func(o *Options) {
		o.Host.NewDriver = func(name string, _ cable.LocalNode, _ cable.Settings) (cable.Driver, error) {
			if name == "vxlan" {
				return nil, errors.New("vxlan.vni: 0 is out of range")
			}
			return wg, nil
		}
	})
	var err error
	select {
	case err = <-r.done:
		r.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("agent kept running without its vxlan driver")
	}
	if err == nil || !strings.Contains(err.Error(), "build cable driver vxlan: vxlan.vni: 0") {
		t.Errorf("Run = %v", err)
	}
	if got := ops(wg.Calls()); !slices.Equal(got, []string{"close "}) {
		t.Errorf("wireguard calls = %q, want only close (built, never initialised)", got)
	}
}
