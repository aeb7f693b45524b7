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

// A worker (non-gateway node) of a gateway-mode cluster: its pod calls a remote
// cluster's service by clusterset name; the worker's eBPF load balancer sends the call to the
// remote gateway's mesh address and ingress port, the worker routes that /32 via its own
// gateway (never the remote pod CIDR, which is its own cluster's too here), and its gateway
// SNATs the call to its mesh address, so the backend sees a's gateway's mesh address.

func TestGatewayModeWorkerCallsThroughItsGateway(t *testing.T) {
	start := time.Now()
	m := harness.New(t)
	a := m.AddGatewayModeCluster("a", "10.40.0.0/16", "")
	b := m.AddGatewayModeCluster("b", "10.40.0.0/16", "")
	a.WriteConfig("")
	b.WriteConfig(gatewayExports(b.Name, b.PodIP))
	for _, x := range []*harness.Cluster{a, b} {
		x.StartAgent("--cleanup-on-exit")
	}
	b.StartServer("hello", 80, "hello from b to {peer}")
	b.StartServer("udpecho", 9000, "echo from b to {peer}")

	w := a.AddWorker("wk1", "10.40.5.0/24")
	w.RouteOnGateway() // what a's CNI would do: a's gateway reaches the worker's pods via the worker
	// A later token of a gateway-mode cluster says so too (the broker refuses a mode change).
	a.JoinAnother(w, "--gateway-mode")
	// The worker serves DNS to its pod on its pod link, as the gateway does.
	dns := netip.AddrPortFrom(w.NodePodIP, harness.DNSPort)
	w.WriteConfig(fmt.Sprintf("dns: {listen: %q}\n", dns.String()))
	w.StartAgent("--cleanup-on-exit")
	t.Cleanup(func() {
		if t.Failed() {
			for _, ns := range []string{w.NS, a.GwNS} {
				r := harness.Run(m.Ctx, "ip", "-n", ns, "route", "show", "table", "all")
				t.Logf("---- %s: ip route show table all\n%s%s", ns, r.Stdout, r.Stderr)
			}
			r := harness.Run(m.Ctx, m.Bin.Cablectl, "status", "--socket", w.StatusSocket)
			t.Logf("---- worker status\n%s%s", r.Stdout, r.Stderr)
		}
	})

	mesh := m.WaitMeshAddresses(40*time.Second, a, b)
	m.WaitConnected(60*time.Second, a, b)

	t.Run("the worker routes b's mesh address via a's gateway and nothing of the shared pod CIDR", func(t *testing.T) {
		want := harness.RouteEntry{Dst: mesh["b"].String(), Via: a.GwUnderlay.String(), Dev: "eth0"}
		routes := waitWorkerRoutes(t, m, w, 30*time.Second, want)
		if slices.ContainsFunc(routes, func(r harness.RouteEntry) bool { return strings.HasPrefix(r.Dst, "10.40.") }) {
			t.Errorf("worker routes %v cover the shared pod CIDR", routes)
		}
	})

	var vip netip.Addr
	t.Run("the worker's DNS answers b's service and its maps hold b's gateway ingress", func(t *testing.T) {
		var err error
		if vip, err = resolveVIPAt(m, w.PodNS, dns, "b"); err != nil {
			t.Fatalf("worker pod: %v", err)
		}
		if err := waitGatewayBackendsOf(w.Status, "b", mesh["b"]); err != nil {
			t.Fatalf("worker's backends of svc-b: %v", err)
		}
	})
	if !vip.IsValid() {
		t.FailNow()
	}

	t.Run("the worker's pod calls b's service over TCP and UDP and the backend sees a's mesh address", func(t *testing.T) {
		wantTCP := fmt.Sprintf("hello from b to %s", mesh["a"])
		var h harness.Hello
		// The first call may race the worker's maps settling after the import arrived.
		err := harness.WaitFor(15*time.Second, 500*time.Millisecond, func() (bool, string) {
			var err error
			h, err = w.Ask(false, netip.AddrPortFrom(vip, 80), 3*time.Second)
			return err == nil && h.Reply == wantTCP, fmt.Sprintf("%+v, %v", h, err)
		})
		if err != nil {
			t.Errorf("TCP from the worker's pod to %s:80: %v; want %q", vip, err, wantTCP)
		}
		wantUDP := fmt.Sprintf("echo from b to %s", mesh["a"])
		h, err = w.Ask(true, netip.AddrPortFrom(vip, 9000), 3*time.Second)
		if err != nil || h.Reply != wantUDP {
			t.Errorf("UDP from the worker's pod to %s:9000: %+v, %v; want %q", vip, h, err, wantUDP)
		}
	})
	m.Logf("gateway-mode worker test body took %s", time.Since(start).Round(time.Millisecond))
}
