package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/exports"
	"github.com/cablemesh/cablemesh/agent/internal/fakedriver"
	"github.com/cablemesh/cablemesh/agent/internal/testbroker"
	"github.com/cablemesh/cablemesh/agent/statusapi"
	apiv1 "github.com/cablemesh/cablemesh/api/v1"
	"github.com/cablemesh/cablemesh/bpf"
)

// webImport is shop/web at 241.0.0.1:80, exported by west (target port 8080: 10.2.0.10:8080) and north
// (10.3.0.10:80, and 10.3.0.11 not ready).
func webImport() *apiv1.ServiceImport {
	return &apiv1.ServiceImport{Namespace: "shop", Name: "web", Type: "ClusterSetIP", Vips: []string{"241.0.0.1"},
		Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
		Clusters: []*apiv1.ImportedCluster{
			{Cluster: "north", ClusterId: 3, Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}},
				Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.3.0.10", Ready: true}, {Ip: "10.3.0.11"}}},
			{Cluster: "west", ClusterId: 2, Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP", TargetPort: 8080}},
				Endpoints: []*apiv1.ServiceEndpoint{{Ip: "10.2.0.10", Ready: true}}},
		}}
}

// servicesAgent starts an east gateway against b with DNS on a free loopback port, the fake
// load balancer, and probes through net (west and north publish health-check addresses).
func servicesAgent(t *testing.T, b *testbroker.Broker, net *switchPinger, mod func(*config.Config, *Options)) (*running, *config.Config, *fakeLB, *fakeCounters) {
	t.Helper()
	for _, e := range []*apiv1.Endpoint{remoteEndpoint("west", "w1", "127.0.0.12", "S1dFU1Qta2V5"), remoteEndpoint("north", "n1", "127.0.0.13", "S05PUlRILWtleQ==")} {
		e.HealthCheckIp = strings.Replace(e.GetPrivateIp(), "127.0.0.1", "10.", 1) + ".0.1"
		b.UpsertEndpoint(e)
	}
	cfg := testConfig(t, b, true)
	cfg.HealthCheck.Period = 100 * time.Millisecond
	cfg.HealthCheck.Timeout = 20 * time.Millisecond
	cfg.DNS.Listen = "127.0.0.1:0"
	lb, ctr := &fakeLB{}, newFakeCounters()
	d := fakedriver.New()
	d.LinkNames = []string{"cbl-wg*"} // a pattern, expanded against the links
	var o *Options
	r := startAgentWith(t, cfg, d, func(opts *Options) {
		opts.Host.NewPinger = net.open
		opts.Host.InterfaceAddrs = func() []netip.Addr { return []netip.Addr{netip.MustParseAddr("10.1.0.1")} }
		fakeDatapath(opts, lb, ctr, map[string]int{"cbl-wg0": 7, "eth0": 2})
		o = opts
		if mod != nil {
			mod(cfg, opts)
		}
	})
	_ = o
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, r)
	return r, cfg, lb, ctr
}

func dnsAddr(t *testing.T, r *running) string {
	t.Helper()
	dp := r.agent.datapath()
	if dp.DNS() == nil {
		t.Fatal("no dns server")
	}
	return dp.DNS().Addr().String()
}

func query(t *testing.T, addr, name string, qtype uint16) *mdns.Msg {
	t.Helper()
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(name), qtype)
	c := &mdns.Client{Timeout: 2 * time.Second}
	resp, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("query %s: %v", name, err)
	}
	return resp
}

