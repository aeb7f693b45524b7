package xds

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	listener "github.com/envoyproxy/go-control-plane/envoy/config/listener/v3"
	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	listenerservice "github.com/envoyproxy/go-control-plane/envoy/service/listener/v3"
	client "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// startServer serves st on a unix socket in a temp dir and returns the server and a client
// connection to it.
func startServer(t *testing.T, st State) (*Server, *grpc.ClientConn) {
	t.Helper()
	s := NewServer(nil)
	sock := filepath.Join(t.TempDir(), "xds.sock")
	lis, err := s.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(s.Close)
	if _, err := s.Update(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return s, cc
}

// waitFor waits until cond holds, on the server's change notifications, for at most 5s.
func waitFor(t *testing.T, s *Server, what string, cond func() bool) {
	t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		ch := s.Changed()
		if cond() {
			return
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; status %+v", what, s.Status())
		}
	}
}

func typeStatus(s *Server, node, typ string) TypeStatus {
	for _, n := range s.Status() {
		if n.Node == node {
			for _, ts := range n.Types {
				if ts.Type == typ {
					return ts
				}
			}
		}
	}
	return TypeStatus{}
}

func fetch(t *testing.T, c client.ADSClient) *client.Response {
	t.Helper()
	type res struct {
		r   *client.Response
		err error
	}
	ch := make(chan res, 1)
	go func() { r, err := c.Fetch(); ch <- res{r, err} }()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.r
	case <-time.After(5 * time.Second):
		t.Fatal("no response from the xDS server in 5s")
	}
	return nil
}

func TestADSClientFetchesTheTCPAndSNIListeners(t *testing.T) {
	s, cc := startServer(t, testState())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := client.NewADSClient(ctx, &core.Node{Id: "envoy-1", Cluster: "east"}, resourcev3.ListenerType)
	if err := c.InitConnect(cc); err != nil {
		t.Fatal(err)
	}
	resp := fetch(t, c)
	got := map[string]*listener.Listener{}
	for _, a := range resp.Resources {
		var l listener.Listener
		if err := a.UnmarshalTo(&l); err != nil {
			t.Fatal(err)
		}
		if err := l.ValidateAll(); err != nil {
			t.Errorf("listener %s: %v", l.Name, err)
		}
		got[l.Name] = &l
	}
	if len(got) != 7 {
		t.Errorf("%d listeners, want 7", len(got))
	}
	for port, cluster := range map[uint32]string{15000: "web.demo.svc.clusterset.local:80", 15001: "web.demo.svc.clusterset.local:443"} {
		l := got[TCPListenerName(port)]
		if l == nil {
			t.Fatalf("no TCP listener for ingress port %d", port)
		}
		if p := l.GetAddress().GetSocketAddress().GetPortValue(); p != port {
			t.Errorf("%s listens on %d", l.Name, p)
		}
		CheckSNIListener(t, &listener.Listener{Name: l.Name, ListenerFilters: []*listener.ListenerFilter{{Name: "envoy.filters.listener.tls_inspector"}},
			FilterChains: []*listener.FilterChain{{Name: l.Name, FilterChainMatch: &listener.FilterChainMatch{ServerNames: []string{"any"}}, Filters: l.FilterChains[0].Filters}}},
			map[string]string{"any": cluster})
	}
	if got[TCPListenerName(15002)] != nil {
		t.Error("a UDP service port got an Envoy TCP listener")
	}
	CheckSNIListener(t, got[SNIListener], map[string]string{
		"80.web.demo.svc.east.cablemesh.local":     "web.demo.svc.clusterset.local:80",
		"web.demo.svc.east.cablemesh.local":        "web.demo.svc.clusterset.local:80",
		"443.web.demo.svc.east.cablemesh.local":    "web.demo.svc.clusterset.local:443",
		"50051.grpc.demo.svc.east.cablemesh.local": "grpc.demo.svc.clusterset.local:50051",
		"grpc.demo.svc.east.cablemesh.local":       "grpc.demo.svc.clusterset.local:50051",
	})
	if err := c.Ack(); err != nil {
		t.Fatal(err)
	}
	want := s.Versions()[resourcev3.ListenerType]
	waitFor(t, s, "the listeners ACK", func() bool { return s.Acked("envoy-1", resourcev3.ListenerType, want) })
	if ts := typeStatus(s, "envoy-1", "listeners"); ts.Sent != want || ts.Current != want || ts.NackError != "" {
		t.Errorf("status %+v, want sent=acked=current=%s", ts, want)
	}

	// Nothing changed: Update sets nothing, the versions stay, no response is pushed.
	changed, err := s.Update(context.Background(), testState())
	if err != nil || changed {
		t.Fatalf("Update with the same state: changed=%v err=%v", changed, err)
	}
	if s.Versions()[resourcev3.ListenerType] != want {
		t.Error("version changed without a change")
	}
	// A change is pushed on the open stream.
	st := testState()
	st.Services[0].Ports[0].IngressPort = 15010
	start := time.Now()
	if changed, err := s.Update(context.Background(), st); err != nil || !changed {
		t.Fatalf("Update with a new ingress port: changed=%v err=%v", changed, err)
	}
	resp = fetch(t, c)
	if d := time.Since(start); d > time.Second {
		t.Errorf("change pushed after %v, want under 1s", d)
	}
	found := false
	for _, a := range resp.Resources {
		var l listener.Listener
		if a.UnmarshalTo(&l) == nil && l.Name == TCPListenerName(15010) {
			found = true
		}
	}
	if !found {
		t.Error("the pushed listeners lack ingress-tcp-15010")
	}
}

