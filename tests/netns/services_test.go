package netns

import (
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// Cross-cluster services, end to end with the real binaries: three clusters, east and
// west export web (TCP, a greeting naming the cluster), echo (UDP, likewise) and db (headless);
// a pod of north calls them by name through its gateway agent's DNS and the eBPF load balancer
// of its cgroup. The pair north-east runs on the kernel VXLAN cable (by policy), so that an
// agent restart does not flap it: the property under test there is the datapath's.

// servicesExports is the exports block of cluster name (10.<n>.0.10 is its pod), web's port
// being webPort there (the same in every cluster: MCS merges ports by name and number).
func servicesExports(n, webPort int, name string) string {
	dbExtra := ""
	if name == "west" {
		dbExtra = fmt.Sprintf(", {ip: 10.%d.0.11, hostname: db-1, ready: false}", n)
	}
	return fmt.Sprintf(`cableDrivers: [wireguard, vxlan]
vxlan: {port: %d, vni: %d}
exports:
- {name: web, namespace: shop, ports: [{name: http, port: %d, protocol: TCP}], endpoints: [{ip: 10.%d.0.10}]}
- {name: echo, namespace: shop, ports: [{name: echo, port: 9000, protocol: UDP}], endpoints: [{ip: 10.%d.0.10}]}
- {name: db, namespace: shop, type: Headless, ports: [{name: pg, port: 5432, protocol: TCP}], endpoints: [{ip: 10.%d.0.10, hostname: db-0}%s]}
`, harness.VXLANPort, harness.VXLANVNI, webPort, n, n, n, dbExtra)
}

const vxlanPairPolicy = `kind: ClusterConnectionPolicy
metadata:
  name: north-east-vxlan
spec:
  clusterSelector:
    vxpair: "yes"
  topology: full-mesh
  connectionPolicy: connect
  cableDriver:
    name: vxlan
  priority: 5
`

const splitPolicy = `kind: ClusterConnectionPolicy
metadata:
  name: split-north-west
spec:
  clusterSelector:
    split: "yes"
  topology: full-mesh
  connectionPolicy: no-connect
  priority: 10
`

// importOf returns the import ns/name in st's services section.
func importOf(st statusapi.Status, ns, name string) (statusapi.ServiceImport, bool) {
	if st.Services == nil {
		return statusapi.ServiceImport{}, false
	}
	for _, imp := range st.Services.Imports {
		if imp.Namespace == ns && imp.Name == name {
			return imp, true
		}
	}
	return statusapi.ServiceImport{}, false
}

// waitImport waits until c's agent holds ns/name with a VIP (ClusterSetIP) and backends in its
// maps from exactly the clusters want (or, headless, imported from them), and returns it.
func waitImport(t *testing.T, m *harness.Mesh, c *harness.Cluster, ns, name string, want ...string) statusapi.ServiceImport {
	t.Helper()
	var imp statusapi.ServiceImport
	sort.Strings(want)
	err := harness.WaitFor(60*time.Second, 200*time.Millisecond, func() (bool, string) {
		st, err := c.Status()
		if err != nil {
			return false, err.Error()
		}
		var ok bool
		if imp, ok = importOf(st, ns, name); !ok {
			return false, fmt.Sprintf("%s/%s not imported; services %+v", ns, name, st.Services)
		}
		var got []string
		for _, ic := range imp.Clusters {
			if imp.Type == "Headless" || len(ic.Backends) > 0 {
				got = append(got, ic.Cluster)
			}
		}
		sort.Strings(got)
		ok = slices.Equal(got, want) && (imp.Type == "Headless" || len(imp.VIPs) > 0)
		return ok, fmt.Sprintf("%+v", imp)
	})
	if err != nil {
		t.Fatalf("%s: import %s/%s from %v: %v", c.Name, ns, name, want, err)
	}
	return imp
}

func TestServicesAcrossThreeClusters(t *testing.T) {
	m := harness.New(t)
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "vxpair=yes", servicesExports(1, 80, "east"))
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "", servicesExports(2, 80, "west"))
	north := m.AddLabelledCluster("north", "10.3.0.0/16", "vxpair=yes", "cableDrivers: [wireguard, vxlan]\n"+
		fmt.Sprintf("vxlan: {port: %d, vni: %d}\n", harness.VXLANPort, harness.VXLANVNI))
	m.Apply(m.PolicyFile("vxlan.yaml", vxlanPairPolicy))
	m.Apply(m.PolicyFile("split.yaml", splitPolicy)) // matches no cluster until the last subtest
	// north's agent leaves everything in place when it stops (the default), as a restarting
	// agent must; the mesh's teardown removes it all.
	east.StartAgent("--cleanup-on-exit")
	west.StartAgent("--cleanup-on-exit")
	north.StartAgent()
	east.StartServer("hello", 80, "web east")
	west.StartServer("hello", 80, "web west")
	east.StartServer("udpecho", 9000, "echo east")
	west.StartServer("udpecho", 9000, "echo west")
	east.StartTCPServer() // echo on :7000, the restart test's "api"
	m.WaitConnected(90*time.Second, east, west, north)

	web := waitImport(t, m, north, "shop", "web", "east", "west")
	vip := netip.MustParseAddr(web.VIPs[0])
	echo := waitImport(t, m, north, "shop", "echo", "east", "west")
	echoVIP := netip.MustParseAddr(echo.VIPs[0])
	waitImport(t, m, north, "shop", "db", "east", "west")
	m.Logf("web VIP %s, echo VIP %s\n%s", vip, echoVIP, north.StatusTable())

	t.Run("the broker lists the imports with their VIPs", func(t *testing.T) {
		r := m.Cablectl("service", "list", "-o", "json")
		if r.Err != nil || !strings.Contains(r.Stdout, `"vip": "`+vip.String()+`"`) || !strings.Contains(r.Stdout, `"name": "db"`) {
			t.Errorf("service list: %s", r)
		}
		r = m.Cablectl("service", "describe", "web", "-n", "shop", "--socket", north.StatusSocket, "-o", "json")
		if r.Err != nil || strings.Count(r.Stdout, `"inLocalMaps": true`) != 2 {
			t.Errorf("service describe --socket (both clusters' endpoints in north's maps): %s", r)
		}
	})

	t.Run("the agent's DNS answers every record of the MCS DNS specification", func(t *testing.T) {
		dns := north.DNSAddr()
		dig := func(name, qtype string) harness.DigResult { return m.Dig(north.PodNS, dns, name, qtype) }
		if d := dig("dns-version.clusterset.local", "TXT"); d.Status != "NOERROR" || !slices.Equal(d.Data("TXT"), []string{`"1.0.0"`}) {
			t.Errorf("dns-version TXT: %s", d.Raw)
		}
		if d := dig("web.shop.svc.clusterset.local", "A"); d.Status != "NOERROR" || !slices.Equal(d.Data("A"), []string{vip.String()}) {
			t.Errorf("A web: %s", d.Raw)
		}
		if d := dig("_http._tcp.web.shop.svc.clusterset.local", "SRV"); !slices.Equal(d.Data("SRV"), []string{"0 100 80 web.shop.svc.clusterset.local."}) {
			t.Errorf("SRV _http._tcp.web: %s", d.Raw)
		}
		if d := dig("web.shop.svc.clusterset.local", "SRV"); !slices.Equal(d.Data("SRV"), []string{"0 100 80 web.shop.svc.clusterset.local."}) {
			t.Errorf("SRV web (bare): %s", d.Raw)
		}
		d := dig("db.shop.svc.clusterset.local", "A")
		got := d.Data("A")
		sort.Strings(got)
		if d.Status != "NOERROR" || !slices.Equal(got, []string{"10.1.0.10", "10.2.0.10"}) {
			t.Errorf("A db (headless: one per ready endpoint, west's db-1 is not ready): %s", d.Raw)
		}
		if d := dig("db-0.east.db.shop.svc.clusterset.local", "A"); !slices.Equal(d.Data("A"), []string{"10.1.0.10"}) {
			t.Errorf("A db-0.east.db: %s", d.Raw)
		}
		if d := dig("db-1.west.db.shop.svc.clusterset.local", "A"); d.Status != "NXDOMAIN" || !d.HasSOA() {
			t.Errorf("A of a not-ready endpoint's name: %s", d.Raw)
		}
		if d := dig("_pg._tcp.db.shop.svc.clusterset.local", "SRV"); len(d.Data("SRV")) != 2 {
			t.Errorf("SRV _pg._tcp.db (one per ready endpoint): %s", d.Raw)
		}
		for _, q := range []struct{ name, qtype, why string }{
			{"web.shop.svc.clusterset.local", "AAAA", "an AAAA query for an IPv4-only service"},
			{"web.shop.svc.clusterset.local", "TXT", "a TXT query on a service"},
			{"shop.svc.clusterset.local", "A", "an empty non-terminal"},
		} {
			if d := dig(q.name, q.qtype); d.Status != "NOERROR" || len(d.Answer) != 0 || !d.HasSOA() {
				t.Errorf("%s is NODATA with the SOA: %s", q.why, d.Raw)
			}
		}
		for _, q := range []struct{ name, why string }{
			{"east.web.shop.svc.clusterset.local", "<clusterid>.<svc> of a ClusterSetIP service"},
			{"nope.shop.svc.clusterset.local", "an unknown service"},
		} {
			if d := dig(q.name, "A"); d.Status != "NXDOMAIN" || !d.HasSOA() {
				t.Errorf("%s is NXDOMAIN with the SOA: %s", q.why, d.Raw)
			}
		}
	})

	t.Run("TCP through the VIP reaches both clusters", func(t *testing.T) {
		seen := map[string]int{}
		for i := 0; i < 24 && len(seen) < 2; i++ {
			h, err := north.Ask(false, netip.AddrPortFrom(vip, 80), 2*time.Second)
			if err != nil {
				t.Fatalf("ask web: %v", err)
			}
			if h.Peer != netip.AddrPortFrom(vip, 80).String() {
				t.Errorf("getpeername %s, want the VIP", h.Peer)
			}
			seen[h.Reply]++
		}
		if seen["web east"] == 0 || seen["web west"] == 0 {
			t.Errorf("replies %v, want both clusters", seen)
		}
	})

	t.Run("UDP through the VIP reaches both clusters and the replies come from the VIP", func(t *testing.T) {
		seen := map[string]int{}
		for i := 0; i < 24 && len(seen) < 2; i++ {
			h, err := north.Ask(true, netip.AddrPortFrom(echoVIP, 9000), 2*time.Second)
			if err != nil {
				t.Fatalf("udpask echo: %v", err)
			}
			if h.Peer != netip.AddrPortFrom(echoVIP, 9000).String() {
				t.Errorf("reply from %s, want the VIP %s", h.Peer, netip.AddrPortFrom(echoVIP, 9000))
			}
			seen[h.Reply]++
		}
		if seen["echo east"] == 0 || seen["echo west"] == 0 {
			t.Errorf("replies %v, want both clusters", seen)
		}
	})

	t.Run("a caller whose cluster also exports uses its own backend", func(t *testing.T) {
		waitImport(t, m, east, "shop", "web", "east")
		for i := 0; i < 10; i++ {
			h, err := east.Ask(false, netip.AddrPortFrom(vip, 80), 2*time.Second)
			if err != nil || h.Reply != "web east" {
				t.Fatalf("ask web from east: %+v %v", h, err)
			}
		}
	})

	t.Run("a service the selector does not admit is not reachable", func(t *testing.T) {
		r := harness.Run(m.Ctx, m.Bin.Cablectl, "service", "export", "secret", "-n", "shop", "--port", "http:8080/TCP",
			"--endpoint", "10.2.0.10", "--labels", "cablemesh.io/exported=false", "--socket", west.StatusSocket)
		if r.Err != nil {
			t.Fatalf("export secret: %s", r)
		}
		if err := harness.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, string) {
			r := m.Cablectl("service", "list", "-o", "json")
			return strings.Contains(r.Stdout, `"name": "secret"`), r.Stdout
		}); err != nil {
			t.Fatalf("secret never reached the broker: %v", err)
		}
		time.Sleep(time.Second) // every agent's watch has had the change
		if d := m.Dig(north.PodNS, north.DNSAddr(), "secret.shop.svc.clusterset.local", "A"); d.Status != "NXDOMAIN" {
			t.Errorf("secret has a name at north: %s", d.Raw)
		}
		if st, _ := north.Status(); func() bool { _, ok := importOf(st, "shop", "secret"); return ok }() {
			t.Errorf("north imports secret")
		}
		if h, err := north.Ask(false, netip.MustParseAddrPort("241.255.255.254:80"), 500*time.Millisecond); err == nil {
			t.Errorf("a made-up VIP answered: %+v", h)
		}
		if r := harness.Run(m.Ctx, m.Bin.Cablectl, "service", "unexport", "secret", "-n", "shop", "--socket", west.StatusSocket); r.Err != nil {
			t.Errorf("unexport secret: %s", r)
		}
		if r := harness.Run(m.Ctx, m.Bin.Cablectl, "service", "unexport", "web", "-n", "shop", "--socket", west.StatusSocket); r.ExitCode != 1 ||
			!strings.Contains(r.Stderr, "defined in the agent config file (exports[0])") {
			t.Errorf("unexport of a config export: %s", r)
		}
	})

	t.Run("an open TCP connection through a VIP survives an agent restart", func(t *testing.T) {
		r := harness.Run(m.Ctx, m.Bin.Cablectl, "service", "export", "api", "-n", "shop", "--port", "tcp:7000/TCP", "--endpoint", "10.1.0.10", "--socket", east.StatusSocket)
		if r.Err != nil {
			t.Fatalf("export api: %s", r)
		}
		api := waitImport(t, m, north, "shop", "api", "east")
		stream := north.StartPod("api-stream", m.Bin.TCPCheck, "stream", "-addr", netip.AddrPortFrom(netip.MustParseAddr(api.VIPs[0]), 7000).String(),
			"-duration", "12s", "-timeout", "3s", "-gap-report", "100ms")
		time.Sleep(2 * time.Second)
		north.StopAgent()
		time.Sleep(500 * time.Millisecond)
		north.StartAgent()
		res, code, err := harness.ReadStream(stream, 60*time.Second)
		if err != nil || code != 0 || res.Error != "" {
			t.Fatalf("stream through the VIP across the restart: exit %d, %+v, %v\n%s", code, res, err, stream.Log())
		}
		m.Logf("stream across the agent restart: %d rounds, longest gap %.1fms", res.Rounds, res.MaxGapMs)
		if res.MaxGapMs > 1000 {
			t.Errorf("the stream stalled %.0fms across the restart", res.MaxGapMs)
		}
		waitImport(t, m, north, "shop", "web", "east", "west")
	})

	t.Run("when an exporting gateway dies new connections go to the other cluster within 2s and open ones are destroyed", func(t *testing.T) {
		// An open connection that landed on east.
		var held *harness.Process
		for i := 0; i < 20 && held == nil; i++ {
			p := north.StartPod(fmt.Sprintf("hold-%d", i), m.Bin.TCPCheck, "hold", "-addr", netip.AddrPortFrom(vip, 80).String(), "-timeout", "2s")
			if err := harness.WaitFor(5*time.Second, 20*time.Millisecond, func() (bool, string) { return len(harness.ReadHellos(p)) > 0, p.Log() }); err != nil {
				t.Fatal(err)
			}
			if harness.ReadHellos(p)[0].Reply == "web east" {
				held = p
			} else {
				_, _ = p.Stop(time.Second)
			}
		}
		if held == nil {
			t.Fatal("no connection landed on east in 20 tries")
		}
		asks := north.StartPod("asks", m.Bin.TCPCheck, "asks", "-addr", netip.AddrPortFrom(vip, 80).String(), "-timeout", "300ms", "-duration", "6s")
		time.Sleep(time.Second)
		killed := time.Now()
		_ = syscall.Kill(east.Agent.Pid(), syscall.SIGKILL)
		harness.MustRun(m.Ctx, "ip", "-n", east.GwNS, "link", "set", "eth0", "down")
		m.Logf("east's agent killed and its gateway taken off the underlay")
		if _, err := asks.Wait(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		var lastFail, firstWest time.Time
		var after []string
		for _, h := range harness.ReadHellos(asks) {
			at := time.Unix(0, h.At)
			if at.Before(killed) {
				continue
			}
			switch {
			case h.Error != "" || h.Reply != "web west":
				lastFail = at
				after = nil
			default:
				if firstWest.IsZero() {
					firstWest = at
				}
				after = append(after, h.Reply)
			}
		}
		failover := lastFail.Sub(killed)
		if lastFail.IsZero() {
			failover = 0
		}
		m.Logf("failover: last connection to the dead cluster %v after the kill, first on west after %v, %d connections on west since",
			failover, firstWest.Sub(killed), len(after))
		if failover >= 2*time.Second || len(after) < 5 {
			t.Errorf("failover took %v (want < 2s with the shipped defaults); %d connections after it", failover, len(after))
		}
		closed := harness.ReadHellos(held)
		if len(closed) < 2 || closed[1].Errno != int(syscall.ECONNABORTED) {
			t.Errorf("the open connection to east: %+v, want it aborted", closed)
		} else {
			m.Logf("the open connection to east was aborted %v after the kill", time.Unix(0, closed[1].At).Sub(killed))
			if d := time.Unix(0, closed[1].At).Sub(killed); d > 2*time.Second {
				t.Errorf("the open connection to east was aborted only %v after the kill", d)
			}
		}
		st, _ := north.Status()
		imp, _ := importOf(st, "shop", "web")
		for _, c := range imp.Clusters {
			if c.Cluster == "east" && (c.Usable || len(c.Backends) > 0) {
				t.Errorf("east still usable at north: %+v", c)
			}
		}
	})

	t.Run("a cluster the policies do not connect is not imported", func(t *testing.T) {
		m.Label("north", "split=yes")
		m.Label("west", "split=yes")
		if err := harness.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, string) {
			st, err := north.Status()
			if err != nil {
				return false, err.Error()
			}
			imp, _ := importOf(st, "shop", "web")
			for _, c := range imp.Clusters {
				if c.Cluster == "west" {
					return false, fmt.Sprintf("%+v", imp)
				}
			}
			return true, fmt.Sprintf("%+v", imp)
		}); err != nil {
			t.Errorf("west is still imported at north: %v", err)
		}
		if d := m.Dig(north.PodNS, north.DNSAddr(), "db-0.west.db.shop.svc.clusterset.local", "A"); d.Status != "NXDOMAIN" {
			t.Errorf("west's db endpoint still has a name at north: %s", d.Raw)
		}
	})
}