func TestImportsBecomeDNSRecordsAndLoadBalancedBackends(t *testing.T) {
	b := newBroker(t)
	b.HoldImports() // the agent has no import set until the first query below was answered
	net := &switchPinger{}
	r, cfg, lb, ctr := servicesAgent(t, b, net, nil)
	addr := dnsAddr(t, r)

	if rc := query(t, addr, "web.shop.svc.clusterset.local", mdns.TypeA).Rcode; rc != mdns.RcodeServerFailure {
		t.Errorf("before any imports the zone answers %s, want SERVFAIL", mdns.RcodeToString[rc])
	}
	b.ReleaseImports()
	eventually(t, "the empty import set makes the zone answer NXDOMAIN", func() bool {
		return query(t, addr, "web.shop.svc.clusterset.local", mdns.TypeA).Rcode == mdns.RcodeNameError
	})
	eventually(t, "the agent asked for imports with the default selector", func() bool {
		for _, w := range b.WatchRequests() {
			if w.GetWantImports() && w.GetImportSelector() == "cablemesh.io/exported=true" {
				return true
			}
		}
		return false
	})

	b.SetImports("east", webImport())
	eventually(t, "both remote clusters' ready backends in the maps", func() bool {
		got, _ := lb.backends("241.0.0.1:80/tcp")
		return slices.Equal(got, []string{"10.2.0.10:8080", "10.3.0.10:80"})
	})
	resp := query(t, addr, "web.shop.svc.clusterset.local", mdns.TypeA)
	if resp.Rcode != mdns.RcodeSuccess || len(resp.Answer) != 1 || resp.Answer[0].(*mdns.A).A.String() != "241.0.0.1" {
		t.Errorf("A web.shop = %v", resp)
	}

	// west's gateway stops answering its probes: its backend leaves the maps within about one
	// period after the third failure, and its sockets are destroyed.
	start := time.Now()
	net.set(true)
	eventually(t, "every backend gone once every probe fails", func() bool {
		got, _ := lb.backends("241.0.0.1:80/tcp")
		return len(got) == 0
	})
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Errorf("backends left %s after the probes began failing (3 x 100ms expected, and the pass at once)", d)
	}
	if got := lb.destroyedEndpoints(); !slices.Contains(got, "10.2.0.10:8080/tcp") {
		t.Errorf("destroyed %v, want west's backend among them", got)
	}
	net.set(false)
	eventually(t, "the backends return once the probes answer", func() bool {
		got, _ := lb.backends("241.0.0.1:80/tcp")
		return len(got) == 2
	})

	// west's lease expires: its backend leaves at once.
	b.DeleteEndpoint("west", "w1")
	eventually(t, "west's backend gone with its endpoint", func() bool {
		got, _ := lb.backends("241.0.0.1:80/tcp")
		return slices.Equal(got, []string{"10.3.0.10:80"})
	})

	s, _ := getStatus(t, cfg.StatusSocket)
	if s.Services == nil || !s.Services.ImportsKnown || len(s.Services.Imports) != 1 {
		t.Fatalf("services status %+v", s.Services)
	}
	imp := s.Services.Imports[0]
	var west, north statusapi.ImportedCluster
	for _, c := range imp.Clusters {
		switch c.Cluster {
		case "west":
			west = c
		case "north":
			north = c
		}
	}
	if west.Usable || !strings.Contains(west.Reason, "no live gateway endpoint") || len(west.Backends) != 0 {
		t.Errorf("west row %+v", west)
	}
	if !north.Usable || north.ReadyEndpoints != 1 || !slices.Equal(north.Backends, []string{"10.3.0.10:80/tcp"}) {
		t.Errorf("north row %+v", north)
	}
	if !s.Services.LoadBalancer.Running || s.Services.LoadBalancer.Services != 1 || !s.Services.DNS.Enabled {
		t.Errorf("datapath %+v %+v", s.Services.LoadBalancer, s.Services.DNS)
	}
	// The counters sit on the cable link and count the remote clusters' subnets.
	ctr.mu.Lock()
	attached, subnets := ctr.attached["cbl-wg0"], len(ctr.subnets)
	ctr.counts[3] = bpf.ClusterCounters{RxPackets: 1, RxBytes: 100, TxPackets: 2, TxBytes: 200}
	ctr.mu.Unlock()
	if !attached || subnets == 0 {
		t.Errorf("counters attached %v, subnets %d", attached, subnets)
	}
	s, _ = getStatus(t, cfg.StatusSocket)
	for _, c := range s.Connections {
		if c.Cluster == "north" && (c.Traffic == nil || c.Traffic.TxBytes != 200) {
			t.Errorf("north traffic %+v", c.Traffic)
		}
	}
}

