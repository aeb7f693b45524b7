// Command cable-broker runs the Cablemesh broker: the mesh's shared state, join tokens and agent
// certificates, served over gRPC with mTLS.
//
//	cable-broker --data-dir DIR [--listen 0.0.0.0:7443] [--lease 30s] [--log-level info]
//	             [--default-cable-driver ipsec|vxlan|wireguard] [--metrics-listen HOST:PORT]
//	             [--service-vip-range 241.0.0.0/8[,IPv6 CIDR]] [--mesh-address-range 242.0.0.0/16]
//	             [--etcd-endpoints URL[,URL...] [--etcd-prefix /cablemesh/] [--secret-key-file FILE]
//	              [--advertise-address HOST:PORT] [--etcd-cacert F --etcd-cert F --etcd-key F]]
//
// On first start it creates the mesh CA and the mesh secret (from which every cluster pair's
// pre-shared key is derived) in DIR, writes DIR/admin.yaml, the credential cablectl uses
// (cablectl --config DIR/admin.yaml ...), and creates the mesh default connection policy "default":
// every pair connects, full mesh, over --default-cable-driver (any registered cable driver: the
// binary links every driver's spec through cable/specs). Later starts keep the stored default policy
// (change it with `cablectl apply`); a --default-cable-driver that differs from it is logged and
// otherwise ignored.
//
// Every exported service (namespace/name) gets one clusterset VIP from each --service-vip-range
// CIDR (an IPv4 one and optionally an IPv6 one), kept in the store while any cluster exports the
// service, so it is stable across broker restarts and agent reconnects. A VIP that lies outside
// the ranges after they were changed is kept (and logged), never renumbered.
//
// Every gateway endpoint gets a mesh address from --mesh-address-range (IPv4, /8 to /30, disjoint
// from the VIP ranges): the address its cable carries when a pair is in gateway mode. It is kept
// in the node's record, so the node gets the same one back across re-registrations and broker
// restarts; it is released when the node is revoked or its cluster removed. No cluster's pod or
// service CIDR may overlap the range.
//
// With --etcd-endpoints the broker keeps every resource, and the mesh CA and secrets (sealed with
// AES-256-GCM under --secret-key-file, default DIR/secret.key), in etcd instead of DIR/broker.db,
// and several replicas serve the mesh at once. The first replica creates the key file; copy it
// (mode 0600) into every other replica's data dir before starting it. Each replica's
// DIR/admin.yaml lists every replica (--advertise-address, or --listen when it names an IP).
//
// With --metrics-listen the broker serves Prometheus metrics at /metrics, /healthz (the process
// serves) and /readyz (gRPC is serving and the store answers) there, over plain HTTP.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cablemesh/cablemesh/broker"
	"github.com/cablemesh/cablemesh/broker/admission"
	"github.com/cablemesh/cablemesh/broker/meshaddr"
	"github.com/cablemesh/cablemesh/cable"
	_ "github.com/cablemesh/cablemesh/cable/specs" // registers every driver's spec: the default policy's and what endpoints publish are checked against them
	"github.com/cablemesh/cablemesh/mcs"
	"github.com/cablemesh/cablemesh/policy"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stderr))
}

