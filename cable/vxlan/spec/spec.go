// Package spec is the vxlan cable driver's spec: its name, the settings and options it takes, and
// its traits. It does no I/O and links no netlink code, so the broker and cablectl use it without
// the datapath (cable/vxlan).
package spec

import (
	"fmt"
	"strconv"

	"github.com/cablemesh/cablemesh/cable"
)

// Name is the registry key of this driver.
const Name = "vxlan"

// MaxPinnedPort is the largest port an embedding driver may pin as the source port: the kernel's
// source port range ends one above it.
const MaxPinnedPort = 65534

func init() {
	cable.RegisterSpec(cable.Spec{
		Name:            Name,
		ParseSettings:   cable.Check(ParseSettings),
		ValidateOptions: cable.Check(ParseOptions),
		Traits:          cable.Traits{Label: "VXLAN", Handshake: cable.NoHandshake},
	})
}

// Defaults of the node-level settings (cable.Settings keys in the agent Config).
const (
	// DefaultPort is the IANA VXLAN UDP port; this node listens on it and publishes it in
	// Endpoint.cable_ports["vxlan"].
	DefaultPort = 4789
	// DefaultVNI is the VXLAN network identifier of the mesh's default device. Both ends of a
	// pair must use the same VNI: keep the node setting equal mesh-wide, or set it per pair with
	// the policy option vni.
	DefaultVNI = 100
	// DefaultInterfacePrefix starts the name of every VXLAN link this driver makes; Cleanup and
	// Init treat every vxlan link with this prefix as ours.
	DefaultInterfacePrefix = "cbl-vx"
	// Overhead is what VXLAN over IPv4 adds to an inner IP packet: outer IPv4 20 + UDP 8 + VXLAN 8
	// + inner Ethernet 14. The default MTU is the underlay MTU minus this.
	Overhead = 50
	// MinMTU is the smallest MTU we accept or compute: every IPv4 host must take 576-byte
	// datagrams. (The inner traffic is IPv4 only, so the IPv6 minimum does not apply.)
	MinMTU = 576
	// MaxMTU is the largest MTU we accept.
	MaxMTU = 65535
	// MaxVNI is the largest 24-bit VNI.
	MaxVNI = 1<<24 - 1
	// maxPrefix keeps prefix + an 8-digit VNI within the kernel's 15 bytes.
	maxPrefix = 6
)

// Setting and option keys.
const (
	KeyPort            = "port"
	keyVNI             = "vni"
	keyMTU             = "mtu"
	keyInterfacePrefix = "interfacePrefix"
)

// Config is the validated form of cable.Settings.
type Config struct {
	Port   int
	VNI    int
	Prefix string
	// MTU is 0 when not set: Init then derives it from the underlay link.
	MTU int
}

// PairOptions are the validated per-connection options; 0 means "not set, use the node's".
type PairOptions struct {
	VNI  int
	Port int
	MTU  int
}

func parsePort(v string) (int, bool) {
	p, err := strconv.Atoi(v)
	return p, err == nil && p >= 1 && p <= 65535 && strconv.Itoa(p) == v
}

func parseVNI(v string) (int, bool) {
	n, err := strconv.Atoi(v)
	return n, err == nil && n >= 1 && n <= MaxVNI && strconv.Itoa(n) == v
}

func parseMTU(v string) (int, bool) {
	m, err := strconv.Atoi(v)
	return m, err == nil && m >= MinMTU && m <= MaxMTU && strconv.Itoa(m) == v
}

// ParseSettings validates settings and fills defaults. It does no I/O; every error is a
// *cable.SettingError naming the key and the value.
func ParseSettings(s cable.Settings) (Config, error) {
	c := Config{Port: DefaultPort, VNI: DefaultVNI, Prefix: DefaultInterfacePrefix}
	var err error
	for _, k := range cable.SortedKeys(s) { // sorted: with several bad keys the error is deterministic
		v := s[k]
		switch k {
		case KeyPort:
			c.Port, err = cable.PortSetting(Name, k, v)
		case keyVNI:
			c.VNI, err = cable.IntSetting(Name, k, v, 1, MaxVNI)
		case keyMTU:
			c.MTU, err = cable.MTUSetting(Name, k, v, MinMTU, MaxMTU)
		case keyInterfacePrefix:
			c.Prefix, err = v, validPrefix(v)
		default:
			err = cable.UnknownSetting(Name, k, v, KeyPort, keyVNI, keyMTU, keyInterfacePrefix)
		}
		if err != nil {
			return Config{}, err
		}
	}
	return c, nil
}

// ParseOptions validates the per-connection options of a policy (cableDriver.options). Unknown
// keys are errors, never silently ignored; every error names the key and the value.
func ParseOptions(o cable.Options) (PairOptions, error) {
	var p PairOptions
	for _, k := range cable.SortedKeys(o) {
		v := o[k]
		switch k {
		case keyVNI:
			n, ok := parseVNI(v)
			if !ok {
				return PairOptions{}, fmt.Errorf("vxlan option %s=%q: want a VNI 1..%d", k, v, MaxVNI)
			}
			p.VNI = n
		case KeyPort:
			n, ok := parsePort(v)
			if !ok {
				return PairOptions{}, fmt.Errorf("vxlan option %s=%q: want a UDP port 1..65535", k, v)
			}
			p.Port = n
		case keyMTU:
			n, ok := parseMTU(v)
			if !ok {
				return PairOptions{}, fmt.Errorf("vxlan option %s=%q: want an integer %d..%d", k, v, MinMTU, MaxMTU)
			}
			p.MTU = n
		default:
			return PairOptions{}, fmt.Errorf("vxlan option %s=%q: unknown key (known: %s, %s, %s)", k, v, keyMTU, KeyPort, keyVNI)
		}
	}
	return p, nil
}

// validPrefix applies the kernel's link name rules to the interface prefix, keeping room for the
// VNI.
func validPrefix(p string) error {
	if len(p) > maxPrefix {
		return cable.BadSetting(Name, keyInterfacePrefix, p, "is %d bytes: at most %d leave room for the VNI in the kernel's 15", len(p), maxPrefix)
	}
	if err := cable.CheckLinkName(p, maxPrefix); err != nil {
		return cable.BadSetting(Name, keyInterfacePrefix, p, "%v", err)
	}
	return nil
}
