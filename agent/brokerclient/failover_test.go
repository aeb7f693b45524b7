package brokerclient

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
)

func TestSplitAddresses(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
		wantErr  string
	}{
		{"one address", "10.0.0.1:7443", []string{"10.0.0.1:7443"}, ""},
		{"two replicas", "10.0.0.1:7443,broker-b.example:7443", []string{"10.0.0.1:7443", "broker-b.example:7443"}, ""},
		{"IPv6", "[fd00::1]:7443,[fd00::2]:7443", []string{"[fd00::1]:7443", "[fd00::2]:7443"}, ""},
		{"no port", "10.0.0.1", nil, "is not host:port"},
		{"an empty entry", "10.0.0.1:7443,", nil, `"" is not host:port`},
		{"spaces around an entry", "10.0.0.1:7443, 10.0.0.2:7443 ", []string{"10.0.0.1:7443", "10.0.0.2:7443"}, ""},
		{"a port out of range", "10.0.0.1:70000", nil, "no valid port"},
		{"a duplicate", "10.0.0.1:7443,10.0.0.1:7443", nil, "listed twice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := SplitAddresses(tt.in)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("%v %v, want %v", got, err, tt.want)
			}
		})
	}
}

// TestSeveralBrokersFailOver: with a dead address and two live replicas in the list, calls
// succeed and spread over both; when one stops, calls go to the other: at most the one call in
// flight fails.
func TestSeveralBrokersFailOver(t *testing.T) {
	serve := func() (*grpc.Server, string) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		s := grpc.NewServer()
		healthpb.RegisterHealthServer(s, health.NewServer())
		go s.Serve(lis)
		t.Cleanup(s.Stop)
		return s, lis.Addr().String()
	}
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	dead.Close()
	s1, a1 := serve()
	_, a2 := serve()
	target, opts, err := dialTarget(deadAddr + "," + a1 + "," + a2)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(target, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	check := func() (string, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var p peer.Peer
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Peer(&p))
		if err != nil {
			return "", err
		}
		return p.Addr.String(), nil
	}
	seen := map[string]bool{}
	deadline := time.Now().Add(5 * time.Second)
	for len(seen) < 2 && time.Now().Before(deadline) {
		a, err := check()
		if err != nil {
			t.Fatalf("check through %s: %v", target, err)
		}
		seen[a] = true
	}
	if !seen[a1] || !seen[a2] || seen[deadAddr] {
		t.Fatalf("calls went to %v; want both live replicas", seen)
	}
	s1.Stop()
	failures := 0
	for i := 0; i < 20; i++ {
		a, err := check()
		if err != nil {
			failures++
			continue
		}
		if a != a2 {
			t.Fatalf("call %d went to %s after it stopped", i, a)
		}
	}
	if failures > 1 {
		t.Fatalf("%d of 20 calls failed after one replica stopped; want at most the one in flight", failures)
	}
}
