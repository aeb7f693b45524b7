package netns

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cablemesh/cablemesh/agent/statusapi"
	"github.com/cablemesh/cablemesh/tests/netns/harness"
)

// An importer's load balancer maps when the imports need more than they hold: two clusters
// export, each at its default per-cluster quota, 256 services of 127 endpoints (32,768 service
// map entries each: together the 65,536 an importer's map holds), and a third cluster then
// exports a service. The importer must take the new service (at the cost of the bulk exporters'
// last one, refused in its status), and keep applying every change, such as a backend going not
// ready; before, the whole sync failed and no change reached the maps at all.

const (
	bulkServices  = 256
	bulkEndpoints = 127
)

// bulkExports is the exports block of a cluster whose pod CIDR is 10.<n>.0.0/16: services
// bulk/<prefix>000.. of bulkEndpoints endpoints each, inside that CIDR.
func bulkExports(n int, prefix string) string {
	var b strings.Builder
	b.WriteString("exports:\n")
	for i := range bulkServices {
		fmt.Fprintf(&b, "- {name: %s%03d, namespace: bulk, ports: [{name: http, port: 80, protocol: TCP}], endpoints: [", prefix, i)
		for j := range bulkEndpoints {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "{ip: 10.%d.%d.%d}", n, 1+i/2, 1+(i%2)*128+j)
		}
		b.WriteString("]}\n")
	}
	return b.String()
}

// backendsOf are the backends north's maps hold for import ns/name, from every cluster.
func backendsOf(imp statusapi.ServiceImport) []string {
	var out []string
	for _, c := range imp.Clusters {
		out = append(out, c.Backends...)
	}
	slices.Sort(out)
	return out
}

func TestServicesAClusterFillingTheMapsStopsNoOtherService(t *testing.T) {
	m := harness.New(t)
	// Every agent plans 65,536 backends on this small machine: probes that time out under that
	// load would take clusters out and back by the thousand backends, which is not under test.
	const patientProbes = "healthCheck: {period: 1s, timeout: 1s, failureThreshold: 20}\n"
	east := m.AddLabelledCluster("east", "10.1.0.0/16", "", patientProbes+bulkExports(1, "e"))
	south := m.AddLabelledCluster("south", "10.4.0.0/16", "", patientProbes+bulkExports(4, "s"))
	west := m.AddLabelledCluster("west", "10.2.0.0/16", "", patientProbes)
	north := m.AddLabelledCluster("north", "10.3.0.0/16", "", patientProbes)
	for _, c := range []*harness.Cluster{east, south, west, north} {
		c.StartAgent("--cleanup-on-exit")
	}
	west.StartServer("hello", 80, "web west")
	m.WaitConnected(120*time.Second, east, south, west, north)

	// north imports every bulk service: 65,536 service map entries, all its map holds.
	err := harness.WaitFor(120*time.Second, time.Second, func() (bool, string) {
		st, err := north.Status()
		if err != nil || st.Services == nil {
			return false, fmt.Sprint(err)
		}
		n := 0
		for _, imp := range st.Services.Imports {
			if imp.Namespace == "bulk" && len(imp.VIPs) > 0 {
				n++
			}
		}
		return n == 2*bulkServices && st.Services.LoadBalancer.Services >= 2*bulkServices-1,
			fmt.Sprintf("%d bulk imports, %d services in the maps (%s)", n, st.Services.LoadBalancer.Services, st.Services.LoadBalancer.Error)
	})
	if err != nil {
		t.Fatalf("north never imported the bulk services: %v", err)
	}
	m.Logf("north imports and holds the %d bulk services", 2*bulkServices)

	export := func(endpoints ...string) {
		t.Helper()
		args := []string{"service", "export", "web", "-n", "shop", "--port", "http:80/TCP", "--socket", west.StatusSocket}
		for _, e := range endpoints {
			args = append(args, "--endpoint", e)
		}
		if r := harness.Run(m.Ctx, m.Bin.Cablectl, args...); r.Err != nil {
			t.Fatalf("export web: %s", r)
		}
	}
	waitBackends := func(want ...string) statusapi.ServiceImport {
		t.Helper()
		var imp statusapi.ServiceImport
		// A status read renders every endpoint of the 512 imports: poll it gently.
		err := harness.WaitFor(120*time.Second, time.Second, func() (bool, string) {
			st, err := north.Status()
			if err != nil {
				return false, err.Error()
			}
			var ok bool
			if imp, ok = importOf(st, "shop", "web"); !ok {
				return false, "shop/web not imported"
			}
			lb := st.Services.LoadBalancer
			return slices.Equal(backendsOf(imp), want), fmt.Sprintf("backends %v; load balancer error %q; web refused %q", backendsOf(imp), lb.Error, imp.LoadBalancerRefused)
		})
		if err != nil {
			t.Fatalf("north's maps never held web's backends %v: %v", want, err)
		}
		return imp
	}

	t.Run("another cluster's new service enters the maps and answers through its VIP", func(t *testing.T) {
		export("10.2.0.10", "10.2.0.11")
		waitBackends("10.2.0.10:80/tcp", "10.2.0.11:80/tcp")
	})

	t.Run("a backend marked not ready leaves the maps", func(t *testing.T) {
		export("10.2.0.10", "10.2.0.11,ready=false")
		imp := waitBackends("10.2.0.10:80/tcp")
		vip := netip.AddrPortFrom(netip.MustParseAddr(imp.VIPs[0]), 80)
		for i := range 8 {
			h, err := north.Ask(false, vip, 2*time.Second)
			if err != nil || h.Reply != "web west" {
				t.Fatalf("ask %d through web's VIP %s: %+v %v", i, vip, h, err)
			}
		}
	})

	t.Run("the import that no longer fits is refused alone, in its status", func(t *testing.T) {
		var st statusapi.Status
		// A status read may time out on a loaded machine: retry it.
		if err := harness.WaitFor(60*time.Second, time.Second, func() (bool, string) {
			var err error
			st, err = north.Status()
			return err == nil && st.Services != nil, fmt.Sprint(err)
		}); err != nil {
			t.Fatal(err)
		}
		var refused []string
		for _, imp := range st.Services.Imports {
			if imp.LoadBalancerRefused != "" {
				refused = append(refused, imp.Namespace+"/"+imp.Name+": "+imp.LoadBalancerRefused)
			}
		}
		// web needs 3 entries: the bulk exporters' last service, in the round-robin order (east
		// before south), makes room; nothing else is refused.
		if len(refused) != 1 || !strings.HasPrefix(refused[0], "bulk/s255: ") || !strings.Contains(refused[0], "full") {
			t.Errorf("refused imports %q, want bulk/s255 alone", refused)
		}
		lb := st.Services.LoadBalancer
		if lb.Refused != 1 || lb.ServiceMapEntries != 65536 || lb.Error != "" || lb.Services != 2*bulkServices {
			t.Errorf("load balancer status %+v", lb)
		}
		if n := strings.Count(north.Agent.Log(), "service import refused by the load balancer"); n != 1 {
			t.Errorf("the refusal was logged %d times, want once", n)
		}
	})
}
