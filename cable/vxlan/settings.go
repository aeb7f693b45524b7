package vxlan

import (
	"fmt"
	"hash/fnv"
	"strconv"

	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/vxlan/spec"
)

// The driver's name, settings and options are its spec's (cable/vxlan/spec), which the broker and
// cablectl link without this datapath.
const (
	Name                   = spec.Name
	DefaultPort            = spec.DefaultPort
	DefaultVNI             = spec.DefaultVNI
	DefaultInterfacePrefix = spec.DefaultInterfacePrefix
	Overhead               = spec.Overhead
	MinMTU                 = spec.MinMTU
	MaxMTU                 = spec.MaxMTU
	MaxVNI                 = spec.MaxVNI
	// MaxPinnedPort is the largest port Embedding.PinSourcePort takes.
	MaxPinnedPort = spec.MaxPinnedPort
	keyPort       = spec.KeyPort
	keyVNI        = "vni"
	keyMTU        = "mtu"
)

type (
	config      = spec.Config
	pairOptions = spec.PairOptions
)

func parseSettings(s cable.Settings) (config, error) { return spec.ParseSettings(s) }

func parseOptions(o cable.Options) (pairOptions, error) { return spec.ParseOptions(o) }

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
