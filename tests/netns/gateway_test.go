package netns

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// Gateway mode, kernel ingress, end to end with the real binaries: clusters a and b share
// pod CIDR 10.40.0.0/16 and join in gateway mode; c (10.43.0.0/16) joins normally, and its pairs
// with a and b are in gateway mode too (either cluster's mode decides). Every cluster exports a
// service (TCP greeting + UDP echo, both naming the caller as the backend sees it). A pod calls
// the other clusters' services by their clusterset names: the eBPF load balancer sends it to the
// remote gateway's mesh address and ingress port, its gateway SNATs it to its own mesh address,
// the remote gateway DNATs it to the backend. The cable (WireGuard: its TUN shows the inner
// packets) carries only mesh addresses.

// gatewayExports is cluster name's exports block: service svc-<name> with a TCP and a UDP port,
// served by its pod.
func gatewayExports(name string, pod netip.Addr) string {
	return fmt.Sprintf(`exports:
- {name: svc-%s, namespace: demo, ports: [{name: hello, port: 80, protocol: TCP}, {name: echo, port: 9000, protocol: UDP}], endpoints: [{ip: %s}]}
`, name, pod)
}

// resolveVIP resolves svc-<name>.demo.svc.clusterset.local with from's agent DNS, from its pod.
func resolveVIP(t *testing.T, m *harness.Mesh, from *harness.Cluster, name string) netip.Addr {
	t.Helper()
	vip, err := resolveVIPAt(m, from.PodNS, from.DNSAddr(), name)
	if err != nil {
		t.Fatalf("%s: %v", from.Name, err)
	}
	return vip
}

// resolveVIPAt resolves svc-<name>.demo.svc.clusterset.local with the DNS server dns, from pod
// namespace podNS.
func resolveVIPAt(m *harness.Mesh, podNS string, dns netip.AddrPort, name string) (netip.Addr, error) {
	var vip netip.Addr
	q := fmt.Sprintf("svc-%s.demo.svc.clusterset.local", name)
	err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
		d := m.Dig(podNS, dns, q, "A")
		if a := d.Data("A"); d.Status == "NOERROR" && len(a) == 1 {
			vip = netip.MustParseAddr(a[0])
			return true, ""
		}
		return false, d.Raw
	})
	if err != nil {
		return vip, fmt.Errorf("resolve %s at %s: %w", q, dns, err)
	}
	return vip, nil
}

// waitGatewayBackends waits until from's agent holds a backend for cluster name's service in its
// maps at mesh (the remote gateway's mesh address), and never a pod IP.
func waitGatewayBackends(t *testing.T, from *harness.Cluster, name string, mesh netip.Addr) {
	t.Helper()
	if err := waitGatewayBackendsOf(from.Status, name, mesh); err != nil {
		t.Fatalf("%s: backends of svc-%s: %v\n%s", from.Name, name, err, from.StatusTable())
	}
}

// waitGatewayBackendsOf is waitGatewayBackends for the agent whose status document status reads
// (a gateway's or a worker's).
func waitGatewayBackendsOf(status func() (statusapi.Status, error), name string, mesh netip.Addr) error {
	return harness.WaitFor(40*time.Second, 250*time.Millisecond, func() (bool, string) {
		st, err := status()
		if err != nil {
			return false, err.Error()
		}
		imp, ok := importOf(st, "demo", "svc-"+name)
		if !ok {
			return false, "not imported yet"
		}
		for _, c := range imp.Clusters {
			if c.Cluster != name {
				continue
			}
			if len(c.Backends) != 2 {
				return false, fmt.Sprintf("%s: backends %v (want TCP and UDP), reason %q", c.Cluster, c.Backends, c.Reason)
			}
			for _, b := range c.Backends {
				if !strings.HasPrefix(b, mesh.String()+":") {
					return false, fmt.Sprintf("backend %s is not at %s's mesh address %s", b, name, mesh)
				}
			}
			return true, ""
		}
		return false, fmt.Sprintf("%+v", imp)
	})
}

