// Package drivers links every cable driver into a binary: importing it registers them all. A new
// driver is one folder under cable/ and one import line here (as CoreDNS's plugin list).
package drivers

import (
	_ "github.com/cablemesh/cablemesh/cable/ipsec"      // registers "ipsec"
	_ "github.com/cablemesh/cablemesh/cable/vxlan"      // registers "vxlan"
	_ "github.com/cablemesh/cablemesh/cable/vxlanipsec" // registers "vxlan+ipsec"
	_ "github.com/cablemesh/cablemesh/cable/wireguard"  // registers "wireguard"
)
