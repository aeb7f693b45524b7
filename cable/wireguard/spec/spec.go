// Package spec is the wireguard cable driver's spec: its name, the settings and options it takes,
// what a node publishes for it, and its traits. It does no I/O and links no WireGuard code, so the
// broker and cablectl use it without the datapath (cable/wireguard).
package spec

import (
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/cablemesh/cablemesh/cable"
)

// Name is the registry key of this driver.
const Name = "wireguard"

// AttrPublicKey is the attribute a wireguard node publishes its public key under (base64, as
// wg(8) prints it).
const AttrPublicKey = "publicKey"

// AttrDevice is the attribute a wireguard node publishes its device kind under (kernel or
// userspace): the two ends of a pair choose how to make their first handshake from both kinds.
// Optional: a node that does not publish it counts as a kernel one.
const AttrDevice = "device"

// HandshakeLifetime is WireGuard's REJECT_AFTER_TIME: a session older than this carries nothing.
const HandshakeLifetime = 180 * time.Second

func init() {
	cable.RegisterSpec(cable.Spec{
		Name:            Name,
		ParseSettings:   cable.Check(ParseSettings),
		ValidateOptions: ParseOptions,
		CheckPublished:  CheckPublished,
		Traits: cable.Traits{
			Label:              "WireGuard",
			Handshake:          cable.SessionHandshake,
			HandshakeLifetime:  HandshakeLifetime,
			HandshakeNote:      "WireGuard also stays silent on a key mismatch",
			PublicKeyAttribute: AttrPublicKey,
		},
	})
}

// CheckPublished validates what a remote wireguard node publishes: its public key.
func CheckPublished(attrs map[string]string) error {
	if attrs[AttrPublicKey] == "" {
		return fmt.Errorf("publishes no wireguard key")
	}
	if k, err := base64.StdEncoding.DecodeString(attrs[AttrPublicKey]); err != nil || len(k) != keyLen {
		return fmt.Errorf("wireguard %s %q is not a base64 32-byte key", AttrPublicKey, attrs[AttrPublicKey])
	}
	return nil
}

// keyLen is the length of a Curve25519 key.
const keyLen = 32

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

// Config is the validated form of cable.Settings.
type Config struct {
	Interface string
	Port      int
	// MTU is 0 when not set: Init then derives it from the underlay link.
	MTU       int
	Keepalive time.Duration
}

// ParseSettings validates settings and fills defaults. It does no I/O; every error is a
// *cable.SettingError naming the key and the value.
func ParseSettings(s cable.Settings) (Config, error) {
	c := Config{Interface: DefaultInterface, Port: DefaultPort, Keepalive: DefaultKeepalive}
	var err error
	for _, k := range cable.SortedKeys(s) { // sorted: with several bad keys the error is deterministic
		v := s[k]
		switch k {
		case keyInterface:
			if err := cable.CheckLinkName(v, cable.MaxLinkName); err != nil {
				return Config{}, cable.BadSetting(Name, k, v, "%v", err)
			}
			c.Interface = v
		case keyPort:
			if c.Port, err = cable.PortSetting(Name, k, v); err != nil {
				return Config{}, err
			}
		case keyMTU:
			if c.MTU, err = cable.MTUSetting(Name, k, v, MinMTU, MaxMTU); err != nil {
				return Config{}, err
			}
		case keyKeepalive:
			// WireGuard counts keepalive in whole seconds, 0..65535.
			d, perr := time.ParseDuration(v)
			if perr != nil {
				return Config{}, cable.BadSetting(Name, k, v, "is not a duration such as 25s (0s disables)")
			}
			if d < 0 || d%time.Second != 0 || d > maxKeepalive {
				return Config{}, cable.BadSetting(Name, k, v, "is not whole seconds between 0s and 65535s")
			}
			c.Keepalive = d
		default:
			return Config{}, cable.UnknownSetting(Name, k, v, keyInterface, keyPort, keyMTU, keyKeepalive)
		}
	}
	return c, nil
}

// ParseOptions validates the per-connection options of a policy. The wireguard driver has none
// yet, so every key is an error rather than being silently ignored.
func ParseOptions(o cable.Options) error {
	if len(o) == 0 {
		return nil
	}
	parts := make([]string, 0, len(o))
	for _, k := range cable.SortedKeys(o) {
		parts = append(parts, fmt.Sprintf("%s=%q", k, o[k]))
	}
	return fmt.Errorf("wireguard option %s: unknown key (the wireguard driver takes no per-connection options)", strings.Join(parts, ", "))
}
