package main

import (
	"flag"
	"fmt"
	"io"

	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"

	"github.com/cablemesh/cablemesh/agent/config"
	"github.com/cablemesh/cablemesh/agent/xds"
)

// envoyBootstrap is `cable-agent envoy-bootstrap --config FILE`: it prints, as YAML on stdout,
// the bootstrap of the Envoy that runs beside this agent as its ingress: ADS from the agent's
// xDS server (ingress.xds.listen), node id "<node>-ingress" and cluster the agent's cluster.
// Exit 2 for bad usage or a config without ingress.xds.listen.
func envoyBootstrap(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cable-agent envoy-bootstrap", flag.ContinueOnError)
	fs.SetOutput(stderr)
	configPath := fs.String("config", "", "agent config file")
	admin := fs.String("admin-address", "127.0.0.1:9901", "Envoy's admin listener, a loopback ip:port (\"\" for none)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *configPath == "" || fs.NArg() > 0 {
		fmt.Fprintln(stderr, "cable-agent: usage: cable-agent envoy-bootstrap --config FILE [--admin-address IP:PORT]")
		return 2
	}
	cfg, err := config.Load(*configPath)
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent:", err)
		return 2
	}
	if cfg.Ingress.XDS.Listen == "" {
		fmt.Fprintf(stderr, "cable-agent: agent config %s: ingress.xds.listen is not set: the agent serves no xDS for Envoy to use\n", *configPath)
		return 2
	}
	network, address, err := config.ParseXDSListen(cfg.Ingress.XDS.Listen)
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent: ingress.xds.listen:", err)
		return 2
	}
	b, err := xds.Bootstrap(xds.BootstrapOptions{NodeID: cfg.Node + "-ingress", NodeCluster: cfg.Cluster, Network: network, Address: address, AdminAddress: *admin})
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent: --admin-address:", err)
		return 2
	}
	// Envoy's own field names (snake_case), as its documentation writes bootstraps.
	js, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(b)
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent:", err)
		return 1
	}
	y, err := yaml.JSONToYAML(js)
	if err != nil {
		fmt.Fprintln(stderr, "cable-agent:", err)
		return 1
	}
	fmt.Fprint(stdout, "# Envoy bootstrap written by cable-agent envoy-bootstrap: every listener, route, cluster,\n# endpoint and secret comes from the agent over ADS.\n")
	if _, err := stdout.Write(y); err != nil {
		return 1
	}
	return 0
}