func TestAnAgentRestartedWithoutItsBrokerServesItsCachedImports(t *testing.T) {
	b := newBroker(t)
	net := &switchPinger{}
	b.SetImports("east", webImport())
	r, cfg, lb, _ := servicesAgent(t, b, net, nil)
	eventually(t, "backends in the maps", func() bool {
		got, _ := lb.backends("241.0.0.1:80/tcp")
		return len(got) == 2
	})
	r.stop()
	b.Stop()

	lb2 := &fakeLB{}
	r2 := startAgentWith(t, cfg, fakedriver.New(), func(o *Options) {
		o.Host.NewPinger = net.open
		fakeDatapath(o, lb2, nil, nil)
	})
	waitReady(t, r2)
	if got, _ := lb2.backends("241.0.0.1:80/tcp"); len(got) != 2 {
		t.Errorf("maps after a restart without the broker: %v", got)
	}
	resp := query(t, dnsAddr(t, r2), "web.shop.svc.clusterset.local", mdns.TypeA)
	if resp.Rcode != mdns.RcodeSuccess || len(resp.Answer) != 1 {
		t.Errorf("DNS after a restart without the broker: %v", resp)
	}
}

func TestTheDatapathStaysOnExitUnlessCleanupIsAsked(t *testing.T) {
	for _, cleanup := range []bool{false, true} {
		b := newBroker(t)
		lb := &fakeLB{}
		r := startAgentWith(t, testConfig(t, b, true), fakedriver.New(), func(o *Options) {
			fakeDatapath(o, lb, nil, nil)
			o.CleanupOnExit = cleanup
		})
		waitReady(t, r)
		r.stop()
		lb.mu.Lock()
		closed, removed := lb.closed, lb.removed
		lb.mu.Unlock()
		if removed != cleanup || closed == cleanup {
			t.Errorf("--cleanup-on-exit %v: closed %v, removed %v", cleanup, closed, removed)
		}
	}
}

func TestAnEmptyImportSelectorIsSentAsEmpty(t *testing.T) {
	b := newBroker(t)
	empty := ""
	servicesAgent(t, b, &switchPinger{}, func(c *config.Config, _ *Options) { c.Imports.Selector = &empty })
	eventually(t, "a watch asking for imports with the empty selector", func() bool {
		for _, w := range b.WatchRequests() {
			if w.GetWantImports() && w.GetImportSelector() == "" {
				return true
			}
		}
		return false
	})
}

