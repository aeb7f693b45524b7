package wireguard

import (
	"fmt"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// Defaults of the node-level settings (cable.Settings keys in the agent config).
const (
	// DefaultInterface is the name of the WireGuard link.
	DefaultInterface = "cbl-wg0"
	// DefaultPort is the UDP port WireGuard listens on.
	DefaultPort = 51820
	// DefaultKeepalive is the persistent keepalive of every peer: it keeps NAT mappings open and
	// lets the state computed from handshakes stay fresh even on an idle tunnel.
	DefaultKeepalive = 25 * time.Second
	// Overhead is what WireGuard adds to a packet in the worst case (IPv6 outer header 40 + UDP 8 +
	// WireGuard header 16 + auth tag 16); the default MTU is the underlay MTU minus this.
	Overhead = 80
	// MinMTU is the smallest MTU we accept or compute: the IPv6 minimum.
	MinMTU = 1280
	// MaxMTU is the largest MTU we accept.
	MaxMTU = 65535
	// maxKeepalive is the largest persistent keepalive WireGuard takes (whole seconds, 16 bits).
	maxKeepalive = 65535 * time.Second
)

// Setting keys:
//
//	interface  name of the WireGuard link (cbl-wg0)
//	port       UDP port WireGuard listens on and this node publishes (51820)
//	mtu        MTU of the link and its routes; 0 or unset: the underlay link's MTU - Overhead
//	keepalive  persistent keepalive of every peer, whole seconds, 0s disables (25s)
const (
	keyInterface = "interface"
	keyPort      = "port"
	keyMTU       = "mtu"
	keyKeepalive = "keepalive"
)

// config is the validated form of cable.Settings.
type config struct {
	Interface string
	Port      int
	// MTU is 0 when not set: Init then derives it from the underlay link.
	MTU       int
	Keepalive time.Duration
}

// parseSettings validates settings and fills defaults. It does no I/O; every error is a
// *cable.SettingError naming the key and the value.
func parseSettings(s cable.Settings) (config, error) {
	c := config{Interface: DefaultInterface, Port: DefaultPort, Keepalive: DefaultKeepalive}
	var err error
	for _, k := range cable.SortedKeys(s) { // sorted: with several bad keys the error is deterministic
		v := s[k]
		switch k {
		case keyInterface:
			if err := cable.CheckLinkName(v, cable.MaxLinkName); err != nil {
				return config{}, cable.BadSetting(Name, k, v, "%v", err)
			}
			c.Interface = v
		case keyPort:
			if c.Port, err = cable.PortSetting(Name, k, v); err != nil {
				return config{}, err
			}
		case keyMTU:
			if c.MTU, err = cable.MTUSetting(Name, k, v, MinMTU, MaxMTU); err != nil {
				return config{}, err
			}
		case keyKeepalive:
			// WireGuard counts keepalive in whole seconds, 0..65535.
			d, perr := time.ParseDuration(v)
			if perr != nil {
				return config{}, cable.BadSetting(Name, k, v, "is not a duration such as 25s (0s disables)")
			}
			if d < 0 || d%time.Second != 0 || d > maxKeepalive {
				return config{}, cable.BadSetting(Name, k, v, "is not whole seconds between 0s and 65535s")
			}
			c.Keepalive = d
		default:
			return config{}, cable.UnknownSetting(Name, k, v, keyInterface, keyPort, keyMTU, keyKeepalive)
		}
	}
	return c, nil
}

// defaultMTU derives the tunnel MTU from the underlay link's MTU.
func defaultMTU(underlayMTU int) int {
	return max(underlayMTU-Overhead, MinMTU)
}

// parseOptions validates the per-connection options of a policy. The wireguard driver has none
// yet, so every key is an error rather than being silently ignored.
func parseOptions(o cable.Options) error {
	if len(o) == 0 {
		return nil
	}
	parts := make([]string, 0, len(o))
	for _, k := range cable.SortedKeys(o) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, o[k]))
	}
	return fmt.Errorf("wireguard option %s: unknown key (the wireguard driver takes no per-connection options)", strings.Join(parts, ", "))
}
