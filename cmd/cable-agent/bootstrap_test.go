package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	bootstrap "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3" // resolves the bootstrap's typed options
	"google.golang.org/protobuf/encoding/protojson"
	"sigs.k8s.io/yaml"
)

func TestEnvoyBootstrapParsesAsAnEnvoyBootstrapAndPointsAtTheAgent(t *testing.T) {
	dir := t.TempDir()
	base := "cluster: east\nnode: gw1\nbroker: 127.0.0.1:1\nstateDir: " + dir + "\n"
	for _, tc := range []struct {
		name, listen string
		check        func(*bootstrap.Bootstrap) string
	}{
		{"a unix socket", "/run/cablemesh/xds.sock", func(b *bootstrap.Bootstrap) string {
			return b.GetStaticResources().GetClusters()[0].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath()
		}},
		{"a unix: socket", "unix:/run/x/xds.sock", func(b *bootstrap.Bootstrap) string {
			return "unix:" + b.GetStaticResources().GetClusters()[0].GetLoadAssignment().GetEndpoints()[0].GetLbEndpoints()[0].GetEndpoint().GetAddress().GetPipe().GetPath()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(dir, "agent.yaml")
			if err := os.WriteFile(cfg, []byte(base+"ingress: {mode: envoy, xds: {listen: \""+tc.listen+"\"}}\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			var out, stderr bytes.Buffer
			if code := envoyBootstrap([]string{"--config", cfg}, &out, &stderr); code != 0 {
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			js, err := yaml.YAMLToJSON(out.Bytes())
			if err != nil {
				t.Fatalf("output is not YAML: %v\n%s", err, out.String())
			}
			var b bootstrap.Bootstrap
			if err := (protojson.UnmarshalOptions{}).Unmarshal(js, &b); err != nil {
				t.Fatalf("output is not an Envoy bootstrap: %v\n%s", err, out.String())
			}
			if err := b.ValidateAll(); err != nil {
				t.Fatalf("bootstrap does not validate: %v", err)
			}
			if got := tc.check(&b); got != tc.listen {
				t.Errorf("xDS cluster address %q, want %q", got, tc.listen)
			}
			if b.GetNode().GetId() != "gw1-ingress" || b.GetNode().GetCluster() != "east" {
				t.Errorf("node %v", b.GetNode())
			}
			if b.GetDynamicResources().GetLdsConfig().GetAds() == nil || b.GetDynamicResources().GetCdsConfig().GetAds() == nil ||
				b.GetDynamicResources().GetAdsConfig().GetGrpcServices()[0].GetEnvoyGrpc().GetClusterName() != "cablemesh-xds" {
				t.Errorf("dynamic resources do not come over ADS from the agent: %v", b.GetDynamicResources())
			}
		})
	}
}

func TestEnvoyBootstrapRefusals(t *testing.T) {
	dir := t.TempDir()
	base := "cluster: east\nnode: gw1\nbroker: 127.0.0.1:1\nstateDir: " + dir + "\n"
	n := 0
	write := func(body string) string {
		n++
		p := filepath.Join(dir, fmt.Sprintf("c%d.yaml", n))
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"no --config", nil, "usage"},
		{"no xDS server configured", []string{"--config", write(base)}, "ingress.xds.listen is not set"},
		{"a TCP xDS address", []string{"--config", write(base + "ingress: {xds: {listen: \"0.0.0.0:18000\"}}\n")}, `ingress.xds.listen: "0.0.0.0:18000" is a TCP address`},
		{"a loopback TCP xDS address", []string{"--config", write(base + "ingress: {xds: {listen: \"127.0.0.1:18000\"}}\n")}, `ingress.xds.listen: "127.0.0.1:18000" is a TCP address`},
		{"a non-loopback admin address", []string{"--config", write(base + "ingress: {xds: {listen: /run/x.sock}}\n"), "--admin-address", "0.0.0.0:9901"}, `admin address "0.0.0.0:9901" is not a loopback`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, stderr bytes.Buffer
			if code := envoyBootstrap(tc.args, &out, &stderr); code != 2 {
				t.Errorf("exit %d, want 2", code)
			}
			if !strings.Contains(stderr.String(), tc.want) || out.Len() != 0 {
				t.Errorf("stderr %q (want %q), stdout %q", stderr.String(), tc.want, out.String())
			}
		})
	}
}
