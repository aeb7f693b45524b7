package vxlan

import (
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/cablemesh/cablemesh/cable"
)

// Defaults of the node-level settings (cable.Settings keys in the agent config).
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
	keyPort            = "port"
	keyVNI             = "vni"
	keyMTU             = "mtu"
	keyInterfacePrefix = "interfacePrefix"
)

// config is the validated form of cable.Settings.
type config struct {
	Port   int
	VNI    int
	Prefix string
	// MTU is 0 when not set: Init then derives it from the underlay link.
	MTU int
}

// pairOptions are the validated per-connection options; 0 means "not set, use the node's".
type pairOptions struct {
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

// parseSettings validates settings and fills defaults. It does no I/O; every error is a
// *cable.SettingError naming the key and the value.
func parseSettings(s cable.Settings) (config, error) {
	c := config{Port: DefaultPort, VNI: DefaultVNI, Prefix: DefaultInterfacePrefix}
	var err error
	for _, k := range cable.SortedKeys(s) { // sorted: with several bad keys the error is deterministic
		v := s[k]
		switch k {
		case keyPort:
			c.Port, err = cable.PortSetting(Name, k, v)
		case keyVNI:
			c.VNI, err = cable.IntSetting(Name, k, v, 1, MaxVNI)
		case keyMTU:
			c.MTU, err = cable.MTUSetting(Name, k, v, MinMTU, MaxMTU)
		case keyInterfacePrefix:
			c.Prefix, err = v, validPrefix(v)
		default:
			err = cable.UnknownSetting(Name, k, v, keyPort, keyVNI, keyMTU, keyInterfacePrefix)
		}
		if err != nil {
			return config{}, err
		}
	}
	return c, nil
}

// parseOptions validates the per-connection options of a policy (cableDriver.options). Unknown
// keys are errors, never silently ignored; every error names the key and the value.
func parseOptions(o cable.Options) (pairOptions, error) {
	var p pairOptions
	for _, k := range cable.SortedKeys(o) {
		v := o[k]
		switch k {
		case keyVNI:
			n, ok := parseVNI(v)
			if !ok {
				return pairOptions{}, fmt.Errorf("vxlan option %s=%q: want a VNI 1..%d", k, v, MaxVNI)
			}
			p.VNI = n
		case keyPort:
			n, ok := parsePort(v)
			if !ok {
				return pairOptions{}, fmt.Errorf("vxlan option %s=%q: want a UDP port 1..65535", k, v)
			}
			p.Port = n
		case keyMTU:
			n, ok := parseMTU(v)
			if !ok {
				return pairOptions{}, fmt.Errorf("vxlan option %s=%q: want an integer %d..%d", k, v, MinMTU, MaxMTU)
			}
			p.MTU = n
		default:
			return pairOptions{}, fmt.Errorf("vxlan option %s=%q: unknown key (known: %s, %s, %s)", k, v, keyMTU, keyPort, keyVNI)
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

// deviceName names the link of one (vni, port): <prefix><vni> on the node's own port (the
// common case: cbl-vx100), <prefix><vni>p<port> on another port when that fits in 15 bytes, and
// otherwise <prefix>h<8 hex digits of an FNV-1a hash of vni and port>. The three forms cannot
// collide with each other (digits only / a 'p' / an 'h' after the prefix); two hashed pairs could,
// and Connect refuses to reuse a link whose VNI or port differs from what it wants.
func deviceName(prefix string, vni, port, nodePort int) string {
	if port == nodePort {
		return prefix + strconv.Itoa(vni)
	}
	if n := prefix + strconv.Itoa(vni) + "p" + strconv.Itoa(port); len(n) <= 15 {
		return n
	}
	h := fnv.New32a()
	fmt.Fprintf(h, "%d/%d", vni, port)
	return fmt.Sprintf("%sh%08x", prefix, h.Sum32())
}

// defaultMTU derives the device MTU from the underlay link's MTU.
func defaultMTU(underlayMTU int) int {
	return max(underlayMTU-Overhead, MinMTU)
}

// pair is what one connection uses after the policy's options are applied to the node's settings.
type pair struct {
	VNI int
	// Port is the device's port: the UDP port it listens on.
	Port int
	// DstPort is the UDP port packets to the remote go to: the policy's port when it sets one
	// (both ends then use it), otherwise the port the remote publishes.
	DstPort int
	// MTU of the routes (and so of the traffic) of this pair.
	MTU    int
	Device string
}

// resolvePair applies opts to the node's config. deviceMTU is the MTU every device of this node
// gets; a pair may only ask for a smaller one (its routes carry it).
func resolvePair(c config, o pairOptions, remotePort uint16, deviceMTU int) (pair, error) {
	p := pair{VNI: c.VNI, Port: c.Port, DstPort: int(remotePort), MTU: deviceMTU}
	if o.VNI != 0 {
		p.VNI = o.VNI
	}
	if o.Port != 0 {
		p.Port, p.DstPort = o.Port, o.Port
	}
	if p.DstPort == 0 {
		return pair{}, fmt.Errorf("the remote publishes no vxlan port and the policy sets no option %s", keyPort)
	}
	if o.MTU != 0 {
		if o.MTU > deviceMTU {
			return pair{}, fmt.Errorf("vxlan option %s=\"%d\": larger than this node's VXLAN device MTU %d (node setting %s, default underlay MTU - %d)",
				keyMTU, o.MTU, deviceMTU, keyMTU, Overhead)
		}
		p.MTU = o.MTU
	}
	p.Device = deviceName(c.Prefix, p.VNI, p.Port, c.Port)
	return p, nil
}
