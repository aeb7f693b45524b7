package netns

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// A worker (non-gateway node) of a gateway-mode cluster (issue 9): its pod calls a remote
// cluster's service by clusterset name; the worker's eBPF load balancer sends the call to the
// remote gateway's mesh address and ingress port, the worker routes that /32 via its own
// gateway (never the remote pod CIDR, which is its own cluster's too here), and its gateway
// SNATs the call to its mesh address, so the backend sees a's gateway's mesh address.

// workerAsk is Cluster.Ask for a worker's pod: tcpcheck ask (or udpask) from the worker's pod
// namespace inside the worker's cgroup, so that its connect goes through the worker's hooks.
func workerAsk(m *harness.Mesh, w *harness.Worker, udp bool, addr netip.AddrPort, timeout time.Duration) (harness.Hello, error) {
	mode := "ask"
	if udp {
		mode = "udpask"
	}
	procs := filepath.Join(m.HostCgroup(w.Node), "cgroup.procs")
	r := harness.RunTimeout(m.Ctx, timeout+10*time.Second, "sh", "-c", `echo $$ > "$0" && exec "$@"`, procs,
		"ip", "netns", "exec", w.PodNS, m.Bin.TCPCheck, mode, "-addr", addr.String(), "-timeout", timeout.String())
	var h harness.Hello
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &h); err != nil {
		return h, fmt.Errorf("%s: %w", r, err)
	}
	if h.Error != "" {
		return h, errors.New(h.Error)
	}
	return h, nil
}

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
	r := m.Cablectl("cluster", "join-token", a.Name, "--gateway-mode")
	if r.Err != nil {
		t.Fatalf("join token for a's worker: %s", r)
	}
	w.WriteToken(strings.TrimSpace(r.Stdout))
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
		q := "svc-b.demo.svc.clusterset.local"
		err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			d := m.Dig(w.PodNS, dns, q, "A")
			if a := d.Data("A"); d.Status == "NOERROR" && len(a) == 1 {
				vip = netip.MustParseAddr(a[0])
				return true, ""
			}
			return false, d.Raw
		})
		if err != nil {
			t.Fatalf("worker pod: resolve %s at %s: %v", q, dns, err)
		}
		err = harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			st, err := w.Status()
			if err != nil {
				return false, err.Error()
			}
			imp, ok := importOf(st, "demo", "svc-b")
			if !ok {
				return false, "not imported yet"
			}
			for _, c := range imp.Clusters {
				if c.Cluster != "b" {
					continue
				}
				if len(c.Backends) != 2 {
					return false, fmt.Sprintf("backends %v (want TCP and UDP), reason %q", c.Backends, c.Reason)
				}
				for _, be := range c.Backends {
					if !strings.HasPrefix(be, mesh["b"].String()+":") {
						return false, fmt.Sprintf("backend %s is not at b's mesh address %s", be, mesh["b"])
					}
				}
				return true, ""
			}
			return false, fmt.Sprintf("%+v", imp)
		})
		if err != nil {
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
			h, err = workerAsk(m, w, false, netip.AddrPortFrom(vip, 80), 3*time.Second)
			return err == nil && h.Reply == wantTCP, fmt.Sprintf("%+v, %v", h, err)
		})
		if err != nil {
			t.Errorf("TCP from the worker's pod to %s:80: %v; want %q", vip, err, wantTCP)
		}
		wantUDP := fmt.Sprintf("echo from b to %s", mesh["a"])
		h, err = workerAsk(m, w, true, netip.AddrPortFrom(vip, 9000), 3*time.Second)
		if err != nil || h.Reply != wantUDP {
			t.Errorf("UDP from the worker's pod to %s:9000: %+v, %v; want %q", vip, h, err, wantUDP)
		}
	})
	m.Logf("gateway-mode worker test body took %s", time.Since(start).Round(time.Millisecond))
}