func TestGatewayModeOverlappingPodCIDRs(t *testing.T) {
	start := time.Now()
	m := harness.New(t)
	a := m.AddGatewayModeCluster("a", "10.40.0.0/16", "")
	b := m.AddGatewayModeCluster("b", "10.40.0.0/16", "")
	c := m.AddLabelledCluster("c", "10.43.0.0/16", "", "")
	for _, x := range []*harness.Cluster{a, b, c} {
		x.WriteConfig(gatewayExports(x.Name, x.PodIP))
		x.StartAgent("--cleanup-on-exit")
		x.StartServer("hello", 80, "hello from "+x.Name+" to {peer}")
		x.StartServer("udpecho", 9000, "echo from "+x.Name+" to {peer}")
	}
	mesh := m.WaitMeshAddresses(40*time.Second, a, b, c)
	m.Logf("mesh addresses %v", mesh)
	if mesh["a"] == mesh["b"] || mesh["a"] == mesh["c"] || mesh["b"] == mesh["c"] {
		t.Fatalf("mesh addresses are not unique: %v", mesh)
	}
	m.WaitConnected(60*time.Second, a, b, c)

	t.Run("status shows both mesh addresses and gateway mode for every pair", func(t *testing.T) {
		r := harness.NSRun(m.Ctx, a.GwNS, m.Bin.Cablectl, "status", "--socket", a.StatusSocket, "-o", "json")
		if r.Err != nil {
			t.Fatalf("cablectl status: %s", r)
		}
		var st statusapi.Status
		if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
			t.Fatalf("decode status: %v", err)
		}
		if st.MeshAddress != mesh["a"].String() {
			t.Errorf("a's meshAddress = %q, want %s", st.MeshAddress, mesh["a"])
		}
		cb, ok := harness.Connection(st, "b")
		if !ok || cb.Mode != "gateway" || !slices.Equal(cb.Subnets, []string{mesh["b"].String() + "/32"}) {
			t.Errorf("a's connection to b = %+v, want mode gateway carrying only %s/32", cb, mesh["b"])
		}
		for _, d := range st.Decisions {
			if d.Mode != "gateway" {
				t.Errorf("decision %+v: want mode gateway", d)
			}
		}
		if dp := st.Ingress.Dataplane; dp == nil || !dp.Programmed || dp.RemoteMeshAddresses != 2 || dp.Ports != 2 || dp.Error != "" {
			t.Errorf("a's ingress data plane = %+v, want programmed, SNAT for b and c, 2 ports", dp)
		}
	})

	t.Run("health probes of a gateway-mode pair go between the two mesh addresses and are answered", func(t *testing.T) {
		err := harness.WaitFor(30*time.Second, 250*time.Millisecond, func() (bool, string) {
			st, err := a.Status()
			if err != nil {
				return false, err.Error()
			}
			cb, _ := harness.Connection(st, "b")
			h := cb.Health
			if h == nil || h.Source != mesh["a"].String() || h.Target != mesh["b"].String() {
				return false, fmt.Sprintf("health %+v, want probes %s -> %s", h, mesh["a"], mesh["b"])
			}
			return h.Healthy && h.ProbesSent > 0 && h.ProbesSent > h.ProbesFailed, fmt.Sprintf("health %+v", h)
		})
		if err != nil {
			t.Error(err)
		}
	})

	for _, x := range []*harness.Cluster{a, b, c} {
		for _, y := range []*harness.Cluster{a, b, c} {
			if x != y {
				waitGatewayBackends(t, x, y.Name, mesh[y.Name])
			}
		}
	}

	// Every call below crosses a's cable, or b's: the capture on a's WireGuard TUN sees the
	// inner packets of a-b and c-a.
	capture := m.StartCapture(a.GwNS, harness.WGInterface, 60*time.Second)
	calls := []struct{ from, to *harness.Cluster }{{a, b}, {b, a}, {c, a}}
	for _, call := range calls {
		t.Run(fmt.Sprintf("%s's pod calls %s's service over TCP and UDP and the backend sees %s's mesh address", call.from.Name, call.to.Name, call.from.Name), func(t *testing.T) {
			vip := resolveVIP(t, m, call.from, call.to.Name)
			wantTCP := fmt.Sprintf("hello from %s to %s", call.to.Name, mesh[call.from.Name])
			h, err := call.from.Ask(false, netip.AddrPortFrom(vip, 80), 3*time.Second)
			if err != nil || h.Reply != wantTCP {
				t.Errorf("TCP to %s:80: %+v, %v; want %q\n%s", vip, h, err, wantTCP, call.from.StatusTable())
			}
			wantUDP := fmt.Sprintf("echo from %s to %s", call.to.Name, mesh[call.from.Name])
			h, err = call.from.Ask(true, netip.AddrPortFrom(vip, 9000), 3*time.Second)
			if err != nil || h.Reply != wantUDP {
				t.Errorf("UDP to %s:9000: %+v, %v; want %q", vip, h, err, wantUDP)
			}
		})
	}

	t.Run("the capture on a's cable shows no address of the shared pod CIDR", func(t *testing.T) {
		rep, err := capture.Stop()
		if err != nil {
			t.Fatal(err)
		}
		m.Logf("capture on a's %s: %+v", harness.WGInterface, rep)
		if rep.IPv4 == 0 {
			t.Fatalf("the capture saw no IPv4 packet: the calls did not cross the cable (%+v)", rep)
		}
		if leaked := rep.Within(netip.MustParsePrefix("10.40.0.0/16")); len(leaked) > 0 {
			t.Errorf("pod addresses of 10.40.0.0/16 on the cable: %v", leaked)
		}
		if leaked := rep.Within(netip.MustParsePrefix("10.43.0.0/16")); len(leaked) > 0 {
			t.Errorf("c's pod addresses on a's cable: %v", leaked)
		}
		for _, want := range []string{mesh["a"].String(), mesh["b"].String(), mesh["c"].String()} {
			if rep.Addrs[want] == 0 {
				t.Errorf("mesh address %s never seen on a's cable: %+v", want, rep.Addrs)
			}
		}
	})
	m.Logf("gateway-mode test body took %s", time.Since(start).Round(time.Millisecond))
}
