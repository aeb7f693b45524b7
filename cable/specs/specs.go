// Package specs links every cable driver's spec into a binary: importing it registers them all,
// without any datapath (no WireGuard, strongSwan or netlink code). The broker, the policy tools
// and cablectl import it; the agent imports cable/drivers, which registers the datapaths too. A
// new driver is one import line here and one in cable/drivers.
package specs

import (
	_ "github.com/cablemesh/cablemesh/cable/ipsec/spec"      // registers "ipsec"
	_ "github.com/cablemesh/cablemesh/cable/vxlan/spec"      // registers "vxlan"
	_ "github.com/cablemesh/cablemesh/cable/vxlanipsec/spec" // registers "vxlan+ipsec"
	_ "github.com/cablemesh/cablemesh/cable/wireguard/spec"  // registers "wireguard"
)
