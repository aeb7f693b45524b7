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
//	xdsgrpc secrets -target T -node ID          fetch the SDS secrets over ADS from the xDS server
//	     [-duration 5s]                         at gRPC target T (unix:///PATH or HOST:PORT) as
//	                                           node ID; prints one JSON object {"cert": PEM,
//	                                           "key": PEM} of the TLS certificate secret served
//	                                           (the netns tests run it as an unprivileged uid)
//	xdsgrpc heartbeat -target BROKER -node ID   one Agent.Heartbeat of node ID at the broker,
//	     -cert F -key F -ca F                   presenting certificate F and key F, verifying
//	                                           the broker with CA bundle F; prints "ok"
//
// Exit codes: 0 ok, 1 failure, 2 bad usage.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	tlsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	client "github.com/envoyproxy/go-control-plane/pkg/client/sotw/v3"
	resourcev3 "github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	_ "google.golang.org/grpc/xds" // the xds:/// resolver and the xDS balancers

	apiv1 "github.com/cablemesh/cablemesh/api/v1"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: xdsgrpc serve|call|secrets|heartbeat [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	listen := fs.String("listen", "", "serve: IP:PORT")
	name := fs.String("name", "", "serve: the backend's name")
	fs.StringVar(name, "node", "", "secrets, heartbeat: the node ID")
	certFile := fs.String("cert", "", "heartbeat: client certificate PEM file")
	keyFile := fs.String("key", "", "heartbeat: its key PEM file")
	caFile := fs.String("ca", "", "heartbeat: CA bundle PEM file")
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
	case "secrets":
		err = secrets(*target, *name, *duration)
	case "heartbeat":
		err = heartbeat(*target, *name, *certFile, *keyFile, *caFile)
	default:
		fmt.Fprintln(os.Stderr, "usage: xdsgrpc serve|call|secrets|heartbeat [flags]")
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

// secrets fetches the SDS secrets with go-control-plane's ADS client and prints the TLS
// certificate one.
func secrets(target, node string, timeout time.Duration) error {
	cc, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c := client.NewADSClient(ctx, &core.Node{Id: node}, resourcev3.SecretType)
	if err := c.InitConnect(cc); err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	type result struct {
		resp *client.Response
		err  error
	}
	ch := make(chan result, 1)
	go func() {
		r, err := c.Fetch()
		ch <- result{r, err}
	}()
	var r result
	select {
	case r = <-ch:
	case <-ctx.Done():
		return fmt.Errorf("fetch secrets: %w", ctx.Err())
	}
	if r.err != nil {
		return fmt.Errorf("fetch secrets: %w", r.err)
	}
	for _, a := range r.resp.Resources {
		var sec tlsv3.Secret
		if err := a.UnmarshalTo(&sec); err != nil {
			return err
		}
		if tc := sec.GetTlsCertificate(); tc != nil {
			return json.NewEncoder(os.Stdout).Encode(map[string]string{
				"name": sec.GetName(), "cert": string(tc.GetCertificateChain().GetInlineBytes()), "key": string(tc.GetPrivateKey().GetInlineBytes()),
			})
		}
	}
	return fmt.Errorf("no TLS certificate secret among %d resources", len(r.resp.Resources))
}

// heartbeat makes one Agent.Heartbeat at the broker with the given client certificate.
func heartbeat(target, node, certFile, keyFile, caFile string) error {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return err
	}
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	host, _, err := net.SplitHostPort(target)
	if err != nil {
		return err
	}
	tc := &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, ServerName: host, MinVersion: tls.VersionTLS12}
	cc, err := grpc.NewClient("passthrough:///"+target, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := apiv1.NewAgentClient(cc).Heartbeat(ctx, &apiv1.HeartbeatRequest{Node: node}); err != nil {
		return err
	}
	fmt.Println("ok")
	return nil
}
