package wireguard

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

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
	// fallbackUnderlayMTU is assumed when the link holding the advertise address cannot be found
	// (e.g. the advertised address is a NAT's public address).
	fallbackUnderlayMTU = 1500
)

// Setting keys.
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

// parseSettings validates settings and fills defaults. It does no I/O; every error names the key
// and the value.
func parseSettings(s cable.Settings) (config, error) {
	c := config{Interface: DefaultInterface, Port: DefaultPort, Keepalive: DefaultKeepalive}
	// Sorted so that with several bad keys the error is deterministic.
	keys := make([]string, 0, len(s))
	for k := range s {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := s[k]
		switch k {
		case keyInterface:
			if err := validInterfaceName(v); err != nil {
				return config{}, fmt.Errorf("wireguard setting %s=%q: %w", k, v, err)
			}
			c.Interface = v
		case keyPort:
			p, err := strconv.Atoi(v)
			if err != nil || p < 1 || p > 65535 {
				return config{}, fmt.Errorf("wireguard setting %s=%q: want a UDP port 1..65535", k, v)
			}
			c.Port = p
		case keyMTU:
			m, err := strconv.Atoi(v)
			if err != nil || m < MinMTU || m > MaxMTU {
				return config{}, fmt.Errorf("wireguard setting %s=%q: want an integer %d..%d", k, v, MinMTU, MaxMTU)
			}
			c.MTU = m
		case keyKeepalive:
			d, err := time.ParseDuration(v)
			if err != nil {
				return config{}, fmt.Errorf("wireguard setting %s=%q: want a duration such as 25s (0 disables): %v", k, v, err)
			}
			// WireGuard counts keepalive in whole seconds, 0..65535.
			if d < 0 || d%time.Second != 0 || d > 65535*time.Second {
				return config{}, fmt.Errorf("wireguard setting %s=%q: want whole seconds between 0s and 65535s", k, v)
			}
			c.Keepalive = d
		default:
			return config{}, fmt.Errorf("wireguard setting %s=%q: unknown key (known: %s, %s, %s, %s)",
				k, v, keyInterface, keyPort, keyMTU, keyKeepalive)
		}
	}
	return c, nil
}

// validInterfaceName applies the kernel's dev_valid_name rules.
func validInterfaceName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("interface name is empty")
	case len(name) > 15:
		return fmt.Errorf("interface name is %d bytes, the kernel allows at most 15", len(name))
	case name == "." || name == "..":
		return fmt.Errorf("interface name may not be . or ..")
	}
	for _, r := range name {
		if r == '/' || r == ':' || unicode.IsSpace(r) || r > unicode.MaxASCII || !unicode.IsPrint(r) {
			return fmt.Errorf("interface name has the invalid character %q", r)
		}
	}
	return nil
}

// defaultMTU derives the tunnel MTU from the underlay link's MTU.
func defaultMTU(underlayMTU int) int {
	m := underlayMTU - Overhead
	if m < MinMTU {
		return MinMTU
	}
	return m
}

// parseOptions validates the per-connection options of a policy. The wireguard driver has none
// yet, so every key is an error rather than being silently ignored.
func parseOptions(o cable.Options) error {
	if len(o) == 0 {
		return nil
	}
	keys := make([]string, 0, len(o))
	for k := range o {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%q", k, o[k]))
	}
	return fmt.Errorf("wireguard option %s: unknown key (the wireguard driver takes no per-connection options)", strings.Join(parts, ", "))
}
