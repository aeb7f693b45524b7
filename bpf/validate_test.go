package bpf

import (
	"net/netip"
	"strings"
	"testing"
)

func TestInvalidServicesAreRefusedNamingTheServiceAndTheField(t *testing.T) {
	ok := be("10.1.0.1", 8080, 1)
	many := make([]Backend, MaxBackendsPerService+1)
	for i := range many {
		many[i] = Backend{Addr: netip.AddrFrom4([4]byte{10, 9, byte(i >> 8), byte(i)}), Port: 80}
	}
	tests := []struct {
		name     string
		services []Service
		want     string
	}{
		{"a service without a VIP", []Service{{Port: 80, Proto: TCP}}, "service[0] <no address>:80/tcp: VIP: no address"},
		{"an unspecified VIP", []Service{svc("0.0.0.0", 80, TCP)}, "VIP: 0.0.0.0 is not a unicast address"},
		{"a zoned VIP", []Service{{VIP: ip("fe80::1%eth0"), Port: 80, Proto: TCP}}, "zoned addresses are not supported"},
		{"port 0", []Service{svc("241.0.0.1", 0, TCP, ok)}, "service[0] 241.0.0.1:0/tcp: port 0 is not a service port"},
		{"an unknown protocol", []Service{svc("241.0.0.1", 80, Proto(1), ok)}, "protocol proto(1): want tcp, udp or sctp"},
		{"a backend on port 0", []Service{svc("241.0.0.1", 80, TCP, be("10.1.0.1", 0, 1))}, "backend[0] 10.1.0.1: port 0 is not a backend port"},
		{"a backend without an address", []Service{svc("241.0.0.1", 80, TCP, ok, Backend{Port: 80})}, "backend[1]: address: no address"},
		{"an IPv6 backend of an IPv4 VIP", []Service{svc("241.0.0.1", 80, TCP, be("fd00::1", 80, 1))}, "backend[0] fd00::1: address family differs from the VIP's"},
		{"the same backend twice", []Service{svc("241.0.0.1", 80, TCP, ok, ok)}, "backend[1] 10.1.0.1:8080: same address and port as backend[0]"},
		{"the same service twice", []Service{svc("241.0.0.1", 80, TCP), svc("::ffff:241.0.0.1", 80, TCP)}, "service[1] 241.0.0.1:80/tcp: same VIP, port and protocol as service[0]"},
		{"too many backends", []Service{{VIP: ip("241.0.0.1"), Port: 80, Proto: TCP, Backends: many}}, "service[0] 241.0.0.1:80/tcp: 1025 backends, at most 1024"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := planSync(newTables(), tt.services, bigCapacity)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want it to say %q", err, tt.want)
			}
		})
	}
}

func TestValidServicesAreNormalizedToUnmappedAddresses(t *testing.T) {
	got, err := normalizeServices([]Service{svc("::ffff:241.0.0.1", 80, UDP, be("::ffff:10.1.0.1", 53, 3))})
	if err != nil {
		t.Fatal(err)
	}
	if got[0].VIP != ip("241.0.0.1") || got[0].Backends[0].Addr != ip("10.1.0.1") {
		t.Errorf("normalized: %v", got)
	}
}

func TestEndpointsToDestroyAreChecked(t *testing.T) {
	for _, tt := range []struct {
		name string
		eps  []Endpoint
		want string
	}{
		{"an endpoint without an address", []Endpoint{{Port: 80, Proto: TCP}}, "endpoint[0]: address: no address"},
		{"an endpoint on port 0", []Endpoint{{Addr: ip("10.0.0.1"), Proto: TCP}}, "endpoint[0] 10.0.0.1: port 0"},
		{"an endpoint without a protocol", []Endpoint{{Addr: ip("10.0.0.1"), Port: 80}}, "protocol proto(0)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := normalizeEndpoints(tt.eps); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err %v, want it to say %q", err, tt.want)
			}
		})
	}
}
