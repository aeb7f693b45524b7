package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestBadUsageExitsTwoBeforeTouchingTheDataDir(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"an unknown default cable driver", []string{"--data-dir", "/nonexistent/x", "--default-cable-driver", "gre"}, `default cable driver "gre" is not one of ipsec, vxlan, vxlan+ipsec, wireguard`},
		{"no data dir", []string{"--default-cable-driver", "vxlan"}, "--data-dir is required"},
		{"a lease under a second", []string{"--data-dir", "/nonexistent/x", "--lease", "10ms"}, "shorter than 1s"},
		{"an agent certificate lifetime under a second", []string{"--data-dir", "/nonexistent/x", "--agent-certificate-lifetime", "500ms"}, "--agent-certificate-lifetime: agent certificate lifetime 500ms is outside 1s to 8760h0m0s"},
		{"an agent certificate lifetime over a year", []string{"--data-dir", "/nonexistent/x", "--agent-certificate-lifetime", "9000h"}, "--agent-certificate-lifetime: agent certificate lifetime 9000h0m0s is outside 1s to 8760h0m0s"},
		{"a VIP range that is not a CIDR", []string{"--data-dir", "/nonexistent/x", "--service-vip-range", "241.0.0.0"}, `--service-vip-range: service VIP range "241.0.0.0" is not a CIDR`},
		{"a VIP range with host bits", []string{"--data-dir", "/nonexistent/x", "--service-vip-range", "241.0.0.1/8"}, "--service-vip-range: service VIP range \"241.0.0.1/8\" has host bits set (did you mean 241.0.0.0/8?)"},
		{"two IPv4 VIP ranges", []string{"--data-dir", "/nonexistent/x", "--service-vip-range", "241.0.0.0/8,242.0.0.0/8"}, "--service-vip-range: service VIP range \"241.0.0.0/8,242.0.0.0/8\": give at most one IPv4 and one IPv6 CIDR"},
		{"a mesh address range that is IPv6", []string{"--data-dir", "/nonexistent/x", "--mesh-address-range", "fd00::/64"}, `--mesh-address-range fd00::/64: mesh address range "fd00::/64" is not IPv4`},
		{"a mesh address range too small", []string{"--data-dir", "/nonexistent/x", "--mesh-address-range", "242.0.0.0/31"}, `--mesh-address-range 242.0.0.0/31: mesh address range "242.0.0.0/31": the prefix length must be /8 to /30`},
		{"a mesh address range inside the VIP range", []string{"--data-dir", "/nonexistent/x", "--mesh-address-range", "241.1.0.0/16"}, "--mesh-address-range 241.1.0.0/16: mesh address range 241.1.0.0/16 overlaps the service VIP range 241.0.0.0/8"},
		{"a VIP range over the default mesh address range", []string{"--data-dir", "/nonexistent/x", "--service-vip-range", "240.0.0.0/4"}, "--mesh-address-range 242.0.0.0/16: mesh address range 242.0.0.0/16 overlaps the service VIP range 240.0.0.0/4"},
		{"a stray argument", []string{"--data-dir", "/nonexistent/x", "extra"}, "unexpected arguments"},
		{"an etcd endpoint that is not a URL", []string{"--data-dir", "/nonexistent/x", "--etcd-endpoints", "10.0.0.1:2379"}, `--etcd-endpoints: "10.0.0.1:2379" is not http(s)://host:port`},
		{"an etcd prefix without its slashes", []string{"--data-dir", "/nonexistent/x", "--etcd-endpoints", "http://10.0.0.1:2379", "--etcd-prefix", "mesh"}, `--etcd-prefix "mesh": must start and end with /`},
		{"an HA flag without etcd", []string{"--data-dir", "/nonexistent/x", "--advertise-address", "10.0.0.1:7443"}, "need --etcd-endpoints"},
		{"a cluster quota of 0", []string{"--data-dir", "/nonexistent/x", "--max-endpoints-per-cluster", "0"}, "--max-endpoints-per-cluster 0"},
		{"a negative cluster quota", []string{"--data-dir", "/nonexistent/x", "--max-services-per-cluster", "-1"}, "--max-services-per-cluster -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stderr bytes.Buffer
			if code := run(tt.args, &stderr); code != 2 || !strings.Contains(stderr.String(), tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr.String(), tt.want)
			}
		})
	}
}

func TestAGoodVIPRangeGetsPastTheFlags(t *testing.T) {
	// The data dir cannot be created, so the broker fails to start (exit 1): the flags were fine.
	var stderr bytes.Buffer
	code := run([]string{"--data-dir", "/proc/cablemesh-test/x", "--service-vip-range", "241.0.0.0/8, fd00:241::/64"}, &stderr)
	if code != 1 || strings.Contains(stderr.String(), "--service-vip-range") {
		t.Fatalf("exit %d, stderr %q; want 1 from the data dir, nothing about the range", code, stderr.String())
	}
}
