// Command xdsgrpc is the xDS netns test's gRPC program, run inside a namespace:
//
//	xdsgrpc serve -listen IP:PORT -name NAME   a gRPC server (the standard health service) that
//	                                           names itself in the "backend" response header;
//	                                           prints "listening ADDR" once bound
//	xdsgrpc call -target xds:///HOST:PORT       a proxyless gRPC client: grpc-go's xDS resolver
//	     [-interval 20ms] [-duration 60s]       and balancer, configured only by what the xDS
//	                                           server in GRPC_XDS_BOOTSTRAP_CONFIG serves; one
//	                                           health Check per interval, each printed as a JSON
//	                                           line {"at": unix ms, "backend": NAME, "err": ...}
//
// Exit codes: 0 ok, 1 failure, 2 bad usage.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and the xDS balancers
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: xdsgrpc serve|call [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", "", "serve: IP:PORT")
	name := fs.String("name", "", "serve: the backend's name")
	target := fs.String("target", "", "call: xds:///HOST:PORT")
	interval := fs.Duration("interval", 20*time.Millisecond, "call: time between calls")
	duration := fs.Duration("duration", time.Minute, "call: how long to call")
	_ = fs.Parse(os.Args[2:])
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(*listen, *name)
	case "call":
		err = call(*target, *interval, *duration)
	default:
		fmt.Fprintln(os.Stderr, "usage: xdsgrpc serve|call [flags]")
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "xdsgrpc:", err)
		os.Exit(1)
	}
}

func serve(listen, name string) error {
	lis, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		_ = grpc.SetHeader(ctx, metadata.Pairs("backend", name))
		return h(ctx, req)
	}))
	healthpb.RegisterHealthServer(s, health.NewServer())
	fmt.Println("listening", lis.Addr())
	return s.Serve(lis)
}

type line struct {
	At      int64  `json:"at"` // unix milliseconds, when the call returned
	Backend string `json:"backend,omitempty"`
	Err     string `json:"err,omitempty"`
}

func call(target string, interval, duration time.Duration) error {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	hc := healthpb.NewHealthClient(cc)
	start := time.Now()
	enc := json.NewEncoder(os.Stdout)
	for time.Since(start) < duration {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		var md metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&md))
		cancel()
		l := line{At: time.Now().UnixMilli()}
		if err != nil {
			l.Err = err.Error()
		} else if b := md.Get("backend"); len(b) > 0 {
			l.Backend = b[0]
		}
		_ = enc.Encode(l)
		time.Sleep(interval)
	}
	return nil
}
