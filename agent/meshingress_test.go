package agent

import (
	"context"
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"sync"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/cablemesh/cablemesh/agent/ingress"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/reconcile"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// fakeIngress records what the agent applies; it never touches the host.
type fakeIngress struct {
	mu      sync.Mutex
	applied []ingress.Config
	links   []netip.Addr
	removed bool
}

func (f *fakeIngress) Apply(_ context.Context, cfg ingress.Config) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, cfg)
	return nil
}
func (f *fakeIngress) Status() ingress.Status        { return ingress.Status{Programmed: true} }
func (f *fakeIngress) Cleanup(context.Context) error { return nil }
func (f *fakeIngress) Close() error                  { return nil }
func (f *fakeIngress) Ensure(a netip.Addr) error {
	f.mu.Lock()
	f.links = append(f.links, a)
	f.mu.Unlock()
	return nil
}
func (f *fakeIngress) Remove() error { f.mu.Lock(); f.removed = true; f.mu.Unlock(); return nil }
func (f *fakeIngress) last() (ingress.Config, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.applied) == 0 {
		return ingress.Config{}, false
	}
	return f.applied[len(f.applied)-1], true
}

// fakeMeshIngress makes an agent's options use f for the data plane and the mesh link.
func fakeMeshIngress(o *Options, f *fakeIngress) {
	o.Host.OpenIngress = func(*slog.Logger) (ingress.Dataplane, error) { return f, nil }
	o.Host.MeshLink = f
}

func TestGatewayModeAgent(t *testing.T) {
	b := newBroker(t)
	b.UpsertCluster(&apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.1.0.0/16"}, GatewayMode: true})
	west := remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5")
	west.MeshAddress = "242.0.0.2"
	b.UpsertEndpoint(west)
	cfg := testConfig(t, b, true)
	d := fakedriver.New()
	f := &fakeIngress{}
	r := startAgentWith(t, cfg, d, func(o *Options) { fakeMeshIngress(o, f); o.CleanupOnExit = true })
	eventually(t, "the agent registered", func() bool { return b.Endpoint("east", cfg.Node) != nil })
	// The broker allocates the mesh address (the fake one is told to).
	own := proto.Clone(b.Endpoint("east", cfg.Node)).(*apiv1.Endpoint)
	own.MeshAddress = "242.0.0.1"
	b.UpsertEndpoint(own)

	eventually(t, "west is connected carrying only the mesh addresses", func() bool {
		for _, c := range d.Calls() {
			if c.Op == "connect" && c.Cluster == "west" && len(c.Remote.Subnets) == 1 && c.Remote.Subnets[0] == netip.MustParsePrefix("242.0.0.2/32") &&
				len(c.Remote.LocalSubnets) == 1 && c.Remote.LocalSubnets[0] == netip.MustParsePrefix("242.0.0.1/32") {
				return true
			}
		}
		return false
	})
	eventually(t, "the data plane SNATs to west's mesh address", func() bool {
		cfg, ok := f.last()
		return ok && cfg.MeshAddress == netip.MustParseAddr("242.0.0.1") && reflect.DeepEqual(cfg.RemoteMeshAddresses, []netip.Addr{netip.MustParseAddr("242.0.0.2")})
	})
	f.mu.Lock()
	links := slices.Clone(f.links)
	f.mu.Unlock()
	if len(links) == 0 || links[len(links)-1] != netip.MustParseAddr("242.0.0.1") {
		t.Errorf("mesh link holds %v, want 242.0.0.1", links)
	}
	st, _ := getStatus(t, cfg.StatusSocket)
	if st.MeshAddress != "242.0.0.1" {
		t.Errorf("status meshAddress = %q", st.MeshAddress)
	}
	if c, ok := connOf(st, "west"); !ok || c.Mode != reconcile.ModeGateway {
		t.Errorf("west = %+v, want mode gateway", c)
	}
	if c, ok := connOf(st, "north"); !ok || c.Mode != reconcile.ModeDirect || len(c.Subnets) != 1 || c.Subnets[0] != "10.3.0.0/16" {
		t.Errorf("north = %+v, want a direct pair with its pod CIDR", c)
	}
	if st.Ingress == nil || st.Ingress.Dataplane == nil || st.Ingress.Dataplane.MeshLink != ingress.MeshLinkName {
		t.Errorf("ingress = %+v, want the data plane with its mesh link", st.Ingress)
	}
	f.mu.Lock()
	f.removed = false // only the stop counts from here
	f.mu.Unlock()
	r.stop()
	f.mu.Lock()
	removed := f.removed
	f.mu.Unlock()
	if !removed {
		t.Error("--cleanup-on-exit left the mesh link")
	}
}
