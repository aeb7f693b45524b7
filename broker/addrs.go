package broker

import (
	"fmt"
	"net"
	"net/netip"
)

// selfAddresses are the broker's own addresses, which no cluster's CIDRs may cover
// (admission.CheckReachable): Config.SelfAddresses when set, else the listen address when it is
// a specific IP, else every address of the host's interfaces.
func (s *Server) selfAddresses() ([]netip.Addr, error) {
	if s.cfg.SelfAddresses != nil {
		return s.cfg.SelfAddresses()
	}
	host, _, err := net.SplitHostPort(s.cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen address %q: %v", s.cfg.Listen, err)
	}
	if a, err := netip.ParseAddr(host); err == nil && !a.IsUnspecified() {
		return []netip.Addr{a.Unmap()}, nil
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("interface addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, ip.Unmap())
			}
		}
	}
	return out, nil
}
