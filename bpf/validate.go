package bpf

import (
	"fmt"
	"net/netip"
)

// normalizeServices checks services before anything is written and returns them in the form
// the maps hold: IPv4-mapped IPv6 addresses become IPv4 (the maps key IPv4 by its mapped form,
// so both spellings are one service). Errors name the service and the field.
func normalizeServices(services []Service) ([]Service, error) {
	out := make([]Service, 0, len(services))
	seen := make(map[svcKey]int, len(services))
	for i, s := range services {
		n, err := normalizeService(s)
		if err != nil {
			return nil, fmt.Errorf("service[%d] %s: %w", i, s, err)
		}
		if j, dup := seen[n.key()]; dup {
			return nil, fmt.Errorf("service[%d] %s: same VIP, port and protocol as service[%d]", i, n, j)
		}
		seen[n.key()] = i
		out = append(out, n)
	}
	return out, nil
}

func normalizeService(s Service) (Service, error) {
	vip, err := normalizeAddr(s.VIP)
	if err != nil {
		return Service{}, fmt.Errorf("VIP: %w", err)
	}
	if s.Port == 0 {
		return Service{}, fmt.Errorf("port 0 is not a service port")
	}
	if !s.Proto.valid() {
		return Service{}, fmt.Errorf("protocol %s: want tcp, udp or sctp", s.Proto)
	}
	if len(s.Backends) > MaxBackendsPerService {
		return Service{}, fmt.Errorf("%d backends, at most %d", len(s.Backends), MaxBackendsPerService)
	}
	n := Service{VIP: vip, Port: s.Port, Proto: s.Proto, Backends: make([]Backend, 0, len(s.Backends))}
	seen := make(map[netip.AddrPort]int, len(s.Backends))
	for i, b := range s.Backends {
		addr, err := normalizeAddr(b.Addr)
		if err != nil {
			return Service{}, fmt.Errorf("backend[%d]: address: %w", i, err)
		}
		// The hooks rewrite the destination within one address family.
		if addr.Is4() != vip.Is4() {
			return Service{}, fmt.Errorf("backend[%d] %s: address family differs from the VIP's", i, addr)
		}
		if b.Port == 0 {
			return Service{}, fmt.Errorf("backend[%d] %s: port 0 is not a backend port", i, addr)
		}
		ap := netip.AddrPortFrom(addr, b.Port)
		if j, dup := seen[ap]; dup {
			return Service{}, fmt.Errorf("backend[%d] %s: same address and port as backend[%d]", i, ap, j)
		}
		seen[ap] = i
		n.Backends = append(n.Backends, Backend{Addr: addr, Port: b.Port, ClusterID: b.ClusterID})
	}
	return n, nil
}

// normalizeAddr accepts a unicast IPv4 or IPv6 address without a zone.
func normalizeAddr(a netip.Addr) (netip.Addr, error) {
	if !a.IsValid() {
		return netip.Addr{}, fmt.Errorf("no address")
	}
	if a.Zone() != "" {
		return netip.Addr{}, fmt.Errorf("%s: zoned addresses are not supported", a)
	}
	a = a.Unmap()
	if a.IsUnspecified() || a.IsMulticast() {
		return netip.Addr{}, fmt.Errorf("%s is not a unicast address", a)
	}
	return a, nil
}

// normalizeEndpoints checks the endpoints given to DestroySockets.
func normalizeEndpoints(eps []Endpoint) ([]Endpoint, error) {
	out := make([]Endpoint, 0, len(eps))
	for i, e := range eps {
		addr, err := normalizeAddr(e.Addr)
		if err != nil {
			return nil, fmt.Errorf("endpoint[%d]: address: %w", i, err)
		}
		if e.Port == 0 {
			return nil, fmt.Errorf("endpoint[%d] %s: port 0 is not a port", i, addr)
		}
		if !e.Proto.valid() {
			return nil, fmt.Errorf("endpoint[%d] %s: protocol %s: want tcp, udp or sctp", i, addr, e.Proto)
		}
		out = append(out, Endpoint{Addr: addr, Port: e.Port, Proto: e.Proto})
	}
	return out, nil
}
