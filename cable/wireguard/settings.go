package wireguard

import (
	"github.com/cablemesh/cablemesh/cable"
	"github.com/cablemesh/cablemesh/cable/wireguard/spec"
)

// The driver's name, settings, options and published attributes are its spec's
// (cable/wireguard/spec), which the broker and cablectl link without this datapath.
const (
	Name             = spec.Name
	AttrPublicKey    = spec.AttrPublicKey
	AttrDevice       = spec.AttrDevice
	DefaultInterface = spec.DefaultInterface
	DefaultPort      = spec.DefaultPort
	DefaultKeepalive = spec.DefaultKeepalive
	Overhead         = spec.Overhead
	MinMTU           = spec.MinMTU
	MaxMTU           = spec.MaxMTU
)

// config is the validated form of cable.Settings.
type config = spec.Config

func parseSettings(s cable.Settings) (config, error) { return spec.ParseSettings(s) }

func parseOptions(o cable.Options) error { return spec.ParseOptions(o) }

// defaultMTU derives the tunnel MTU from the underlay link's MTU.
func defaultMTU(underlayMTU int) int {
	return max(underlayMTU-Overhead, MinMTU)
}
