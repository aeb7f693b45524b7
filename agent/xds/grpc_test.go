package xds

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/xds"
)

// startBackend serves gRPC health on addr, naming itself in the "backend" header.
func startBackend(t *testing.T, addr, name string) {
	t.Helper()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("backend", name))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(lis)
	t.Cleanup(s.Stop)
}

// TestGRPCXDSClientFollowsTheServedEndpoints runs grpc-go's own xDS client against the server:
// it resolves xds:///grpc.demo.svc.clusterset.local:50051 from the API listener, route,
// cluster and load assignment alone, and its RPCs follow the ready endpoints as they change.
func TestGRPCXDSClientFollowsTheServedEndpoints(t *testing.T) {
	// Two backends on one port of two loopback addresses (the export has one target port).
	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := probe.Addr().(*net.TCPAddr).Port
	probe.Close()
	startBackend(t, fmt.Sprintf("127.0.0.1:%d", port), "one")
	startBackend(t, fmt.Sprintf("127.0.0.2:%d", port), "two")

	state := func(eps ...Endpoint) State {
		return State{Cluster: "west", MeshDomain: "cablemesh.local", Services: []Service{{Namespace: "demo", Name: "grpc",
			Ports: []Port{{Name: "grpc", Port: 50051, TargetPort: uint32(port), Protocol: "TCP"}}, Endpoints: eps}}}
	}
	s := NewServer(nil)
	sock := filepath.Join(t.TempDir(), "xds.sock")
	lis, err := s.Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(lis)
	t.Cleanup(s.Close)
	ctx := context.Background()
	if _, err := s.Update(ctx, state(Endpoint{IP: "127.0.0.1", Ready: true})); err != nil {
		t.Fatal(err)
	}
	bootstrap := fmt.Sprintf(`{"xds_servers":[{"server_uri":"unix://%s","channel_creds":[{"type":"insecure"}],"server_features":["xds_v3"]}],"node":{"id":"grpc-unit","locality":{}}}`, sock)
	rb, err := xds.NewXDSResolverWithConfigForTesting([]byte(bootstrap))
	if err != nil {
		t.Fatal(err)
	}
	cc, err := grpc.NewClient("xds:///grpc.demo.svc.clusterset.local:50051", grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithResolvers(rb))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	backend := func() string {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		var md metadata.MD
		if _, err := hc.Check(cctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md)); err != nil {
			return "error: " + err.Error()
		}
		return md.Get("backend")[0]
	}
	// until waits until the calls reach exactly want, and says how long that took.
	until := func(what string, want ...string) time.Duration {
		t.Helper()
		start := time.Now()
		for time.Since(start) < 10*time.Second {
			seen := map[string]bool{}
			for range 8 {
				seen[backend()] = true
			}
			ok := len(seen) == len(want)
			for _, w := range want {
				ok = ok && seen[w]
			}
			if ok {
				return time.Since(start)
			}
		}
		t.Fatalf("%s: RPCs never reached exactly %v", what, want)
		return 0
	}
	until("first endpoint", "one")
	if _, err := s.Update(ctx, state(Endpoint{IP: "127.0.0.1", Ready: true}, Endpoint{IP: "127.0.0.2", Ready: true})); err != nil {
		t.Fatal(err)
	}
	t.Logf("second endpoint added: RPCs reach both after %v", until("second endpoint added", "one", "two"))
	if _, err := s.Update(ctx, state(Endpoint{IP: "127.0.0.1", Ready: false}, Endpoint{IP: "127.0.0.2", Ready: true})); err != nil {
		t.Fatal(err)
	}
	t.Logf("first endpoint un-readied: RPCs reach two alone after %v", until("first endpoint un-readied", "two"))
	if _, err := s.Update(ctx, state(Endpoint{IP: "127.0.0.1", Ready: true})); err != nil {
		t.Fatal(err)
	}
	t.Logf("second endpoint removed: RPCs reach one alone after %v", until("second endpoint removed", "one"))
	waitFor(t, s, "grpc-go's ACK of the current endpoints", func() bool {
		return typeStatus(s, "grpc-unit", "endpoints").Acked == s.Versions()["type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"]
	})
}
