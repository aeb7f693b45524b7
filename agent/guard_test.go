package agent

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

// TestARemoteSubnetCoveringWhatTheNodeNeedsIsNotRouted: remote clusters'
// records carry, besides their pod CIDRs, a subnet that covers the broker's address (west), a
// remote gateway's address (north covers west's gateway) and this node's advertise address
// (south). The agent connects each pair with its other subnets only, and says in status why.
func TestARemoteSubnetCoveringWhatTheNodeNeedsIsNotRouted(t *testing.T) {
	b := newBroker(t) // listens on 127.0.0.1; west's gateway is 127.0.0.12, north's 127.0.0.13
	b.UpsertCluster(&apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16", "127.0.0.0/30"}})
	b.UpsertCluster(&apiv1.Cluster{Name: "north", Id: 3, PodCidrs: []string{"10.3.0.0/16"}, ServiceCidrs: []string{"127.0.0.12/32"}})
	b.UpsertCluster(&apiv1.Cluster{Name: "south", Id: 4, PodCidrs: []string{"10.4.0.0/16", "127.0.0.8/30"}})
	b.UpsertEndpoint(remoteEndpoint("south", "s1", "127.0.0.14", "U09VVEgta2V5"))
	cfg := testConfig(t, b, true) // advertiseAddress 127.0.0.11
	d := fakedriver.New()
	startAgent(t, cfg, d, nil)

	eventually(t, "connections to north, south and west", func() bool { return connectedClusters(d) == "north,south,west" })
	want := map[string]string{"west": "10.2.0.0/16", "north": "10.3.0.0/16", "south": "10.4.0.0/16"}
	for cluster, subnet := range want {
		r, _ := d.Has(cluster)
		if !slices.Equal(r.Subnets, []netip.Prefix{netip.MustParsePrefix(subnet)}) {
			t.Errorf("%s is connected with subnets %v, want only %s", cluster, r.Subnets, subnet)
		}
	}

	s, _ := getStatus(t, cfg.StatusSocket)
	why := map[string][]string{
		"west":  {"127.0.0.0/30", "broker", "127.0.0.1"},
		"north": {"127.0.0.12/32", "gateway", "127.0.0.12"},
		"south": {"127.0.0.8/30", "advertise", "127.0.0.11"},
	}
	for cluster, words := range why {
		c := connectionOf(s, cluster)
		if c.State != "connected" || !containsAll(c.Message, words...) {
			t.Errorf("status of %s: state %q, message %q; want connected, with a message naming %v", cluster, c.State, c.Message, words)
		}
		if !slices.ContainsFunc(s.Problems, func(p statusapi.Problem) bool { return p.Cluster == cluster && containsAll(p.Message, words...) }) {
			t.Errorf("status problems %+v lack one for %s naming %v", s.Problems, cluster, words)
		}
		t.Logf("%s: %s", cluster, c.Message)
	}
}

// TestARemoteSubnetCoveringTheUnderlayIsNotRouted (defect 2, the exact case, which the real
// broker refuses at cluster creation): a remote cluster's pod CIDR covers this node's underlay
// network, the network of the link of its advertise address. The broker is named by host name,
// resolved once at start.
func TestARemoteSubnetCoveringTheUnderlayIsNotRouted(t *testing.T) {
	b := newBroker(t)
	b.UpsertCluster(&apiv1.Cluster{Name: "west", Id: 2, PodCidrs: []string{"10.2.0.0/16", "10.250.0.0/16"}})
	b.UpsertCluster(&apiv1.Cluster{Name: "north", Id: 3, PodCidrs: []string{"10.3.0.0/16", "127.0.0.0/31"}})
	cfg := testConfig(t, b, true)
	_, port, _ := strings.Cut(b.Addr(), ":")
	cfg.Broker = "localhost:" + port
	var underlayOf, looked []string
	d := fakedriver.New()
	startAgentWith(t, cfg, d, func(o *Options) {
		o.Host.Underlay = func(a netip.Addr) (netip.Prefix, error) {
			underlayOf = append(underlayOf, a.String())
			return netip.MustParsePrefix("10.250.0.11/24"), nil
		}
		o.Host.LookupHost = func(_ context.Context, host string) ([]netip.Addr, error) {
			looked = append(looked, host)
			return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
		}
	})
	eventually(t, "connections to north and west", func() bool { return connectedClusters(d) == "north,west" })
	for cluster, subnet := range map[string]string{"west": "10.2.0.0/16", "north": "10.3.0.0/16"} {
		if r, _ := d.Has(cluster); !slices.Equal(r.Subnets, []netip.Prefix{netip.MustParsePrefix(subnet)}) {
			t.Errorf("%s is connected with subnets %v, want only %s", cluster, r.Subnets, subnet)
		}
	}
	if !slices.Equal(underlayOf, []string{"127.0.0.11"}) || !slices.Equal(looked, []string{"localhost"}) {
		t.Errorf("underlay looked up for %v, broker host names resolved: %v; want the advertise address and localhost, once each", underlayOf, looked)
	}
	s, _ := getStatus(t, cfg.StatusSocket)
	for cluster, words := range map[string][]string{
		"west":  {"10.250.0.0/16", "overlaps this node's underlay network 10.250.0.0/24"},
		"north": {"127.0.0.0/31", "broker's address 127.0.0.1 (localhost)"},
	} {
		if c := connectionOf(s, cluster); c.State != "connected" || !containsAll(c.Message, words...) {
			t.Errorf("status of %s: state %q, message %q; want connected, naming %v", cluster, c.State, c.Message, words)
		}
	}
}

// TestADriverConnectErrorIsThePairsStatus: a pair whose driver refuses to
// connect it is in state error with the driver's own words.
func TestADriverConnectErrorIsThePairsStatus(t *testing.T) {
	b := newBroker(t)
	cfg := testConfig(t, b, true)
	d := fakedriver.New()
	d.ConnectErr = errors.New(`wireguard option "mtu": 100000 is out of range (1280..65535)`)
	r := startAgent(t, cfg, d, nil)
	waitReady(t, r)
	eventually(t, "the broker state arrived", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return len(s.Connections) == 2
	})
	var c statusapi.Connection
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		s, _ := getStatus(t, cfg.StatusSocket)
		if c = connectionOf(s, "west"); c.State == "error" && strings.Contains(c.Message, `"mtu": 100000 is out of range`) {
			break
		}
	}
	if c.State != "error" || !strings.Contains(c.Message, `"mtu": 100000 is out of range`) {
		t.Errorf("west: state %q, message %q; want error with the driver's message", c.State, c.Message)
	}
	t.Logf("west: %s: %s", c.State, c.Message)
}

func connectionOf(s statusapi.Status, cluster string) statusapi.Connection {
	for _, c := range s.Connections {
		if c.Cluster == cluster {
			return c
		}
	}
	return statusapi.Connection{}
}

func containsAll(s string, subs ...string) bool {
	for _, x := range subs {
		if !strings.Contains(s, x) {
			return false
		}
	}
	return true
}