// run is main with its arguments and stderr, returning the exit code (2: bad usage).
func run(args []string, stderr io.Writer) int {
	fs := flag.NewFlagSet("cable-broker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dataDir := fs.String("data-dir", "", "directory for the store, the mesh CA and admin.yaml (required)")
	listen := fs.String("listen", broker.DefaultListen, "address to serve the gRPC API on")
	lease := fs.Duration("lease", broker.DefaultLease, "default endpoint lease; agents heartbeat within it")
	certLifetime := fs.Duration("agent-certificate-lifetime", broker.DefaultAgentCertificateLifetime,
		"how long the agent certificates issued from now on last, "+broker.MinAgentCertificateLifetime.String()+" to "+broker.DefaultAgentCertificateLifetime.String()+"; agents renew two thirds into it")
	logLevel := fs.String("log-level", "info", "log level: debug | info | warn | error")
	defaultDriver := fs.String("default-cable-driver", policy.DefaultDriver, "cable driver of the mesh default policy created at first start: "+
		strings.Join(cable.Names(), " | ")+" (later starts keep the stored policy)")
	vipRange := fs.String("service-vip-range", mcs.DefaultVIPRange, "clusterset VIP range: an IPv4 CIDR, and optionally an IPv6 one after a comma (dual-stack services get one VIP of each)")
	meshRange := fs.String("mesh-address-range", meshaddr.DefaultRange, "IPv4 range gateways' mesh addresses (gateway mode) come from, /8 to /30; must not overlap --service-vip-range, and no cluster CIDR may overlap it")
	etcdEndpoints := fs.String("etcd-endpoints", "", "keep the state in etcd at these client URLs (comma-separated) instead of DIR/broker.db; several replicas may then serve the mesh")
	etcdPrefix := fs.String("etcd-prefix", broker.DefaultEtcdRoot, "key prefix of the mesh in etcd")
	secretKeyFile := fs.String("secret-key-file", "", "key that seals the secrets kept in etcd (default DIR/"+broker.SecretKeyFile+"; every replica needs a copy of the first replica's)")
	advertise := fs.String("advertise-address", "", "host:port at which the other replicas' admin.yaml reach this one (default --listen when it names an IP)")
	etcdCA := fs.String("etcd-cacert", "", "CA bundle verifying etcd's serving certificates (https endpoints)")
	etcdCert := fs.String("etcd-cert", "", "client certificate for etcd")
	etcdKey := fs.String("etcd-key", "", "client key for etcd")
	metricsListen := fs.String("metrics-listen", "", "address to serve /metrics, /healthz and /readyz on over plain HTTP, e.g. 127.0.0.1:9465 (default: none)")
	pprof := fs.Bool("pprof", false, "also serve Go's profiles at /debug/pprof/ on --metrics-listen (they expose the process's internals: keep that address private)")
	linkReports := fs.Duration("link-report-interval", broker.DefaultLinkReportInterval, "how often gateways send the broker their full link report (cablectl links --all; changes go at once, at most one report per node every "+broker.DefaultLinkReportMinInterval.String()+"); a report is stale after three intervals")
	var quota admission.ExportQuota
	fs.IntVar(&quota.Services, "max-services-per-cluster", admission.DefaultQuotaServices, "most services (namespace/name) the nodes of one cluster may export together")
	fs.IntVar(&quota.Endpoints, "max-endpoints-per-cluster", admission.DefaultQuotaEndpoints, "most endpoints the exports of one cluster's nodes may have together")
	fs.IntVar(&quota.ServiceMapEntries, "max-service-map-entries-per-cluster", admission.DefaultQuotaServiceMapEntries,
		"most entries of an importer's load balancer service map the exports of one cluster may need: ports x (endpoints + VIPs) of each export (an importer's map holds 65536 by default)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if quota.Services < 1 || quota.Endpoints < 1 || quota.ServiceMapEntries < 1 {
		fmt.Fprintf(stderr, "cable-broker: --max-services-per-cluster %d, --max-endpoints-per-cluster %d, --max-service-map-entries-per-cluster %d: each must be at least 1\n",
			quota.Services, quota.Endpoints, quota.ServiceMapEntries)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "cable-broker: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *pprof && *metricsListen == "" {
		fmt.Fprintln(stderr, "cable-broker: --pprof needs --metrics-listen (the profiles are served there)")
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(stderr, "cable-broker: --data-dir is required")
		return 2
	}
	if *linkReports < time.Second {
		fmt.Fprintf(stderr, "cable-broker: --link-report-interval %s is shorter than 1s\n", *linkReports)
		return 2
	}
	if *lease < time.Second {
		fmt.Fprintf(stderr, "cable-broker: --lease %s is shorter than 1s\n", *lease)
		return 2
	}
	if err := broker.ValidateAgentCertificateLifetime(*certLifetime); err != nil {
		fmt.Fprintf(stderr, "cable-broker: --agent-certificate-lifetime: %v\n", err)
		return 2
	}
	vipRanges, err := mcs.ParseVIPRanges(*vipRange)
	if err != nil {
		fmt.Fprintf(stderr, "cable-broker: --service-vip-range: %v\n", err)
		return 2
	}
	meshAddrs, err := meshaddr.ParseRange(*meshRange)
	if err == nil {
		err = meshaddr.CheckDisjoint(meshAddrs, vipRanges)
	}
	if err != nil {
		fmt.Fprintf(stderr, "cable-broker: --mesh-address-range %s: %v\n", *meshRange, err)
		return 2
	}
	if err := broker.ValidateDefaultCableDriver(*defaultDriver); err != nil {
		fmt.Fprintf(stderr, "cable-broker: --default-cable-driver: %v\n", err)
		return 2
	}
	// Only a driver given on the command line is compared with the stored default policy: the
	// flag's default value says nothing about what the operator wants on a later start.
	driver := ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "default-cable-driver" {
			driver = *defaultDriver
		}
	})
	var etcdCfg *broker.EtcdConfig
	if *etcdEndpoints != "" {
		etcdCfg, err = broker.ParseEtcdFlags(*etcdEndpoints, *etcdPrefix, *secretKeyFile, *advertise, *etcdCA, *etcdCert, *etcdKey)
		if err != nil {
			fmt.Fprintf(stderr, "cable-broker: %v\n", err)
			return 2
		}
	} else if *advertise != "" || *secretKeyFile != "" || *etcdCA != "" || *etcdCert != "" || *etcdKey != "" {
		fmt.Fprintln(stderr, "cable-broker: --advertise-address, --secret-key-file and --etcd-* need --etcd-endpoints")
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "cable-broker: --log-level %q: want debug, info, warn or error\n", *logLevel)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	// A signal during start-up (a store that does not answer) stops it too.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	srv, err := broker.New(ctx, broker.Config{DataDir: *dataDir, Listen: *listen, Lease: *lease, Logger: log, DefaultCableDriver: driver,
		ServiceVIPRanges: vipRanges, MeshAddressRange: meshAddrs, Etcd: etcdCfg, ExportQuota: quota,
		LinkReportInterval: *linkReports, AgentCertificateLifetime: *certLifetime})
	if err != nil {
		log.Error("start broker", "err", err)
		return 1
	}
	defer srv.Close()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Error("listen", "addr", *listen, "err", err)
		return 1
	}
	if *metricsListen != "" {
		mlis, err := net.Listen("tcp", *metricsListen)
		if err != nil {
			log.Error("listen", "metricsListen", *metricsListen, "err", err)
			return 1
		}
		mctx, stopMetrics := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.ServeMetrics(mctx, mlis, *pprof); err != nil {
				log.Error("metrics", "err", err)
			}
		}()
		defer func() {
			stopMetrics()
			<-done
		}()
	}
	if err := srv.Serve(ctx, lis); err != nil {
		log.Error("serve", "err", err)
		return 1
	}
	log.Info("broker stopped")
	return 0
}
