package netns

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// TestARemoteSubnetOverlappingTheUnderlayIsNotRouted: west's
// service CIDR 172.31.0.128/25 lies inside the gateways' underlay network 172.31.0.0/24 without
// covering the broker's or any gateway's address (so the broker accepts it). East's agent refuses
// to route it over the cable: it says why in its log and status, keeps the broker reachable over
// the underlay, and still routes west's pod CIDR.
func TestARemoteSubnetOverlappingTheUnderlayIsNotRouted(t *testing.T) {
	const inUnderlay = "172.31.0.128/25"
	m := harness.New(t)
	east := m.AddCluster("east", "10.1.0.0/16")
	west := m.NewCluster("west", "10.2.0.0/16")
	r := m.JoinToken("west", "10.2.0.0/16", "--service-cidr", inUnderlay)
	if r.Err != nil {
		t.Fatalf("join token for west with service CIDR %s: %s", inUnderlay, r)
	}
	west.WriteToken(strings.TrimSpace(r.Stdout))
	west.WriteConfig("")
	east.StartAgent()
	west.StartAgent()
	m.WaitConnected(ConnectTimeout, east, west)

	t.Run("east routes west's pod CIDR and not the subnet inside its underlay", func(t *testing.T) {
		var routes []string
		err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			routes = m.AllRoutes(east.GwNS)
			has := func(dst string) bool {
				return slices.ContainsFunc(routes, func(l string) bool { return strings.HasPrefix(l, dst+" ") })
			}
			return has("10.2.0.0/16") && !has(inUnderlay), strings.Join(routes, "\n")
		})
		if err != nil {
			t.Errorf("east's routes: %v", err)
		}
		if ok, res := m.PingOK(east.PodNS, west.PodIP, 5); !ok {
			t.Errorf("ping east pod -> west pod: %d/%d: %s", res.Received, res.Transmitted, res.Output)
		}
		// An address of the underlay network outside every gateway still leaves over eth0.
		if r := harness.Run(m.Ctx, "ip", "-n", east.GwNS, "route", "get", "172.31.0.200"); r.Err != nil || !strings.Contains(r.Stdout, "dev eth0") {
			t.Errorf("route to 172.31.0.200 in east: %s", r)
		}
	})

	t.Run("east says why in its status and log", func(t *testing.T) {
		st, err := east.Status()
		if err != nil {
			t.Fatal(err)
		}
		c, ok := harness.Connection(st, "west")
		if !ok || c.State != "connected" || !containsAll(c.Message, inUnderlay, "underlay network 172.31.0.0/24") {
			t.Errorf("east's west connection: ok %v, state %q, message %q", ok, c.State, c.Message)
		}
		if slices.Contains(c.Subnets, inUnderlay) {
			t.Errorf("east's west connection routes %v", c.Subnets)
		}
		found := false
		for _, p := range st.Problems {
			found = found || (p.Cluster == "west" && strings.Contains(p.Message, inUnderlay))
		}
		if !found {
			t.Errorf("east's status problems %+v do not name %s", st.Problems, inUnderlay)
		}
		if l := lineWith(east.Agent.Log(), inUnderlay); !strings.Contains(l, "level=WARN") {
			t.Errorf("east's log has no warning naming %s (last line naming it: %q)", inUnderlay, l)
		} else {
			t.Logf("east's log: %s", l)
		}
		t.Logf("east's status:\n%s", east.StatusTable())
	})

	t.Run("the broker stays reachable: heartbeats go on and changes arrive", func(t *testing.T) {
		if ok, res := m.PingOK(east.GwNS, m.BrokerAddr, 3); !ok {
			t.Errorf("ping broker from east's gateway: %d/%d", res.Received, res.Transmitted)
		}
		changeReachesAgents(t, m, []*harness.Cluster{east, west}, "guard=checked")
		start := time.Now()
		err := harness.WaitFor(40*time.Second, time.Second, func() (bool, string) {
			st, err := east.Status()
			if err != nil {
				return false, err.Error()
			}
			ok := st.Broker.Connected && st.Broker.LastContact != nil && st.Broker.LastContact.After(start)
			return ok, fmt.Sprintf("connected=%v lastContact=%v error=%q", st.Broker.Connected, st.Broker.LastContact, st.Broker.Error)
		})
		if err != nil {
			t.Errorf("east's broker contact: %v", err)
		}
		if !netip.MustParsePrefix(inUnderlay).Overlaps(netip.MustParsePrefix(harness.UnderlayCIDR)) {
			t.Fatalf("the test's subnet %s is not inside the underlay %s", inUnderlay, harness.UnderlayCIDR)
		}
	})
}
