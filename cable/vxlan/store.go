package vxlan

import (
	"fmt"

	"github.com/cablemesh/cablemesh/internal/statefile"
)

// connections is the driver's connections.json in dir (StateDir/vxlan): the remote clusters and
// what Connect installed for them. Kernel VXLAN links, FDB entries and routes survive an agent
// restart, but the kernel knows no cluster names: this file lets Init tell our entries from
// stale ones and lets Connections name each connection.
func connections(dir string) statefile.Store[conn] {
	return statefile.Store[conn]{Driver: Name, Dir: dir, Check: checkConn}
}

// checkConn validates one record of connections.json: everything Init and Connections rely on is
// checked, so a damaged file is an error instead of a wrong deletion.
func checkConn(cluster string, c conn) error {
	switch {
	case c.Device == "" || len(c.Device) > 15:
		return fmt.Errorf("cluster %s: device %q is not a link name", cluster, c.Device)
	case c.VNI < 1 || c.VNI > MaxVNI:
		return fmt.Errorf("cluster %s: vni %d out of range", cluster, c.VNI)
	case c.Port < 1 || c.Port > 65535 || c.DstPort < 1 || c.DstPort > 65535:
		return fmt.Errorf("cluster %s: port %d / dstPort %d out of range", cluster, c.Port, c.DstPort)
	case c.MTU < MinMTU || c.MTU > MaxMTU:
		return fmt.Errorf("cluster %s: mtu %d out of range", cluster, c.MTU)
	}
	if _, err := VTEPAddr(c.Address); err != nil {
		return fmt.Errorf("cluster %s: %w", cluster, err)
	}
	for _, p := range c.Subnets {
		if !p.IsValid() || !p.Addr().Is4() {
			return fmt.Errorf("cluster %s: subnet %s is not an IPv4 CIDR", cluster, p)
		}
	}
	for _, p := range c.LocalSubnets {
		if !p.IsValid() || !p.Addr().Is4() {
			return fmt.Errorf("cluster %s: local subnet %s is not an IPv4 CIDR", cluster, p)
		}
	}
	return nil
}