func TestNACKIsTrackedWithItsErrorDetail(t *testing.T) {
	s, cc := startServer(t, testState())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := client.NewADSClient(ctx, &core.Node{Id: "envoy-nack"}, resourcev3.ClusterType)
	if err := c.InitConnect(cc); err != nil {
		t.Fatal(err)
	}
	fetch(t, c)
	if err := c.Nack("cluster web: unknown field"); err != nil {
		t.Fatal(err)
	}
	v := s.Versions()[resourcev3.ClusterType]
	waitFor(t, s, "the NACK", func() bool { return typeStatus(s, "envoy-nack", "clusters").NackError != "" })
	ts := typeStatus(s, "envoy-nack", "clusters")
	if ts.NackError != "cluster web: unknown field" || ts.NackVersion != v || ts.Acked == v {
		t.Errorf("status after NACK: %+v", ts)
	}
	// A new version that the client ACKs clears the NACK.
	st := testState()
	st.Services = st.Services[:1]
	if _, err := s.Update(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	// The client's NACK carried no accepted version, so the cache may send the refused version
	// once more before the new one: ACK whatever comes until the new version has been ACKed.
	v2 := s.Versions()[resourcev3.ClusterType]
	go func() {
		for {
			if _, err := c.Fetch(); err != nil {
				return
			}
			if c.Ack() != nil {
				return
			}
		}
	}()
	waitFor(t, s, "the ACK of the new version", func() bool { return s.Acked("envoy-nack", resourcev3.ClusterType, v2) })
	if ts := typeStatus(s, "envoy-nack", "clusters"); ts.NackError != "" {
		t.Errorf("NACK still shown after the next version was ACKed: %+v", ts)
	}
}

func TestDeltaAndPerTypeServices(t *testing.T) {
	s, cc := startServer(t, testState())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Delta ADS: clusters, named as gRPC does.
	ds, err := discovery.NewAggregatedDiscoveryServiceClient(cc).DeltaAggregatedResources(ctx)
	if err != nil {
		t.Fatal(err)
	}
	name := "grpc.demo.svc.clusterset.local:50051"
	if err := ds.Send(&discovery.DeltaDiscoveryRequest{Node: &core.Node{Id: "grpc-delta"}, TypeUrl: resourcev3.ClusterType, ResourceNamesSubscribe: []string{name}}); err != nil {
		t.Fatal(err)
	}
	resp, err := ds.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Resources) != 1 || resp.Resources[0].Name != name {
		t.Fatalf("delta response: %v", resp.Resources)
	}
	if err := ds.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: resp.Nonce}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "the delta ACK", func() bool {
		ts := typeStatus(s, "grpc-delta", "clusters")
		return ts.Acked != "" && ts.Acked == ts.Sent
	})
	if err := ds.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resourcev3.ClusterType, ResponseNonce: "bogus", ErrorDetail: &rpcstatus.Status{Message: "delta refused"}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, s, "the delta NACK", func() bool { return typeStatus(s, "grpc-delta", "clusters").NackError == "delta refused" })

	// The per-type listener service, state of the world.
	ls, err := listenerservice.NewListenerDiscoveryServiceClient(cc).StreamListeners(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := ls.Send(&discovery.DiscoveryRequest{Node: &core.Node{Id: "lds-only"}, TypeUrl: resourcev3.ListenerType}); err != nil {
		t.Fatal(err)
	}
	lr, err := ls.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if lr.VersionInfo != s.Versions()[resourcev3.ListenerType] || len(lr.Resources) != 7 {
		t.Errorf("LDS: version %s with %d listeners, want %s with 7", lr.VersionInfo, len(lr.Resources), s.Versions()[resourcev3.ListenerType])
	}
}

func TestListenRefusesNonLocalAddresses(t *testing.T) {
	s := NewServer(nil)
	for _, addr := range []string{"0.0.0.0:18000", "10.0.0.1:18000", "example.com:18000", "relative/xds.sock", "unix:rel.sock", "127.0.0.1:18000", "[::1]:18000", "localhost:18000", "127.0.0.1:0"} {
		if lis, err := s.Listen(addr); err == nil {
			lis.Close()
			t.Errorf("Listen(%q) succeeded, want a refusal", addr)
		} else if !strings.Contains(err.Error(), "ingress.xds.listen") || !strings.Contains(err.Error(), addr) {
			t.Errorf("Listen(%q): %v, want an error naming the field and the value", addr, err)
		}
	}
}