// agentAPI calls the agent's API on socket.
func agentAPI(t *testing.T, socket, method, path string, body any) (int, []byte) {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
	}}
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, "http://agent"+path, rd)
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func TestExportsReachTheBrokerFromConfigAndRuntime(t *testing.T) {
	b := newBroker(t)
	r, cfg, _, _ := servicesAgent(t, b, &switchPinger{}, func(c *config.Config, _ *Options) {
		c.Exports = []config.Export{{Name: "db", Namespace: "shop", Type: "Headless", Endpoints: []config.ExportEndpoint{{IP: "10.1.0.20", Hostname: "db-0"}}}}
	})
	_ = r
	eventually(t, "the config export at the broker", func() bool {
		got, _ := b.Exports("east", "east-gw1")
		return len(got) == 1 && got[0].GetName() == "db" && got[0].GetEndpoints()[0].GetReady()
	})

	web := statusapi.Export{Ports: []statusapi.ServicePort{{Name: "http", Port: 80, Protocol: "tcp"}},
		Endpoints: []statusapi.ServiceEndpoint{{IP: "10.1.0.10", Ready: true}}}
	code, body := agentAPI(t, cfg.StatusSocket, "PUT", statusapi.ExportsPath+"shop/web", web)
	if code != http.StatusOK || !strings.Contains(string(body), `"protocol": "TCP"`) || !strings.Contains(string(body), `"source": "runtime"`) {
		t.Fatalf("PUT web: %d %s", code, body)
	}
	eventually(t, "both exports at the broker", func() bool {
		got, _ := b.Exports("east", "east-gw1")
		return len(got) == 2 && got[1].GetName() == "web" && got[1].GetCluster() == "east" && got[1].GetLabels()["cablemesh.io/exported"] == "true"
	})
	if data, err := os.ReadFile(filepath.Join(cfg.StateDir, exports.ExportsFile)); err != nil || !strings.Contains(string(data), `"web"`) {
		t.Errorf("exports.json: %s %v", data, err)
	}

	bad := web
	bad.Ports = []statusapi.ServicePort{{Name: "http", Port: 70000}}
	if code, body := agentAPI(t, cfg.StatusSocket, "PUT", statusapi.ExportsPath+"shop/web2", bad); code != http.StatusBadRequest || !strings.Contains(string(body), "export.ports[0].port: 70000") {
		t.Errorf("bad port: %d %s", code, body)
	}
	if code, body := agentAPI(t, cfg.StatusSocket, "PUT", statusapi.ExportsPath+"shop/db", web); code != http.StatusConflict || !strings.Contains(string(body), "agent config file (exports[0])") {
		t.Errorf("exporting over a config export: %d %s", code, body)
	}
	if code, body := agentAPI(t, cfg.StatusSocket, "DELETE", statusapi.ExportsPath+"shop/db", nil); code != http.StatusConflict || !strings.Contains(string(body), "agent config file") {
		t.Errorf("unexporting a config export: %d %s", code, body)
	}
	if code, body := agentAPI(t, cfg.StatusSocket, "DELETE", statusapi.ExportsPath+"shop/nope", nil); code != http.StatusNotFound {
		t.Errorf("unexporting nothing: %d %s", code, body)
	}
	s, _ := getStatus(t, cfg.StatusSocket)
	if len(s.Services.Exports) != 2 || !s.Services.Sync.InSync {
		t.Errorf("exports status %+v %+v", s.Services.Exports, s.Services.Sync)
	}

	// The runtime export survives a restart.
	r.stop()
	r2 := startAgentWith(t, cfg, fakedriver.New(), func(o *Options) { fakeDatapath(o, nil, nil, nil) })
	waitReady(t, r2)
	eventually(t, "the restarted agent still exports web", func() bool {
		s, _ := getStatus(t, cfg.StatusSocket)
		return len(s.Services.Exports) == 2 && s.Services.Sync.InSync
	})
	if code, _ := agentAPI(t, cfg.StatusSocket, "DELETE", statusapi.ExportsPath+"shop/web", nil); code != http.StatusNoContent {
		t.Errorf("unexport web: %d", code)
	}
	eventually(t, "web withdrawn at the broker", func() bool {
		got, _ := b.Exports("east", "east-gw1")
		return len(got) == 1
	})
}

// fakeSource is a Kubernetes export source driven by the test.
type fakeSource struct{ ch chan []*apiv1.ServiceExport }

func (f *fakeSource) Run(ctx context.Context, onChange func([]*apiv1.ServiceExport)) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case s := <-f.ch:
			onChange(s)
		}
	}
}

func TestKubernetesExportsJoinTheNodesSet(t *testing.T) {
	b := newBroker(t)
	src := &fakeSource{ch: make(chan []*apiv1.ServiceExport)}
	servicesAgent(t, b, &switchPinger{}, func(c *config.Config, o *Options) {
		c.Kubernetes.Enabled = true
		o.Kubernetes = src
	})
	src.ch <- []*apiv1.ServiceExport{{Namespace: "shop", Name: "cart", Ports: []*apiv1.ServicePort{{Port: 80}}},
		{Namespace: "shop", Name: "Bad_Name", Ports: []*apiv1.ServicePort{{Port: 80}}}}
	eventually(t, "the valid Kubernetes export at the broker", func() bool {
		got, _ := b.Exports("east", "east-gw1")
		return len(got) == 1 && got[0].GetName() == "cart" && got[0].GetType() == "ClusterSetIP"
	})
}

