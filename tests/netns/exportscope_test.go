package netns

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// An exported endpoint must lie in the exporting cluster (its pod or service CIDRs): otherwise a
// cluster could point the importers' callers at their own loopback, a metadata service, the
// broker, another cluster's pod or another service's VIP. Three clusters with the real
// binaries: east tries each of those, through cablectl (the agent refuses, naming the field, the
// value and the CIDRs) and through a runtime exports file the agent sends as it is (the broker
// refuses); north, which runs a server on its own loopback, never reaches it through a VIP or a
// headless name, and a name west and east share reaches west only.
func TestExportedEndpointsStayInTheirCluster(t *testing.T) {
	m := harness.New(t)
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "", "")
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "", "")
	north := m.AddLabelledCluster("north", "10.3.0.0/16", "", "")
	for _, c := range []*harness.Cluster{east, west, north} {
		c.StartAgent("--cleanup-on-exit")
	}
	west.StartServer("hello", 8080, "api west")
	// Listens on every address of north's pod namespace, its loopback included: what a hijacked
	// VIP would reach.
	north.StartServer("hello", 8080, "north loopback")
	m.WaitConnected(90*time.Second, east, west, north)

	exportAt := func(c *harness.Cluster, name string, args ...string) harness.Result {
		argv := append([]string{"service", "export", name, "-n", "shop", "--port", "http:8080/TCP"}, args...)
		return harness.Run(m.Ctx, m.Bin.Cablectl, append(argv, "--socket", c.StatusSocket)...)
	}
	if r := exportAt(west, "api", "--endpoint", west.PodIP.String()); r.Err != nil {
		t.Fatalf("west exports api at its pod: %s", r)
	}
	api := waitImport(t, m, north, "shop", "api", "west")
	apiVIP := netip.MustParseAddr(api.VIPs[0])
	m.Logf("shop/api from west at %s, VIP %s", west.PodIP, apiVIP)

	eastCIDRs := "is not in cluster east's pod CIDRs [10.1.0.0/16] or service CIDRs []"
	t.Run("cablectl export of an endpoint outside the cluster is refused, naming the field, the value and the CIDRs", func(t *testing.T) {
		// 127.0.0.1 last: where an old agent that accepted them all left shop/lo.
		for _, ip := range []string{"169.254.169.254", m.BrokerAddr.String(), west.PodIP.String(), apiVIP.String(), "127.0.0.1"} {
			r := exportAt(east, "lo", "--endpoint", ip)
			want := fmt.Sprintf("export.endpoints[0].ip %s %s", ip, eastCIDRs)
			if r.ExitCode == 0 || !strings.Contains(r.Stderr, want) {
				t.Errorf("export lo at %s: exit %d, stderr %q; want a non-zero exit and %q", ip, r.ExitCode, strings.TrimSpace(r.Stderr), want)
			}
		}
		// The same name as west's, at east's caller-side loopback.
		if r := exportAt(east, "api", "--endpoint", "127.0.0.1"); r.ExitCode == 0 || !strings.Contains(r.Stderr, "export.endpoints[0].ip 127.0.0.1 "+eastCIDRs) {
			t.Errorf("export api at 127.0.0.1: exit %d, stderr %q", r.ExitCode, strings.TrimSpace(r.Stderr))
		}
		if r := exportAt(east, "hl", "--type", "Headless", "--endpoint", "127.0.0.1,hostname=h0"); r.ExitCode == 0 || !strings.Contains(r.Stderr, "127.0.0.1 "+eastCIDRs) {
			t.Errorf("export headless hl at 127.0.0.1: exit %d, stderr %q", r.ExitCode, strings.TrimSpace(r.Stderr))
		}
	})

	// On a broker and agents that accepted them, the imports above reach north within a second
	// or two: give them that long before judging north's calls and names.
	time.Sleep(3 * time.Second)

	// notImported fails when north imports shop/name, and when a call through its VIP reaches
	// north's own loopback server.
	notImported := func(t *testing.T, name string) {
		t.Helper()
		st, err := north.Status()
		if err != nil {
			t.Fatal(err)
		}
		imp, ok := importOf(st, "shop", name)
		if !ok {
			return
		}
		t.Errorf("north imports shop/%s: %+v", name, imp)
		for _, v := range imp.VIPs {
			for range 6 {
				if h, err := north.Ask(false, netip.AddrPortFrom(netip.MustParseAddr(v), 8080), 2*time.Second); err == nil && h.Reply == "north loopback" {
					t.Errorf("shop/%s's VIP %s reached north's own loopback", name, v)
					break
				}
			}
		}
	}
	t.Run("north's calls through a VIP never reach its own loopback", func(t *testing.T) { notImported(t, "lo") })

	t.Run("a name west and east share reaches west only", func(t *testing.T) {
		seen := map[string]int{}
		for range 20 {
			h, err := north.Ask(false, netip.AddrPortFrom(apiVIP, 8080), 2*time.Second)
			if err != nil {
				seen["error: "+err.Error()]++
				continue
			}
			seen[h.Reply]++
		}
		if seen["api west"] != 20 {
			t.Errorf("20 calls of shop/api from north: %v; want all on west", seen)
		}
	})

	t.Run("headless DNS never answers 127.0.0.1", func(t *testing.T) {
		for _, name := range []string{"hl.shop.svc.clusterset.local", "h0.east.hl.shop.svc.clusterset.local"} {
			d := m.Dig(north.PodNS, north.DNSAddr(), name, "A")
			if slices.Contains(d.Data("A"), "127.0.0.1") {
				t.Errorf("%s A: %s", name, d.Raw)
			}
		}
	})

	t.Run("the broker refuses what an agent sends from an old runtime exports file", func(t *testing.T) {
		east.StopAgent()
		stale := map[string]any{"exports": []map[string]any{
			{"name": "stale", "namespace": "shop", "ports": []map[string]any{{"name": "http", "port": 8080, "protocol": "TCP"}},
				"endpoints": []map[string]any{{"ip": "127.0.0.1"}}},
		}}
		b, err := json.Marshal(stale)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(east.StateDir, "exports.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
		east.StartAgent("--cleanup-on-exit")
		want := "exports[0].endpoints[0].ip 127.0.0.1 " + eastCIDRs
		if err := harness.WaitFor(30*time.Second, 200*time.Millisecond, func() (bool, string) {
			st, err := east.Status()
			if err != nil || st.Services == nil {
				return false, fmt.Sprint(err)
			}
			return strings.Contains(st.Services.Sync.Error, want), fmt.Sprintf("%+v", st.Services.Sync)
		}); err != nil {
			t.Errorf("east's export sync never showed the broker's refusal %q: %v", want, err)
		}
		if r := m.Cablectl("service", "list", "-o", "json"); strings.Contains(r.Stdout, `"name": "stale"`) {
			t.Errorf("the broker stored the stale export: %s", r.Stdout)
		}
		time.Sleep(2 * time.Second) // as above
		notImported(t, "stale")
	})
}