// svcImport is a ClusterSetIP import of VIP vip, port 80, exported by cluster (id) with the
// endpoints 10.<id>.<vip's last byte>.1.. (ready unless listed in notReady).
func svcImport(name, vip, cluster string, id uint32, endpoints int, notReady ...int) *apiv1.ServiceImport {
	ic := &apiv1.ImportedCluster{Cluster: cluster, ClusterId: id, Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}}}
	last := netip.MustParseAddr(vip).As4()[3]
	for i := range endpoints {
		ic.Endpoints = append(ic.Endpoints, &apiv1.ServiceEndpoint{Ip: fmt.Sprintf("10.%d.%d.%d", id, last, i+1), Ready: !slices.Contains(notReady, i)})
	}
	return &apiv1.ServiceImport{Namespace: "shop", Name: name, Type: "ClusterSetIP", Vips: []string{vip},
		Ports: []*apiv1.ServicePort{{Name: "http", Port: 80, Protocol: "TCP"}}, Clusters: []*apiv1.ImportedCluster{ic}}
}

func refusedImports(t *testing.T, socket string) map[string]string {
	t.Helper()
	s, _ := getStatus(t, socket)
	out := map[string]string{}
	if s.Services == nil {
		return out
	}
	for _, imp := range s.Services.Imports {
		if imp.LoadBalancerRefused != "" {
			out[imp.Name] = imp.LoadBalancerRefused
		}
	}
	return out
}

// Maps too small for every import: each import that does not fit is refused alone and shown in
// its status, a cluster's newcomer does not evict that cluster's services, and every other
// change (another cluster's new service, a backend going not ready) still reaches the maps.
func TestImportsThatDoNotFitTheMapsAreRefusedAloneAndTheRestIsApplied(t *testing.T) {
	b := newBroker(t)
	r, cfg, lb, _ := servicesAgent(t, b, &switchPinger{}, nil)
	_ = r
	lb.mu.Lock()
	lb.maxEntries = 6 // one entry per service and one per backend
	lb.mu.Unlock()
	held := func(vip string) []string { got, _ := lb.backends(vip + ":80/tcp"); return got }

	big := svcImport("big", "241.0.0.1", "north", 3, 3) // 4 entries
	b.SetImports("east", big)
	eventually(t, "north's big service in the maps", func() bool { return len(held("241.0.0.1")) == 3 })

	// Two newcomers of one pass are ranked by name.
	small := svcImport("second", "241.0.0.2", "north", 3, 1) // 2 entries: 6 with big, fits
	more := svcImport("third", "241.0.0.3", "north", 3, 1)   // 2 more: refused
	b.SetImports("east", big, small, more)
	eventually(t, "north's newcomer refused, in its status", func() bool {
		return strings.Contains(refusedImports(t, cfg.StatusSocket)["third"], "needs 2 entries")
	})
	if len(held("241.0.0.1")) != 3 || len(held("241.0.0.2")) != 1 || len(held("241.0.0.3")) != 0 {
		t.Fatalf("maps hold big %v, small %v, more %v", held("241.0.0.1"), held("241.0.0.2"), held("241.0.0.3"))
	}

	// west's first service comes in the first round, ahead of north's second: small gives way.
	web := svcImport("web", "241.0.0.4", "west", 2, 1)
	b.SetImports("east", big, small, more, web)
	eventually(t, "west's new service in the maps", func() bool { return len(held("241.0.0.4")) == 1 })
	if got := refusedImports(t, cfg.StatusSocket); len(got) != 2 || got["second"] == "" || got["third"] == "" {
		t.Errorf("refused %v, want second and third", got)
	}

	// A backend of big goes not ready: the change reaches the maps though imports are refused.
	b.SetImports("east", svcImport("big", "241.0.0.1", "north", 3, 3, 0), small, more, web)
	eventually(t, "big's not-ready backend out of the maps", func() bool { return len(held("241.0.0.1")) == 2 })

	// big goes: small and more fit again, and their refusals clear.
	b.SetImports("east", small, more, web)
	eventually(t, "the refused services taken once there is room", func() bool {
		return len(held("241.0.0.2")) == 1 && len(held("241.0.0.3")) == 1 && len(refusedImports(t, cfg.StatusSocket)) == 0
	})
	s, _ := getStatus(t, cfg.StatusSocket)
	if lb := s.Services.LoadBalancer; lb.Refused != 0 || lb.ServiceMapEntries != 6 || lb.Error != "" {
		t.Errorf("load balancer status %+v", lb)
	}
}
